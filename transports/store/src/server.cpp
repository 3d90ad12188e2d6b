// Server: one io_context on one thread; every connection is a Session driven by asynchronous
// reads, writes and one timer, so thousands of clients cost no threads.
//
// Note [Store waits]
// A blocking request (get, wait, multi_get) that finds a key missing becomes the session's
// pending wait. It keeps a cursor into its keys: every key before the cursor was present when
// the cursor passed it (and, for multi_get, a pointer to its value in data_ was taken;
// unordered_map nodes never move, only erasing one invalidates it). The wait is registered on
// the key at the cursor only; when that key is written the cursor moves on. So a wait for n keys
// costs O(n) lookups in all, however the writes interleave (the NCCL bootstrap pattern, K
// clients each waiting for K keys, is O(K^2), not O(K^3)). delete_key bumps deletions_; a wait
// that sees it changed restarts its cursor, since a key it passed may be gone. The answer is
// built in the same handler that saw the last key, so it reflects one state of the store.
//
// The bootstrap pattern also sends the same key list K times (every rank gathers every rank's
// key). The server keeps the key list of the last multi_get it answered, with its value
// pointers: a multi_get with an equal list, and no delete_key since, takes those pointers after
// one pass of string comparisons (sequential, a few ns each) instead of K hash lookups. Values
// are read through the pointers when answering, so a set since then is seen; the encoded answer
// is kept too, and reused until the next write or delete. Waiting sessions that ask for the same
// keys share a WaitGroup (one cursor, one encoded answer sent to all): a wait for keys equal to
// the latest group's joins it.
//
// Note [Store memory]
// A frame's header only claims a length: a session grows its body buffer as the bytes arrive,
// kBodyChunkBytes at a time, so a peer that claims frame_bytes_max and sends nothing (or
// little) costs the server one chunk, not the whole frame. And an allocation that fails in a
// handler (std::bad_alloc for a large body, a parsed request or an answer, or anything else a
// handler throws) closes that session only (Session::guarded, and accept_pending's own
// catch): an exception that left a handler would leave io.run() and end the process.
// A wait group is the exception: its members are waiting on other sessions' handlers, so a
// failure that would leave them unanswered (no memory for the group's answer in finish_group, or
// to register the group under its next missing key when a write advances it in notify) must not
// close only the session whose handler ran into it (the writer's, whose request succeeded), or
// the members would learn nothing until their own timeouts. fail_group closes every member still
// waiting instead (closing allocates nothing), so each client gets a prompt TransportError; the
// writer's session and the other groups carry on.

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <charconv>
#include <chorus/check.hpp>
#include <chorus/error.hpp>
#include <chorus/store/store.hpp>
#include <cstdlib>
#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "protocol.hpp"

namespace chorus::store {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using detail::error_context;
using detail::make_request;
using detail::ok_number;
using detail::ok_value;
using detail::Op;
using detail::refusal;
using detail::Request;
using detail::Response;
using detail::Status;

// An encoded frame, shared by every session it is sent to (a wait group's answer).
using Frame = std::shared_ptr<const std::vector<std::uint8_t>>;

// A failed accept (out of descriptors, say) is retried after this pause rather than at once.
constexpr std::chrono::milliseconds kAcceptRetry{20};
// Note [Store memory]: a request body is read, and its buffer grown, this much at a time.
constexpr std::size_t kBodyChunkBytes = std::size_t{64} << 10;

// Note [Store close-on-exec]
// Every socket of the server is close-on-exec from the system call that creates it: a process
// the application forks and execs (a launcher's ranks, a helper) must not inherit the listening
// socket or a connection, or it keeps the port bound and connections open after the server
// closed them. Boost.Asio 1.74 (Asio 1.18) opens sockets with a plain ::socket() and accepts
// with a plain ::accept() (asio/detail/impl/socket_ops.ipp); it passes SOCK_CLOEXEC nowhere, and
// only its own epoll, timerfd and eventfd descriptors are close-on-exec. Setting FD_CLOEXEC with
// fcntl afterwards leaves a window in which another thread's fork+exec (the launcher hosts the
// store in the process that forks the ranks) inherits the socket. So the server opens its
// listening socket with ::socket(..., SOCK_STREAM | SOCK_CLOEXEC, ...) and accepts with
// ::accept4(..., SOCK_CLOEXEC), and hands the descriptors to Asio with assign(). The client opens
// its socket with SOCK_CLOEXEC too (client.cpp).

// Owns a descriptor until it is released to an Asio object, and closes it otherwise.
class OwnedDescriptor {
 public:
  explicit OwnedDescriptor(int fd) noexcept : fd_(fd) {}
  OwnedDescriptor(const OwnedDescriptor&) = delete;
  OwnedDescriptor& operator=(const OwnedDescriptor&) = delete;
  ~OwnedDescriptor() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

boost::system::error_code last_error() {
  return boost::system::error_code(errno, boost::system::system_category());
}

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

// Compares in time independent of where the strings differ (a token must not leak byte by byte).
bool same_secret(std::string_view a, std::string_view b) noexcept {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
    const auto y = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
    difference = static_cast<unsigned char>(difference | (x ^ y));
  }
  return difference == 0;
}

std::string quoted(std::string_view key) {
  constexpr std::size_t kShownBytesMax = 200;
  std::string text = "'";
  text += key.substr(0, kShownBytesMax);
  if (key.size() > kShownBytesMax) {
    text += "...";
  }
  return text + "'";
}

std::optional<std::int64_t> parse_int64(std::string_view text) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || at != end || text.empty()) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

