#pragma once

// chorus::launch_environment — who this process is in a multi-process job, read from the
// environment its launcher set: `chorus launch` and torchrun (RANK, WORLD_SIZE, ...), Open MPI's
// mpirun (OMPI_COMM_WORLD_*) or Slurm's srun (SLURM_PROCID, ...). See docs/launch.md.
//
//   const chorus::LaunchEnvironment env = chorus::launch_environment();
//   if (env.found()) { ... env.rank, env.world_size, env.master_addr ... }

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace chorus {

// Which launcher's variables were read.
enum class LaunchSource : std::uint8_t {
  None,      // no launcher variables: a single process (rank 0 of 1)
  Torchrun,  // RANK WORLD_SIZE [LOCAL_RANK LOCAL_WORLD_SIZE]: torchrun and `chorus launch`
  OpenMpi,   // OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE [OMPI_COMM_WORLD_LOCAL_RANK
             //  OMPI_COMM_WORLD_LOCAL_SIZE]
  Slurm,     // SLURM_PROCID SLURM_STEP_NUM_TASKS|SLURM_NTASKS [SLURM_LOCALID], in an srun
             //  step only
};

// "none", "torchrun", "openmpi", "slurm".
std::string_view name(LaunchSource source) noexcept;

struct LaunchEnvironment {
  LaunchSource source = LaunchSource::None;
  // 0 <= rank < world_size.
  int rank = 0;
  int world_size = 1;
  // The rank among the processes of this node (picks the GPU). Equal to `rank` when the source
  // does not say (one node assumed).
  int local_rank = 0;
  // Processes on this node, when the source says (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE).
  std::optional<int> local_world_size;
  // Where the rendezvous store listens: MASTER_ADDR and MASTER_PORT, read whatever the source
  // (under Slurm or mpirun the job script exports them).
  std::optional<std::string> master_addr;
  std::optional<std::uint16_t> master_port;

  bool found() const noexcept { return source != LaunchSource::None; }
};

// Looks a variable up: nullptr when unset (the contract of std::getenv).
using GetEnv = std::function<const char*(const char* name)>;

// Reads the launch environment through `getenv` (std::getenv when empty). Precedence, first
// match wins, each source chosen by the presence of its rank or size variable:
//   1. RANK / WORLD_SIZE (torchrun, `chorus launch`) — the most specific: a torchrun started
//      inside a Slurm or mpirun job sets them for its own children;
//   2. OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE — mpirun inside a Slurm allocation describes
//      the processes it started, while the SLURM_* variables describe the batch step;
//   3. SLURM_PROCID / SLURM_STEP_NUM_TASKS (SLURM_NTASKS when unset), read only inside an srun
//      step (SLURM_STEP_ID or SLURM_STEPID set): a batch script outside srun sees SLURM_PROCID=0
//      and SLURM_NTASKS of the whole allocation, and is one process, not rank 0 of N.
// Integers are plain decimal (no sign, no spaces). Throws InvalidArgument naming the variable
// when a value is malformed or out of range (rank outside [0, world_size), world_size < 1,
// local rank outside [0, local world size), a port outside 1..65535), when a source's rank is
// set without its size or the other way round, or when its local world size is set without its
// local rank. Never blocks; thread-safe when `getenv` is.
LaunchEnvironment launch_environment(const GetEnv& getenv = {});

// The rank and world size that `chorus launch` or torchrun gave this process.
struct TorchrunRank {
  int rank = 0;  // 0 <= rank < world_size
  int world_size = 1;
};

// Reads RANK and WORLD_SIZE through `getenv` (std::getenv when empty) and no other variable: for
// a caller that only needs to know whether `chorus launch` or torchrun started this process
// (chorus::run refusing --transport=mpi there), so that a variable it never uses, a
// MASTER_PORT=0 say, cannot fail it. These two come first in launch_environment()'s precedence,
// so when they are set its source is Torchrun with this rank and world size. std::nullopt when
// neither is set. Throws InvalidArgument naming the variable as launch_environment() does for
// these two: a malformed or out-of-range value, or one set without the other. Never blocks;
// thread-safe when `getenv` is.
std::optional<TorchrunRank> torchrun_rank(const GetEnv& getenv = {});

}  // namespace chorus
