#include "chorus/launch_environment.hpp"

#include <cstdlib>
#include <limits>
#include <string>

#include "chorus/error.hpp"

namespace chorus {
namespace {

struct SourceNames {
  LaunchSource source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;  // nullptr: this source has none
};

// In precedence order (launch_environment.hpp says why).
constexpr SourceNames kSources[] = {
    {LaunchSource::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {LaunchSource::OpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {LaunchSource::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

// The task count of the srun step, preferred to SLURM_NTASKS when set.
constexpr const char* kSlurmStepTasks = "SLURM_STEP_NUM_TASKS";

[[noreturn]] void bad_variable(const std::string& variable, const std::string& value,
                               const std::string& expected) {
  throw InvalidArgument(
      ErrorContext{-1, "launch_environment", -1, ""},
      "environment variable " + variable + "='" + value + "' is invalid: expected " + expected);
}

// A plain decimal integer in [low, high]: digits only, at most 9 of them (so it fits an int).
int parse_int(const char* variable, const char* text, int low, int high) {
  const std::string value = text;
  const std::string expected =
      "a decimal integer from " + std::to_string(low) + " to " + std::to_string(high);
  if (value.empty() || value.size() > 9 ||
      value.find_first_not_of("0123456789") != std::string::npos) {
    bad_variable(variable, value, expected);
  }
  const long parsed = std::strtol(value.c_str(), nullptr, 10);
  if (parsed < low || parsed > high) {
    bad_variable(variable, value, expected);
  }
  return static_cast<int>(parsed);
}

// `getenv`, or std::getenv when it is empty.
GetEnv or_process_environment(const GetEnv& getenv) {
  return getenv ? getenv : GetEnv([](const char* variable) -> const char* {
    return std::getenv(variable);  // NOLINT(concurrency-mt-unsafe): reading only
  });
}

// Reads the rank and world size of `names` (its size from `world_size_name`) into `environment`
// and sets its source; false, leaving it untouched, when neither variable is set.
bool read_rank_and_size(const SourceNames& names, const char* world_size_name, const GetEnv& lookup,
                        LaunchEnvironment& environment) {
  const char* rank = lookup(names.rank);
  const char* world_size = lookup(world_size_name);
  if (rank == nullptr && world_size == nullptr) {
    return false;
  }
  if (rank == nullptr || world_size == nullptr) {
    const char* missing = rank == nullptr ? names.rank : world_size_name;
    const char* present = rank == nullptr ? world_size_name : names.rank;
    throw InvalidArgument(ErrorContext{-1, "launch_environment", -1, ""},
                          std::string("environment variable ") + missing + " is unset while " +
                              present + " is set: a launcher sets both");
  }
  environment.source = names.source;
  environment.world_size =
      parse_int(world_size_name, world_size, 1, std::numeric_limits<int>::max());
  environment.rank = parse_int(names.rank, rank, 0, environment.world_size - 1);
  return true;
}

}  // namespace

std::string_view name(LaunchSource source) noexcept {
  switch (source) {
    case LaunchSource::None:
      return "none";
    case LaunchSource::Torchrun:
      return "torchrun";
    case LaunchSource::OpenMpi:
      return "openmpi";
    case LaunchSource::Slurm:
      return "slurm";
  }
  return "?";
}

LaunchEnvironment launch_environment(const GetEnv& getenv) {
  const GetEnv lookup = or_process_environment(getenv);
  LaunchEnvironment environment;
  for (const SourceNames& names : kSources) {
    const char* world_size_name = names.world_size;
    if (names.source == LaunchSource::Slurm) {
      // A Slurm batch script (sbatch, no srun) sees SLURM_PROCID=0 and SLURM_NTASKS=N for the
      // whole allocation: a program run straight from it would take itself for rank 0 of N and
      // wait for peers that never come. Only srun's tasks are ranks, and only an srun step sets
      // a step id; outside one, Slurm's variables describe no launch (a world of 1).
      if (lookup("SLURM_STEP_ID") == nullptr && lookup("SLURM_STEPID") == nullptr) {
        continue;
      }
      // The step's own task count: SLURM_NTASKS may be the allocation's (srun -n 2 inside an
      // allocation of 8).
      if (lookup(kSlurmStepTasks) != nullptr) {
        world_size_name = kSlurmStepTasks;
      }
    }
    if (!read_rank_and_size(names, world_size_name, lookup, environment)) {
      continue;
    }
    int local_high = environment.world_size - 1;
    const char* local_rank = lookup(names.local_rank);
    if (names.local_world_size != nullptr) {
      if (const char* local_world_size = lookup(names.local_world_size)) {
        environment.local_world_size =
            parse_int(names.local_world_size, local_world_size, 1, environment.world_size);
        local_high = *environment.local_world_size - 1;
        // The rank is no stand-in for the local rank of a node that has fewer processes than
        // the world (RANK=5 of 8 with 4 per node is not local rank 5).
        if (local_rank == nullptr) {
          throw InvalidArgument(ErrorContext{-1, "launch_environment", -1, ""},
                                std::string("environment variable ") + names.local_rank +
                                    " is unset while " + names.local_world_size +
                                    " is set: a launcher sets both");
        }
      }
    }
    environment.local_rank = local_rank == nullptr
                                 ? environment.rank
                                 : parse_int(names.local_rank, local_rank, 0, local_high);
    break;
  }
  if (const char* address = lookup("MASTER_ADDR")) {
    if (*address == '\0') {
      bad_variable("MASTER_ADDR", address, "a host name or address");
    }
    environment.master_addr = address;
  }
  if (const char* port = lookup("MASTER_PORT")) {
    environment.master_port = static_cast<std::uint16_t>(parse_int("MASTER_PORT", port, 1, 65535));
  }
  return environment;
}

std::optional<TorchrunRank> torchrun_rank(const GetEnv& getenv) {
  const SourceNames& torchrun = kSources[0];
  static_assert(kSources[0].source == LaunchSource::Torchrun, "first in precedence");
  LaunchEnvironment environment;
  if (!read_rank_and_size(torchrun, torchrun.world_size, or_process_environment(getenv),
                          environment)) {
    return std::nullopt;
  }
  return TorchrunRank{environment.rank, environment.world_size};
}

}  // namespace chorus