struct Session;

// Note [Store waits]: the sessions waiting for one list of keys.
struct WaitGroup {
  struct Member {
    std::weak_ptr<Session> session;
    std::uint64_t wait_id;
  };

  Op op = Op::Wait;
  std::vector<std::string> keys;
  std::vector<const std::string*> values;  // Get/MultiGet: filled up to the cursor
  std::size_t cursor = 0;
  std::uint64_t deletions_seen = 0;
  std::vector<Member> members;
  std::size_t live = 0;  // members still waiting
  bool done = false;
};

struct Server::Impl {
  explicit Impl(ServerOptions options_in);

  // Waits for a pending connection, then accept_pending().
  void start_accept();
  // Accepts one pending connection (close-on-exec from the start) and starts its session.
  void accept_pending();
  // start_accept() after kAcceptRetry.
  void accept_later();
  void serve(const std::shared_ptr<Session>& session);
  void handle(const std::shared_ptr<Session>& session, Request request);
  void start_wait(const std::shared_ptr<Session>& session, Request request);
  void advance(const std::shared_ptr<WaitGroup>& group);
  // Answers every member still waiting (the group's keys are all present). Throws nothing a
  // handler must catch: Note [Store memory].
  void finish_group(const std::shared_ptr<WaitGroup>& group);
  // Ends a group that cannot be answered: closes every member still waiting, so that each client
  // learns it at once (TransportError) rather than at its timeout. Allocates nothing.
  void fail_group(WaitGroup& wait);
  std::vector<std::uint8_t> answer(Op op, std::span<const std::string* const> values) const;
  // A member's wait ends: answered, timed out, cancelled, or its connection closed.
  void end_wait(Session& s);
  void abandon_wait(const std::shared_ptr<Session>& session, Status status,
                    const std::string& message);
  void notify(const std::string& key);
  // Drops finished groups from every key's list and the keys left without any.
  void sweep_waiters();
  void erase_session(std::uint64_t id);
  // Refusal when creating `new_keys` keys would pass keys_max.
  std::optional<Response> over_key_limit(std::size_t new_keys) const;

  ServerOptions options;
  std::optional<std::string> token;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  tcp protocol = tcp::v4();  // the listening socket's, and so every accepted one's
  asio::steady_timer accept_retry{io};
  std::uint16_t port = 0;
  std::thread thread;
  std::mutex stop_mutex;
  bool stopped = false;
  std::atomic<std::size_t> connections{0};
  std::atomic<std::size_t> waiting{0};

  // Owned by the server thread from here on.
  std::unordered_map<std::string, std::string> data;
  // Each waiting group is registered under the key at its cursor.
  std::unordered_map<std::string, std::vector<std::weak_ptr<WaitGroup>>> waiters;
  // waiters.size() at which the next new key sweeps the whole map (sweep_waiters), and the
  // size published for Server::waited_keys().
  std::size_t waiters_sweep_at = kWaitersSweepMin;
  std::atomic<std::size_t> waited_keys{0};
  static constexpr std::size_t kWaitersSweepMin = 64;
  // The group created last and still waiting: a wait for the same keys joins it.
  std::weak_ptr<WaitGroup> latest_group;
  std::uint64_t deletions = 0;
  // Note [Store waits]: the last multi_get's keys and value pointers, valid while `deletions`
  // equals resolved_deletions.
  std::vector<std::string> resolved_keys;
  std::vector<const std::string*> resolved_values;
  std::uint64_t resolved_deletions = 0;
  // Its encoded answer, valid while `mutations` equals resolved_frame_mutations.
  Frame resolved_frame;
  std::uint64_t resolved_frame_mutations = 0;
  // Counts every write and delete (every call of notify, every delete_key that removed a key).
  std::uint64_t mutations = 0;
  std::unordered_map<std::uint64_t, std::weak_ptr<Session>> sessions;
  std::uint64_t next_session_id = 0;
  std::uint64_t next_wait_id = 0;
};

