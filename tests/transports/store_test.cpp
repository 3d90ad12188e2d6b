// The TCP rendezvous store (transports/store, docs/store.md): every call, blocking and
// cancellation, limits, the token, garbage on the wire, and a server that dies under its clients.
// Everything runs on loopback in this process; nothing sleeps to synchronise (a test that must
// know a client is blocked polls Server::waiting() under a deadline).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chorus/error.hpp>
#include <chorus/store/store.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "protocol.hpp"  // transports/store/src: the wire format, for bodies no peer here sends
#include "resolver.hpp"  // transports/store/src: the client's resolver seam
#include "support/address_space.hpp"
#include "support/expect_error.hpp"
#include "support/scoped_environment.hpp"

// The public header keeps Boost private (pimpl): nothing above may have pulled it in.
#if defined(BOOST_ASIO_VERSION) || defined(BOOST_CONFIG_HPP) || defined(BOOST_VERSION)
#error "<chorus/store/store.hpp> must not reach a Boost header"
#endif

namespace chorus::store {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// Far longer than anything here should take: a deadline that only a hang reaches.
constexpr seconds kHang{60};
// A bound on "promptly" (a server's death, a handshake refusal): generous for loaded CI
// machines, and still far below kHang.
constexpr seconds kPrompt{10};

ClientOptions options_for(const Server& server, std::optional<std::string> token = std::nullopt) {
  ClientOptions options;
  options.port = server.port();
  options.token = std::move(token);
  return options;
}

std::unique_ptr<Client> connect(const Server& server,
                                std::optional<std::string> token = std::nullopt) {
  return std::make_unique<Client>(options_for(server, std::move(token)), kHang);
}

// Polls (no sleep) until `condition` holds; fails the test at kHang.
template <class Condition>
void eventually(Condition condition, const char* what) {
  const Deadline deadline(kHang);
  while (!condition()) {
    ASSERT_FALSE(deadline.passed()) << "never happened: " << what;
    std::this_thread::yield();
  }
}

// A raw TCP connection to the server, for speaking garbage.
class RawSocket {
 public:
  explicit RawSocket(std::uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    EXPECT_GE(fd_, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  }
  ~RawSocket() { ::close(fd_); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  int fd() const { return fd_; }

  void send(std::string_view bytes) const {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // True when the server closed the connection before the deadline (all data read is dropped).
  bool closed_by_peer(Deadline deadline) const {
    char buffer[256];
    while (!deadline.passed()) {
      pollfd entry{fd_, POLLIN, 0};
      if (::poll(&entry, 1, static_cast<int>(deadline.remaining().count())) <= 0) {
        continue;
      }
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) {
        return true;
      }
    }
    return false;
  }

 private:
  int fd_;
};

std::string frame(std::string_view body) {
  std::string out(4, '\0');
  const auto n = static_cast<std::uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) {
    out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  }
  return out + std::string(body);
}

// A valid hello (version 1, no token), as docs/store.md spells it.
std::string hello_frame() {
  std::string body;
  body += '\x01';                              // Op::Hello
  body += std::string("CHST", 4);              // magic
  body += std::string("\x01\x00", 2);          // version 1
  body += std::string("\x00\x00\x00\x00", 4);  // empty token
  return frame(body);
}

// Reads exactly `bytes` from `fd`; false when the peer closed (or the read failed) first.
bool read_exactly(int fd, char* out, std::size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, out, bytes, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) {
        continue;
      }
      return false;
    }
    out += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

// A frame's body length from its 4-byte little-endian header.
std::size_t frame_length(const char* header) {
  std::size_t length = 0;
  for (int i = 3; i >= 0; --i) {
    length = (length << 8) | static_cast<unsigned char>(header[i]);
  }
  return length;
}

// A listener on loopback that accepts one connection, runs `serve` on it and closes it.
// `receive_buffer_bytes` (0: the system's) is inherited by the accepted connection.
class OneConnectionServer {
 public:
  OneConnectionServer(std::function<void(int connection)> serve, int receive_buffer_bytes = 0)
      : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    EXPECT_GE(fd_, 0);
    if (receive_buffer_bytes > 0) {
      EXPECT_EQ(::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer_bytes,
                             sizeof receive_buffer_bytes),
                0);
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(fd_, 1), 0);
    socklen_t length = sizeof address;
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length), 0);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this, serve = std::move(serve)] {
      const int connection = ::accept(fd_, nullptr, nullptr);
      if (connection < 0) {
        return;  // shut down before anybody connected
      }
      serve(connection);
      ::close(connection);
    });
  }
  ~OneConnectionServer() {
    ::shutdown(fd_, SHUT_RDWR);  // wakes an accept() still waiting
    thread_.join();
    ::close(fd_);
  }
  OneConnectionServer(const OneConnectionServer&) = delete;
  OneConnectionServer& operator=(const OneConnectionServer&) = delete;

  std::uint16_t port() const { return port_; }

 private:
  int fd_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

// A store spoken by hand, for what a real Server does not do on demand (stop reading in the
// middle of a request, answer out of bounds): it accepts one connection, reads its hello and
// answers it (with a frame limit of `frame_limit`, 1 GiB unless told), runs `script` on the
// connection, then closes it. Its receive buffer is small, so a large request fills the socket
// buffers at once and the client's write blocks while the script does not read.
class ScriptedStore : public OneConnectionServer {
 public:
  explicit ScriptedStore(std::function<void(int connection)> script,
                         std::uint64_t frame_limit = std::uint64_t{1} << 30)
      : OneConnectionServer(
            [script = std::move(script), frame_limit](int connection) {
              char header[4];
              std::string hello;
              if (!read_exactly(connection, header, sizeof header)) {
                return;
              }
              hello.resize(frame_length(header));
              if (!read_exactly(connection, hello.data(), hello.size())) {
                return;
              }
              std::string answer(1, '\0');   // Ok
              for (int i = 0; i < 8; ++i) {  // u64 frame limit
                answer += static_cast<char>((frame_limit >> (8 * i)) & 0xff);
              }
              const std::string reply = frame(answer);
              ::send(connection, reply.data(), reply.size(), MSG_NOSIGNAL);
              script(connection);
            },
            /*receive_buffer_bytes=*/64 << 10) {}
};

// Far more than the socket buffers between a client and a ScriptedStore hold.
constexpr std::size_t kLargeRequestBytes = std::size_t{64} << 20;

// The client's end of its connection to `port` on loopback, found among this process's
// descriptors (-1 when there is none): for a test that writes on it behind the client's back.
int client_socket_to(std::uint16_t port) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_in peer{};
    socklen_t length = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) == 0 &&
        peer.sin_family == AF_INET && ntohs(peer.sin_port) == port) {
      return fd;
    }
  }
  return -1;
}

