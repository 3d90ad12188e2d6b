// chorus::mpi::run — one MPI process as one chorus rank (chorus/mpi/mpi.hpp).

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/error.hpp"
#include "chorus/mpi/mpi.hpp"
#include "chorus/runtime.hpp"
#include "mpi_transport.hpp"

namespace chorus::mpi {
namespace detail {

void abort_job(MpiProcess& process, const std::string& what) {
  const int rank = process.rank();
  const int world_size = process.world_size();
  std::fprintf(stderr,
               "chorus: rank %d of %d failed: %s\n"
               "chorus: aborting the MPI job (MPI_Abort) so no other rank waits for rank %d\n",
               rank, world_size, what.c_str(), rank);
  std::fflush(stderr);
  std::fflush(stdout);
  // Note [MPI locking], unless another thread keeps the lock (Note [Aborting under the lock]).
  std::unique_lock mpi_lock(process.mutex(), std::defer_lock);
  const auto give_up = std::chrono::steady_clock::now() + kAbortLockWait;
  while (!mpi_lock.try_lock()) {
    if (std::chrono::steady_clock::now() >= give_up) {
      std::fprintf(stderr,
                   "chorus: rank %d: another thread holds the MPI lock (inside a blocking MPI "
                   "call?); aborting without it\n",
                   rank);
      std::fflush(stderr);
      // MPI_Abort beside that thread breaks the thread level: a watchdog ends this process
      // should it not return or end; without one (no thread to be had), std::abort at once.
      try {
        std::thread([rank] {
          std::this_thread::sleep_for(kAbortCallWait);
          std::fprintf(stderr,
                       "chorus: rank %d: MPI_Abort did not end the process within %lld ms; "
                       "ending it with std::abort\n",
                       rank, static_cast<long long>(kAbortCallWait.count()));
          std::fflush(stderr);
          std::abort();
        }).detach();
      } catch (...) {
        std::abort();
      }
      break;
    }
    std::this_thread::yield();
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; if it did, end this process anyway
}

}  // namespace detail

namespace {

using detail::abort_job;

// Like the simulator's report: the first kUnwaitedListedMax, then a count.
void report_unwaited(const std::vector<UnwaitedWork>& unwaited) {
  constexpr std::size_t kUnwaitedListedMax = 16;
  for (std::size_t i = 0; i < unwaited.size() && i < kUnwaitedListedMax; ++i) {
    std::fprintf(stderr, "chorus: %s\n", unwaited[i].to_string().c_str());
  }
  if (unwaited.size() > kUnwaitedListedMax) {
    std::fprintf(stderr, "chorus: rank %d: ... and %zu more works never waited (%zu in all)\n",
                 unwaited.front().rank, unwaited.size() - kUnwaitedListedMax, unwaited.size());
  }
}

// options.schedule, with Auto replaced by CHORUS_MPI_SCHEDULE when that is set.
MpiSchedule resolve_schedule(const MpiRunOptions& options) {
  if (options.schedule != MpiSchedule::Auto) {
    return options.schedule;
  }
  const char* name = std::getenv("CHORUS_MPI_SCHEDULE");  // NOLINT(concurrency-mt-unsafe)
  return name == nullptr ? MpiSchedule::Auto : parse_schedule(name);
}

// options.node_cpus, with 0 replaced by CHORUS_MPI_NODE_CPUS when that is set; 0: count them.
int resolve_node_cpus(const MpiRunOptions& options) {
  const auto refuse = [](const std::string& what) {
    throw InvalidArgument(ErrorContext{-1, "chorus::mpi::run", -1, ""}, what);
  };
  if (options.node_cpus < 0) {
    refuse("MpiRunOptions::node_cpus is " + std::to_string(options.node_cpus) +
           ": expected a positive CPU count, or 0 to count them");
  }
  if (options.node_cpus > 0) {
    return options.node_cpus;
  }
  const char* text = std::getenv("CHORUS_MPI_NODE_CPUS");  // NOLINT(concurrency-mt-unsafe)
  if (text == nullptr) {
    return 0;
  }
  const std::string_view value(text);
  int cpus = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), cpus);
  if (error != std::errc() || end != value.data() + value.size() || cpus <= 0) {
    refuse("CHORUS_MPI_NODE_CPUS is '" + std::string(value) + "': expected a positive CPU count");
  }
  return cpus;
}

// The largest count chorus passes MPI as an int (Note [MPI int counts]): INT_MAX, unless the
// test seam CHORUS_MPI_INT_COUNT_MAX lowers it, so tests reach the limits with small buffers.
int resolve_int_count_max() {
  const char* text = std::getenv("CHORUS_MPI_INT_COUNT_MAX");  // NOLINT(concurrency-mt-unsafe)
  if (text == nullptr) {
    return std::numeric_limits<int>::max();
  }
  const std::string_view value(text);
  int count_max = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), count_max);
  if (error != std::errc() || end != value.data() + value.size() || count_max <= 0) {
    throw InvalidArgument(ErrorContext{-1, "chorus::mpi::run", -1, ""},
                          "CHORUS_MPI_INT_COUNT_MAX is '" + std::string(value) +
                              "': expected a positive count no larger than 2^31-1");
  }
  return count_max;
}