struct Session : std::enable_shared_from_this<Session> {
  Session(Server::Impl& server_in, tcp::socket socket_in, std::uint64_t id_in)
      : server(server_in), socket(std::move(socket_in)), timer(server_in.io), id(id_in) {}

  // Note [Store memory]: runs a handler's work; what it throws closes this session only.
  template <class Work>
  void guarded(Work work) noexcept {
    try {
      work();
    } catch (const std::exception&) {
      close();  // out of memory, say: lose this connection, keep the server
    }
  }

  void start() {
    auto self = shared_from_this();
    timer.expires_after(server.options.handshake_timeout);
    timer.async_wait([self](const boost::system::error_code& error) {
      if (!error && !self->authenticated) {
        self->close();  // never said hello: a stray or hostile peer
      }
    });
    read();
  }

  void read() {
    CHORUS_CHECK(!reading && !closed);
    reading = true;
    auto self = shared_from_this();
    asio::async_read(socket, asio::buffer(header),
                     [self](const boost::system::error_code& error, std::size_t) {
                       self->guarded([&] { self->on_header(error); });
                     });
  }

  void on_header(const boost::system::error_code& error) {
    if (error || closed) {
      close();
      return;
    }
    const std::uint32_t bytes = detail::read_frame_header(header.data());
    const std::size_t limit =
        authenticated ? server.options.frame_bytes_max : detail::kHelloFrameBytesMax;
    if (bytes == 0 || bytes > limit) {
      close();  // a frame no client sends: garbage, or a peer trying to exhaust memory
      return;
    }
    CHORUS_CHECK(body.empty());
    body_bytes = bytes;
    read_body();
  }

  // Note [Store memory]: the next chunk of the body, into a buffer grown only by that much.
  void read_body() {
    const std::size_t have = body.size();
    CHORUS_CHECK(have < body_bytes);
    const std::size_t chunk = std::min(kBodyChunkBytes, body_bytes - have);
    if (body.capacity() < have + chunk) {
      // Doubling, as resize would, but never past the frame: a 33 MiB body gets 33 MiB, not 64.
      body.reserve(std::min(body_bytes, std::max(2 * body.capacity(), have + chunk)));
    }
    body.resize(have + chunk);
    auto self = shared_from_this();
    asio::async_read(socket, asio::buffer(body.data() + have, chunk),
                     [self](const boost::system::error_code& read_error, std::size_t) {
                       self->guarded([&] { self->on_body_chunk(read_error); });
                     });
  }

  void on_body_chunk(const boost::system::error_code& error) {
    if (error || closed) {
      close();
      return;
    }
    CHORUS_CHECK(body.size() <= body_bytes);
    if (body.size() < body_bytes) {
      read_body();
      return;
    }
    on_body();
  }

  void on_body() {
    reading = false;
    Request request;
    try {
      request = detail::parse_request(body);
    } catch (const detail::ProtocolError&) {
      close();
      return;
    }
    body.clear();
    body.shrink_to_fit();
    // What this throws (out of memory, say) is Session::guarded's to catch: Note [Store memory].
    server.handle(shared_from_this(), std::move(request));
    if (closed) {
      return;
    }
    // The next request is read once the answer is written (a client that does not read its
    // answers stops being read: no unbounded queue), or now when the request awaits keys (the
    // only request it may send meanwhile is Cancel).
    if (!reading && outbox.empty()) {
      read();
    }
  }

  void send(std::vector<std::uint8_t> frame) {
    send(std::make_shared<const std::vector<std::uint8_t>>(std::move(frame)));
  }

  void send(Frame frame) {
    if (closed) {
      return;
    }
    outbox.push_back(std::move(frame));
    if (outbox.size() == 1) {
      write_front();
    }
  }

  void write_front() {
    auto self = shared_from_this();
    asio::async_write(socket, asio::buffer(*outbox.front()),
                      [self](const boost::system::error_code& error, std::size_t) {
                        self->guarded([&] { self->on_written(error); });
                      });
  }

  void on_written(const boost::system::error_code& error) {
    if (error || closed) {
      close();
      return;
    }
    outbox.pop_front();
    if (!outbox.empty()) {
      write_front();
    } else if (close_after_write) {
      close();
    } else if (!reading) {
      read();
    }
  }