// Writes junk on `fd` (non-blocking) until its send buffer, and the peer's receive buffer, are
// full: what a peer that stopped reading under a flood of frames leaves. Down to single bytes (a
// small write can still fit in the last segment after a large one is refused), and again after
// pauses until two in a row let nothing more in (acknowledgements free the send buffer, and the
// peer may shrink its receive queue, for a while after the first refusal).
void fill_send_buffer(int fd) {
  const std::string junk(64 << 10, 'j');
  int quiet_pauses = 0;
  for (int round = 0; round < 100 && quiet_pauses < 2; ++round) {
    bool wrote = false;
    for (std::size_t bytes = junk.size(); bytes > 0; bytes /= 16) {
      while (::send(fd, junk.data(), bytes, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
        wrote = true;
      }
    }
    quiet_pauses = wrote ? 0 : quiet_pauses + 1;
    std::this_thread::sleep_for(milliseconds(50));
  }
}

// The host name the tests look up through stand-in resolvers, which answer it with 127.0.0.1
// (where the tests' servers listen): no test asks the real name server. A name, not an address,
// so that the client looks it up through the resolver (Note [Store host lookup]).
constexpr const char* kStandInHostName = "store.test";

// Waits (up to kHang) until every host lookup's helper thread has finished: an answer that came
// after its client's deadline has then been freed, or leaked, which ASan's leak check sees.
void wait_for_lookups() {
  eventually([] { return detail::lookups_running() == 0; }, "the lookups' threads finish");
}

// Puts a stand-in resolver in the client's place for its lifetime (resolver.hpp): the stand-in
// fails with `error` (by default EAI_AGAIN, a temporary failure: the name server did not answer)
// the first `failures` times it is called, then answers with 127.0.0.1's address (from
// ::getaddrinfo, whatever name it was asked). A negative count fails every time.
class ScopedFlakyResolver {
 public:
  explicit ScopedFlakyResolver(int failures, int error = EAI_AGAIN) {
    failures_left_ = failures;
    error_ = error;
    calls_ = 0;
    previous_ = detail::exchange_resolver(&resolve);
  }
  // Waits for the lookups first: one its client left at the deadline would otherwise call the
  // stand-in (and count in calls()) during the next test of the same process.
  ~ScopedFlakyResolver() {
    wait_for_lookups();
    detail::exchange_resolver(previous_);
  }
  ScopedFlakyResolver(const ScopedFlakyResolver&) = delete;
  ScopedFlakyResolver& operator=(const ScopedFlakyResolver&) = delete;

  static int calls() { return calls_.load(); }

 private:
  static int resolve(const char* host, const char* service, const addrinfo* hints,
                     addrinfo** found) {
    calls_.fetch_add(1);
    if (failures_left_.load() != 0) {
      failures_left_.fetch_sub(1);
      return error_.load();
    }
    static_cast<void>(host);
    return ::getaddrinfo("127.0.0.1", service, hints, found);
  }

  // Static: a resolver is a plain function pointer. One ScopedFlakyResolver at a time.
  static inline std::atomic<int> failures_left_{0};
  static inline std::atomic<int> calls_{0};
  static inline std::atomic<int> error_{EAI_AGAIN};
  detail::Resolver previous_ = nullptr;
};

// Puts a stand-in resolver in the client's place for its lifetime (resolver.hpp) that blocks,
// like a name server that does not answer, until the test opens its gate; then it answers with
// 127.0.0.1's address (from ::getaddrinfo, so that ::freeaddrinfo can free it). It records how
// often it was called and answered, and on which thread. Its destructor opens the gate and waits
// for the lookups to finish, so that none outlives the test, whatever it asserted. A stand-in
// that waits for its gate longer than kHang answers anyway: a client that ignores its deadline
// (and so blocks in the stand-in on the test's thread) fails the test instead of hanging it.
class ScopedGatedResolver {
 public:
  ScopedGatedResolver() {
    {
      const std::lock_guard lock(mutex_);
      open_ = false;
      calls_ = 0;
      answers_ = 0;
      caller_ = std::thread::id();
    }
    previous_ = detail::exchange_resolver(&resolve);
  }
  ~ScopedGatedResolver() {
    open();
    wait_for_lookups();
    detail::exchange_resolver(previous_);
  }
  ScopedGatedResolver(const ScopedGatedResolver&) = delete;
  ScopedGatedResolver& operator=(const ScopedGatedResolver&) = delete;

  // Lets every call, waiting or to come, answer.
  static void open() {
    {
      const std::lock_guard lock(mutex_);
      open_ = true;
    }
    gate_cv_.notify_all();
  }
  static int calls() {
    const std::lock_guard lock(mutex_);
    return calls_;
  }
  static int answers() {
    const std::lock_guard lock(mutex_);
    return answers_;
  }
  // The thread of the last call (a default id: none yet).
  static std::thread::id caller() {
    const std::lock_guard lock(mutex_);
    return caller_;
  }

 private:
  static int resolve(const char* host, const char* service, const addrinfo* hints,
                     addrinfo** found) {
    static_cast<void>(host);
    {
      std::unique_lock lock(mutex_);
      ++calls_;
      caller_ = std::this_thread::get_id();
      gate_cv_.wait_for(lock, kHang, [] { return open_; });
    }
    const int code = ::getaddrinfo("127.0.0.1", service, hints, found);
    const std::lock_guard lock(mutex_);
    ++answers_;
    return code;
  }

  // Static: a resolver is a plain function pointer. One ScopedGatedResolver at a time.
  static inline std::mutex mutex_;
  static inline std::condition_variable gate_cv_;
  static inline bool open_ = false;  // the fields are guarded by mutex_
  static inline int calls_ = 0;
  static inline int answers_ = 0;
  static inline std::thread::id caller_;
  detail::Resolver previous_ = nullptr;
};

// A listener on loopback that is not a chorus store: to its connection it sends `greeting`,
// then holds it open until the peer closes it (so that the client sees only the greeting).
class ForeignServer : public OneConnectionServer {
 public:
  explicit ForeignServer(std::string greeting)
      : OneConnectionServer([greeting = std::move(greeting)](int connection) {
          ::send(connection, greeting.data(), greeting.size(), MSG_NOSIGNAL);
          char buffer[256];
          while (::recv(connection, buffer, sizeof buffer, 0) > 0) {
          }
        }) {}
};

TEST(Store, SetGetOverwriteAndBinaryValues) {
  Server server;
  auto client = connect(server);
  client->set("a", "1");
  EXPECT_EQ(client->get("a"), "1");
  client->set("a", "2");
  EXPECT_EQ(client->get("a"), "2");
  const std::string binary("\0\xff\x01zero", 7);
  client->set(std::string("k\0ey", 4), binary);
  EXPECT_EQ(client->get(std::string("k\0ey", 4)), binary);
  client->set("empty", "");
  EXPECT_EQ(client->get("empty"), "");
  EXPECT_GT(server.port(), 0);
  EXPECT_EQ(server.host(), "127.0.0.1");
}

TEST(Store, AddIsAtomicAcrossClients) {
  Server server;
  constexpr int kClients = 8;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&server] {
      auto client = connect(server);
      for (int i = 0; i < kAdds; ++i) {
        client->add("counter", 1);
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  auto client = connect(server);
  EXPECT_EQ(client->add("counter", 0), kClients * kAdds);
  EXPECT_EQ(client->get("counter"), std::to_string(kClients * kAdds));
  EXPECT_EQ(client->add("fresh", -5), -5);
  EXPECT_EQ(client->add("fresh", 7), 2);
}

TEST(Store, AddOnTextOrOverflowIsInvalidArgumentAndTheClientStaysUsable) {
  Server server;
  auto client = connect(server);
  client->set("text", "hello");
  EXPECT_THROW(client->add("text", 1), InvalidArgument);
  client->set("big", std::to_string(std::numeric_limits<std::int64_t>::max()));
  EXPECT_THROW(client->add("big", 1), InvalidArgument);
  EXPECT_EQ(client->get("text"), "hello");
}

TEST(Store, CompareSetSemantics) {
  Server server;
  auto client = connect(server);
  // Absent and a non-empty expected value: nothing happens.
  EXPECT_EQ(client->compare_set("k", "x", "y"), std::nullopt);
  EXPECT_EQ(client->num_keys(), 0);
  // Absent and an empty expected value: created.
  EXPECT_EQ(client->compare_set("k", "", "first"), "first");
  // Present and matching: swapped.
  EXPECT_EQ(client->compare_set("k", "first", "second"), "second");
  // Present and not matching: the current value comes back, unchanged.
  EXPECT_EQ(client->compare_set("k", "first", "third"), "second");
  EXPECT_EQ(client->get("k"), "second");
}

TEST(Store, DeleteKeyAndNumKeys) {
  Server server;
  auto client = connect(server);
  EXPECT_EQ(client->num_keys(), 0);
  client->set("a", "1");
  client->set("b", "2");
  EXPECT_EQ(client->num_keys(), 2);
  EXPECT_TRUE(client->delete_key("a"));
  EXPECT_FALSE(client->delete_key("a"));
  EXPECT_EQ(client->num_keys(), 1);
  EXPECT_THROW(client->get("a", milliseconds(20)), Timeout);
}

TEST(Store, MultiSetAndMultiGetKeepOrder) {
  Server server;
  auto client = connect(server);
  client->multi_set({{"x", "1"}, {"y", "2"}, {"z", "3"}});
  EXPECT_EQ(client->multi_get({"z", "x", "y", "x"}),
            (std::vector<std::string>{"3", "1", "2", "1"}));
  EXPECT_EQ(client->multi_get({}), std::vector<std::string>{});
  client->wait({"x", "y", "z"}, milliseconds(100));
}

TEST(Store, BlockingGetIsReleasedBySetFromAnotherClient) {
  Server server;
  auto getter = connect(server);
  std::string seen;
  std::thread blocked([&] { seen = getter->get("late", kHang); });
  eventually([&] { return server.waiting() == 1; }, "the get waits on the server");
  connect(server)->set("late", "value");
  blocked.join();
  EXPECT_EQ(seen, "value");
  EXPECT_EQ(server.waiting(), 0U);
}

TEST(Store, MultiGetAndWaitAreReleasedKeyByKey) {
  Server server;
  auto waiter = connect(server);
  std::vector<std::string> seen;
  std::thread blocked([&] { seen = waiter->multi_get({"a", "b", "c"}, kHang); });
  eventually([&] { return server.waiting() == 1; }, "the multi_get waits");
  auto writer = connect(server);
  writer->set("c", "3");
  writer->set("a", "1");
  EXPECT_EQ(server.waiting(), 1U);
  // A deleted key the wait already passed must be waited for again.
  writer->delete_key("a");
  writer->set("b", "2");
  EXPECT_EQ(server.waiting(), 1U);
  writer->set("a", "one");
  blocked.join();
  EXPECT_EQ(seen, (std::vector<std::string>{"one", "2", "3"}));
}

// Waiters for the same keys are answered together only when they asked the same: a wait and a
// multi_get blocked on the same keys each get their own answer, whichever came first.
TEST(Store, AWaitAndAMultiGetForTheSameKeysEachGetTheirOwnAnswer) {
  Server server;
  auto getter = connect(server);
  auto waiter = connect(server);
  auto writer = connect(server);
  for (const bool multi_get_first : {true, false}) {
    const std::vector<std::string> keys =
        multi_get_first ? std::vector<std::string>{"a", "b"} : std::vector<std::string>{"c", "d"};
    std::vector<std::string> values;
    const auto get = [&] { EXPECT_NO_THROW(values = getter->multi_get(keys, kHang)); };
    const auto wait = [&] { EXPECT_NO_THROW(waiter->wait(keys, kHang)); };
    std::thread first(multi_get_first ? std::function<void()>(get) : wait);
    eventually([&] { return server.waiting() == 1; }, "the first waits");
    std::thread second(multi_get_first ? std::function<void()>(wait) : get);
    eventually([&] { return server.waiting() == 2; }, "the second waits");
    writer->set(keys[0], "1");
    writer->set(keys[1], "2");
    first.join();
    second.join();
    EXPECT_EQ(values, (std::vector<std::string>{"1", "2"})) << multi_get_first;
  }
}

TEST(Store, RepeatedMultiGetSeesLatestValuesAndDeletions) {
  Server server;
  auto client = connect(server);
  client->multi_set({{"a", "1"}, {"b", "2"}});
  EXPECT_EQ(client->multi_get({"a", "b"}), (std::vector<std::string>{"1", "2"}));
  client->set("a", "one");  // the same key list again: the server's shortcut must see this
  EXPECT_EQ(client->multi_get({"a", "b"}), (std::vector<std::string>{"one", "2"}));
  EXPECT_EQ(client->multi_get({"b", "a"}), (std::vector<std::string>{"2", "one"}));
  EXPECT_EQ(client->multi_get({"a", "b"}), (std::vector<std::string>{"one", "2"}));
  client->delete_key("b");
  EXPECT_THROW(client->multi_get({"a", "b"}, milliseconds(20)), Timeout);
  client->set("b", "two");
  EXPECT_EQ(client->multi_get({"a", "b"}), (std::vector<std::string>{"one", "two"}));
}

TEST(Store, WaitersForTheSameKeysAreAnsweredTogetherWhenOneLeaves) {
  Server server;
  constexpr int kWaiters = 3;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::vector<std::string>> seen(kWaiters);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWaiters; ++w) {
    clients.push_back(connect(server));
  }
  for (int w = 0; w < kWaiters; ++w) {
    threads.emplace_back([&, w] {
      seen[static_cast<std::size_t>(w)] =
          clients[static_cast<std::size_t>(w)]->multi_get({"a", "b"}, kHang);
    });
  }
  eventually([&] { return server.waiting() == kWaiters; }, "three multi_gets wait");
  // A fourth wait for the same keys times out, a fifth is cancelled, a sixth's connection
  // closes: the others keep waiting.
  auto impatient = connect(server);
  EXPECT_THROW(impatient->multi_get({"a", "b"}, milliseconds(20)), Timeout);
  auto cancelled = connect(server);
  std::thread cancelling([&] { EXPECT_THROW(cancelled->wait({"a", "b"}, kHang), Aborted); });
  eventually([&] { return server.waiting() == kWaiters + 1; }, "the wait waits");
  cancelled->cancel();
  cancelling.join();
  {
    RawSocket leaving(server.port());
    leaving.send(hello_frame());
    std::string body("\x09", 1);                        // multi_get
    body += std::string("\x10\x27\0\0\0\0\0\0", 8);     // 10000 ms
    body += std::string("\x02\0\0\0", 4);               // two keys
    body += std::string("\x01\0\0\0a\x01\0\0\0b", 10);  // "a", "b"
    leaving.send(frame(body));
    eventually([&] { return server.waiting() == kWaiters + 1; }, "the raw multi_get waits");
  }
  eventually([&] { return server.waiting() == kWaiters; }, "the closed connection's wait ends");
  auto writer = connect(server);
  writer->set("b", "2");
  writer->set("a", "1");
  for (auto& thread : threads) {
    thread.join();
  }
  for (const auto& values : seen) {
    EXPECT_EQ(values, (std::vector<std::string>{"1", "2"}));
  }
  EXPECT_EQ(server.waiting(), 0U);
  EXPECT_EQ(impatient->multi_get({"a", "b"}), (std::vector<std::string>{"1", "2"}));
}

TEST(Store, DeadlinePassingIsTimeoutNamingTheKeyAndTheClientStaysUsable) {
  Server server;
  auto client = connect(server);
  const auto start = Clock::now();
  EXPECT_EQ(testing::expect_error<Timeout>([&] { client->get("never-set", milliseconds(50)); },
                                           {"never-set"})
                .context.op,
            "store.get");
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(50));
  EXPECT_LT(elapsed, kPrompt);
  const std::vector<std::string> here_and_missing{"here", "missing"};
  testing::expect_error<Timeout>([&] { client->wait(here_and_missing, milliseconds(20)); },
                                 {"here"});
  EXPECT_THROW(client->multi_get({"missing"}, milliseconds(0)), Timeout);
  client->set("here", "1");
  EXPECT_EQ(client->get("here"), "1");
  EXPECT_EQ(server.waiting(), 0U);
}

