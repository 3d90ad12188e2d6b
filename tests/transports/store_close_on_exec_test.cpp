// The store's socket calls, seen and steered through linker wrappers: this executable is linked
// with -Wl,--wrap=socket,--wrap=accept,--wrap=accept4 (its own executable, so no other test runs
// through the wrappers; chorus_store is a static library, so its calls, Boost.Asio's header code
// included, are wrapped too).
//
// Every socket of the store is close-on-exec from the call that creates it (Note [Store
// close-on-exec] in transports/store/src/server.cpp): a FD_CLOEXEC set by fcntl afterwards
// leaves a window in which another thread's fork+exec inherits the socket. That window cannot be
// hit on demand (its width is the time between two system calls), so StoreCloseOnExec checks
// the cause instead of the race: the flags every socket had when it was created.
// Store.EverySocketOfTheStoreIsClosedOnExec (store_test.cpp) checks the flags they end up with.
//
// The server accepts with accept4, whose failures (out of descriptors, a connection reset before
// it was accepted, a signal) cannot be caused on demand either: StoreAccept injects them.

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chorus/store/store.hpp>
#include <chrono>
#include <memory>
#include <string>

namespace {

// Sockets created (socket, accept, accept4) with and without SOCK_CLOEXEC, by any thread.
std::atomic<int> created_close_on_exec{0};
std::atomic<int> created_inheritable{0};

// The server's next accept4 calls fail with this errno, without accepting, while
// accept_failures_left is positive.
std::atomic<int> accept_failure_errno{0};
std::atomic<int> accept_failures_left{0};
std::atomic<int> accept_failures_injected{0};

void count(int socket_fd, bool close_on_exec) {
  if (socket_fd >= 0) {
    (close_on_exec ? created_close_on_exec : created_inheritable).fetch_add(1);
  }
}

}  // namespace

// The linker sends this executable's calls of socket, accept and accept4 here, and __real_* to
// the C library's.
extern "C" {
int __real_socket(int domain, int type, int protocol);
int __real_accept(int fd, sockaddr* address, socklen_t* length);
int __real_accept4(int fd, sockaddr* address, socklen_t* length, int flags);

int __wrap_socket(int domain, int type, int protocol) {
  const int socket_fd = __real_socket(domain, type, protocol);
  count(socket_fd, (type & SOCK_CLOEXEC) != 0);
  return socket_fd;
}

int __wrap_accept(int fd, sockaddr* address, socklen_t* length) {
  const int socket_fd = __real_accept(fd, address, length);
  count(socket_fd, false);  // accept cannot ask for close-on-exec
  return socket_fd;
}

int __wrap_accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  // Only the server's thread accepts: the decrement cannot race with another accept4.
  if (accept_failures_left.load() > 0) {
    accept_failures_left.fetch_sub(1);
    accept_failures_injected.fetch_add(1);
    errno = accept_failure_errno.load();
    return -1;
  }
  const int socket_fd = __real_accept4(fd, address, length, flags);
  count(socket_fd, (flags & SOCK_CLOEXEC) != 0);
  return socket_fd;
}
}

namespace chorus::store {
namespace {

// Far longer than anything here should take: a deadline that only a hang reaches.
constexpr std::chrono::seconds kHang{60};

TEST(StoreCloseOnExec, EverySocketOfTheStoreIsCreatedCloseOnExec) {
  created_close_on_exec = 0;
  created_inheritable = 0;
  Server server;
  ClientOptions options;
  options.port = server.port();
  auto first = std::make_unique<Client>(options, kHang);
  auto second = std::make_unique<Client>(options, kHang);
  // Each client's call is answered only once the server has accepted its connection.
  first->set("k", "v");
  EXPECT_EQ(second->get("k"), "v");
  // The listening socket, two accepted connections and the clients' two ends of them: the
  // wrappers were reached (the count proves it), and none of them was created inheritable.
  EXPECT_GE(created_close_on_exec.load(), 5);
  EXPECT_EQ(created_inheritable.load(), 0);
}

// accept4 fails with this errno a few times before it accepts the connection.
class StoreAccept : public ::testing::TestWithParam<int> {};

TEST_P(StoreAccept, AFailedAcceptIsRetriedAndTheConnectionServed) {
  // Whatever the failure (EMFILE and the like: retried after a pause; a connection gone before
  // it was accepted, EAGAIN: the next readiness is awaited; EINTR: retried at once), the pending
  // connection stays queued, and is accepted and served once accept4 succeeds again.
  constexpr int kFailures = 3;
  Server server;
  accept_failures_injected = 0;
  accept_failure_errno = GetParam();
  accept_failures_left = kFailures;
  ClientOptions options;
  options.port = server.port();
  Client client(options, kHang);  // returns once its hello is answered: accepted
  EXPECT_EQ(accept_failures_injected.load(), kFailures);
  client.set("k", "v");
  EXPECT_EQ(client.get("k"), "v");
  EXPECT_EQ(server.connections(), 1U);
}

std::string errno_name(const ::testing::TestParamInfo<int>& param) {
  switch (param.param) {
    case EMFILE:
      return "EMFILE";
    case ENFILE:
      return "ENFILE";
    case ENOBUFS:
      return "ENOBUFS";
    case ENOMEM:
      return "ENOMEM";
    case ECONNABORTED:
      return "ECONNABORTED";
    case EPROTO:
      return "EPROTO";
    case EAGAIN:
      return "EAGAIN";
    case EINTR:
      return "EINTR";
    default:
      return "errno" + std::to_string(param.param);
  }
}

INSTANTIATE_TEST_SUITE_P(Errors, StoreAccept,
                         ::testing::Values(EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED, EPROTO,
                                           EAGAIN, EINTR),
                         errno_name);

}  // namespace
}  // namespace chorus::store