  void close() {
    if (closed) {
      return;
    }
    closed = true;
    if (pending.has_value()) {
      server.end_wait(*this);
    }
    boost::system::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    timer.cancel();
    server.erase_session(id);
  }

  // Note [Store waits].
  struct PendingWait {
    std::uint64_t wait_id = 0;
    std::shared_ptr<WaitGroup> group;
    std::chrono::milliseconds timeout{0};
    bool counted = false;  // in Server::waiting()
  };

  Server::Impl& server;
  tcp::socket socket;
  asio::steady_timer timer;  // the handshake deadline, then the pending wait's deadline
  std::uint64_t id;
  std::array<std::uint8_t, detail::kFrameHeaderBytes> header{};
  std::vector<std::uint8_t> body;  // the bytes of the body read so far: Note [Store memory]
  std::size_t body_bytes = 0;      // the length its header claims
  std::deque<Frame> outbox;
  bool authenticated = false;
  bool reading = false;
  bool closed = false;
  bool close_after_write = false;
  std::optional<PendingWait> pending;
};

Server::Impl::Impl(ServerOptions options_in)
    : options(std::move(options_in)), token(token_from(options.token)) {
  if (options.frame_bytes_max < detail::kHelloFrameBytesMax ||
      options.frame_bytes_max > std::numeric_limits<std::uint32_t>::max()) {
    throw InvalidArgument(error_context("store.server"),
                          "frame_bytes_max must lie in [" +
                              std::to_string(detail::kHelloFrameBytesMax) + ", 2^32 - 1], not " +
                              std::to_string(options.frame_bytes_max));
  }
  if (options.keys_max == 0) {
    throw InvalidArgument(error_context("store.server"), "keys_max must be positive");
  }
  // A handshake timeout that has passed before any client can speak refuses every client.
  if (options.handshake_timeout <= std::chrono::milliseconds(0)) {
    throw InvalidArgument(error_context("store.server"),
                          "handshake_timeout must be positive, not " +
                              std::to_string(options.handshake_timeout.count()) + " ms");
  }
  // The timer adds it to now() in nanoseconds: far beyond the store's timeout bound that
  // overflows into the past, and the timer fires at once, refusing every client too.
  if (options.handshake_timeout > std::chrono::milliseconds(detail::kTimeoutMsMax)) {
    throw InvalidArgument(error_context("store.server"),
                          "handshake_timeout must be at most 2^40 ms (about 34 years, the "
                          "store's longest timeout), not " +
                              std::to_string(options.handshake_timeout.count()) + " ms");
  }
  boost::system::error_code error;
  asio::ip::address address = asio::ip::make_address(options.host, error);
  tcp::endpoint endpoint;
  if (!error) {
    endpoint = tcp::endpoint(address, options.port);
  } else {
    tcp::resolver resolver(io);
    auto results = resolver.resolve(options.host, std::to_string(options.port), error);
    if (error || results.empty()) {
      throw TransportError(error_context("store.server"),
                           "cannot resolve host '" + options.host + "': " + error.message());
    }
    endpoint = results.begin()->endpoint();
  }
  // Note [Store close-on-exec].
  protocol = endpoint.protocol();
  OwnedDescriptor listening(
      ::socket(protocol.family(), SOCK_STREAM | SOCK_CLOEXEC, protocol.protocol()));
  if (listening.get() < 0) {
    error = last_error();
  } else {
    acceptor.assign(protocol, listening.get(), error);
    if (!error) {
      listening.release();  // the acceptor's now
    }
  }
  if (!error) {
    // So that an accept4 after a readiness that no connection backs any more (reset meanwhile)
    // fails with EAGAIN instead of blocking the server's thread.
    acceptor.non_blocking(true, error);
  }
  if (!error) {
    acceptor.set_option(tcp::acceptor::reuse_address(true), error);
  }
  if (!error) {
    acceptor.bind(endpoint, error);
  }
  if (!error) {
    acceptor.listen(asio::socket_base::max_listen_connections, error);
  }
  if (error == boost::system::errc::address_in_use) {
    throw AddressInUse(error_context("store.server"), "cannot listen on " + options.host + ":" +
                                                          std::to_string(options.port) + ": " +
                                                          error.message());
  }
  if (error) {
    throw TransportError(error_context("store.server"), "cannot listen on " + options.host + ":" +
                                                            std::to_string(options.port) + ": " +
                                                            error.message());
  }
  port = acceptor.local_endpoint().port();
}

