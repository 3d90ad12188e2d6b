// The store server's memory (Note [Store memory] in transports/store/src/server.cpp): a frame's
// header commits no memory for bytes that have not arrived, and an allocation that fails in a
// handler closes that session only, never the server. Its own executable: it replaces the global
// operator new, to see and refuse the allocations of the server's thread.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chorus/error.hpp>
#include <chorus/store/store.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "support/refusing_new.hpp"

namespace {

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

// Set on the tests' own thread. The clients are blocking and run on it; the only other thread
// is the server's, so an allocation made elsewhere is the server's.
thread_local bool on_test_thread = false;
// The largest allocation the server's thread made.
std::atomic<std::size_t> server_allocation_bytes_max{0};
// The server's allocations of at least this many bytes are refused (kNone: none is).
std::atomic<std::size_t> refuse_server_allocations_from{kNone};
// The server's next allocation of exactly this many bytes is refused (kNone: none is).
std::atomic<std::size_t> refuse_next_server_allocation_of{kNone};
// The server's allocations refused so far.
std::atomic<int> server_allocations_refused{0};

}  // namespace

bool chorus::testing::refuse_allocation(std::size_t size) noexcept {
  if (on_test_thread) {
    return false;
  }
  std::size_t largest = server_allocation_bytes_max.load();
  while (size > largest && !server_allocation_bytes_max.compare_exchange_weak(largest, size)) {
  }
  std::size_t exact = size;
  if (size >= refuse_server_allocations_from.load() ||
      refuse_next_server_allocation_of.compare_exchange_strong(exact, kNone)) {
    server_allocations_refused.fetch_add(1);
    return true;
  }
  return false;
}

namespace chorus::store {
namespace {

using std::chrono::seconds;

// Far longer than anything here should take: a deadline that only a hang reaches.
constexpr seconds kHang{60};
// The chunk the server reads a body in (docs/store.md, "How it works").
constexpr std::size_t kBodyChunkBytes = std::size_t{64} << 10;

class StoreOutOfMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    on_test_thread = true;
    server_allocation_bytes_max = 0;
    refuse_server_allocations_from = kNone;
    refuse_next_server_allocation_of = kNone;
    server_allocations_refused = 0;
  }
  void TearDown() override {
    refuse_server_allocations_from = kNone;
    refuse_next_server_allocation_of = kNone;
  }

  std::unique_ptr<Client> connect() const {
    ClientOptions options;
    options.port = server_.port();
    return std::make_unique<Client>(options, kHang);
  }

  // Polls (no sleep) until the server holds `count` connections; fails the test at kHang.
  void expect_connections(std::size_t count) const {
    const Deadline deadline(kHang);
    while (server_.connections() != count) {
      ASSERT_FALSE(deadline.passed())
          << "the server still holds " << server_.connections() << " connections, not " << count;
      std::this_thread::yield();
    }
  }

  // Polls (no sleep) until `count` clients wait for keys; fails the test at kHang.
  void expect_waiting(std::size_t count) const {
    const Deadline deadline(kHang);
    while (server_.waiting() != count) {
      ASSERT_FALSE(deadline.passed())
          << server_.waiting() << " clients wait for keys, not " << count;
      std::this_thread::yield();
    }
  }

  Server server_;
};

// Runs `call` on a thread of its own whose allocations count as the test's, not the server's.
template <class Call>
std::future<void> on_own_thread(Call call) {
  return std::async(std::launch::async, [call = std::move(call)] {
    on_test_thread = true;
    call();
  });
}

// How a blocked call ended: "answered", or the name of the error it threw.
std::string outcome(std::future<void>& call) {
  try {
    call.get();
    return "answered";
  } catch (const TransportError&) {
    return "TransportError";
  } catch (const Timeout&) {
    return "Timeout";
  } catch (const std::exception& error) {
    return std::string("another error: ") + error.what();
  }
}

