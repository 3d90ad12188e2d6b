#pragma once

// chorus::run --transport=nccl: the NCCL transport's Environment from the launch environment
// (<chorus/launch_environment.hpp>), so a rank started by srun or mpirun finds its rank and world
// size in SLURM_* or OMPI_COMM_WORLD_* and not only in torchrun's RANK/WORLD_SIZE. Internal to
// chorus::launch (run.cpp); tests/transports/nccl_test.cpp includes it too. Needs no CUDA device.

#include <string>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/launch_environment.hpp"
#include "chorus/nccl/nccl.hpp"

namespace chorus::detail {

// What the job script of `source` does to give the store an address, for the error below.
inline std::string master_hint(LaunchSource source) {
  switch (source) {
    case LaunchSource::OpenMpi:
      return "under Open MPI's mpirun, export MASTER_ADDR and MASTER_PORT in the job script "
             "(rank 0's host and a free port there; `mpirun -x MASTER_ADDR -x MASTER_PORT` "
             "passes them to ranks on other nodes)";
    case LaunchSource::Slurm:
      return "under Slurm's srun, export MASTER_ADDR and MASTER_PORT in the job script (the "
             "first host of `scontrol show hostnames \"$SLURM_JOB_NODELIST\"` and a free port)";
    default:
      return "chorus launch and torchrun set both; a job that sets RANK and WORLD_SIZE itself "
             "must set MASTER_ADDR and MASTER_PORT too";
  }
}

// The rank, world size, local rank (which picks the CUDA device) and store address of a process
// whose launcher was recognised (`launch.found()`). Throws InvalidArgument naming MASTER_ADDR
// and/or MASTER_PORT, the launcher and what its job script should export when they are unset:
// every rank meets at the store rank 0 hosts there (Note [NCCL store]). Never blocks.
inline nccl::Environment nccl_environment(const LaunchEnvironment& launch) {
  CHORUS_CHECK(launch.found());
  std::string missing;
  if (!launch.master_addr) {
    missing = "MASTER_ADDR";
  }
  if (!launch.master_port) {
    missing += missing.empty() ? "MASTER_PORT" : " and MASTER_PORT";
  }
  if (!missing.empty()) {
    const bool both = !launch.master_addr && !launch.master_port;
    throw InvalidArgument(
        ErrorContext{launch.rank, "chorus::run", -1, ""},
        "environment variable" + std::string(both ? "s " : " ") + missing +
            (both ? " are" : " is") + " not set, so transport 'nccl' (rank " +
            std::to_string(launch.rank) + " of " + std::to_string(launch.world_size) +
            " from launcher '" + std::string(name(launch.source)) +
            "') has no address for its store, which rank 0 hosts at MASTER_ADDR:MASTER_PORT: " +
            master_hint(launch.source));
  }
  nccl::Environment environment;
  environment.rank = launch.rank;
  environment.world_size = launch.world_size;
  environment.local_rank = launch.local_rank;
  environment.master_addr = *launch.master_addr;
  environment.master_port = *launch.master_port;
  return environment;
}

}  // namespace chorus::detail