void Server::Impl::start_accept() {
  // Note [Store close-on-exec]: Asio waits until a connection is pending, accept4 takes it.
  acceptor.async_wait(tcp::acceptor::wait_read, [this](const boost::system::error_code& error) {
    if (error == asio::error::operation_aborted || !acceptor.is_open()) {
      return;
    }
    if (error) {
      accept_later();  // the wait itself failed: retry after a pause, not at once
      return;
    }
    accept_pending();
  });
}

void Server::Impl::accept_pending() {
  int fd = -1;
  do {
    fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    switch (errno) {
      case EAGAIN:
#if EWOULDBLOCK != EAGAIN
      case EWOULDBLOCK:
#endif
      case ECONNABORTED:
      case EPROTO:
        // The connection went away between the readiness and the accept: wait for the next.
        start_accept();
        return;
      default:
        // EMFILE and friends: pause instead of spinning; the pending connection stays queued.
        accept_later();
        return;
    }
  }
  OwnedDescriptor accepted(fd);
  try {
    tcp::socket socket(io);
    boost::system::error_code assign_error;
    socket.assign(protocol, accepted.get(), assign_error);
    if (assign_error) {
      start_accept();  // drop the connection (its descriptor closes here) rather than leak it
      return;
    }
    accepted.release();  // the socket's now
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    const std::uint64_t id = next_session_id++;
    auto session = std::make_shared<Session>(*this, std::move(socket), id);
    sessions.emplace(id, session);
    connections.fetch_add(1, std::memory_order_relaxed);
    session->guarded([&] { session->start(); });
  } catch (const std::exception&) {
    // Note [Store memory]: no memory for the session; this connection is lost (its descriptor,
    // socket or session closes as it is destroyed), the server accepts the next.
    accept_later();
    return;
  }
  start_accept();
}

void Server::Impl::accept_later() {
  accept_retry.expires_after(kAcceptRetry);
  accept_retry.async_wait([this](const boost::system::error_code& retry_error) {
    if (!retry_error) {
      start_accept();
    }
  });
}

void Server::Impl::erase_session(std::uint64_t id) {
  if (sessions.erase(id) == 1) {
    connections.fetch_sub(1, std::memory_order_relaxed);
  }
}

std::optional<Response> Server::Impl::over_key_limit(std::size_t new_keys) const {
  if (data.size() + new_keys <= options.keys_max) {
    return std::nullopt;
  }
  return refusal(Status::InvalidArgument, "the store holds " + std::to_string(data.size()) +
                                              " keys; creating " + std::to_string(new_keys) +
                                              " more would pass its limit of " +
                                              std::to_string(options.keys_max) + " keys");
}