std::string frame_header(std::uint32_t bytes) {
  std::string header(4, '\0');
  for (int i = 0; i < 4; ++i) {
    header[static_cast<std::size_t>(i)] = static_cast<char>((bytes >> (8 * i)) & 0xff);
  }
  return header;
}

// A frame's body length from its 4-byte little-endian header.
std::size_t frame_length(const char* header) {
  std::size_t length = 0;
  for (int i = 3; i >= 0; --i) {
    length = (length << 8) | static_cast<unsigned char>(header[i]);
  }
  return length;
}

// A valid hello (version 1, no token), as docs/store.md spells it.
std::string hello_frame() {
  std::string body;
  body += '\x01';                              // Op::Hello
  body += std::string("CHST", 4);              // magic
  body += std::string("\x01\x00", 2);          // version 1
  body += std::string("\x00\x00\x00\x00", 4);  // empty token
  return frame_header(static_cast<std::uint32_t>(body.size())) + body;
}

TEST_F(StoreOutOfMemory, AFrameIsBufferedOnlyAsItsBytesArrive) {
  auto bystander = connect();
  bystander->set("k", "v");
  {
    // Says hello, claims a frame of the whole limit (64 MiB), sends 1000 bytes of it and stops:
    // the server sees the end of the connection mid-body and closes it.
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(server_.port());
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    const std::string hello = hello_frame();
    ASSERT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(hello.size()));
    // The answer: the session is there (connections() counts it) until it closes.
    char answer[64];
    std::size_t answered = 0;
    while (answered < 4 || answered < 4 + frame_length(answer)) {
      const ssize_t n = ::recv(fd, answer + answered, sizeof answer - answered, 0);
      ASSERT_GT(n, 0) << "the server closed the connection instead of answering its hello";
      answered += static_cast<std::size_t>(n);
    }
    const std::string bytes =
        frame_header(static_cast<std::uint32_t>(std::size_t{64} << 20)) + std::string(1000, 'x');
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    ASSERT_EQ(::shutdown(fd, SHUT_WR), 0);
    expect_connections(1);
    ::close(fd);
  }
  // The first chunk of the body, not the 64 MiB its header claimed, is the largest thing the
  // server allocated.
  EXPECT_EQ(server_allocation_bytes_max.load(), kBodyChunkBytes);
  EXPECT_EQ(bystander->get("k"), "v");
  EXPECT_EQ(connect()->get("k"), "v");
}

TEST_F(StoreOutOfMemory, ABodyGrowsToItsFrameAndNoFurther) {
  // 32 chunks and a bit: growing by doubling, as a plain resize does, would reserve 4 MiB for
  // the last bytes. The buffer doubles but stops at the frame; the value the server keeps is a
  // copy of the same size.
  auto client = connect();
  const std::string value((std::size_t{2} << 20) + 100, 'v');
  client->set("big", value);
  EXPECT_EQ(client->get("big"), value);
  EXPECT_GE(server_allocation_bytes_max.load(), value.size());
  EXPECT_LT(server_allocation_bytes_max.load(), value.size() + kBodyChunkBytes);
}

TEST_F(StoreOutOfMemory, AnAllocationThatFailsWhileABodyArrivesClosesOnlyThatSession) {
  auto bystander = connect();
  bystander->set("k", "v");
  const std::string value(std::size_t{2} << 20, 'x');
  // The body's buffer grows a chunk at a time; its growth to 1 MiB fails.
  refuse_server_allocations_from = std::size_t{1} << 20;
  auto victim = connect();
  EXPECT_THROW(victim->set("big", value), TransportError);
  EXPECT_EQ(server_allocations_refused.load(), 1);
  refuse_server_allocations_from = kNone;
  expect_connections(1);
  EXPECT_EQ(bystander->get("k"), "v");
  bystander->set("big", value);
  EXPECT_EQ(connect()->get("big"), value);
}