// Whether finished Starteds are recycled (Note [Recycled Started]): yes, unless the test seam
// CHORUS_MPI_RECYCLE_STARTED=0 turns it off, so that an out-of-memory sweep refuses the
// allocations recycling saves (mpi.out_of_memory_test.*.fresh).
bool resolve_recycles() {
  const char* text = std::getenv("CHORUS_MPI_RECYCLE_STARTED");  // NOLINT(concurrency-mt-unsafe)
  if (text == nullptr) {
    return true;
  }
  const std::string_view value(text);
  if (value != "0" && value != "1") {
    throw InvalidArgument(
        ErrorContext{-1, "chorus::mpi::run", -1, ""},
        "CHORUS_MPI_RECYCLE_STARTED is '" + std::string(value) + "': expected 0 or 1");
  }
  return value == "1";
}

}  // namespace

std::string_view schedule_name(MpiSchedule schedule) noexcept {
  switch (schedule) {
    case MpiSchedule::Auto:
      return "auto";
    case MpiSchedule::Mpi:
      return "mpi";
    case MpiSchedule::Chorus:
      return "chorus";
  }
  return "auto";
}

MpiSchedule parse_schedule(std::string_view name) {
  for (const MpiSchedule schedule : {MpiSchedule::Auto, MpiSchedule::Mpi, MpiSchedule::Chorus}) {
    if (name == schedule_name(schedule)) {
      return schedule;
    }
  }
  throw InvalidArgument(ErrorContext{-1, "chorus::mpi::run", -1, ""},
                        "unknown MPI schedule '" + std::string(name) +
                            "' (CHORUS_MPI_SCHEDULE): expected auto, mpi or chorus");
}

bool launched_by_mpi() noexcept {
  // Which launcher sets each: the declaration (chorus/mpi/mpi.hpp).
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(name) != nullptr) {  // NOLINT(concurrency-mt-unsafe): read-only use
      return true;
    }
  }
  return false;
}

int run(const MpiRunOptions& run_options, std::function<void()> rank_main) {
  const MpiSchedule schedule = resolve_schedule(run_options);
  const int node_cpus = resolve_node_cpus(run_options);
  const int int_count_max = resolve_int_count_max();
  const bool recycles = resolve_recycles();
  auto process = std::make_shared<detail::MpiProcess>(node_cpus, int_count_max, recycles);
  {
    RankOptions options;
    options.timeout = run_options.timeout;
    options.host_pool_bytes_max = run_options.host_pool_bytes_max;
    std::shared_ptr<detail::MpiTransport> transport;
    try {
      transport = std::make_shared<detail::MpiTransport>(process, run_options.timeout,
                                                         run_options.check_collectives, schedule);
    } catch (...) {
      // The ranks disagree on the schedule: every rank found it (the comparison is collective),
      // and every rank ends the job the way a failed rank does.
      abort_job(*process, describe(std::current_exception()));
    }
    RankContext context(transport, options);
    const ScopedRankBinding binding(&context);
    std::exception_ptr error;
    try {
      rank_main();
    } catch (...) {
      error = std::current_exception();
    }
    if (error) {
      // Do not finish the rank: its leftover works may wait on peers that wait on this rank.
      abort_job(*process, describe(error));
    }
    RankContext::Summary summary = context.finish();
    report_unwaited(summary.unwaited);
    if (summary.error) {
      abort_job(*process, describe(summary.error));
    }
  }
  // Every rank got here: the communicators are freed (with the context); finalise.
  process.reset();
  return 0;
}

}  // namespace chorus::mpi
