// Client: one TCP connection to a Server.
//
// Why POSIX sockets here and Boost.Asio only in the server: a client is a blocking object (one
// call at a time on the caller's thread), and an Asio socket needs an io_context whose reactor
// costs three descriptors (epoll, eventfd, timerfd) per context. A process running thousands of
// clients on loopback (bench/store_bench.cpp: 4096 clients and the server in one process) would
// need four descriptors per client instead of one. A non-blocking socket, poll() with the
// deadline, and a small state mutex (Note [Client cancel]) give the same behaviour at one
// descriptor each.

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chorus/check.hpp>
#include <chorus/error.hpp>
#include <chorus/store/store.hpp>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "protocol.hpp"
#include "resolver.hpp"

namespace chorus::store {
namespace detail {
namespace {
// Atomic so that a test swapping it and a client reading it never race.
std::atomic<Resolver> current_resolver{nullptr};  // nullptr: ::getaddrinfo
// Helper threads of host lookups that have not finished yet (Note [Store host lookup]).
std::atomic<std::size_t> running_lookups{0};
}  // namespace

Resolver resolver() noexcept {
  const Resolver chosen = current_resolver.load(std::memory_order_acquire);
  return chosen != nullptr ? chosen : &::getaddrinfo;
}

Resolver exchange_resolver(Resolver next) noexcept {
  return current_resolver.exchange(next, std::memory_order_acq_rel);
}

std::size_t lookups_running() noexcept { return running_lookups.load(std::memory_order_acquire); }
}  // namespace detail

namespace {

using detail::error_context;
using detail::make_request;
using detail::ok_number;
using detail::ok_value;
using detail::Op;
using detail::refusal;
using detail::Request;
using detail::Response;
using detail::Status;

// How long after a blocking call's deadline the client still waits for the server's own
// Timeout answer (the server times the wait; this only guards against a wedged server).
constexpr std::chrono::seconds kAnswerGrace{2};

// kAnswerGrace after `deadline`, or after now for a deadline already passed (the server answers
// such a call with Timeout at once), saturating at time_point::max(): a deadline may be any time
// point, min() and max() included.
Deadline with_grace(const Deadline& deadline) noexcept {
  constexpr auto kMax = Deadline::Clock::time_point::max();
  const Deadline::Clock::duration grace = kAnswerGrace;
  const auto from = std::max(deadline.at(), Deadline::Clock::now());
  return from > kMax - grace ? Deadline(kMax) : Deadline(from + grace);
}
// Bounds on the pause between connection attempts while the server is not up yet.
constexpr std::chrono::milliseconds kRetryFirst{5};
constexpr std::chrono::milliseconds kRetryLongest{250};
// A cancel frame is tiny; if it cannot be written in this time the connection is stuck anyway.
constexpr std::chrono::seconds kCancelWriteTimeout{1};

// The timeout a blocking request carries on the wire: the deadline's time left when it is sent
// (after any wait for the connection), capped as the protocol requires.
std::int64_t timeout_ms(const Deadline& deadline) {
  const auto ms = static_cast<std::uint64_t>(deadline.remaining().count());
  return static_cast<std::int64_t>(std::min(ms, detail::kTimeoutMsMax));
}

// The deadline passed inside an I/O loop (turned into chorus::Timeout by the caller, which knows
// what it was waiting for).
struct DeadlinePassed {};

std::string errno_text(int error) { return std::strerror(error); }

std::optional<std::string> token_from(const std::optional<std::string>& option) {
  if (option.has_value()) {
    return option->empty() ? std::nullopt : option;
  }
  const char* value = std::getenv(std::string(kTokenEnvironmentVariable).c_str());
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  return std::string(value);
}

// Waits until `fd` is ready for `events` or the deadline passes (DeadlinePassed).
void poll_until(int fd, short events, const Deadline& deadline) {
  for (;;) {
    const std::chrono::milliseconds left = deadline.remaining();
    if (left.count() <= 0) {
      throw DeadlinePassed{};
    }
    pollfd entry{fd, events, 0};
    const int ready =
        ::poll(&entry, 1, static_cast<int>(std::min<std::int64_t>(left.count(), INT_MAX)));
    if (ready > 0) {
      return;  // readable, writable, or an error/hangup the next recv/send reports
    }
    if (ready < 0 && errno != EINTR) {
      throw TransportError(error_context("store"), "poll failed: " + errno_text(errno));
    }
  }
}

// Note [Store host lookup]
// getaddrinfo takes no timeout: a name server that does not answer holds one call for
// resolv.conf's timeout x attempts x servers (5 s x 2 x up to 3 by default), whatever the
// client's deadline. So connect finds the store's addresses in one of two ways:
// - A numeric address (127.0.0.1, ::1: the usual MASTER_ADDR) is converted at once on the
//   calling thread by ::getaddrinfo with AI_NUMERICHOST, which never asks a name server. The
//   resolver seam (resolver.hpp) is not called for it, and no thread is started.
// - Any other host is a name. Each try runs the resolver on a helper thread of its own
//   (detached), and the caller waits for its answer on a condition variable until the deadline.
//   When the deadline comes first the caller throws Timeout ("the name server did not answer in
//   time") and leaves the lookup behind. The two threads share only a PendingLookup (a
//   shared_ptr): whichever lets go of it last frees the answer (~PendingLookup calls
//   freeaddrinfo on an answer the caller did not take), and the helper thread never touches the
//   Client, which may be gone by the time the resolver returns. A try that answers EAI_AGAIN is
//   retried like before (with the backoff of a refused connect), each try waited for no longer
//   than the time left, and no try starts once the deadline has passed; so a connect leaves at
//   most one lookup behind, whose thread ends when the resolver gives up.
// detail::lookups_running() counts the helper threads still running: a test waits for it to
// reach 0 to know that an abandoned lookup has finished and freed its answer.

// The state a lookup's helper thread shares with the caller waiting for it (Note [Store host
// lookup]).
struct PendingLookup {
  PendingLookup(std::string host_in, std::string service_in, const addrinfo& hints_in)
      : host(std::move(host_in)), service(std::move(service_in)), hints(hints_in) {}
  ~PendingLookup() {
    if (found != nullptr) {
      ::freeaddrinfo(found);  // an answer that came after the caller's deadline
    }
  }
  PendingLookup(const PendingLookup&) = delete;
  PendingLookup& operator=(const PendingLookup&) = delete;

