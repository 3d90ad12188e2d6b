#pragma once

// chorus::mpi — the MPI transport (docs/mpi.md). One MPI process is one chorus rank; the world is
// MPI_COMM_WORLD. Users reach it through chorus::run with --transport=mpi under mpirun; this
// header is for the launcher and for tests. It does not include <mpi.h>.

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "chorus/dtype.hpp"
#include "chorus/reduce_op.hpp"

namespace chorus::mpi {

// How a (dtype, reduction) pair is carried out on MPI, for documentation and tests; computed
// without calling MPI. Names are MPI's ("MPI_FLOAT", "MPI_SUM"), or "chorus_fp16_max" for the
// user-defined operations chorus registers where MPI has none (or where MPI's differs: NaN
// propagation of float min/max).
struct Mapping {
  std::string datatype;  // the MPI datatype the elements travel as
  std::string op;        // the MPI_Op, or a chorus user-defined op name
  bool user_op = false;  // op is a chorus user-defined MPI_Op (MPI_Op_create)
  // avg: the transport sums, then divides every result element by the group size (integers
  // truncate toward zero, as chorus::kernels do).
  bool divide_after = false;
  // premul_sum(f): the transport sums a scaled copy (f * x, rounded to the dtype) of the input.
  bool scale_input = false;
  // Float16 and BFloat16 sum, avg, premul_sum and product: the elements travel as MPI_FLOAT
  // (each rank's input widened, f * x taken in float), and the result is divided (avg) and
  // rounded to the dtype once, as the simulator's kernels do; reducing the 16-bit values
  // themselves would round at every step (an avg of 60000s overflowed to inf). Twice the bytes.
  bool widened = false;
};

// The mapping of `reduce_op` on `dtype`. `reduce_op` must be valid for `dtype`
// (ReduceOp::check_dtype); throws InvalidArgument otherwise. Never blocks; thread-safe.
Mapping describe_mapping(DType dtype, const ReduceOp& reduce_op);

// Whether this process was started by an MPI launcher, for chorus::run's hint when such a
// process runs the simulator (each process would simulate a world of its own; docs/mpi.md,
// "Environment variables"): one of these is set, each by launchers of MPI processes only:
// OMPI_COMM_WORLD_SIZE (Open MPI's mpirun), PMI_SIZE (PMI-1 and PMI-2 launchers: MPICH's and
// Intel MPI's Hydra mpiexec, srun --mpi=pmi2), PMIX_RANK (PMIx launchers: Open MPI 5's prterun,
// srun --mpi=pmix), MPI_LOCALNRANKS (Hydra's count of ranks on the node, which it sets beside
// its PMI variables). Only read: --transport=mpi asks MPI for the rank. Thread-safe.
bool launched_by_mpi() noexcept;

// Who schedules all_reduce, reduce_scatter, all_gather and all_to_all (docs/mpi.md, "chorus's
// own schedules").
enum class MpiSchedule {
  // chorus's schedules from kChorusScheduleMinBytes up to kChorusScheduleMaxBytes per rank
  // (all_to_all at every size: ranks' totals differ, and all must choose alike) on groups of two
  // or more, and below kChorusScheduleMinBytes one-round direct exchanges (all_reduce included)
  // on groups of two to kSmallDirectMaxRanks ranks, when every node runs no more ranks than it
  // has CPUs; MPI's nonblocking collectives otherwise. The environment variable
  // CHORUS_MPI_SCHEDULE (auto, mpi or chorus) replaces Auto.
  Auto,
  // Always MPI's nonblocking collectives (MPI_Iallreduce, ...: Open MPI's coll/libnbc).
  Mpi,
  // chorus's schedules over MPI_Isend/MPI_Irecv on every group of two or more ranks: a ring
  // all_reduce, and direct exchanges for reduce_scatter (reduced in rank order), all_gather and
  // all_to_all. Each result element is reduced at one rank, so every rank gets the same bits.
  // A ring chunk over 2^31-1 bytes makes that all_reduce fall back to MPI_Iallreduce (the same
  // on every rank); direct exchanges send element counts, which are ints already.
  Chorus,
};

// Auto's range for chorus's schedules, in bytes of one rank's larger buffer.
inline constexpr std::size_t kChorusScheduleMinBytes = std::size_t{4} << 10;
inline constexpr std::size_t kChorusScheduleMaxBytes = std::size_t{16} << 20;
// Auto's largest group for direct exchanges below kChorusScheduleMinBytes: one round of n - 1
// messages each way per rank, where MPI's small-message algorithms take log2(n) rounds.
inline constexpr int kSmallDirectMaxRanks = 8;

// "auto", "mpi", "chorus".
std::string_view schedule_name(MpiSchedule schedule) noexcept;
// The schedule named `name` (as schedule_name gives it); throws InvalidArgument naming the
// accepted names otherwise.
MpiSchedule parse_schedule(std::string_view name);

struct MpiRunOptions {
  // How long a wait (and a communicator's set-up) may take before it throws Timeout.
  std::chrono::nanoseconds timeout = std::chrono::minutes(10);
  // Before each operation, its group's members compare what they issued (docs/mpi.md,
  // "Checking collectives"): CollectiveMismatch on every rank instead of MPI's truncation error
  // or a hang. One to three small extra collectives per operation: for debugging.
  bool check_collectives = false;
  // Bytes of freed host storage each rank keeps for reuse (RankOptions::host_pool_bytes_max).
  // Outputs larger than this come fresh from the heap every time, paying first touch of every
  // page; `chorus bench` raises it to keep its largest outputs.
  std::size_t host_pool_bytes_max = std::size_t{64} << 20;
  // Who schedules the collectives; Auto also reads CHORUS_MPI_SCHEDULE.
  MpiSchedule schedule = MpiSchedule::Auto;
  // The CPUs of each node, against which Auto and waits decide whether a node is oversubscribed
  // (Note [Wait backoff]): 0 counts them (std::thread::hardware_concurrency, every online CPU,
  // which a container's CPU quota does not lower), or reads CHORUS_MPI_NODE_CPUS (a positive
  // integer) when that is set.
  int node_cpus = 0;
};

// Runs `rank_main` as this process's rank (chorus::run with transport "mpi" calls this):
// initialises MPI (MPI_THREAD_SERIALIZED or better; every MPI call chorus makes holds one
// per-process lock, so any thread may wait on a Work), binds a RankContext whose waits time out
// after `options.timeout`, runs the rank function, finishes the rank (completing leftover works,
// printing unwaited ones to stderr prefixed by the rank), and finalises MPI if it initialised
// it. Collective over MPI_COMM_WORLD: every process of the job calls it.
//
// Returns 0 when the rank succeeded. When the rank function throws, or finishing the rank raises
// a deferred error, prints "chorus: rank R of N failed: <error>" and the abort notice to stderr
// and calls MPI_Abort(MPI_COMM_WORLD, 1): every other rank of the job ends too (mpirun exits
// non-zero) instead of hanging in a collective the failed rank will never join. Does not return
// in that case. Throws TransportError if MPI cannot start.
int run(const MpiRunOptions& options, std::function<void()> rank_main);

}  // namespace chorus::mpi
