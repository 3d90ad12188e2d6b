// chorus::launch_environment on fake environments (a map behind the getenv-like function): no
// global environment is touched.

#include <gtest/gtest.h>

#include <chorus/error.hpp>
#include <chorus/launch_environment.hpp>
#include <map>
#include <optional>
#include <string>

namespace chorus {
namespace {

using Variables = std::map<std::string, std::string>;

LaunchEnvironment read(const Variables& variables) {
  return launch_environment([&variables](const char* name) -> const char* {
    const auto found = variables.find(name);
    return found == variables.end() ? nullptr : found->second.c_str();
  });
}

// The message of the InvalidArgument that reading `variables` throws ("" when none).
std::string error_of(const Variables& variables) {
  try {
    read(variables);
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "";
}

TEST(LaunchEnvironment, NoVariablesMeansOneProcess) {
  const LaunchEnvironment environment = read({});
  EXPECT_FALSE(environment.found());
  EXPECT_EQ(environment.source, LaunchSource::None);
  EXPECT_EQ(environment.rank, 0);
  EXPECT_EQ(environment.world_size, 1);
  EXPECT_EQ(environment.local_rank, 0);
  EXPECT_FALSE(environment.local_world_size);
  EXPECT_FALSE(environment.master_addr);
  EXPECT_FALSE(environment.master_port);
}

TEST(LaunchEnvironment, ReadsTorchrunsNames) {
  const LaunchEnvironment environment = read({{"RANK", "5"},
                                              {"WORLD_SIZE", "8"},
                                              {"LOCAL_RANK", "1"},
                                              {"LOCAL_WORLD_SIZE", "4"},
                                              {"MASTER_ADDR", "node017"},
                                              {"MASTER_PORT", "29500"}});
  EXPECT_EQ(environment.source, LaunchSource::Torchrun);
  EXPECT_EQ(name(environment.source), "torchrun");
  EXPECT_EQ(environment.rank, 5);
  EXPECT_EQ(environment.world_size, 8);
  EXPECT_EQ(environment.local_rank, 1);
  EXPECT_EQ(environment.local_world_size, 4);
  EXPECT_EQ(environment.master_addr, "node017");
  EXPECT_EQ(environment.master_port, 29500);
}

TEST(LaunchEnvironment, ReadsOpenMpisAndSlurmsNames) {
  const LaunchEnvironment mpi = read({{"OMPI_COMM_WORLD_RANK", "3"},
                                      {"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(mpi.source, LaunchSource::OpenMpi);
  EXPECT_EQ(mpi.rank, 3);
  EXPECT_EQ(mpi.world_size, 4);
  EXPECT_EQ(mpi.local_rank, 1);
  EXPECT_EQ(mpi.local_world_size, 2);

  const LaunchEnvironment slurm = read({{"SLURM_STEP_ID", "0"},
                                        {"SLURM_PROCID", "6"},
                                        {"SLURM_NTASKS", "16"},
                                        {"SLURM_LOCALID", "2"}});
  EXPECT_EQ(slurm.source, LaunchSource::Slurm);
  EXPECT_EQ(name(slurm.source), "slurm");
  EXPECT_EQ(slurm.rank, 6);
  EXPECT_EQ(slurm.world_size, 16);
  EXPECT_EQ(slurm.local_rank, 2);
  EXPECT_FALSE(slurm.local_world_size);
  EXPECT_FALSE(slurm.master_port);
}

TEST(LaunchEnvironment, SlurmIsReadOnlyInsideAnSrunStep) {
  // An sbatch script run without srun: the allocation's SLURM_NTASKS and SLURM_PROCID=0, no step
  // id. The program is one process, not rank 0 of 8 waiting for seven that never come.
  const Variables batch = {{"SLURM_JOB_ID", "1234"},
                           {"SLURM_PROCID", "0"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_LOCALID", "0"}};
  const LaunchEnvironment alone = read(batch);
  EXPECT_EQ(alone.source, LaunchSource::None);
  EXPECT_EQ(alone.rank, 0);
  EXPECT_EQ(alone.world_size, 1);
  EXPECT_EQ(alone.local_rank, 0);
  // Nor are half or malformed Slurm variables outside a step an error: they describe no launch.
  EXPECT_EQ(read({{"SLURM_NTASKS", "4"}}).source, LaunchSource::None);
  EXPECT_EQ(read({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "4"}}).source, LaunchSource::None);
  // A task of an srun step (either spelling of the step id).
  for (const char* step : {"SLURM_STEP_ID", "SLURM_STEPID"}) {
    Variables task = batch;
    task.insert({step, "0"});
    task["SLURM_PROCID"] = "5";
    const LaunchEnvironment environment = read(task);
    EXPECT_EQ(environment.source, LaunchSource::Slurm) << step;
    EXPECT_EQ(environment.rank, 5) << step;
    EXPECT_EQ(environment.world_size, 8) << step;
  }
  // The step's task count wins over the allocation's (srun -n 2 inside an allocation of 8).
  Variables small_step = batch;
  small_step.insert({{"SLURM_STEP_ID", "3"}, {"SLURM_STEP_NUM_TASKS", "2"}});
  small_step["SLURM_PROCID"] = "1";
  const LaunchEnvironment step = read(small_step);
  EXPECT_EQ(step.source, LaunchSource::Slurm);
  EXPECT_EQ(step.rank, 1);
  EXPECT_EQ(step.world_size, 2);
  small_step["SLURM_PROCID"] = "2";
  EXPECT_NE(error_of(small_step)
                .find("SLURM_PROCID='2' is invalid: expected a decimal integer "
                      "from 0 to 1"),
            std::string::npos)
      << error_of(small_step);
  small_step["SLURM_STEP_NUM_TASKS"] = "0";
  EXPECT_NE(error_of(small_step).find("SLURM_STEP_NUM_TASKS='0'"), std::string::npos);
}

TEST(LaunchEnvironment, TorchrunBeatsOpenMpiWhichBeatsSlurm) {
  const Variables slurm = {
      {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}};
  Variables mpi_in_slurm = slurm;
  mpi_in_slurm.insert({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}});
  EXPECT_EQ(read(mpi_in_slurm).source, LaunchSource::OpenMpi);
  EXPECT_EQ(read(mpi_in_slurm).rank, 2);
  Variables torchrun_in_both = mpi_in_slurm;
  torchrun_in_both.insert({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(read(torchrun_in_both).source, LaunchSource::Torchrun);
  EXPECT_EQ(read(torchrun_in_both).rank, 1);
  EXPECT_EQ(read(torchrun_in_both).world_size, 2);
  // The winner's local rank, never another source's; absent, it is the rank.
  EXPECT_EQ(read(torchrun_in_both).local_rank, 1);
}

TEST(LaunchEnvironment, MalformedValuesNameTheVariable) {
  EXPECT_NE(error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}).find("RANK='-1'"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("from 0 to 1"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE='0'"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", " 2"}}).find("WORLD_SIZE=' 2'"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}).find("WORLD_SIZE="),
            std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "4"}}).find("LOCAL_RANK='4'"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}})
          .find("LOCAL_RANK='2'"),
      std::string::npos);
  EXPECT_NE(error_of({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "abc"}})
                .find("SLURM_NTASKS='abc'"),
            std::string::npos);
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "1"}})
                .find("OMPI_COMM_WORLD_RANK='1'"),
            std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "65536"}}).find("MASTER_PORT='65536'"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "0"}}).find("MASTER_PORT='0'"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_ADDR", ""}}).find("MASTER_ADDR=''"), std::string::npos);
}

