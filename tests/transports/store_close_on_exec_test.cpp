// Every socket of the store is close-on-exec from the call that creates it (Note [Store
// close-on-exec] in transports/store/src/server.cpp): a FD_CLOEXEC set by fcntl afterwards
// leaves a window in which another thread's fork+exec inherits the socket. That window cannot be
// hit on demand (its width is the time between two system calls), so this test checks the cause
// instead of the race: it is linked with -Wl,--wrap=socket,--wrap=accept,--wrap=accept4 (its
// own executable, so no other test runs through the wrappers), and the wrappers below see the
// flags of every socket the store's code (a static library, so its calls are wrapped too,
// Boost.Asio's header code included) creates.
// Store.EverySocketOfTheStoreIsClosedOnExec (store_test.cpp) checks the flags the sockets end up
// with; this checks that they had them from the start.

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chorus/store/store.hpp>
#include <chrono>
#include <memory>

namespace {

// Sockets created (socket, accept, accept4) with and without SOCK_CLOEXEC, by any thread.
std::atomic<int> created_close_on_exec{0};
std::atomic<int> created_inheritable{0};

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

}  // namespace
}  // namespace chorus::store