void Server::Impl::handle(const std::shared_ptr<Session>& session, Request request) {
  Session& s = *session;
  const Op op = request.op;
  if (!s.authenticated) {
    if (op != Op::Hello) {
      s.close();  // the first request must be the hello
      return;
    }
    Response refused = refusal(Status::Refused, "");
    if (request.number != detail::kVersion) {
      refused.message = "protocol version " + std::to_string(request.number) +
                        " is not supported (the server speaks " + std::to_string(detail::kVersion) +
                        ")";
    } else if (token.has_value() && !same_secret(*token, request.values[0])) {
      refused.message = request.values[0].empty()
                            ? "the store requires a token (CHORUS_STORE_TOKEN) and none was given"
                            : "wrong token (CHORUS_STORE_TOKEN)";
    } else {
      s.authenticated = true;
      s.timer.cancel();
      s.send(detail::encode_response(
          op, ok_number(static_cast<std::int64_t>(options.frame_bytes_max))));
      return;
    }
    s.close_after_write = true;
    s.send(detail::encode_response(op, refused));
    return;
  }
  if (s.pending.has_value()) {
    if (op == Op::Cancel) {
      const WaitGroup& group = *s.pending->group;
      CHORUS_CHECK(group.cursor < group.keys.size());
      abandon_wait(session, Status::Cancelled,
                   "cancelled while waiting for key " + quoted(group.keys[group.cursor]));
    } else {
      s.close();  // a second request while one is pending breaks the protocol
    }
    return;
  }
  switch (op) {
    case Op::Hello:
      s.close();  // a second hello breaks the protocol
      return;
    case Op::Cancel:
      return;  // the wait it meant has completed already; nothing to answer
    case Op::Set: {
      std::string& key = request.keys[0];
      auto found = data.find(key);
      if (found == data.end()) {
        if (auto over = over_key_limit(1)) {
          s.send(detail::encode_response(op, *over));
          return;
        }
        data.emplace(key, std::move(request.values[0]));
      } else {
        found->second = std::move(request.values[0]);
      }
      s.send(detail::encode_response(op, Response{}));
      notify(key);
      return;
    }
    case Op::Add: {
      const std::string& key = request.keys[0];
      auto found = data.find(key);
      std::int64_t value = 0;
      if (found != data.end()) {
        const std::optional<std::int64_t> stored = parse_int64(found->second);
        if (!stored.has_value()) {
          s.send(detail::encode_response(
              op, refusal(Status::InvalidArgument, "key " + quoted(key) + " holds " +
                                                       std::to_string(found->second.size()) +
                                                       " bytes that are not a decimal integer")));
          return;
        }
        value = *stored;
      } else if (auto over = over_key_limit(1)) {
        s.send(detail::encode_response(op, *over));
        return;
      }
      if (__builtin_add_overflow(value, request.number, &value)) {
        s.send(detail::encode_response(
            op,
            refusal(Status::InvalidArgument, "adding " + std::to_string(request.number) +
                                                 " to key " + quoted(key) + " overflows int64")));
        return;
      }
      data[key] = std::to_string(value);
      s.send(detail::encode_response(op, ok_number(value)));
      notify(key);
      return;
    }
    case Op::CompareSet: {
      const std::string& key = request.keys[0];
      const std::string& expected = request.values[0];
      auto found = data.find(key);
      Response response;
      bool changed = false;
      if (found == data.end()) {
        if (expected.empty()) {
          if (auto over = over_key_limit(1)) {
            s.send(detail::encode_response(op, *over));
            return;
          }
          data.emplace(key, request.values[1]);
          response.values.push_back(std::move(request.values[1]));
          changed = true;
        }
      } else {
        if (found->second == expected) {
          found->second = request.values[1];
          changed = true;
        }
        response.values.push_back(found->second);
      }
      s.send(detail::encode_response(op, response));
      if (changed) {
        notify(key);
      }
      return;
    }
    case Op::DeleteKey: {
      const bool existed = data.erase(request.keys[0]) == 1;
      if (existed) {
        ++deletions;
        ++mutations;
      }
      s.send(detail::encode_response(op, ok_number(existed ? 1 : 0)));
      return;
    }
    case Op::NumKeys:
      s.send(detail::encode_response(op, ok_number(static_cast<std::int64_t>(data.size()))));
      return;
    case Op::MultiSet: {
      std::unordered_set<std::string_view> created;
      for (const std::string& key : request.keys) {
        if (!data.contains(key)) {
          created.insert(key);
        }
      }
      if (auto over = over_key_limit(created.size())) {
        s.send(detail::encode_response(op, *over));
        return;
      }
      for (std::size_t i = 0; i < request.keys.size(); ++i) {
        data[request.keys[i]] = std::move(request.values[i]);
      }
      s.send(detail::encode_response(op, Response{}));
      for (const std::string& key : request.keys) {
        notify(key);
      }
      return;
    }
    case Op::Get:
    case Op::Wait:
    case Op::MultiGet:
      start_wait(session, std::move(request));
      return;
  }
}

void Server::Impl::start_wait(const std::shared_ptr<Session>& session, Request request) {
  Session& s = *session;
  CHORUS_CHECK(!s.pending.has_value());
  CHORUS_CHECK(request.number >= 0);
  const Op op = request.op;
  // The last multi_get answered asked for these very keys, and nothing was deleted since.
  if (op == Op::MultiGet && resolved_deletions == deletions && !resolved_keys.empty() &&
      request.keys == resolved_keys) {
    if (!resolved_frame || resolved_frame_mutations != mutations) {
      resolved_frame =
          std::make_shared<const std::vector<std::uint8_t>>(answer(op, resolved_values));
      resolved_frame_mutations = mutations;
    }
    s.send(resolved_frame);
    return;
  }
  // A group already waits for these very keys: join it.
  std::shared_ptr<WaitGroup> group = latest_group.lock();
  const bool join = group && !group->done && group->op == op && group->keys == request.keys;
  if (!join) {
    group = std::make_shared<WaitGroup>();
    group->op = op;
    group->keys = std::move(request.keys);
    if (op != Op::Wait) {
      group->values.assign(group->keys.size(), nullptr);
    }
    group->deletions_seen = deletions;
  }
  const std::uint64_t wait_id = next_wait_id++;
  group->members.push_back(WaitGroup::Member{session, wait_id});
  ++group->live;
  Session::PendingWait wait;
  wait.wait_id = wait_id;
  wait.group = group;
  wait.timeout = std::chrono::milliseconds(request.number);
  s.pending = std::move(wait);
  if (!join) {
    advance(group);
    if (!group->done) {
      latest_group = group;
    }
  }
  if (!s.pending.has_value() || s.closed) {
    return;  // answered at once
  }
  s.pending->counted = true;
  waiting.fetch_add(1, std::memory_order_relaxed);
  s.timer.expires_after(s.pending->timeout);
  s.timer.async_wait([this, session, wait_id](const boost::system::error_code& error) {
    Session& late = *session;
    if (error || !late.pending.has_value() || late.pending->wait_id != wait_id) {
      return;
    }
    late.guarded([&] {
      const WaitGroup& timed_out = *late.pending->group;
      CHORUS_CHECK(timed_out.cursor < timed_out.keys.size());
      std::string message = "key " + quoted(timed_out.keys[timed_out.cursor]) +
                            " was not set within " + std::to_string(late.pending->timeout.count()) +
                            " ms";
      if (timed_out.keys.size() > 1) {
        message += " (" + std::to_string(timed_out.cursor) + " of " +
                   std::to_string(timed_out.keys.size()) + " keys were)";
      }
      abandon_wait(session, Status::Timeout, message);
    });
  });
}