TEST(LaunchEnvironment, HalfASourceIsAnError) {
  EXPECT_NE(error_of({{"RANK", "0"}}).find("WORLD_SIZE is unset while RANK is set"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "4"}})
                .find("SLURM_PROCID is unset while SLURM_NTASKS"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}})
                .find("SLURM_NTASKS is unset while SLURM_PROCID"),
            std::string::npos);
  // Except in a Slurm batch script outside srun (no step id): no launch at all.
  EXPECT_EQ(read({{"SLURM_PROCID", "0"}}).source, LaunchSource::None);
}

TEST(LaunchEnvironment, ALocalWorldSizeWithoutALocalRankIsAnError) {
  // The rank is no local rank on a node with fewer processes than the world: RANK=5 of 8 with 4
  // per node once read as local rank 5.
  const std::string torchrun =
      error_of({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_NE(torchrun.find("environment variable LOCAL_RANK is unset while LOCAL_WORLD_SIZE is "
                          "set: a launcher sets both"),
            std::string::npos)
      << torchrun;
  const std::string mpi = error_of({{"OMPI_COMM_WORLD_RANK", "1"},
                                    {"OMPI_COMM_WORLD_SIZE", "2"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_NE(mpi.find("OMPI_COMM_WORLD_LOCAL_RANK is unset while OMPI_COMM_WORLD_LOCAL_SIZE"),
            std::string::npos)
      << mpi;
  // Without a local world size the rank still stands in (one node assumed).
  EXPECT_EQ(read({{"RANK", "5"}, {"WORLD_SIZE", "8"}}).local_rank, 5);
}

// torchrun_rank on a fake environment, like read().
std::optional<TorchrunRank> read_torchrun_rank(const Variables& variables) {
  return torchrun_rank([&variables](const char* name) -> const char* {
    const auto found = variables.find(name);
    return found == variables.end() ? nullptr : found->second.c_str();
  });
}

// The message of the InvalidArgument that torchrun_rank throws on `variables` ("" when none).
std::string torchrun_rank_error_of(const Variables& variables) {
  try {
    read_torchrun_rank(variables);
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "";
}

TEST(TorchrunRank, ReadsRankAndWorldSizeAndNothingElse) {
  // Every other variable malformed: launch_environment would throw on each.
  const Variables torchrun = {{"RANK", "1"},
                              {"WORLD_SIZE", "2"},
                              {"LOCAL_RANK", "x"},
                              {"LOCAL_WORLD_SIZE", "9"},
                              {"MASTER_PORT", "0"},
                              {"MASTER_ADDR", ""},
                              {"OMPI_COMM_WORLD_RANK", "x"}};
  EXPECT_NE(error_of(torchrun), "");
  const std::optional<TorchrunRank> rank = read_torchrun_rank(torchrun);
  ASSERT_TRUE(rank);
  EXPECT_EQ(rank->rank, 1);
  EXPECT_EQ(rank->world_size, 2);

  // Not started by chorus launch or torchrun: none, whatever else is set.
  EXPECT_FALSE(read_torchrun_rank({}));
  EXPECT_FALSE(read_torchrun_rank(
      {{"MASTER_PORT", "0"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
}

TEST(TorchrunRank, ChecksItsTwoVariablesAsLaunchEnvironmentDoes) {
  EXPECT_NE(torchrun_rank_error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x'"),
            std::string::npos);
  EXPECT_NE(torchrun_rank_error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("from 0 to 1"),
            std::string::npos);
  EXPECT_NE(torchrun_rank_error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE='0'"),
            std::string::npos);
  EXPECT_NE(torchrun_rank_error_of({{"RANK", "0"}}).find("WORLD_SIZE is unset while RANK is set"),
            std::string::npos);
}

TEST(LaunchEnvironment, TheDefaultReadsTheProcessEnvironment) {
  // Whatever the test runs under, it must parse (ctest sets none of these).
  EXPECT_NO_THROW(launch_environment());
}

}  // namespace
}  // namespace chorus