  // Set before the helper thread starts; read-only after.
  const std::string host;
  const std::string service;
  const addrinfo hints;

  std::mutex mutex;
  std::condition_variable answered_cv;
  // Guarded by mutex.
  bool answered = false;
  int code = 0;               // the resolver's result, once answered
  addrinfo* found = nullptr;  // its addresses (code 0) until the caller takes them
};

using Addresses = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

// Runs `resolve` for `host` on a helper thread and waits for its answer until the deadline
// (Note [Store host lookup]). Returns the resolver's code, with its addresses in `addresses`
// when that is 0, or nullopt when the deadline came first. Throws TransportError when no thread
// can be started.
std::optional<int> look_up_until(detail::Resolver resolve, const std::string& host,
                                 const std::string& service, const addrinfo& hints,
                                 const Deadline& deadline, Addresses& addresses) {
  auto lookup = std::make_shared<PendingLookup>(host, service, hints);
  detail::running_lookups.fetch_add(1, std::memory_order_relaxed);
  try {
    std::thread([lookup, resolve]() mutable noexcept {
      addrinfo* found = nullptr;
      const int code =
          resolve(lookup->host.c_str(), lookup->service.c_str(), &lookup->hints, &found);
      {
        const std::lock_guard lock(lookup->mutex);
        lookup->answered = true;
        lookup->code = code;
        lookup->found = code == 0 ? found : nullptr;  // on failure `found` means nothing
      }
      lookup->answered_cv.notify_one();  // alive: this thread still holds a reference
      lookup.reset();                    // the last one out frees an answer nobody took
      detail::running_lookups.fetch_sub(1, std::memory_order_release);
    }).detach();
  } catch (const std::system_error& error) {
    detail::running_lookups.fetch_sub(1, std::memory_order_relaxed);
    throw TransportError(error_context("store.connect"), "cannot resolve store host '" + host +
                                                             "': no thread for the lookup (" +
                                                             error.what() + ")");
  } catch (...) {  // std::bad_alloc from std::thread's state
    detail::running_lookups.fetch_sub(1, std::memory_order_relaxed);
    throw;
  }
  std::unique_lock lock(lookup->mutex);
  if (!lookup->answered_cv.wait_until(lock, deadline.at(), [&] { return lookup->answered; })) {
    return std::nullopt;  // the helper thread frees what it finds, if it is the last one out
  }
  if (lookup->code == 0) {
    addresses.reset(std::exchange(lookup->found, nullptr));
  }
  return lookup->code;
}

}  // namespace

// Note [Client cancel]
// cancel() is called from another thread while a call is in flight, and must not wait for that
// call's request to be written: a large multi_set (or a wait on many keys) to a server that
// reads slowly, or not at all, can take until its deadline to write. So no lock is held while a
// request is written, and the call's phase says who may write: in Sending only the calling
// thread writes (its request), in Answering only cancel() does (its Cancel frame, under
// state_mutex, so two cancels send one frame). A cancel() that comes in Sending for a blocking
// call is remembered (cancel_requested) and the calling thread sends the Cancel frame itself as
// soon as its request is out, while still in step: the server allows only a Cancel after a
// pending blocking request. A cancel() for a non-blocking call does nothing (such calls are not
// cancellable), at once. A Cancel frame that cannot be written (kCancelWriteTimeout: the server
// is not reading) shuts the socket down, so that the call still ends now, with TransportError.
struct Client::Impl {
  enum class Phase { Idle, Sending, Answering };

