// mpi.abort_test (one rank under mpirun): a failed rank's abort while another thread of it holds
// the MPI lock, as a thread blocked in MPI_Comm_create_group for a member that never comes does
// (Note [Aborting under the lock] in transports/mpi/src/mpi_transport.hpp). The job must still
// end, naming the rank; until 2026-12-06 the abort waited for the lock for ever.

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "mpi_transport.hpp"

int main() {
  using chorus::mpi::detail::MpiProcess;
  auto process = std::make_shared<MpiProcess>();
  std::atomic<bool> held{false};
  std::promise<void> never;
  std::thread holder([&] {
    const std::lock_guard mpi_lock(process->mutex());
    held.store(true, std::memory_order_release);
    never.get_future().wait();  // stands for the blocking MPI call that never returns
  });
  while (!held.load(std::memory_order_acquire)) {
    std::this_thread::yield();
  }
  chorus::mpi::detail::abort_job(*process,
                                 "planted failure while another thread holds the MPI lock");
}