TEST(Store, AWaitThatTimesOutSaysHowManyOfItsKeysWereSet) {
  Server server;
  auto client = connect(server);
  client->set("a", "1");
  // The server's timeout is what was left of the 20 ms when the request was sent.
  testing::expect_error<Timeout>(
      [&] {
        client->wait({"a", "b", "c"}, milliseconds(20));
      },
      {"key 'b' was not set within ", " ms (1 of 3 keys were)"});
}

TEST(Store, CancelReleasesABlockedWaitWithAborted) {
  Server server;
  auto client = connect(server);
  client->cancel();  // nothing in flight: no effect
  std::atomic<bool> aborted = false;
  std::thread blocked([&] {
    try {
      client->wait({"never"}, kHang);
    } catch (const Aborted& error) {
      aborted = std::string(error.what()).find("never") != std::string::npos;
    }
  });
  eventually([&] { return server.waiting() == 1; }, "the wait waits");
  const auto start = Clock::now();
  client->cancel();
  blocked.join();
  EXPECT_LT(Clock::now() - start, kPrompt);
  EXPECT_TRUE(aborted);
  // The connection is still in step: the next calls work.
  client->set("after", "cancel");
  EXPECT_EQ(client->get("after"), "cancel");
  client->cancel();
  EXPECT_EQ(client->get("after"), "cancel");
}

TEST(Store, CancelDoesNotWaitForALargeRequestBeingWritten) {
  // A multi_set far larger than the socket buffers, to a store that stops reading after its first
  // bytes: the client's write blocks until the store reads or the deadline passes. A cancel()
  // meanwhile has nothing to cancel (a multi_set is not cancellable) and must say so at once,
  // not wait for the write (Note [Client cancel] in client.cpp).
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ScriptedStore store([&](int connection) {
    char header[4];
    read_exactly(connection, header, sizeof header);  // the multi_set is being written
    started.set_value();
    released.wait();
  });  // then closes the connection: the client's write fails
  ClientOptions options;
  options.port = store.port();
  Client client(options, kHang);
  auto setting = std::async(std::launch::async, [&] {
    try {
      client.multi_set({{"big", std::string(kLargeRequestBytes, 'x')}}, kHang);
      return std::string("no error");
    } catch (const TransportError&) {
      return std::string("TransportError");
    } catch (const Error& error) {
      return std::string(error.what());
    }
  });
  const bool began = started.get_future().wait_for(kHang) == std::future_status::ready;
  auto cancelling = std::async(std::launch::async, [&] { client.cancel(); });
  const bool prompt = cancelling.wait_for(kPrompt) == std::future_status::ready;
  const bool still_writing = setting.wait_for(seconds(0)) == std::future_status::timeout;
  release.set_value();
  EXPECT_TRUE(began);
  EXPECT_TRUE(prompt) << "cancel() waited for the multi_set being written";
  EXPECT_TRUE(still_writing);
  EXPECT_EQ(setting.get(), "TransportError");
  cancelling.get();
}

TEST(Store, ACancelWhileABlockingRequestIsWrittenFollowsIt) {
  // A wait whose request (one very long key) is still being written when cancel() comes: cancel()
  // returns at once, and the Cancel frame follows the whole request on the wire (the server
  // allows only a Cancel after a pending wait), so the wait is answered Cancelled: Aborted.
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<std::string> next_frame;  // what the client sent after the wait
  ScriptedStore store([&](int connection) {
    char header[4];
    read_exactly(connection, header, sizeof header);  // the wait is being written
    started.set_value();
    released.wait();
    std::string request(frame_length(header), '\0');
    std::string next;
    if (read_exactly(connection, request.data(), request.size()) &&
        read_exactly(connection, header, sizeof header)) {
      next.assign(frame_length(header), '\0');
      if (!read_exactly(connection, next.data(), next.size())) {
        next = "truncated";
      }
    }
    next_frame.set_value(next);
    const std::string answer = frame(std::string("\x02\x09\x00\x00\x00", 5) + "cancelled");
    ::send(connection, answer.data(), answer.size(), MSG_NOSIGNAL);
  });
  ClientOptions options;
  options.port = store.port();
  Client client(options, kHang);
  auto waiting = std::async(std::launch::async, [&] {
    try {
      client.wait({std::string(kLargeRequestBytes, 'k')}, kHang);
      return std::string("no error");
    } catch (const Aborted&) {
      return std::string("Aborted");
    } catch (const Error& error) {
      return std::string(error.what());
    }
  });
  const bool began = started.get_future().wait_for(kHang) == std::future_status::ready;
  auto cancelling = std::async(std::launch::async, [&] { client.cancel(); });
  const bool prompt = cancelling.wait_for(kPrompt) == std::future_status::ready;
  release.set_value();
  EXPECT_TRUE(began);
  EXPECT_TRUE(prompt) << "cancel() waited for the wait's request being written";
  EXPECT_EQ(waiting.get(), "Aborted");
  cancelling.get();
  EXPECT_EQ(next_frame.get_future().get(), std::string(1, '\x0b'));  // Op::Cancel, alone
}

TEST(Store, ACancelWhoseWriteCannotCompleteEndsTheCallPromptly) {
  // A wait is in flight (the store has read its request) when the store stops reading and the
  // client's send buffer is full, so the Cancel cannot be written. The connection is not broken:
  // cancel() gives up on the write after its timeout (a second) and shuts the connection down,
  // so the wait fails with TransportError at once instead of waiting out its deadline.
  std::promise<void> read_the_wait;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ScriptedStore store([&](int connection) {
    char header[4];
    if (read_exactly(connection, header, sizeof header)) {
      std::string request(frame_length(header), '\0');
      read_exactly(connection, request.data(), request.size());
    }
    read_the_wait.set_value();
    released.wait();  // reads nothing more, answers nothing
  });
  ClientOptions options;
  options.port = store.port();
  Client client(options, kHang);
  auto waiting = std::async(std::launch::async, [&] {
    try {
      client.wait({"never"}, kHang);
      return std::string("no error");
    } catch (const TransportError&) {
      return std::string("TransportError");
    } catch (const Error& error) {
      return std::string(error.what());
    }
  });
  const bool began = read_the_wait.get_future().wait_for(kHang) == std::future_status::ready;
  const int fd = client_socket_to(store.port());
  if (began && fd >= 0) {
    fill_send_buffer(fd);
  }
  const Clock::time_point start = Clock::now();
  client.cancel();
  const bool ended = waiting.wait_for(kPrompt) == std::future_status::ready;
  const Clock::duration took = Clock::now() - start;
  release.set_value();  // the store closes the connection: the wait ends now if not before
  EXPECT_TRUE(began);
  EXPECT_GE(fd, 0);
  EXPECT_TRUE(ended) << "the wait outlived a cancel whose Cancel could not be written";
  EXPECT_LT(took, kPrompt);
  EXPECT_EQ(waiting.get(), "TransportError");
  EXPECT_THROW(client.set("after", "cancel", kHang), TransportError);  // closed for good
}

