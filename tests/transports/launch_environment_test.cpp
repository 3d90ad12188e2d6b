// chorus::launch_environment on fake environments (a map behind the getenv-like function): no
// global environment is touched.

#include <gtest/gtest.h>

#include <chorus/error.hpp>
#include <chorus/launch_environment.hpp>
#include <map>
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

  const LaunchEnvironment slurm =
      read({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "2"}});
  EXPECT_EQ(slurm.source, LaunchSource::Slurm);
  EXPECT_EQ(name(slurm.source), "slurm");
  EXPECT_EQ(slurm.rank, 6);
  EXPECT_EQ(slurm.world_size, 16);
  EXPECT_EQ(slurm.local_rank, 2);
  EXPECT_FALSE(slurm.local_world_size);
  EXPECT_FALSE(slurm.master_port);
}

TEST(LaunchEnvironment, TorchrunBeatsOpenMpiWhichBeatsSlurm) {
  const Variables slurm = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}};
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
  EXPECT_NE(error_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "abc"}}).find("SLURM_NTASKS='abc'"),
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
  EXPECT_NE(error_of({{"SLURM_NTASKS", "4"}}).find("SLURM_PROCID is unset while SLURM_NTASKS"),
            std::string::npos);
  // Except a Slurm batch script's own SLURM_PROCID (sbatch without --ntasks, no srun).
  EXPECT_EQ(read({{"SLURM_PROCID", "0"}}).source, LaunchSource::None);
}

TEST(LaunchEnvironment, TheDefaultReadsTheProcessEnvironment) {
  // Whatever the test runs under, it must parse (ctest sets none of these).
  EXPECT_NO_THROW(launch_environment());
}

}  // namespace
}  // namespace chorus
