// mpi.abort_test (one rank under mpirun): a failed rank's abort while another thread of it holds
// the MPI lock, as a thread blocked in MPI_Comm_create_group for a member that never comes does
// (Note [Aborting under the lock] in transports/mpi/src/mpi_transport.hpp). The job must still
// end, naming the rank; until 2026-12-06 the abort waited for the lock for ever.

//
// mpi.abort_hang_test builds it with CHORUS_ABORT_TEST_MPI_ABORT_HANGS: its MPI_Abort, defined
// here through MPI's profiling interface (which lets a program replace MPI_X, PMPI_X staying the
// library's), never returns, as an MPI_Abort beside a thread inside MPI may not. The watchdog
// must end the process with std::abort; until 2026-12-07 the job never ended.

#include <mpi.h>

#include <atomic>
#include <cstdio>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "mpi_transport.hpp"

#if defined(CHORUS_ABORT_TEST_MPI_ABORT_HANGS)
extern "C" int MPI_Abort(MPI_Comm /*comm*/, int /*errorcode*/) {
  std::fputs("mpi.abort_hang_test: MPI_Abort called, never to return\n", stderr);
  std::fflush(stderr);
  std::promise<void> never;
  never.get_future().wait();
  return MPI_SUCCESS;
}
#endif

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