TEST(Store, AnUnexpectedExceptionMidCallClosesTheConnectionForGood) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "an address-space limit does not mix with a sanitizer's shadow memory";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "an address-space limit does not mix with a sanitizer's shadow memory";
#endif
#endif
  // The store answers a get with a header claiming a body of 1 GiB (its announced frame limit),
  // and the client, under an address-space limit far below that, fails to allocate the body:
  // std::bad_alloc mid-call, which is not a chorus Error. The call must still end and close the
  // connection, so the next call is TransportError (it used to find the call still in flight and
  // abort the process on a CHORUS_CHECK). In a child process: the limit is process-wide.
  auto run = [] {
    ScriptedStore store([](int connection) {
      char header[4];
      if (read_exactly(connection, header, sizeof header)) {
        std::string request(frame_length(header), '\0');
        read_exactly(connection, request.data(), request.size());
        const std::uint32_t claimed = std::uint32_t{1} << 30;
        std::string answer(4, '\0');
        for (int i = 0; i < 4; ++i) {
          answer[static_cast<std::size_t>(i)] = static_cast<char>((claimed >> (8 * i)) & 0xff);
        }
        ::send(connection, answer.data(), answer.size(), MSG_NOSIGNAL);
      }
      char buffer[256];
      while (::recv(connection, buffer, sizeof buffer, 0) > 0) {
      }
    });
    ClientOptions options;
    options.port = store.port();
    Client client(options, kHang);
    if (!chorus::testing::limit_address_space(std::size_t{256} << 20)) {
      std::_Exit(10);
    }
    try {
      client.get("k", kHang);
      std::_Exit(11);
    } catch (const std::bad_alloc&) {
    } catch (...) {
      std::_Exit(12);
    }
    try {
      client.get("k", kHang);
      std::_Exit(13);
    } catch (const TransportError&) {
    } catch (...) {
      std::_Exit(14);
    }
    std::_Exit(0);
  };
  // The child starts threads and allocates: re-executed, not a bare fork of this process.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(0), "");
}

TEST(Store, CancelThroughAPrefixView) {
  Server server;
  auto client = connect(server);
  PrefixStore view("pg", *client);
  std::atomic<bool> aborted = false;
  std::thread blocked([&] {
    try {
      view.get("never", kHang);
    } catch (const Aborted&) {
      aborted = true;
    }
  });
  eventually([&] { return server.waiting() == 1; }, "the get waits");
  view.cancel();
  blocked.join();
  EXPECT_TRUE(aborted);
}

TEST(Store, PrefixViewsAreIsolated) {
  Server server;
  auto client = connect(server);
  PrefixStore group0("pg0", *client);
  PrefixStore group1("pg1", *client);
  PrefixStore nested("sub", group0);
  group0.set("x", "zero");
  group1.set("x", "one");
  nested.set("x", "nested");
  EXPECT_EQ(group0.get("x"), "zero");
  EXPECT_EQ(group1.get("x"), "one");
  EXPECT_EQ(client->get("pg0/x"), "zero");
  EXPECT_EQ(client->get("pg0/sub/x"), "nested");
  EXPECT_EQ(group0.add("n", 2), 2);
  EXPECT_EQ(group1.add("n", 5), 5);
  EXPECT_TRUE(group0.delete_key("x"));
  EXPECT_EQ(group1.get("x"), "one");
  EXPECT_EQ(group0.multi_get({"n"}), std::vector<std::string>{"2"});
  EXPECT_THROW(group0.get("x", milliseconds(10)), Timeout);
  EXPECT_EQ(client->num_keys(), group0.num_keys());  // num_keys counts the whole store
}

TEST(Store, RendezvousBroadcastAllgatherAndBarrierOnEightClients) {
  Server server;
  constexpr int kWorld = 8;
  constexpr int kRounds = 3;
  std::vector<std::vector<std::string>> gathered(kWorld);
  std::vector<std::vector<std::string>> broadcasts(kWorld);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      auto client = connect(server);
      PrefixStore world("world", *client);
      Rendezvous rendezvous(world, rank, kWorld);
      for (int round = 0; round < kRounds; ++round) {
        const std::vector<std::string> all =
            rendezvous.allgather_bytes("r" + std::to_string(rank) + "." + std::to_string(round));
        gathered[static_cast<std::size_t>(rank)].insert(
            gathered[static_cast<std::size_t>(rank)].end(), all.begin(), all.end());
        const int root = (round * 3) % kWorld;
        broadcasts[static_cast<std::size_t>(rank)].push_back(rendezvous.broadcast_bytes(
            root, rank == root ? std::string("from ") + std::to_string(root) : "ignored"));
        rendezvous.barrier();
      }
    });
  }
  for (auto& thread : ranks) {
    thread.join();
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<std::string> expected_gather;
    std::vector<std::string> expected_broadcast;
    for (int round = 0; round < kRounds; ++round) {
      for (int r = 0; r < kWorld; ++r) {
        expected_gather.push_back("r" + std::to_string(r) + "." + std::to_string(round));
      }
      expected_broadcast.push_back("from " + std::to_string((round * 3) % kWorld));
    }
    EXPECT_EQ(gathered[static_cast<std::size_t>(rank)], expected_gather) << "rank " << rank;
    EXPECT_EQ(broadcasts[static_cast<std::size_t>(rank)], expected_broadcast) << "rank " << rank;
  }
  // The last rank through each call removed its keys.
  EXPECT_EQ(connect(server)->num_keys(), 0);
}

TEST(Store, ExitBarrierKeepsRankZerosServerUntilEveryRankIsDone) {
  // Note [Exit barrier]: rank 0 hosts the server and destroys it the moment exit_barrier
  // returns there, as nccl::run does. With Rendezvous::barrier alone rank 0 often left while
  // other ranks still waited for 'released' or counted out, and they got TransportError.
  constexpr int kWorld = 8;
  constexpr int kRepetitions = 100;
  std::atomic<int> errors{0};
  std::string first_error;
  std::mutex first_error_mutex;
  for (int repetition = 0; repetition < kRepetitions; ++repetition) {
    auto server = std::make_unique<Server>();
    const std::uint16_t port = server->port();
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < kWorld; ++rank) {
      ranks.emplace_back([&, rank] {
        try {
          ClientOptions options;
          options.port = port;
          Client client(options, seconds(30));
          PrefixStore exit("exit", client);
          exit_barrier(exit, rank, kWorld, seconds(30));
          if (rank == 0) {
            EXPECT_EQ(client.num_keys(), 0) << "exit_barrier left keys behind";
            server.reset();  // what nccl::run's rank 0 does next
          }
        } catch (const Error& error) {
          errors.fetch_add(1);
          const std::lock_guard lock(first_error_mutex);
          if (first_error.empty()) {
            first_error = "repetition " + std::to_string(repetition) + ", rank " +
                          std::to_string(rank) + ": " + error.what();
          }
        }
      });
    }
    for (auto& thread : ranks) {
      thread.join();
    }
  }
  EXPECT_EQ(errors.load(), 0) << first_error;
}

TEST(Store, ExitBarrierOfOneRankAndOutsideTheWorld) {
  Server server;
  auto client = connect(server);
  exit_barrier(*client, 0, 1, seconds(5));
  EXPECT_EQ(client->num_keys(), 0);
  EXPECT_THROW(exit_barrier(*client, 2, 2, seconds(5)), InvalidArgument);
}

// The deadline of the exit barriers below: one that only a hang reaches. Before
// exit_barrier_failed the failed rank just left, and the others waited here for it.
constexpr seconds kExitBarrierDeadline = kHang;

TEST(Store, ExitBarrierGivesEveryRankTheFailureAFailedRankReported) {
  // Note [Exit barrier]: rank 2 failed and leaves at once; ranks 0 and 1 finished. They must
  // get RankFailure naming rank 2 and its error, not a Timeout on 'released' after the whole
  // deadline (10 min under nccl::run), and rank 0 must still outlive the others' last calls.
  constexpr int kWorld = 3;
  auto server = std::make_unique<Server>();
  const std::uint16_t port = server->port();
  std::vector<std::string> outcomes(kWorld);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      std::string& outcome = outcomes[static_cast<std::size_t>(rank)];
      try {
        ClientOptions options;
        options.port = port;
        Client client(options, kHang);
        PrefixStore exit("exit", client);
        if (rank == 2) {
          exit_barrier_failed(exit, rank, kWorld, "chorus::Timeout: boom", seconds(10));
          outcome = "reported";
          return;
        }
        exit_barrier(exit, rank, kWorld, kExitBarrierDeadline);
        outcome = "returned";
      } catch (const RankFailure& error) {
        outcome = "RankFailure: " + std::string(error.what());
      } catch (const Error& error) {
        outcome = "other error: " + std::string(error.what());
      }
      if (rank == 0) {
        server.reset();  // what nccl::run's rank 0 does next
      }
    });
  }
  for (auto& thread : ranks) {
    thread.join();
  }
  for (int rank : {0, 1}) {
    EXPECT_EQ(outcomes[static_cast<std::size_t>(rank)],
              "RankFailure: chorus::RankFailure: [rank " + std::to_string(rank) +
                  "] store.exit_barrier: rank 2 failed: chorus::Timeout: boom");
  }
  EXPECT_EQ(outcomes[2], "reported");
}