TEST_F(StoreOutOfMemory, AnAllocationThatFailsWhileARequestIsParsedClosesOnlyThatSession) {
  auto bystander = connect();
  bystander->set("k", "v");
  // The parsed value's string (its bytes and a terminating NUL): no buffer of the body, which
  // grows by powers of two from one chunk, is of that size.
  const std::string value(300'000, 'y');
  refuse_next_server_allocation_of = value.size() + 1;
  auto victim = connect();
  EXPECT_THROW(victim->set("parsed", value), TransportError);
  EXPECT_EQ(server_allocations_refused.load(), 1);
  expect_connections(1);
  EXPECT_EQ(bystander->get("k"), "v");
  bystander->set("parsed", value);
  EXPECT_EQ(connect()->get("parsed"), value);
}

TEST_F(StoreOutOfMemory, AGroupWhoseAnswerCannotBeAllocatedEndsEveryWaitAtOnce) {
  // Three clients wait for the same key: one wait group, answered by one encoded frame
  // (finish_group in server.cpp). Its allocation fails. Every waiter must learn it at once (its
  // connection closed: TransportError), not at its own deadline (kHang: Timeout), which is what
  // it did when the exception closed only the writer's session.
  constexpr int kWaiters = 3;
  const std::string value(300'000, 'v');
  std::vector<std::unique_ptr<Client>> waiters;
  std::vector<std::future<void>> calls;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(connect());
    calls.push_back(on_own_thread([&waiter = *waiters.back()] { waiter.get("key", kHang); }));
  }
  expect_waiting(kWaiters);
  // The set's body is the value and 12 bytes (the opcode, the key and two lengths), the answer's
  // frame the value and 24 (its header, status, length and the encoder's slack): while the set
  // runs, the answer is the server's only allocation this large.
  refuse_server_allocations_from = value.size() + 20;
  auto writer = connect();
  writer->set("key", value);
  for (std::future<void>& call : calls) {
    EXPECT_EQ(outcome(call), "TransportError");
  }
  refuse_server_allocations_from = kNone;
  EXPECT_EQ(server_allocations_refused.load(), 1);
  EXPECT_EQ(server_.waiting(), 0U);
  // The writer's request succeeded and its session is not the one to blame: it stays usable.
  EXPECT_EQ(writer->get("key"), value);
  expect_connections(1);
  EXPECT_EQ(connect()->get("key"), value);
}

TEST_F(StoreOutOfMemory, AGroupThatCannotBeRegisteredUnderItsNextKeyEndsEveryWaitAtOnce) {
  // Three clients wait for the same two keys: one wait group, registered under "first". When
  // "first" is written the group moves on to the second key and registers itself under it; the
  // copy of that key (long, so not in the string's inline buffer) fails. The group is then
  // registered nowhere: every waiter must learn it at once (TransportError), not at its own
  // deadline (Timeout), which is what it did when the exception closed only the writer's session.
  constexpr int kWaiters = 3;
  const std::vector<std::string> keys = {"first", std::string(1000, 's')};
  std::vector<std::unique_ptr<Client>> waiters;
  std::vector<std::future<void>> calls;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(connect());
    calls.push_back(
        on_own_thread([&waiter = *waiters.back(), &keys] { waiter.wait(keys, kHang); }));
  }
  expect_waiting(kWaiters);
  // Writing "first" (a frame of a few bytes) allocates nothing else this large.
  refuse_server_allocations_from = keys[1].size() + 1;
  auto writer = connect();
  writer->set("first", "1");
  for (std::future<void>& call : calls) {
    EXPECT_EQ(outcome(call), "TransportError");
  }
  refuse_server_allocations_from = kNone;
  EXPECT_EQ(server_allocations_refused.load(), 1);
  EXPECT_EQ(server_.waiting(), 0U);
  EXPECT_EQ(writer->get("first"), "1");
  expect_connections(1);
  auto late = connect();
  late->set(keys[1], "2");
  late->wait(keys, kHang);
}

}  // namespace
}  // namespace chorus::store