  ClientOptions options;
  std::string address;  // host:port, for messages
  std::size_t frame_bytes_max = 0;

  // Held for a whole call: one request on the wire at a time. Timed: a call queued behind
  // another thread's blocking call waits for it no longer than its own deadline.
  std::timed_mutex call_mutex;
  // Guards the fields below; held only briefly (and while cancel() writes its small frame),
  // never while a request is written. See Note [Client cancel].
  std::mutex state_mutex;
  // fd, phase and blocking_in_flight are changed under state_mutex, by the thread that holds
  // call_mutex (or the constructor or destructor), and read without it by that thread.
  // cancel_requested and cancel_sent are changed under state_mutex both by that thread (a call
  // resets them as it begins) and by cancel(), from any thread; read only under state_mutex.
  int fd = -1;
  Phase phase = Phase::Idle;
  bool blocking_in_flight = false;  // the call in flight is a get/wait/multi_get
  bool cancel_requested = false;    // cancel() came while the request was being written
  bool cancel_sent = false;         // a Cancel was written (or tried) for the call in flight
  // The Cancel's write failed and the socket was shut down (send_cancel_locked): the calling
  // thread reads it, without state_mutex, to say why its call failed.
  std::atomic<bool> cancel_write_failed{false};
  // Why the connection was closed (empty while it is usable). Guarded by call_mutex.
  std::string closed_because;

  ~Impl() { close_socket(); }

  void close_socket() noexcept {
    const std::lock_guard lock(state_mutex);
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
    }
  }

  // Closes the connection for good: its state is unknown after a failure mid-call.
  void fail(std::string why) {
    closed_because = std::move(why);
    close_socket();
  }

  // fail() for a catch (...): when even the reason cannot be stored (out of memory), a short
  // one (no allocation in practice) is, so that the connection is closed for good all the same.
  void fail_noexcept(const std::string& op) noexcept {
    try {
      closed_because = "a " + op + " failed mid-call with an unexpected exception";
    } catch (...) {
      closed_because = "failed";  // within the small-string buffer
    }
    close_socket();
  }

  // Only one thread writes at a time: Note [Client cancel].
  void send_all(const std::vector<std::uint8_t>& frame, const Deadline& deadline) const {
    CHORUS_CHECK(fd >= 0);
    std::size_t sent = 0;
    while (sent < frame.size()) {
      const ssize_t n = ::send(fd, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        poll_until(fd, POLLOUT, deadline);
      } else {
        throw TransportError(
            error_context("store"),
            "the store at " + address + " closed the connection (send: " + errno_text(errno) + ")");
      }
    }
  }

  void read_exact(std::uint8_t* out, std::size_t bytes, const Deadline& deadline) const {
    while (bytes > 0) {
      const ssize_t n = ::recv(fd, out, bytes, 0);
      if (n > 0) {
        out += n;
        bytes -= static_cast<std::size_t>(n);
      } else if (n == 0) {
        throw TransportError(error_context("store"),
                             "the store at " + address + " closed the connection (server gone?)");
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        poll_until(fd, POLLIN, deadline);
      } else {
        throw TransportError(error_context("store"), "the connection to the store at " + address +
                                                         " failed: " + errno_text(errno));
      }
    }
  }