TEST(Store, ExitBarrierWithFailedRanksLetsRankZeroReturnLastAndCleansUp) {
  // Ranks 1 and 3 of 5 fail together: the first report wins and every other rank gets the same
  // one; rank 0's wait for the left keys completes (the failed ranks leave too), it returns only
  // after the others' last calls (its server destroyed then hurts nobody), and no key is left.
  constexpr int kWorld = 5;
  constexpr int kRepetitions = 20;
  for (int repetition = 0; repetition < kRepetitions; ++repetition) {
    auto server = std::make_unique<Server>();
    const std::uint16_t port = server->port();
    std::vector<std::string> outcomes(kWorld);
    std::int64_t keys_left = -1;
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < kWorld; ++rank) {
      ranks.emplace_back([&, rank] {
        std::string& outcome = outcomes[static_cast<std::size_t>(rank)];
        try {
          ClientOptions options;
          options.port = port;
          Client client(options, kHang);
          PrefixStore exit("exit", client);
          if (rank == 1 || rank == 3) {
            exit_barrier_failed(exit, rank, kWorld, "error " + std::to_string(rank), seconds(10));
            outcome = "reported";
            return;
          }
          try {
            exit_barrier(exit, rank, kWorld, kExitBarrierDeadline);
            outcome = "returned";
          } catch (const RankFailure& error) {
            outcome = error.detail();
          }
          if (rank == 0) {
            keys_left = client.num_keys();
            server.reset();  // what nccl::run's rank 0 does next
          }
        } catch (const Error& error) {
          outcome = "other error: " + std::string(error.what());
        }
      });
    }
    for (auto& thread : ranks) {
      thread.join();
    }
    SCOPED_TRACE("repetition " + std::to_string(repetition));
    const std::string& first = outcomes[0];
    EXPECT_TRUE(first == "rank 1 failed: error 1" || first == "rank 3 failed: error 3") << first;
    EXPECT_EQ(outcomes[2], first);
    EXPECT_EQ(outcomes[4], first);
    EXPECT_EQ(outcomes[1], "reported");
    EXPECT_EQ(outcomes[3], "reported");
    EXPECT_EQ(keys_left, 0) << "exit_barrier left keys behind";
  }
}

TEST(Store, ExitBarrierFailedOutsideTheWorldAndCutsLongText) {
  Server server;
  auto client = connect(server);
  EXPECT_THROW(exit_barrier_failed(*client, 2, 2, "x", seconds(5)), InvalidArgument);
  // A world of one: rank 0 reports (its store outlives it) and releases its own barrier.
  PrefixStore exit("exit", *client);
  exit_barrier_failed(exit, 0, 1, std::string(kFailureTextBytesMax + 1, 'x'), seconds(5));
  EXPECT_EQ(exit.get("chorus.exit/failed", seconds(5)),
            "rank 0 failed: " + std::string(kFailureTextBytesMax, 'x') + " [...]");
  EXPECT_EQ(client->num_keys(), 1) << "only the failure is left, for nobody to read";
}

TEST(Store, CallsQueuedBehindABlockedCallTimeOutWithoutClosingTheConnection) {
  // One client shared by two threads: A blocks in a get; B's set, queued behind it, must not
  // wait past its own deadline, and must not then time out mid-call and close the connection
  // under A (it once waited for A's whole get, sent anyway, and closed it).
  Server server;
  auto shared = connect(server);
  std::promise<std::string> got;
  std::thread a([&] { got.set_value(shared->get("released-later", kHang)); });
  eventually([&] { return server.waiting() == 1; }, "A's get is blocked on the server");
  std::future<std::string> b = std::async(std::launch::async, [&]() -> std::string {
    try {
      shared->set("k", "v", milliseconds(200));
    } catch (const Timeout& error) {
      return error.what();
    }
    return "the set returned";
  });
  // Before the fix B returned only after A's get, which nothing would end: a bound, then A is
  // released whatever happened, so that the test ends either way.
  const std::future_status b_done = b.wait_for(kPrompt);
  connect(server)->set("released-later", "x");
  a.join();
  ASSERT_EQ(b_done, std::future_status::ready) << "B waited for A's call past its deadline";
  EXPECT_EQ(got.get_future().get(), "x");
  const std::string message = b.get();
  EXPECT_NE(message.find("store.set"), std::string::npos) << message;
  EXPECT_NE(message.find("waited for another thread's call on the same client"), std::string::npos)
      << message;
  EXPECT_NE(message.find("nothing was sent"), std::string::npos) << message;
  // The connection is still usable, and B's set was not sent.
  EXPECT_EQ(shared->num_keys(kHang), 1);
  shared->set("k", "after", kHang);
  EXPECT_EQ(shared->get("k", kHang), "after");
}

TEST(Store, NonBlockingCallsUnderAPassedDeadlineAreRefusedUnsentAndTheClientStaysUsable) {
  // A set under a deadline already passed was once sent (and applied), its answer then missed at
  // once: Timeout, and the connection closed for good. Nothing is sent now, as when the deadline
  // passes while the call waits for another thread's call.
  Server server;
  auto client = connect(server);
  auto other = connect(server);
  const Deadline passed(Clock::now());
  EXPECT_EQ(
      testing::expect_error<Timeout>([&] { client->set("k", "v", passed); }, {"nothing was sent"})
          .context.op,
      "store.set");
  EXPECT_THROW(client->add("n", 1, passed), Timeout);
  EXPECT_THROW(client->compare_set("c", "", "x", passed), Timeout);
  EXPECT_THROW(client->multi_set({{"m", "1"}}, passed), Timeout);
  EXPECT_THROW(client->delete_key("k", passed), Timeout);
  EXPECT_THROW(client->num_keys(Deadline(Clock::time_point::min())), Timeout);
  EXPECT_EQ(other->num_keys(kHang), 0);  // none was applied
  client->set("k", "after", kHang);      // the connection was kept
  EXPECT_EQ(client->get("k", kHang), "after");
}

TEST(Store, RendezvousCountsOutEvenWhenTheCallUsedUpItsDeadline) {
  // A broadcast's get may take the call's whole deadline; counting out (an add, then the last
  // rank's deletes) once reused it and then failed the call that had its value. Deterministic
  // here: the value is published and the deadline has passed before the late rank's call, whose
  // get the server still answers (the key is there).
  Server server;
  auto root_client = connect(server);
  auto late_client = connect(server);
  Rendezvous root(*root_client, 0, 2);
  Rendezvous late(*late_client, 1, 2);
  EXPECT_EQ(root.broadcast_bytes(0, "blob", kHang), "blob");
  EXPECT_EQ(late.broadcast_bytes(0, "", Deadline(Clock::now())), "blob");
  EXPECT_EQ(root_client->num_keys(kHang), 0);  // the late rank was last: it deleted the keys
}

TEST(Store, RendezvousRanksThatDisagreeOnTheWorldSizeAreInvalidArgument) {
  // It once CHECK-aborted the process: a third rank counting out of a call of a world of 2.
  Server server;
  auto first = connect(server);
  auto second = connect(server);
  Rendezvous of_two(*first, 1, 2);
  EXPECT_EQ(of_two.broadcast_bytes(1, "x"), "x");  // counted out as 1 of 2: keys kept
  Rendezvous of_one(*second, 0, 1);
  // The same call's keys: counted out as 2 of 1.
  testing::expect_error<InvalidArgument>([&] { of_one.broadcast_bytes(0, "y"); },
                                         {"rank 0 counted itself out of chorus.rendezvous/0/"
                                          "broadcast as number 2 of a world of 1: the ranks "
                                          "disagree on the world size"});
  EXPECT_EQ(second->num_keys(kHang), 2);  // the value and the count, left for inspection
}

TEST(Store, RendezvousRefusesRanksOutsideTheWorld) {
  Server server;
  auto client = connect(server);
  EXPECT_THROW((Rendezvous{*client, 2, 2}), InvalidArgument);
  EXPECT_THROW((Rendezvous{*client, -1, 2}), InvalidArgument);
  Rendezvous alone(*client, 0, 1);
  EXPECT_THROW(alone.broadcast_bytes(1, "x"), InvalidArgument);
  EXPECT_EQ(alone.broadcast_bytes(0, "x"), "x");
  EXPECT_EQ(alone.allgather_bytes("y"), std::vector<std::string>{"y"});
}