namespace {

// Whether a registered waiter's group ended (answered, or every member left): a list entry to
// drop.
bool finished(const std::weak_ptr<WaitGroup>& waiter) {
  const auto group = waiter.lock();
  return !group || group->done;
}

}  // namespace

// Note [Store waits].
void Server::Impl::advance(const std::shared_ptr<WaitGroup>& group) {
  WaitGroup& wait = *group;
  CHORUS_CHECK(!wait.done);
  if (wait.live == 0) {
    wait.done = true;  // every member timed out, cancelled or left: nobody to answer
    return;
  }
  if (wait.deletions_seen != deletions) {
    wait.deletions_seen = deletions;
    wait.cursor = 0;  // a key the cursor passed may be gone (and its value pointer with it)
  }
  while (wait.cursor < wait.keys.size()) {
    const std::string& key = wait.keys[wait.cursor];
    auto found = data.find(key);
    if (found == data.end()) {
      if (waiters.size() >= waiters_sweep_at && !waiters.contains(key)) {
        sweep_waiters();
      }
      std::vector<std::weak_ptr<WaitGroup>>& list = waiters[key];
      waited_keys.store(waiters.size(), std::memory_order_relaxed);
      // Drop entries of groups that ended before the key appeared, so a key that is never set
      // cannot collect garbage without bound.
      if (list.size() >= 16 && (list.size() & (list.size() - 1)) == 0) {
        std::erase_if(list, finished);
      }
      list.push_back(group);
      return;
    }
    if (!wait.values.empty()) {
      wait.values[wait.cursor] = &found->second;
    }
    ++wait.cursor;
  }
  finish_group(group);
}

std::vector<std::uint8_t> Server::Impl::answer(Op op,
                                               std::span<const std::string* const> values) const {
  switch (op) {
    case Op::Wait:
      return detail::encode_response(op, Response{});
    case Op::Get:
      CHORUS_CHECK(values.size() == 1 && values[0] != nullptr);
      return detail::encode_response(op, ok_value(*values[0]));
    case Op::MultiGet: {
      const std::size_t bytes = detail::multi_get_values_bytes(values);
      if (bytes > options.frame_bytes_max) {
        return detail::encode_response(
            op, refusal(Status::InvalidArgument,
                        "the values of " + std::to_string(values.size()) + " keys take " +
                            std::to_string(bytes) + " bytes, over the frame limit of " +
                            std::to_string(options.frame_bytes_max) + " bytes"));
      }
      return detail::encode_multi_get_values(values);
    }
    default:
      CHORUS_CHECK(false);
  }
  return {};
}

// Every member still waiting gets the same answer, encoded once. Note [Store memory]: if there
// is no memory for that answer, every member is closed instead (fail_group), and one member's
// failure to queue the answer closes that member only.
void Server::Impl::finish_group(const std::shared_ptr<WaitGroup>& group) {
  WaitGroup& wait = *group;
  CHORUS_CHECK(!wait.done);
  CHORUS_CHECK_EQ(wait.cursor, wait.keys.size());
  CHORUS_CHECK_EQ(wait.deletions_seen, deletions);
  Frame frame;
  try {
    frame = std::make_shared<const std::vector<std::uint8_t>>(answer(wait.op, wait.values));
  } catch (const std::exception&) {
    fail_group(wait);
    return;
  }
  wait.done = true;
  for (const WaitGroup::Member& member : wait.members) {
    const std::shared_ptr<Session> session = member.session.lock();
    if (session && session->pending.has_value() && session->pending->wait_id == member.wait_id) {
      end_wait(*session);
      session->guarded([&] { session->send(frame); });
    }
  }
  CHORUS_CHECK_EQ(wait.live, std::size_t{0});
  if (wait.op == Op::MultiGet) {
    resolved_keys = std::move(wait.keys);
    resolved_values = std::move(wait.values);
    resolved_deletions = deletions;
    resolved_frame = frame;
    resolved_frame_mutations = mutations;
  }
}