  std::vector<std::uint8_t> read_frame(const Deadline& deadline) const {
    std::uint8_t header[detail::kFrameHeaderBytes];
    read_exact(header, sizeof header, deadline);
    const std::uint32_t bytes = detail::read_frame_header(header);
    // Before the handshake the peer may be anything listening on the port (an SSH server's
    // "SSH-" reads as 759 MB): its reply is held to the handshake's size, so that nothing large
    // is allocated and the client says what it met instead of waiting out the deadline.
    if (frame_bytes_max == 0 && bytes > detail::kHelloFrameBytesMax) {
      throw TransportError(error_context("store.connect"),
                           "the peer at " + address +
                               " is not a chorus store (handshake reply of " +
                               std::to_string(bytes) + " bytes, at most " +
                               std::to_string(detail::kHelloFrameBytesMax) + " expected)");
    }
    if (frame_bytes_max != 0 && bytes > frame_bytes_max) {
      throw TransportError(error_context("store"), "the store at " + address + " sent a frame of " +
                                                       std::to_string(bytes) + " bytes (limit " +
                                                       std::to_string(frame_bytes_max) + ")");
    }
    std::vector<std::uint8_t> body(bytes);
    read_exact(body.data(), body.size(), deadline);
    return body;
  }

  void connect(const Deadline& deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    const std::string service = std::to_string(options.port);
    // Between tries (the name server or the store may answer later): report, pause, back off.
    std::chrono::milliseconds pause = kRetryFirst;
    const auto retry_after = [&](const std::string& reason) {
      if (options.on_connect_retry) {
        options.on_connect_retry(reason);
      }
      std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
      pause = std::min(pause * 2, kRetryLongest);
    };
    // A numeric address at once, a name on a helper thread: Note [Store host lookup].
    Addresses addresses(nullptr, &::freeaddrinfo);
    addrinfo numeric_hints = hints;
    numeric_hints.ai_flags |= AI_NUMERICHOST;
    addrinfo* numeric = nullptr;
    if (::getaddrinfo(options.host.c_str(), service.c_str(), &numeric_hints, &numeric) == 0) {
      addresses.reset(numeric);
    }
    const auto resolve_timeout = [&](const std::string& reason) {
      return Timeout(
          error_context("store.connect"),
          "could not resolve store host '" + options.host + "' before the deadline: " + reason);
    };
    // Why the last try failed: the Timeout says it when no further try can start.
    std::string reason = "the deadline had passed before the lookup began";
    while (addresses == nullptr) {
      if (deadline.passed()) {
        throw resolve_timeout(reason);
      }
      const std::optional<int> resolved =
          look_up_until(detail::resolver(), options.host, service, hints, deadline, addresses);
      if (!resolved.has_value()) {
        throw resolve_timeout("the name server did not answer in time");
      }
      if (*resolved == 0) {
        break;
      }
      reason = ::gai_strerror(*resolved);
      if (*resolved != EAI_AGAIN) {
        throw InvalidArgument(error_context("store.connect"),
                              "cannot resolve store host '" + options.host + "': " + reason);
      }
      // A temporary failure (the name server did not answer in time): it may answer on a later
      // try, like a server that is not listening yet, so try again until the deadline.
      if (!deadline.passed()) {
        retry_after(reason);
      }
    }
    std::string last_error = "no address";
    pause = kRetryFirst;
    for (;;) {
      for (const addrinfo* at = addresses.get(); at != nullptr; at = at->ai_next) {
        const int socket_fd =
            ::socket(at->ai_family, at->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (socket_fd < 0) {
          throw TransportError(error_context("store.connect"),
                               "socket() failed: " + errno_text(errno));
        }
        int error = 0;
        if (::connect(socket_fd, at->ai_addr, at->ai_addrlen) != 0) {
          error = errno;
          if (error == EINPROGRESS) {
            try {
              poll_until(socket_fd, POLLOUT, deadline);
            } catch (...) {
              ::close(socket_fd);
              throw Timeout(error_context("store.connect"), "could not connect to the store at " +
                                                                address + " before the deadline");
            }
            socklen_t length = sizeof error;
            ::getsockopt(socket_fd, SOL_SOCKET, SO_ERROR, &error, &length);
          }
        }
        if (error == 0) {
          const int one = 1;
          ::setsockopt(socket_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          fd = socket_fd;
          return;
        }
        ::close(socket_fd);
        last_error = errno_text(error);
      }
      if (deadline.remaining() <= std::chrono::milliseconds(0)) {
        throw Timeout(
            error_context("store.connect"),
            "could not connect to the store at " + address + " before the deadline: " + last_error);
      }
      // The server may not be listening yet (ranks start in any order): try again.
      retry_after(last_error);
    }
  }

  // Caller holds state_mutex; the call in flight is blocking and its request is out.
  void send_cancel_locked() noexcept {
    CHORUS_CHECK(phase == Phase::Answering);
    CHORUS_CHECK(blocking_in_flight);
    if (fd < 0 || cancel_sent) {
      return;
    }
    cancel_sent = true;  // one Cancel per call, whether or not its write completes
    try {
      send_all(detail::encode_request(detail::make_request(Op::Cancel)),
               Deadline(kCancelWriteTimeout));
    } catch (...) {
      // The Cancel could not be written: the connection failed, or the server has not read for
      // kCancelWriteTimeout and the send buffer is full (then the connection itself is not
      // broken, and the call in flight would wait out its whole deadline). Either way the
      // Cancel is not coming and the cancel must still end the call: shutting the socket down
      // (not closing it: the calling thread still reads it) wakes the call's read at once,
      // which then fails with TransportError and closes the connection for good.
      cancel_write_failed = true;
      ::shutdown(fd, SHUT_RDWR);
    }
  }

  // The call's phases (Note [Client cancel]); the calling thread holds call_mutex.
  void begin_sending(bool blocking) {
    const std::lock_guard lock(state_mutex);
    CHORUS_CHECK(phase == Phase::Idle);
    phase = Phase::Sending;
    blocking_in_flight = blocking;
    cancel_requested = false;
    cancel_sent = false;
    cancel_write_failed = false;
  }
  void begin_answering() {
    const std::lock_guard lock(state_mutex);
    CHORUS_CHECK(phase == Phase::Sending);
    phase = Phase::Answering;
    if (cancel_requested) {
      CHORUS_CHECK(blocking_in_flight);
      send_cancel_locked();
    }
  }
  void end_call() noexcept {
    const std::lock_guard lock(state_mutex);
    phase = Phase::Idle;
    blocking_in_flight = false;
    cancel_requested = false;
  }

  void hello(const Deadline& deadline) {
    Request request = detail::make_request(Op::Hello, {}, {token_from(options.token).value_or("")},
                                           detail::kVersion);
    const std::vector<std::uint8_t> frame = detail::encode_request(request);
    if (frame.size() - detail::kFrameHeaderBytes > detail::kHelloFrameBytesMax) {
      close_socket();
      throw InvalidArgument(error_context("store.connect"),
                            "the token (" + std::to_string(request.values[0].size()) +
                                " bytes) makes the handshake longer than the " +
                                std::to_string(detail::kHelloFrameBytesMax) +
                                " bytes a store accepts before it: use a shorter token");
    }
    Response response;
    try {
      send_all(frame, deadline);  // no call can be in flight yet, so no cancel()
      response = detail::parse_response(Op::Hello, read_frame(deadline));
    } catch (const DeadlinePassed&) {
      close_socket();
      throw Timeout(error_context("store.connect"),
                    "the store at " + address + " did not answer the handshake in time");
    } catch (const detail::ProtocolError& error) {
      close_socket();
      throw TransportError(
          error_context("store.connect"),
          "the store at " + address + " answered the handshake with garbage: " + error.what());
    } catch (...) {
      close_socket();
      throw;
    }
    if (response.status != Status::Ok) {
      close_socket();
      throw TransportError(
          error_context("store.connect"),
          "the store at " + address + " refused the connection: " + response.message);
    }
    if (response.number <= 0) {
      close_socket();
      throw TransportError(error_context("store.connect"), "the store at " + address +
                                                               " reported a frame limit of " +
                                                               std::to_string(response.number));
    }
    frame_bytes_max = static_cast<std::size_t>(response.number);
  }
};

Client::Client(ClientOptions options, Deadline deadline) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->address = impl_->options.host + ":" + std::to_string(impl_->options.port);
  impl_->connect(deadline);
  impl_->hello(deadline);
}

Client::~Client() = default;

std::size_t Client::frame_bytes_max() const noexcept { return impl_->frame_bytes_max; }

void Client::cancel() noexcept {
  Impl& impl = *impl_;
  const std::lock_guard lock(impl.state_mutex);
  if (impl.fd < 0 || !impl.blocking_in_flight || impl.cancel_sent) {
    return;
  }
  if (impl.phase == Impl::Phase::Sending) {
    // The request is still being written: the calling thread sends the Cancel after it.
    impl.cancel_requested = true;
    return;
  }
  impl.send_cancel_locked();
}

Response Client::round_trip(Request& request, Deadline deadline) {
  Impl& impl = *impl_;
  const std::string op = "store." + std::string(detail::op_name(request.op));
  // Another thread's call may hold the connection for long (a get blocked on a key). Waiting
  // for it past this call's deadline, then sending anyway, would time the call out mid-call and
  // close the connection shared with that thread; refusing here sends nothing and keeps it.
  std::unique_lock call_lock(impl.call_mutex, std::try_to_lock);
  if (!call_lock.owns_lock()) {
    if (!call_lock.try_lock_until(deadline.at()) || deadline.passed()) {
      throw Timeout(error_context(op),
                    "the deadline passed while the call waited for another "
                    "thread's call on the same client to the store at " +
                        impl.address + " to finish (nothing was sent)");
    }
  }
  if (!impl.closed_because.empty()) {
    throw TransportError(error_context(op),
                         "the connection to the store at " + impl.address +
                             " was closed after an earlier failure: " + impl.closed_because);
  }
  const bool blocking = detail::is_blocking(request.op);
  // A non-blocking call has no timeout on the wire: sent with its deadline passed, it would be
  // applied, and its answer then missed, which leaves the connection in an unknown state (closed
  // for good). Refused here, like a call that waited out its deadline for the connection above.
  // A blocking call is still sent: the server answers it with Timeout at once (or with the
  // value, when the key is there), and the connection is kept.
  if (!blocking && deadline.passed()) {
    throw Timeout(error_context(op), "the deadline had passed before the call to the store at " +
                                         impl.address + " was sent (nothing was sent)");
  }
  if (blocking) {
    // Measured now, not when the call began: the wait for the connection came out of it.
    request.number = timeout_ms(deadline);
  }
  std::vector<std::uint8_t> frame = detail::encode_request(request);
  const std::size_t body_bytes = frame.size() - detail::kFrameHeaderBytes;
  if (body_bytes > impl.frame_bytes_max) {
    throw InvalidArgument(error_context(op), "the request takes " + std::to_string(body_bytes) +
                                                 " bytes, over the store's frame limit of " +
                                                 std::to_string(impl.frame_bytes_max) + " bytes");
  }
  // The server answers a blocking call at its deadline itself (Timeout); the grace only guards
  // against a server that never answers.
  const Deadline answer_deadline = blocking ? with_grace(deadline) : deadline;
  auto describe_keys = [&request] {
    if (request.keys.empty()) {
      return std::string();
    }
    std::string text = " for key '" + request.keys[0] + "'";
    if (request.keys.size() > 1) {
      text += " (and " + std::to_string(request.keys.size() - 1) + " more)";
    }
    return text;
  };
  std::vector<std::uint8_t> body;
  impl.begin_sending(blocking);
  try {
    impl.send_all(frame, deadline);  // no lock held: Note [Client cancel]
    impl.begin_answering();
    body = impl.read_frame(answer_deadline);
  } catch (const DeadlinePassed&) {
    impl.end_call();
    impl.close_socket();  // first: building the messages below may throw
    impl.fail("a " + op + " timed out mid-call");
    throw Timeout(error_context(op), "no answer from the store at " + impl.address +
                                         describe_keys() +
                                         " before the deadline; the connection is closed");
  } catch (const Error& error) {
    impl.end_call();
    impl.close_socket();  // first: building the message below may throw
    const std::string why =
        impl.cancel_write_failed
            ? "the call was cancelled, but the Cancel could not be written to the store at " +
                  impl.address +
                  " (it is not reading, or the connection failed); the connection is closed"
            : error.detail();
    impl.fail(why);
    throw TransportError(error_context(op), why);
  } catch (...) {
    // Anything else (std::bad_alloc for the answer's body, say) also leaves the connection in
    // an unknown state mid-call: end the call (or the next one would find it still in flight)
    // and close the connection for good, then let the exception go on.
    impl.end_call();
    impl.fail_noexcept(op);
    throw;
  }
  impl.end_call();
  if (impl.cancel_write_failed) {
    // The answer came, but a cancel that could not write its Cancel shut the socket down (it
    // raced with the answer): the call succeeded, the connection is over, and the next call
    // says why.
    impl.fail("a cancelled " + op +
              " was answered, but its Cancel could not be written and shut the connection down");
  }
  try {
    return detail::parse_response(request.op, body);
  } catch (const detail::ProtocolError& error) {
    impl.fail(std::string("garbage answer: ") + error.what());
    throw TransportError(error_context(op), "the store at " + impl.address +
                                                " answered with garbage: " + error.what());
  }
}

}  // namespace chorus::store