TEST(Store, FrameSizeLimitIsInvalidArgumentAndTheClientStaysUsable) {
  ServerOptions options;
  options.frame_bytes_max = 8192;
  Server server(options);
  auto client = connect(server);
  EXPECT_EQ(client->frame_bytes_max(), 8192U);
  testing::expect_error<InvalidArgument>([&] { client->set("big", std::string(10'000, 'x')); },
                                         {"frame limit of 8192"});
  // Each value fits; their multi_get answer does not.
  for (const char* key : {"a", "b", "c"}) {
    client->set(key, std::string(3000, 'v'));
  }
  EXPECT_THROW(client->multi_get({"a", "b", "c"}), InvalidArgument);
  EXPECT_EQ(client->multi_get({"a", "b"}).size(), 2U);
  ServerOptions zero;
  zero.frame_bytes_max = 0;
  EXPECT_THROW(Server{zero}, InvalidArgument);
}

// The frame limit bounds a body, itself included: a request, and a multi_get's answer, of
// exactly the limit go through; one byte more is refused.
TEST(Store, RequestsAndAnswersOfExactlyTheFrameLimitGoThrough) {
  ServerOptions options;
  options.frame_bytes_max = 8192;
  Server server(options);
  auto client = connect(server);
  // A set's body: the opcode (1), the key's length word (4) and byte, the value's length word (4).
  const std::string value(8192 - 1 - 4 - 1 - 4, 'v');
  client->set("k", value);
  EXPECT_EQ(client->get("k"), value);
  EXPECT_THROW(client->set("k", value + "v"), InvalidArgument);
  // A multi_get's answer: the status (1), the count (4), then a length word (4) per value.
  const std::string a(4000, 'a');
  const std::string b(8192 - 1 - 4 - 4 - 4000 - 4, 'b');
  client->set("a", a);
  client->set("b", b);
  EXPECT_EQ(client->multi_get({"a", "b"}), (std::vector<std::string>{a, b}));
  client->set("b", b + "b");
  EXPECT_THROW(client->multi_get({"a", "b"}), InvalidArgument);
  EXPECT_EQ(client->get("k"), value);
}

TEST(Store, KeyCountLimitIsInvalidArgument) {
  ServerOptions options;
  options.keys_max = 3;
  Server server(options);
  auto client = connect(server);
  client->multi_set({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  testing::expect_error<InvalidArgument>([&] { client->set("d", "4"); }, {"limit of 3 keys"});
  EXPECT_THROW(client->add("d", 1), InvalidArgument);
  EXPECT_THROW(client->compare_set("d", "", "4"), InvalidArgument);
  client->set("a", "replaced");  // replacing creates nothing
  EXPECT_TRUE(client->delete_key("a"));
  // A multi_set that would pass the limit creates nothing.
  EXPECT_THROW(client->multi_set({{"x", "1"}, {"y", "2"}}), InvalidArgument);
  EXPECT_EQ(client->num_keys(), 2);
  client->set("d", "4");
  EXPECT_EQ(client->num_keys(), 3);
}

TEST(Store, WrongOrMissingTokenIsRefusedAtConnect) {
  ServerOptions options;
  options.token = "s3cret";
  Server server(options);
  testing::expect_error<TransportError>([&] { Client client(options_for(server, ""), kHang); },
                                        {"requires a token"});
  testing::expect_error<TransportError>([&] { Client client(options_for(server, "guess"), kHang); },
                                        {"wrong token"});
  auto client = connect(server, "s3cret");
  client->set("k", "v");
  EXPECT_EQ(client->get("k"), "v");
  eventually([&] { return server.connections() == 1; }, "refused connections are closed");
}

TEST(Store, ATokenTooLongForTheHandshakeIsInvalidArgumentAtTheClient) {
  ServerOptions options;
  options.token = "s3cret";
  Server server(options);
  testing::expect_error<InvalidArgument>(
      [&] { Client client(options_for(server, std::string(5000, 't')), kHang); },
      {"the token (5000 bytes) makes the handshake longer"});
}

TEST(Store, ATokenThatMakesTheHelloExactlyItsLimitIsAccepted) {
  // The hello's body: the opcode (1), the magic (4), the version (2), the token's length word (4)
  // and bytes; at most 4096 bytes.
  const std::string token(4096 - 1 - 4 - 2 - 4, 't');
  ServerOptions options;
  options.token = token;
  Server server(options);
  auto client = connect(server, token);
  client->set("k", "v");
  EXPECT_EQ(client->get("k"), "v");
  EXPECT_THROW((Client{options_for(server, token + "t"), kHang}), InvalidArgument);
}

TEST(Store, TokenFromTheEnvironment) {
  // Restored however the test ends: a token left behind would break every later test.
  const testing::ScopedEnvironment token({{std::string(kTokenEnvironmentVariable), "from-env"}});
  Server server;  // token unset in the options: the environment's
  EXPECT_THROW((Client{options_for(server, "other"), kHang}), TransportError);
  Client client(options_for(server), kHang);  // the environment's, too
  token.set(std::string(kTokenEnvironmentVariable), std::nullopt);
  client.set("k", "v");
  EXPECT_THROW((Client{options_for(server), kHang}), TransportError);
}

TEST(Store, GarbageClosesOnlyThatConnection) {
  Server server;
  auto good = connect(server);
  good->set("k", "v");
  {
    // Not a chorus client at all: the length word reads as ~540 MB, past the hello limit.
    RawSocket http(server.port());
    http.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_TRUE(http.closed_by_peer(kPrompt));
  }
  {
    // A frame whose body does not parse, before any hello.
    RawSocket junk(server.port());
    junk.send(frame("\x63junk"));
    EXPECT_TRUE(junk.closed_by_peer(kPrompt));
  }
  {
    // A proper hello, then an unknown opcode.
    RawSocket rogue(server.port());
    rogue.send(hello_frame());
    rogue.send(frame("\x7f"));
    EXPECT_TRUE(rogue.closed_by_peer(kPrompt));
  }
  {
    // A proper hello, then a set whose key length runs past the body.
    RawSocket truncated(server.port());
    truncated.send(hello_frame());
    truncated.send(frame(std::string("\x02\xff\x00\x00\x00k", 6)));
    EXPECT_TRUE(truncated.closed_by_peer(kPrompt));
  }
  EXPECT_EQ(good->get("k"), "v");
  good->set("k", "still serving");
  EXPECT_EQ(connect(server)->get("k"), "still serving");
  eventually([&] { return server.connections() == 1; }, "garbage connections are closed");
}

// An empty frame is no request any client sends: before the hello and after it, its header
// closes that connection, and the server serves the others.
TEST(Store, AFrameWithAnEmptyBodyClosesOnlyThatConnection) {
  Server server;
  auto good = connect(server);
  good->set("k", "v");
  {
    RawSocket early(server.port());
    early.send(frame(""));
    EXPECT_TRUE(early.closed_by_peer(kPrompt));
  }
  {
    RawSocket late(server.port());
    late.send(hello_frame());
    late.send(frame(""));
    EXPECT_TRUE(late.closed_by_peer(kPrompt));
  }
  EXPECT_EQ(good->get("k"), "v");
  eventually([&] { return server.connections() == 1; }, "empty-frame connections are closed");
}

// Before its hello a connection sends no frame over the hello's limit (4096 bytes), whatever the
// frame limit: the header closes the connection, without waiting for the body (or for the
// handshake timeout, here longer than the test).
TEST(Store, AFrameOverTheHelloLimitBeforeTheHelloClosesTheConnectionAtOnce) {
  ServerOptions options;
  options.handshake_timeout = kHang;
  Server server(options);
  RawSocket early(server.port());
  early.send(frame(std::string(4097, '\x01')).substr(0, 4));  // the header only
  EXPECT_TRUE(early.closed_by_peer(kPrompt));
}

TEST(Store, AnOpcodeBelowTheFirstClosesTheConnection) {
  Server server;
  RawSocket zero(server.port());
  zero.send(hello_frame());
  zero.send(frame(std::string("\x00", 1)));  // opcode 0: Op::Hello (1) is the first
  EXPECT_TRUE(zero.closed_by_peer(kPrompt));
}

// After its hello a connection says hello no more, and sends one request at a time (a Cancel
// aside): a second hello, or a request while its get waits, closes it.
TEST(Store, ASecondHelloOrARequestBehindAWaitingGetClosesTheConnection) {
  Server server;
  {
    RawSocket twice(server.port());
    twice.send(hello_frame());
    twice.send(hello_frame());
    EXPECT_TRUE(twice.closed_by_peer(kPrompt));
  }
  {
    RawSocket eager(server.port());
    eager.send(hello_frame());
    std::string get("\x03", 1);                     // get
    get += std::string("\x10\x27\0\0\0\0\0\0", 8);  // 10000 ms
    get += std::string("\x05\0\0\0never", 9);       // "never"
    eager.send(frame(get));
    eventually([&] { return server.waiting() == 1; }, "the raw get waits");
    eager.send(frame(std::string("\x08", 1)));  // num_keys, while the get waits
    EXPECT_TRUE(eager.closed_by_peer(kPrompt));
  }
  EXPECT_EQ(server.waiting(), 0U);
  eventually([&] { return server.connections() == 0; }, "both connections are closed");
}

TEST(Store, AHelloOfAnotherProtocolVersionIsRefusedNamingBothVersions) {
  Server server;
  RawSocket future(server.port());
  std::string hello;
  hello += '\x01';                              // Op::Hello
  hello += std::string("CHST", 4);              // magic
  hello += std::string("\x02\x00", 2);          // version 2
  hello += std::string("\x00\x00\x00\x00", 4);  // empty token
  future.send(frame(hello));
  // Status::Refused, then the message as a string (its length word, its bytes).
  const std::string refusal =
      "\x04" + frame("protocol version 2 is not supported (the server speaks 1)");
  char header[4];
  ASSERT_TRUE(read_exactly(future.fd(), header, sizeof header));
  std::string answer(frame_length(header), '\0');
  ASSERT_TRUE(read_exactly(future.fd(), answer.data(), answer.size()));
  EXPECT_EQ(answer, refusal);
  EXPECT_TRUE(future.closed_by_peer(kPrompt));
}

TEST(Store, AHandshakeTimeoutThatIsNotPositiveIsRefusedAtConstruction) {
  const auto expect_refused = [](milliseconds timeout, const std::string& reason) {
    ServerOptions options;
    options.handshake_timeout = timeout;
    testing::expect_error<InvalidArgument>(
        [&] { Server server(options); },
        {"handshake_timeout " + reason + std::to_string(timeout.count()) + " ms"});
  };
  // It once made the server close every connection before its hello.
  for (const milliseconds timeout : {milliseconds(0), milliseconds(-1)}) {
    expect_refused(timeout, "must be positive, not ");
  }
  // Far above the store's bound it overflowed the timer's nanoseconds and fired at once: the
  // same refusal of every client.
  for (const milliseconds timeout :
       {milliseconds::max(), milliseconds((std::int64_t{1} << 40) + 1)}) {
    expect_refused(timeout,
                   "must be at most 2^40 ms (about 34 years, the store's longest timeout), not ");
  }
  // The bound itself is accepted.
  ServerOptions longest;
  longest.handshake_timeout = milliseconds(std::int64_t{1} << 40);
  Server server(longest);
  EXPECT_NO_THROW(connect(server)->num_keys());
}

TEST(Store, APeerThatIsNotAStoreIsTransportErrorPromptly) {
  // "SSH-" read as a frame length is 759 MB: once allocated, then waited for until the deadline
  // ("did not answer the handshake in time").
  ForeignServer ssh("SSH-2.0-OpenSSH_9.2\r\n");
  ClientOptions options;
  options.port = ssh.port();
  const auto start = Clock::now();
  testing::expect_error<TransportError>(
      [&] { Client client(options, kHang); },
      {"is not a chorus store (handshake reply of 759714643 bytes, at most 4096 "
       "expected)"});
  EXPECT_LT(Clock::now() - start, kPrompt);
}

TEST(Store, AStoreThatReportsAFrameLimitOfZeroIsRefusedAtConnect) {
  const ScriptedStore zero([](int) {}, /*frame_limit=*/0);
  ClientOptions options;
  options.port = zero.port();
  testing::expect_error<TransportError>(
      [&] { Client client(options, kHang); },
      {"the store at 127.0.0.1:" + std::to_string(zero.port()) + " reported a frame limit of 0"});
}

// An answer whose header claims more than the frame limit the store reported is refused when its
// header comes, not waited for until the deadline.
TEST(Store, AnAnswerOverTheFrameLimitIsTransportErrorAtOnce) {
  const ScriptedStore oversized(
      [](int connection) {
        char header[4];
        std::string request;
        if (!read_exactly(connection, header, sizeof header)) {
          return;
        }
        request.resize(frame_length(header));
        if (!read_exactly(connection, request.data(), request.size())) {
          return;
        }
        const std::string claim = frame(std::string(4097, '\0')).substr(0, 4);  // the header only
        ::send(connection, claim.data(), claim.size(), MSG_NOSIGNAL);
        char buffer[256];
        while (::recv(connection, buffer, sizeof buffer, 0) > 0) {
        }
      },
      /*frame_limit=*/4096);
  ClientOptions options;
  options.port = oversized.port();
  Client client(options, kHang);
  testing::expect_error<TransportError>(
      [&] { client.num_keys(kPrompt); },
      {"the store at 127.0.0.1:" + std::to_string(oversized.port()) +
       " sent a frame of 4097 bytes (limit 4096)"});
}

// A store that takes a wait and never answers: past the deadline and the client's grace for the
// answer, the call is Timeout naming the first key and how many more, and the connection closes.
TEST(Store, AStoreThatNeverAnswersIsTimeoutNamingTheKeysAndClosesTheConnection) {
  const ScriptedStore silent([](int connection) {
    char buffer[256];
    while (::recv(connection, buffer, sizeof buffer, 0) > 0) {
    }
  });
  ClientOptions options;
  options.port = silent.port();
  Client client(options, kHang);
  const std::string store = "the store at 127.0.0.1:" + std::to_string(silent.port());
  testing::expect_error<Timeout>(
      [&] {
        client.wait({"a", "b", "c"}, milliseconds(50));
      },
      {"no answer from " + store +
       " for key 'a' (and 2 more) before the deadline; the connection is closed"});
  testing::expect_error<TransportError>([&] { client.num_keys(kHang); },
                                        {"a store.wait timed out mid-call"});
}

TEST(Store, SilentConnectionIsClosedAfterTheHandshakeTimeout) {
  ServerOptions options;
  options.handshake_timeout = milliseconds(50);
  Server server(options);
  RawSocket silent(server.port());
  EXPECT_TRUE(silent.closed_by_peer(kPrompt));
  auto client = connect(server);  // a real client's hello comes in time
  client->set("k", "v");
}

TEST(Store, ServerDeathIsTransportErrorPromptly) {
  auto server = std::make_unique<Server>();
  auto blocked_client = connect(*server);
  auto idle_client = connect(*server);
  const std::uint16_t port = server->port();
  std::atomic<bool> transport_error = false;
  std::thread blocked([&] {
    try {
      blocked_client->get("never", kHang);
    } catch (const TransportError&) {
      transport_error = true;
    }
  });
  eventually([&] { return server->waiting() == 1; }, "the get waits");
  const auto start = Clock::now();
  server->stop();
  blocked.join();
  EXPECT_LT(Clock::now() - start, kPrompt);  // not at the 60 s deadline
  EXPECT_TRUE(transport_error);
  EXPECT_THROW(idle_client->set("k", "v", kHang), TransportError);
  EXPECT_THROW(idle_client->num_keys(kHang), TransportError);  // closed for good
  server.reset();
  ClientOptions options;
  options.port = port;
  EXPECT_THROW((Client{options, milliseconds(50)}), Timeout);  // nobody listens any more
}

TEST(Store, ClientRetriesUntilTheServerListens) {
  // A port bound but not listening refuses connections, and stays this test's until the server
  // takes it: the client is refused at least once (ClientOptions::on_connect_retry says so), then
  // the server starts on that port, and the client's next attempt connects.
  const int reserved = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(reserved, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(reserved, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(::getsockname(reserved, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::uint16_t port = ntohs(address.sin_port);
  std::atomic<int> refusals{0};
  std::string first_refusal;  // written before the first increment, read after the join
  std::atomic<bool> ended{false};
  std::string seen;
  std::string failure;
  std::thread early([&] {
    ClientOptions options;
    options.port = port;
    options.on_connect_retry = [&](const std::string& reason) {
      if (refusals.load() == 0) {
        first_refusal = reason;
      }
      refusals.fetch_add(1);
    };
    try {
      Client client(options, kHang);
      seen = client.get("k", kHang);
    } catch (const Error& error) {
      failure = error.what();
    }
    ended = true;
  });
  eventually([&] { return refusals.load() > 0 || ended.load(); }, "the client is refused");
  ::close(reserved);
  ServerOptions server_options;
  server_options.port = port;
  Server server(server_options);
  connect(server)->set("k", "v");
  early.join();
  EXPECT_EQ(failure, "");
  EXPECT_GE(refusals.load(), 1);
  EXPECT_EQ(first_refusal, std::strerror(ECONNREFUSED));
  EXPECT_EQ(seen, "v");
}

TEST(Store, ATemporaryResolverFailureIsRetriedUntilTheDeadline) {
  // EAI_AGAIN twice, then the real resolver: the client tries again (on_connect_retry is told
  // why, each time) and connects.
  Server server;
  const ScopedFlakyResolver resolver(2);
  std::vector<std::string> retries;
  ClientOptions options = options_for(server);
  options.host = kStandInHostName;  // a numeric host is never looked up, so never fails
  options.on_connect_retry = [&](const std::string& reason) { retries.push_back(reason); };
  Client client(options, kHang);
  client.set("k", "v");
  EXPECT_EQ(client.get("k"), "v");
  EXPECT_EQ(ScopedFlakyResolver::calls(), 3);
  EXPECT_EQ(retries, std::vector<std::string>(2, ::gai_strerror(EAI_AGAIN)));
}

TEST(Store, AResolverThatStaysTemporarilyFailedIsTimeoutAtTheDeadline) {
  const ScopedFlakyResolver resolver(-1);
  ClientOptions options;
  options.host = "store.invalid";
  options.port = 1;
  const auto start = Clock::now();
  testing::expect_error<Timeout>([&] { Client client(options, milliseconds(200)); },
                                 {"could not resolve store host 'store.invalid' before the "
                                  "deadline: " +
                                  std::string(::gai_strerror(EAI_AGAIN))});
  EXPECT_GE(Clock::now() - start, milliseconds(200));
  EXPECT_LT(Clock::now() - start, kPrompt);
  EXPECT_GT(ScopedFlakyResolver::calls(), 1);
}

TEST(Store, APermanentResolverFailureIsInvalidArgumentAtOnce) {
  const ScopedFlakyResolver resolver(-1, EAI_NONAME);
  ClientOptions options;
  options.host = "store.invalid";
  options.port = 1;
  EXPECT_THROW(Client(options, kHang), InvalidArgument);
  EXPECT_EQ(ScopedFlakyResolver::calls(), 1);
}

TEST(Store, ANameServerThatDoesNotAnswerIsTimeoutAtTheDeadline) {
  // The stand-in blocks like a name server that does not answer: getaddrinfo takes no deadline,
  // and a client that called it on its own thread blocked for the resolver's timeout (tens of
  // seconds), whatever its deadline. Now it waits for the lookup's thread until the deadline.
  ScopedGatedResolver resolver;
  ClientOptions options;
  options.host = kStandInHostName;
  options.port = 1;
  testing::expect_error<Timeout>(
      [&] { Client client(options, milliseconds(200)); },
      {"could not resolve store host 'store.test' before the deadline: the "
       "name server did not answer in time"});
  // The constructor returned while the stand-in had not answered: the deadline ended the wait.
  EXPECT_EQ(ScopedGatedResolver::answers(), 0);
  // The lookup answers after its client is gone: the answer is freed (ASan's leak check sees it
  // otherwise), and the lookup's thread, not the test's, asked the resolver.
  ScopedGatedResolver::open();
  wait_for_lookups();
  EXPECT_EQ(ScopedGatedResolver::calls(), 1);
  EXPECT_EQ(ScopedGatedResolver::answers(), 1);
  EXPECT_NE(ScopedGatedResolver::caller(), std::this_thread::get_id());
}

TEST(Store, AHostNameIsLookedUpOnAnotherThreadAndConnects) {
  Server server;
  const ScopedGatedResolver resolver;
  ScopedGatedResolver::open();  // a name server that answers at once
  ClientOptions options = options_for(server);
  options.host = kStandInHostName;
  Client client(options, kHang);
  client.set("k", "v");
  EXPECT_EQ(client.get("k"), "v");
  EXPECT_EQ(ScopedGatedResolver::calls(), 1);
  EXPECT_EQ(ScopedGatedResolver::answers(), 1);
  EXPECT_NE(ScopedGatedResolver::caller(), std::this_thread::get_id());
}

TEST(Store, ANumericHostIsConvertedWithoutTheResolverOrAThread) {
  // The gate stays shut: a client that asked the resolver would block in it.
  Server server;
  const ScopedGatedResolver resolver;
  Client client(options_for(server), kHang);  // host 127.0.0.1
  client.set("k", "v");
  EXPECT_EQ(client.get("k"), "v");
  EXPECT_EQ(ScopedGatedResolver::calls(), 0);
  EXPECT_EQ(detail::lookups_running(), 0U);
}

// The server's process is killed (no stop(), no destructor): the kernel closes its sockets, and a
// client blocked in get learns it at once. The server's process says when the get waits on it,
// so the kill always finds the get blocked.
TEST(Store, KilledServerProcessIsTransportErrorPromptly) {
  int port_pipe[2];
  int waiting_pipe[2];
  ASSERT_EQ(::pipe(port_pipe), 0);
  ASSERT_EQ(::pipe(waiting_pipe), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(port_pipe[0]);
    ::close(waiting_pipe[0]);
    Server server;
    const std::uint16_t port = server.port();
    if (::write(port_pipe[1], &port, sizeof port) != static_cast<ssize_t>(sizeof port)) {
      ::_exit(1);
    }
    // Polled as eventually() does (no sleep), with the same bound.
    const Deadline deadline(kHang);
    while (server.waiting() == 0 && !deadline.passed()) {
      std::this_thread::yield();
    }
    const char waiting = 'w';
    if (::write(waiting_pipe[1], &waiting, 1) != 1) {
      ::_exit(1);
    }
    for (;;) {
      ::pause();  // serve until killed
    }
  }
  ::close(port_pipe[1]);
  ::close(waiting_pipe[1]);
  std::uint16_t port = 0;
  ASSERT_EQ(::read(port_pipe[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  ::close(port_pipe[0]);
  ClientOptions options;
  options.port = port;
  Client client(options, kHang);
  client.set("k", "v");
  std::atomic<bool> transport_error = false;
  std::thread blocked([&] {
    try {
      client.get("never", kHang);
    } catch (const TransportError&) {
      transport_error = true;
    }
  });
  char waiting = 0;
  EXPECT_EQ(::read(waiting_pipe[0], &waiting, 1), 1);  // the get waits on the server now
  ::close(waiting_pipe[0]);
  const auto start = Clock::now();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  blocked.join();
  EXPECT_LT(Clock::now() - start, kPrompt);
  EXPECT_TRUE(transport_error);
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
}

TEST(Store, ManyConnectionsOnOneServerThread) {
  Server server;
  constexpr int kClients = 300;
  std::vector<std::unique_ptr<Client>> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.push_back(connect(server));
    clients.back()->set("rank/" + std::to_string(c), std::to_string(c));
  }
  EXPECT_EQ(server.connections(), static_cast<std::size_t>(kClients));
  std::vector<std::string> keys;
  for (int c = 0; c < kClients; ++c) {
    keys.push_back("rank/" + std::to_string(c));
  }
  const std::vector<std::string> values = clients[kClients / 2]->multi_get(keys);
  for (int c = 0; c < kClients; ++c) {
    EXPECT_EQ(values[static_cast<std::size_t>(c)], std::to_string(c));
  }
  clients.clear();
  eventually([&] { return server.connections() == 0; }, "closed clients leave the server");
}

// The socket descriptors open in this process now.
std::vector<int> open_sockets() {
  std::vector<int> sockets;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::filesystem::path target = std::filesystem::read_symlink(entry.path(), error);
    if (!error && target.string().starts_with("socket:")) {
      sockets.push_back(std::stoi(entry.path().filename().string()));
    }
  }
  std::sort(sockets.begin(), sockets.end());
  return sockets;
}

TEST(Store, EverySocketOfTheStoreIsClosedOnExec) {
  // Boost.Asio 1.74 opens the listening socket and accepts connections without SOCK_CLOEXEC: a
  // process forked and exec'd meanwhile inherited them (and kept the port bound).
  const std::vector<int> before = open_sockets();
  Server server;
  auto client = connect(server);
  client->set("k", "v");  // answered: the server has accepted the connection
  std::vector<int> created;
  std::ranges::set_difference(open_sockets(), before, std::back_inserter(created));
  // The listening socket, the accepted connection and the client's end of it.
  ASSERT_EQ(created.size(), 3u);
  for (const int fd : created) {
    const int flags = ::fcntl(fd, F_GETFD);
    ASSERT_GE(flags, 0) << "descriptor " << fd;
    EXPECT_EQ(flags & FD_CLOEXEC, FD_CLOEXEC) << "descriptor " << fd << " is not close-on-exec";
  }
}

TEST(Store, DeadlinesFromDurationsAndTimePoints) {
  const Deadline never(std::chrono::hours::max());
  EXPECT_GT(never.remaining(), std::chrono::hours(24 * 365));
  EXPECT_FALSE(never.passed());
  const Deadline past(milliseconds(-5));
  EXPECT_TRUE(past.passed());
  EXPECT_EQ(past.remaining(), milliseconds(0));
  const Deadline at(Clock::now() + seconds(10));
  EXPECT_LE(at.remaining(), seconds(10));
  // A resolver that answers at once that the name does not exist: no real name server is asked,
  // and the deadline leaves the lookup's thread time to start on a loaded machine (one that
  // answers after the deadline makes this a Timeout).
  const ScopedFlakyResolver resolver(-1, EAI_NONAME);
  EXPECT_THROW(
      (Client{ClientOptions{"no.such.host.invalid", 1, std::nullopt}, milliseconds(kPrompt)}),
      InvalidArgument);
}

TEST(Store, TheExtremeTimePointsAreDeadlinesToo) {
  // time_point::min() once looked hours away to remaining() (its distance to now overflowed),
  // so a get under it blocked; max() is never, through the client's grace as well.
  const Deadline earliest(Clock::time_point::min());
  EXPECT_TRUE(earliest.passed());
  EXPECT_EQ(earliest.remaining(), milliseconds(0));
  const Deadline latest(Clock::time_point::max());
  EXPECT_FALSE(latest.passed());
  EXPECT_GT(latest.remaining(), std::chrono::hours(24 * 365));
  Server server;
  auto client = connect(server);
  const auto start = Clock::now();
  EXPECT_THROW(client->get("never-set", earliest), Timeout);
  EXPECT_LT(Clock::now() - start, kPrompt);
  // A blocking call under a passed deadline is still sent, and answered by the server (Timeout
  // above, or the value when the key is there): the connection stays usable.
  client->set("here", "1");
  EXPECT_EQ(client->get("here", earliest), "1");
  EXPECT_EQ(client->get("here", latest), "1");
}

TEST(Store, KeysThatTimedOutAreNotKeptForever) {
  // Every get below times out on a key nobody sets: the server keeps no list for those keys
  // beyond the next sweep (it once kept one per distinct key, without bound).
  Server server;
  auto client = connect(server);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_THROW(client->get("never-" + std::to_string(i), milliseconds(0)), Timeout);
  }
  EXPECT_EQ(server.waiting(), 0U);
  EXPECT_LE(server.waited_keys(), 64U);
  EXPECT_EQ(client->num_keys(), 0);
}

// The parser's checks that no client or server here trips, on bodies built by hand.
std::vector<std::uint8_t> bytes_of(std::string_view text) {
  return std::vector<std::uint8_t>(text.begin(), text.end());
}

template <class Parse>
std::string protocol_error_of(Parse parse) {
  try {
    parse();
  } catch (const detail::ProtocolError& error) {
    return error.what();
  }
  return "no ProtocolError";
}

// A list's count is checked against the bytes left before any item is read (or room reserved for
// it): each key takes at least its 4-byte length word.
TEST(Store, AListCountTheBodyCannotHoldIsRefusedBeforeItsItems) {
  std::string body("\x09", 1);           // multi_get
  body += std::string(8, '\0');          // 0 ms
  body += std::string("\x02\0\0\0", 4);  // two keys
  body += std::string("\x00\0\0\0", 4);  // room for one empty key, not two
  EXPECT_EQ(protocol_error_of([&] { (void)detail::parse_request(bytes_of(body)); }),
            "at offset 13: key count 2 exceeds the body");
}

// A compare_set's presence flag and a delete_key's existence flag are 0 or 1.
TEST(Store, AnAnswersFlagAboveOneIsRefused) {
  EXPECT_EQ(protocol_error_of([] {
              (void)detail::parse_response(detail::Op::CompareSet,
                                           bytes_of(std::string("\0\x02", 2)));
            }),
            "at offset 2: presence flag 2");
  EXPECT_EQ(protocol_error_of([] {
              (void)detail::parse_response(detail::Op::DeleteKey,
                                           bytes_of(std::string("\0\x02", 2)));
            }),
            "at offset 2: existence flag 2");
  EXPECT_EQ(
      detail::parse_response(detail::Op::DeleteKey, bytes_of(std::string("\0\x01", 2))).number, 1);
}

}  // namespace
}  // namespace chorus::store