void Server::Impl::fail_group(WaitGroup& wait) {
  CHORUS_CHECK(!wait.done);
  wait.done = true;
  for (const WaitGroup::Member& member : wait.members) {
    const std::shared_ptr<Session> session = member.session.lock();
    if (session && session->pending.has_value() && session->pending->wait_id == member.wait_id) {
      session->close();  // ends its wait (end_wait) and allocates nothing
    }
  }
  CHORUS_CHECK_EQ(wait.live, std::size_t{0});
}

void Server::Impl::end_wait(Session& s) {
  CHORUS_CHECK(s.pending.has_value());
  WaitGroup& group = *s.pending->group;
  CHORUS_CHECK(group.live > 0);
  --group.live;
  if (s.pending->counted) {
    waiting.fetch_sub(1, std::memory_order_relaxed);
  }
  s.pending.reset();
  s.timer.cancel();
}

void Server::Impl::abandon_wait(const std::shared_ptr<Session>& session, Status status,
                                const std::string& message) {
  CHORUS_CHECK(status != Status::Ok);
  end_wait(*session);
  session->send(detail::encode_response(Op::Wait, refusal(status, message)));
}

void Server::Impl::sweep_waiters() {
  // A key nobody sets keeps its list until a sweep: the per-key trim in advance() bounds each
  // list, this bounds the number of lists (a client waiting on ever new keys that time out).
  for (auto entry = waiters.begin(); entry != waiters.end();) {
    std::erase_if(entry->second, finished);
    entry = entry->second.empty() ? waiters.erase(entry) : std::next(entry);
  }
  waiters_sweep_at = std::max(kWaitersSweepMin, 2 * waiters.size());
  waited_keys.store(waiters.size(), std::memory_order_relaxed);
}

void Server::Impl::notify(const std::string& key) {
  ++mutations;
  auto found = waiters.find(key);
  if (found == waiters.end()) {
    return;
  }
  const std::vector<std::weak_ptr<WaitGroup>> list = std::move(found->second);
  waiters.erase(found);
  waited_keys.store(waiters.size(), std::memory_order_relaxed);
  for (const std::weak_ptr<WaitGroup>& entry : list) {
    const std::shared_ptr<WaitGroup> group = entry.lock();
    if (group && !group->done) {
      // Note [Store memory]: the list was taken out of `waiters`, so a group whose advance fails
      // (no memory to register it under its next missing key) is registered nowhere: it is
      // failed here, and the groups after it still advance. The failure is not the writer's:
      // its session stays open.
      try {
        advance(group);
      } catch (const std::exception&) {
        fail_group(*group);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  Impl& impl = *impl_;
  impl.start_accept();
  impl.thread = std::thread([&impl] { impl.io.run(); });
}

Server::~Server() { stop(); }

const std::string& Server::host() const noexcept { return impl_->options.host; }

std::uint16_t Server::port() const noexcept { return impl_->port; }

std::size_t Server::connections() const noexcept {
  return impl_->connections.load(std::memory_order_relaxed);
}

std::size_t Server::waiting() const noexcept {
  return impl_->waiting.load(std::memory_order_relaxed);
}

std::size_t Server::waited_keys() const noexcept {
  return impl_->waited_keys.load(std::memory_order_relaxed);
}

void Server::stop() {
  Impl& impl = *impl_;
  const std::lock_guard lock(impl.stop_mutex);
  if (impl.stopped) {
    return;
  }
  impl.stopped = true;
  asio::post(impl.io, [&impl] {
    boost::system::error_code ignored;
    impl.acceptor.close(ignored);
    impl.accept_retry.cancel();
    // Closing every socket now (not when the io_context is destroyed) is what tells blocked
    // clients at once that the server is gone.
    std::vector<std::shared_ptr<Session>> open;
    for (auto& [id, weak] : impl.sessions) {
      if (auto session = weak.lock()) {
        open.push_back(std::move(session));
      }
    }
    for (const auto& session : open) {
      session->close();
    }
    impl.io.stop();
  });
  impl.thread.join();
}

}  // namespace chorus::store
