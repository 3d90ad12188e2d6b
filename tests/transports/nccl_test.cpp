// The NCCL transport without a device (docs/nccl.md): the dtype/op mapping, the environment (and
// the one chorus::run makes from any launcher's), the unique-id exchange through the store, the
// ncclCommSplit plan of a partition of the world, the errors a communicator's abort leaves in its
// works, and the no-device error of --transport=nccl.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chorus/chorus.hpp>
#include <chorus/nccl/nccl.hpp>
#include <chorus/store/store.hpp>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "block_pool.hpp"
#include "device_scope.hpp"
#include "nccl_launch_environment.hpp"
#include "nccl_transport.hpp"
#include "support/expect_error.hpp"
#include "support/narrowed_transport.hpp"
#include "support/scoped_environment.hpp"

namespace chorus::nccl {
namespace {

// Client options that reach `server` on loopback.
store::ClientOptions options_for(const store::Server& server) {
  store::ClientOptions options;
  options.port = server.port();
  return options;
}

// ---- Mapping

struct Row {
  DType dtype;
  ReduceOp::Kind op;
  const char* datatype;  // nullptr: InvalidArgument
  const char* nccl_op;
  int count_factor;
};

// Note [NCCL mapping], the whole table: every dtype with every op it accepts.
const Row kTable[] = {
    {DType::Bool, ReduceOp::Kind::Min, "ncclUint8", "ncclMin", 1},
    {DType::Bool, ReduceOp::Kind::Max, "ncclUint8", "ncclMax", 1},
    {DType::Bool, ReduceOp::Kind::BAnd, "ncclUint8", "ncclMin", 1},
    {DType::Bool, ReduceOp::Kind::BOr, "ncclUint8", "ncclMax", 1},
    {DType::Bool, ReduceOp::Kind::BXor, nullptr, nullptr, 0},
    {DType::UInt8, ReduceOp::Kind::Sum, "ncclUint8", "ncclSum", 1},
    {DType::UInt8, ReduceOp::Kind::Avg, "ncclUint8", "ncclAvg", 1},
    {DType::UInt8, ReduceOp::Kind::Max, "ncclUint8", "ncclMax", 1},
    {DType::UInt8, ReduceOp::Kind::BAnd, nullptr, nullptr, 0},
    {DType::Int8, ReduceOp::Kind::Sum, "ncclUint8", "ncclSum", 1},
    {DType::Int8, ReduceOp::Kind::Product, "ncclUint8", "ncclProd", 1},
    {DType::Int8, ReduceOp::Kind::Min, "ncclInt8", "ncclMin", 1},
    {DType::Int8, ReduceOp::Kind::Avg, "ncclInt8", "ncclAvg", 1},
    {DType::Int8, ReduceOp::Kind::BXor, nullptr, nullptr, 0},
    {DType::Int32, ReduceOp::Kind::Sum, "ncclUint32", "ncclSum", 1},
    {DType::Int32, ReduceOp::Kind::Max, "ncclInt32", "ncclMax", 1},
    {DType::Int32, ReduceOp::Kind::Avg, "ncclInt32", "ncclAvg", 1},
    {DType::Int32, ReduceOp::Kind::BOr, nullptr, nullptr, 0},
    {DType::Int64, ReduceOp::Kind::Product, "ncclUint64", "ncclProd", 1},
    {DType::Int64, ReduceOp::Kind::Min, "ncclInt64", "ncclMin", 1},
    {DType::Int64, ReduceOp::Kind::BAnd, nullptr, nullptr, 0},
    {DType::Float16, ReduceOp::Kind::Sum, "ncclFloat16", "ncclSum", 1},
    {DType::Float16, ReduceOp::Kind::Avg, "ncclFloat16", "ncclAvg", 1},
    {DType::Float16, ReduceOp::Kind::PremulSum, "ncclFloat16", "ncclRedOpCreatePreMulSum", 1},
    {DType::BFloat16, ReduceOp::Kind::Sum, "ncclBfloat16", "ncclSum", 1},
    {DType::BFloat16, ReduceOp::Kind::Min, "ncclBfloat16", "ncclMin", 1},
    {DType::Float32, ReduceOp::Kind::Product, "ncclFloat32", "ncclProd", 1},
    {DType::Float32, ReduceOp::Kind::Max, "ncclFloat32", "ncclMax", 1},
    {DType::Float64, ReduceOp::Kind::Avg, "ncclFloat64", "ncclAvg", 1},
    {DType::Float64, ReduceOp::Kind::PremulSum, "ncclFloat64", "ncclRedOpCreatePreMulSum", 1},
    {DType::Complex64, ReduceOp::Kind::Sum, "ncclFloat32", "ncclSum", 2},
    {DType::Complex64, ReduceOp::Kind::Avg, "ncclFloat32", "ncclAvg", 2},
    {DType::Complex128, ReduceOp::Kind::PremulSum, "ncclFloat64", "ncclRedOpCreatePreMulSum", 2},
};

ReduceOp op_of(ReduceOp::Kind kind) {
  return kind == ReduceOp::Kind::PremulSum ? ReduceOp::premul_sum(0.5) : ReduceOp(kind);
}

TEST(NcclMapping, MatchesTheTable) {
  for (const Row& row : kTable) {
    SCOPED_TRACE(std::string(dtype_name(row.dtype)) + " " + std::string(reduce_kind_name(row.op)));
    if (row.datatype == nullptr) {
      EXPECT_THROW((void)describe_mapping(row.dtype, op_of(row.op)), InvalidArgument);
      const std::string problem = mapping_problem(row.dtype, op_of(row.op));
      EXPECT_EQ(problem.rfind("nccl: ", 0), 0u) << problem;  // names the backend
      EXPECT_NE(problem.find("not supported by the NCCL backend"), std::string::npos) << problem;
      continue;
    }
    const Mapping mapping = describe_mapping(row.dtype, op_of(row.op));
    EXPECT_EQ(mapping.datatype, row.datatype);
    EXPECT_EQ(mapping.op, row.nccl_op);
    EXPECT_EQ(mapping.count_factor, row.count_factor);
    EXPECT_EQ(mapping_problem(row.dtype, op_of(row.op)), "");
  }
}

// Every (dtype, op) pair: either ReduceOp::check_dtype refuses it (and so does the mapping, with
// the same reason after the backend's name), or the mapping succeeds, or it is one of the bitwise
// combinations NCCL lacks.
TEST(NcclMapping, CoversEveryDTypeAndOp) {
  const ReduceOp::Kind kinds[] = {
      ReduceOp::Kind::Sum, ReduceOp::Kind::Avg,  ReduceOp::Kind::Product,
      ReduceOp::Kind::Min, ReduceOp::Kind::Max,  ReduceOp::Kind::BAnd,
      ReduceOp::Kind::BOr, ReduceOp::Kind::BXor, ReduceOp::Kind::PremulSum};
  int supported = 0;
  for (const DType dtype : kAllDTypes) {
    for (const ReduceOp::Kind kind : kinds) {
      const ReduceOp op = op_of(kind);
      const std::string refused = op.check_dtype(dtype);
      const std::string problem = mapping_problem(dtype, op);
      if (!refused.empty()) {
        EXPECT_EQ(problem, "nccl: " + refused);
        EXPECT_THROW((void)describe_mapping(dtype, op), InvalidArgument);
        continue;
      }
      const bool bitwise = kind == ReduceOp::Kind::BAnd || kind == ReduceOp::Kind::BOr ||
                           kind == ReduceOp::Kind::BXor;
      if (bitwise && !(dtype == DType::Bool && kind != ReduceOp::Kind::BXor)) {
        EXPECT_NE(problem, "") << dtype_name(dtype) << " " << reduce_kind_name(kind);
        continue;
      }
      EXPECT_EQ(problem, "") << dtype_name(dtype) << " " << reduce_kind_name(kind);
      ++supported;
    }
  }
  // 4 integer dtypes x 5 (sum avg product min max) + 4 floating x 6 (+ premul_sum)
  // + 2 complex x 3 (sum avg premul_sum) + Bool x 4 (min max band bor).
  EXPECT_EQ(supported, 4 * 5 + 4 * 6 + 2 * 3 + 4);
}

TEST(NcclMapping, RefusesAnUnrecognizedOp) {
  EXPECT_EQ(testing::expect_error<InvalidArgument>(
                [] { (void)describe_mapping(DType::Float32, ReduceOp("median")); }, {})
                .detail,
            "nccl: Unrecognized reduce_op 'median'");
  EXPECT_EQ(mapping_problem(DType::Float32, ReduceOp("median")),
            "nccl: Unrecognized reduce_op 'median'");
}

// ---- Environment

using Variables = std::map<std::string, std::string>;

Environment parse(const Variables& variables) {
  return parse_environment([&variables](const char* name) -> const char* {
    const auto found = variables.find(name);
    return found == variables.end() ? nullptr : found->second.c_str();
  });
}

const Variables kGood = {
    {"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};

TEST(NcclEnvironment, ReadsTorchrunsVariables) {
  Environment environment = parse(kGood);
  EXPECT_EQ(environment.rank, 2);
  EXPECT_EQ(environment.world_size, 4);
  EXPECT_EQ(environment.local_rank, 2);  // LOCAL_RANK unset: RANK
  EXPECT_EQ(environment.master_addr, "127.0.0.1");
  EXPECT_EQ(environment.master_port, 29500);
  Variables with_local = kGood;
  with_local["LOCAL_RANK"] = "0";
  EXPECT_EQ(parse(with_local).local_rank, 0);
}

TEST(NcclEnvironment, NamesAMissingOrMalformedVariable) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"RANK", "", "environment variable RANK is not set"},
      {"RANK", "4", "environment variable RANK='4' is invalid: expected an integer from 0 to 3"},
      {"RANK", "-1", "RANK='-1' is invalid"},
      {"WORLD_SIZE", "0", "WORLD_SIZE='0' is invalid"},
      {"WORLD_SIZE", "two", "WORLD_SIZE='two' is invalid"},
      {"MASTER_ADDR", "", "environment variable MASTER_ADDR is not set"},
      {"MASTER_PORT", "65536",
       "MASTER_PORT='65536' is invalid: expected an integer from 1 to 65535"},
      {"MASTER_PORT", "99999999999999999999999", "MASTER_PORT='99999999999999999999999'"},
      {"LOCAL_RANK", "x", "LOCAL_RANK='x' is invalid"},
  };
  for (const auto& [name, value, expected] : cases) {
    Variables variables = kGood;
    if (value.empty()) {
      variables.erase(name);
    } else {
      variables[name] = value;
    }
    SCOPED_TRACE(name + "=" + value);
    testing::expect_error<InvalidArgument>([&] { (void)parse(variables); }, {expected});
  }
}

// ---- The environment chorus::run passes (nccl_environment, transports/launch/src)

LaunchEnvironment launched(const Variables& variables) {
  return launch_environment([&variables](const char* name) -> const char* {
    const auto found = variables.find(name);
    return found == variables.end() ? nullptr : found->second.c_str();
  });
}

const Variables kSlurm = {{"SLURM_STEP_ID", "0"},        {"SLURM_PROCID", "5"},
                          {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_NTASKS", "16"},
                          {"SLURM_LOCALID", "1"},        {"MASTER_ADDR", "node-a"},
                          {"MASTER_PORT", "29400"}};
const Variables kOpenMpi = {
    {"OMPI_COMM_WORLD_RANK", "6"},       {"OMPI_COMM_WORLD_SIZE", "12"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
    {"MASTER_ADDR", "10.0.0.7"},         {"MASTER_PORT", "29501"}};

TEST(NcclLaunchEnvironment, SlurmsVariablesGiveRankWorldSizeLocalRankAndStore) {
  const LaunchEnvironment launch = launched(kSlurm);
  ASSERT_EQ(launch.source, LaunchSource::Slurm);
  const Environment environment = chorus::detail::nccl_environment(launch);
  EXPECT_EQ(environment.rank, 5);
  EXPECT_EQ(environment.world_size, 8);  // the step's tasks, not the allocation's
  EXPECT_EQ(environment.local_rank, 1);
  EXPECT_EQ(environment.master_addr, "node-a");
  EXPECT_EQ(environment.master_port, 29400);
}

TEST(NcclLaunchEnvironment, OpenMpisVariablesGiveRankWorldSizeLocalRankAndStore) {
  const LaunchEnvironment launch = launched(kOpenMpi);
  ASSERT_EQ(launch.source, LaunchSource::OpenMpi);
  const Environment environment = chorus::detail::nccl_environment(launch);
  EXPECT_EQ(environment.rank, 6);
  EXPECT_EQ(environment.world_size, 12);
  EXPECT_EQ(environment.local_rank, 2);
  EXPECT_EQ(environment.master_addr, "10.0.0.7");
  EXPECT_EQ(environment.master_port, 29501);
}

TEST(NcclLaunchEnvironment, TorchrunsVariablesGiveWhatParseEnvironmentGives) {
  Variables variables = kGood;
  variables["LOCAL_RANK"] = "1";
  const Environment environment = chorus::detail::nccl_environment(launched(variables));
  const Environment parsed = parse(variables);
  EXPECT_EQ(environment.rank, parsed.rank);
  EXPECT_EQ(environment.world_size, parsed.world_size);
  EXPECT_EQ(environment.local_rank, parsed.local_rank);
  EXPECT_EQ(environment.master_addr, parsed.master_addr);
  EXPECT_EQ(environment.master_port, parsed.master_port);
}

// The message of the InvalidArgument nccl_environment throws for `variables` ("" when none).
std::string conversion_error(const Variables& variables) {
  try {
    (void)chorus::detail::nccl_environment(launched(variables));
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "";
}

TEST(NcclLaunchEnvironment, AMissingStoreAddressNamesTheVariableAndTheLauncher) {
  Variables slurm = kSlurm;
  slurm.erase("MASTER_ADDR");
  std::string error = conversion_error(slurm);
  EXPECT_NE(error.find("environment variable MASTER_ADDR is not set"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 5 of 8 from launcher 'slurm'"), std::string::npos) << error;
  EXPECT_NE(error.find("under Slurm's srun, export MASTER_ADDR and MASTER_PORT in the job script"),
            std::string::npos)
      << error;

  Variables open_mpi = kOpenMpi;
  open_mpi.erase("MASTER_PORT");
  error = conversion_error(open_mpi);
  EXPECT_NE(error.find("environment variable MASTER_PORT is not set"), std::string::npos) << error;
  EXPECT_NE(error.find("launcher 'openmpi'"), std::string::npos) << error;
  EXPECT_NE(
      error.find("under Open MPI's mpirun, export MASTER_ADDR and MASTER_PORT in the job script"),
      std::string::npos)
      << error;

  open_mpi.erase("MASTER_ADDR");
  error = conversion_error(open_mpi);
  EXPECT_NE(error.find("environment variables MASTER_ADDR and MASTER_PORT are not set"),
            std::string::npos)
      << error;
}

// Note [Device scopes]: without a driver the primary-context query cannot tell, and a scope then
// puts the earlier device back as it always did. nccl_gpu_job checks the query's answer on a
// device.
TEST(NcclDeviceScope, WithoutADriverThePrimaryContextQueryCannotTell) {
  if (cuda_device_count().count > 0) {
    GTEST_SKIP() << "a CUDA device is present: nccl_gpu_job checks the query there";
  }
  EXPECT_EQ(detail::primary_context_active(0), std::nullopt);
}

// chorus::run --transport=nccl under srun: it passes Slurm's rank and world size to the
// transport, which then finds no device here, rather than reading RANK/WORLD_SIZE itself.
TEST(NcclLaunchEnvironment, ChorusRunTakesTheRankFromSrun) {
  if (cuda_device_count().count > 0) {
    GTEST_SKIP() << "a CUDA device is present: the run would start a real rank";
  }
  const testing::ScopedEnvironment slurm({{"SLURM_STEP_ID", "0"},
                                          {"SLURM_PROCID", "0"},
                                          {"SLURM_NTASKS", "1"},
                                          {"MASTER_ADDR", "127.0.0.1"},
                                          {"MASTER_PORT", "29400"}});
  RunOptions options;
  options.transport = "nccl";
  testing::expect_error<TransportError>([&] { (void)chorus::run(options, [] {}); },
                                        {"no CUDA device"});
}

// Under mpirun without MASTER_ADDR: named, with the launcher, on any machine (before the device).
TEST(NcclLaunchEnvironment, ChorusRunNamesAMissingMasterAddrUnderMpirun) {
  const testing::ScopedEnvironment open_mpi({{"OMPI_COMM_WORLD_RANK", "1"},
                                             {"OMPI_COMM_WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", std::nullopt},
                                             {"MASTER_PORT", "29400"}});
  RunOptions options;
  options.transport = "nccl";
  bool ran = false;
  testing::expect_error<InvalidArgument>(
      [&] { (void)chorus::run(options, [&] { ran = true; }); },
      {"environment variable MASTER_ADDR is not set", "launcher 'openmpi'"});
  EXPECT_FALSE(ran);
}

// ---- Unique-id exchange through the store

class NcclUniqueIdExchange : public ::testing::TestWithParam<int> {};

TEST_P(NcclUniqueIdExchange, EveryRankGetsRankZerosBytes) {
  const int world_size = GetParam();
  store::Server server;
  // A fake id: 128 bytes (NCCL_UNIQUE_ID_BYTES) with NULs and high bytes in it.
  std::string id(128, '\0');
  for (std::size_t i = 0; i < id.size(); ++i) {
    id[i] = static_cast<char>((i * 37 + 11) % 256);
  }
  std::vector<std::string> received(static_cast<std::size_t>(world_size));
  std::vector<int> made(static_cast<std::size_t>(world_size), 0);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      store::Client client(options_for(server), std::chrono::seconds(30));
      store::PrefixStore prefix("chorus/nccl/comm/test", client);
      store::Rendezvous rendezvous(prefix, rank, world_size);
      const auto index = static_cast<std::size_t>(rank);
      received[index] = exchange_unique_id(
          rendezvous, id.size(),
          [&] {
            ++made[index];
            return id;
          },
          std::chrono::seconds(30));
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  for (int rank = 0; rank < world_size; ++rank) {
    const auto index = static_cast<std::size_t>(rank);
    EXPECT_EQ(received[index], id) << "rank " << rank;
    EXPECT_EQ(made[index], rank == 0 ? 1 : 0) << "only rank 0 makes the id";
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, NcclUniqueIdExchange, ::testing::Values(1, 2, 3, 4));

TEST(NcclUniqueIdExchangeErrors, ATruncatedIdIsRefusedOnRankZero) {
  store::Server server;
  store::Client client(options_for(server), std::chrono::seconds(30));
  store::Rendezvous rendezvous(client, 0, 1);
  EXPECT_THROW((void)exchange_unique_id(
                   rendezvous, 128, [] { return std::string(5, 'x'); }, std::chrono::seconds(5)),
               InvalidArgument);
}

// ncclGetUniqueId failing on rank 0 reaches every rank at once, naming the failure, instead of
// leaving the others to wait out the deadline for an id that never comes.
TEST(NcclUniqueIdExchangeErrors, RankZerosFailureToMakeTheIdReachesEveryRank) {
  constexpr int kWorldSize = 3;
  store::Server server;
  std::vector<std::string> errors(kWorldSize);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    threads.emplace_back([&, rank] {
      store::Client client(options_for(server), std::chrono::seconds(30));
      store::Rendezvous rendezvous(client, rank, kWorldSize);
      try {
        (void)exchange_unique_id(
            rendezvous, 128,
            []() -> std::string {
              throw TransportError(ErrorContext{0, "communicator set-up", -1, ""},
                                   "nccl: ncclGetUniqueId failed: unhandled system error");
            },
            std::chrono::seconds(60));  // a peer still waiting would fail this test by timing
      } catch (const TransportError& error) {
        errors[static_cast<std::size_t>(rank)] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  EXPECT_NE(errors[0].find("nccl: ncclGetUniqueId failed: unhandled system error"),
            std::string::npos)
      << errors[0];
  for (std::size_t rank = 1; rank < errors.size(); ++rank) {
    EXPECT_NE(errors[rank].find("nccl: rank 0 of this communicator could not make its unique id: "
                                "chorus::TransportError: [rank 0] communicator set-up: nccl: "
                                "ncclGetUniqueId failed: unhandled system error"),
              std::string::npos)
        << "rank " << rank << ": " << errors[rank];
  }
}

// The store's Timeout names only its call and key: the rank's error says which rank it is and
// that it waited for rank 0's unique id.
TEST(NcclUniqueIdExchangeErrors, ARankWaitsForRankZeroUntilTheDeadline) {
  store::Server server;
  store::Client client(options_for(server), std::chrono::seconds(30));
  store::Rendezvous rendezvous(client, 1, 2);
  const testing::CaughtError caught = testing::expect_error<Timeout>(
      [&] {
        (void)exchange_unique_id(
            rendezvous, 128, [] { return std::string(128, 'x'); }, std::chrono::milliseconds(200));
      },
      {});
  EXPECT_EQ(caught.context.rank, 1);
  EXPECT_EQ(caught.context.op, "nccl::exchange_unique_id");
  EXPECT_TRUE(caught.detail.starts_with(
      "nccl: the unique id from rank 0 of this communicator did not arrive: store.get: key "
      "'chorus.rendezvous/0/broadcast/value' was not set within "))
      << caught.detail;
  EXPECT_TRUE(caught.detail.ends_with(" ms")) << caught.detail;
}

// create_comm names this rank (not its rank in the group), the group, and the world rank that
// makes the unique id. Before any device is touched: a rank waiting for the root needs no GPU.
TEST(NcclUniqueIdExchangeErrors, CommunicatorSetUpNamesTheRankTheGroupAndTheRoot) {
  store::Server server;
  auto client = std::make_shared<store::Client>(options_for(server), std::chrono::seconds(30));
  const Environment environment{2, 3, 2, "127.0.0.1", server.port()};
  detail::NcclTransport transport(environment, client, 0, std::chrono::milliseconds(200), false,
                                  false);
  const std::vector<int> ranks{1, 2};
  const testing::CaughtError caught =
      testing::expect_error<Timeout>([&] { (void)transport.create_comm("", ranks); }, {});
  EXPECT_EQ(caught.context.rank, 2);
  EXPECT_EQ(caught.context.op, "communicator set-up");
  EXPECT_EQ(caught.context.group, "[1, 2]");
  EXPECT_TRUE(
      caught.detail.starts_with("nccl: the unique id from rank 0 of this communicator did not "
                                "arrive: store.get: key 'chorus/nccl/comm/"))
      << caught.detail;
  EXPECT_TRUE(caught.detail.ends_with(" ms (rank 0 of this communicator is rank 1)"))
      << caught.detail;
}

// Note [NCCL communicator set-up], "Retries": core calls create_comm again after a set-up threw;
// the exchange must not run again on the failed attempt's store keys (a late root's id, a
// partial count). The retry throws the first error's type at once, naming it, without a store
// call (the server is gone by then: a retry that used the store got TransportError); another
// group still gets its own set-up.
TEST(NcclUniqueIdExchangeErrors, ARetryAfterAFailedSetUpThrowsTheFirstErrorAgain) {
  auto server = std::make_unique<store::Server>();
  auto client = std::make_shared<store::Client>(options_for(*server), std::chrono::seconds(30));
  const Environment environment{2, 3, 2, "127.0.0.1", server->port()};
  detail::NcclTransport transport(environment, client, 0, std::chrono::milliseconds(200), false,
                                  false);
  // The set-up of a group of `ranks`, which times out.
  const auto timed_out_set_up = [&transport](const std::vector<int>& ranks) {
    return testing::expect_error<Timeout>([&] { (void)transport.create_comm("", ranks); }, {});
  };
  const std::string first = timed_out_set_up({1, 2}).detail;
  const std::string other = timed_out_set_up({0, 2}).detail;
  EXPECT_TRUE(
      other.starts_with("nccl: the unique id from rank 0 of this communicator did not "
                        "arrive: store.get: key 'chorus/nccl/comm/"))
      << "another group's set-up is its own: " << other;
  server.reset();
  for (int retry = 0; retry < 2; ++retry) {
    SCOPED_TRACE("retry " + std::to_string(retry));
    const testing::CaughtError caught = timed_out_set_up({1, 2});
    EXPECT_EQ(caught.context.rank, 2);
    EXPECT_EQ(caught.context.op, "communicator set-up");
    EXPECT_EQ(caught.context.group, "[1, 2]");
    EXPECT_EQ(caught.detail, "nccl: the group's set-up failed earlier: " + first +
                                 "; a retry is not supported on NCCL");
  }
}

// Note [NCCL store]: rank 0 connects to a store already listening at MASTER_ADDR:MASTER_PORT.
TEST(NcclStore, RankZeroConnectsToTheStoreThatHoldsTheAddress) {
  store::Server launcher;
  const Environment environment{0, 2, 0, "127.0.0.1", launcher.port()};
  detail::StoreConnection connection = detail::connect_store(environment, std::chrono::seconds(30));
  EXPECT_EQ(connection.server, nullptr);
  connection.client->set("k", "from rank 0");
  store::Client probe(options_for(launcher), std::chrono::seconds(30));
  EXPECT_EQ(probe.get("k"), "from rank 0");
}

// An address rank 0 cannot listen on for another reason than its being taken (192.0.2.1,
// TEST-NET-1, is no address of this host) is rank 0's error at once, not a connect that waits
// out the timeout on every rank.
TEST(NcclStore, RankZeroThatCannotHostTheStoreSaysWhyAtOnce) {
  const Environment environment{0, 2, 0, "192.0.2.1", 29500};
  const testing::CaughtError caught = testing::expect_error<TransportError>(
      [&] { (void)detail::connect_store(environment, std::chrono::seconds(60)); }, {});
  EXPECT_EQ(caught.context.rank, 0);
  EXPECT_EQ(caught.context.op, "nccl::run");
  EXPECT_EQ(caught.detail,
            "rank 0 cannot host the store at MASTER_ADDR:MASTER_PORT (192.0.2.1:29500): cannot "
            "listen on 192.0.2.1:29500: Cannot assign requested address");
}

// ---- Splitting a partition of the world (Note [NCCL communicator set-up])

using Parts = std::vector<std::vector<int>>;

// Every rank of every partition: the color is its part's smallest rank, the key its position
// there, so each part comes out of ncclCommSplit in group order; ranks that have theirs take part
// without a color.
TEST(NcclSplitPlan, ColorIsThePartsSmallestRankAndKeyThePositionOnEveryRank) {
  const std::vector<Parts> cases = {
      {{0}},                     // world 1
      {{0, 1}, {2, 3}},          // list of lists
      {{3, 1}, {0, 2}},          // permuted parts
      {{0}, {1}, {2}},           // parts of one, world 3
      {{0, 3}, {1, 4}, {2, 5}},  // columns of a 2 x 3 mesh
      {{4, 0, 2}, {1, 3, 5}},    // odd part size
  };
  for (const Parts& parts : cases) {
    int world_size = 0;
    for (const auto& part : parts) {
      world_size += static_cast<int>(part.size());
    }
    std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, rank)
    std::map<int, std::size_t> part_of_color;
    for (std::size_t index = 0; index < parts.size(); ++index) {
      for (std::size_t position = 0; position < parts[index].size(); ++position) {
        const int rank = parts[index][position];
        const transport::Partition partition{parts, static_cast<int>(index)};
        const SplitPlan plan = split_plan(partition, world_size, rank, false);
        EXPECT_EQ(plan.color, *std::min_element(parts[index].begin(), parts[index].end()));
        EXPECT_EQ(plan.key, static_cast<int>(position));
        by_color[plan.color].emplace_back(plan.key, rank);
        part_of_color[plan.color] = index;
        EXPECT_EQ(split_plan(partition, world_size, rank, true).color, kNoColor);
      }
    }
    // What ncclCommSplit makes of it: per color, ranks ordered by key are the part.
    ASSERT_EQ(by_color.size(), parts.size());
    for (auto& [color, members] : by_color) {
      std::sort(members.begin(), members.end());
      std::vector<int> ordered;
      for (const auto& [key, rank] : members) {
        ordered.push_back(rank);
      }
      EXPECT_EQ(ordered, parts[part_of_color[color]]);
    }
  }
}

// Ranks 0 and 1 list {{0, 1}, {2, 3}}, ranks 2 and 3 {{2, 3}, {0, 1}}: the same groups, so the
// same communicators on the simulator and MPI. Colors from each rank's own list would be 0 for
// all four (one communicator of four); the smallest rank gives each part its own.
TEST(NcclSplitPlan, RanksThatListThePartsInOtherOrdersStillSplitIntoTheParts) {
  const Parts first = {{0, 1}, {2, 3}};
  const Parts second = {{2, 3}, {0, 1}};
  EXPECT_EQ(split_plan({first, 0}, 4, 0, false).color, 0);
  EXPECT_EQ(split_plan({first, 0}, 4, 1, false).color, 0);
  EXPECT_EQ(split_plan({second, 0}, 4, 2, false).color, 2);
  EXPECT_EQ(split_plan({second, 0}, 4, 3, false).color, 2);
  EXPECT_EQ(split_plan({second, 0}, 4, 3, false).key, 1);
}

TEST(NcclSplitPlan, RefusesWhatIsNotAPartitionOfTheWorld) {
  const auto refused = [](const transport::Partition& partition, int world_size, int rank) {
    testing::expect_error<InvalidArgument>(
        [&] { (void)split_plan(partition, world_size, rank, false); },
        {"nccl: not a partition of the world"});
  };
  refused({Parts{{0, 1}}, 0}, 4, 0);          // leaves ranks 2 and 3 out
  refused({Parts{{0, 1}, {2, 3}}, 0}, 4, 2);  // rank 2 is not in part 0
  refused({Parts{{0, 1}, {1, 2}}, 0}, 3, 0);  // rank 1 twice
  refused({Parts{{0, 1}, {2, 3}}, 5}, 4, 0);  // no part 5
  refused({Parts{}, 0}, 1, 0);
}

// ---- Agreeing on a split before it (Note [Split agreement])

TEST(NcclSplitAgreement, TheDescriptionListsPartsBySmallestRankAndKeepsMemberOrder) {
  EXPECT_EQ(split_description("tp", {Parts{{2, 3}, {0, 1}}, 0}), "'tp' [[0, 1], [2, 3]]");
  EXPECT_EQ(split_description("tp", {Parts{{0, 1}, {2, 3}}, 1}), "'tp' [[0, 1], [2, 3]]");
  EXPECT_EQ(split_description("", {Parts{{3, 1}, {2, 0}}, 0}), "'' [[2, 0], [3, 1]]");
  EXPECT_NE(split_description("tp", {Parts{{1, 0}, {2, 3}}, 0}),
            split_description("tp", {Parts{{0, 1}, {2, 3}}, 0}));
  EXPECT_NE(split_description("dp", {Parts{{0, 1}, {2, 3}}, 0}),
            split_description("tp", {Parts{{0, 1}, {2, 3}}, 0}));
}

// Runs agree_on_split for round `round` on `descriptions.size()` ranks, each a thread with its
// own client; rank r skips the round when descriptions[r] is empty. Returns each rank's error
// text ("" when it agreed).
std::vector<std::string> agree(store::Server& server, const std::vector<std::string>& descriptions,
                               std::int64_t round,
                               const std::vector<std::chrono::milliseconds>& timeouts) {
  const int world_size = static_cast<int>(descriptions.size());
  std::vector<std::string> errors(descriptions.size());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    const auto index = static_cast<std::size_t>(rank);
    if (descriptions[index].empty()) {
      continue;
    }
    threads.emplace_back([&, rank, index] {
      store::Client client(options_for(server), std::chrono::seconds(30));
      try {
        agree_on_split(client, rank, world_size, round, descriptions[index], "'tp' [..]",
                       timeouts[index]);
      } catch (const Error& error) {
        errors[index] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  return errors;
}

// The same deadline on every rank.
std::vector<std::string> agree(store::Server& server, const std::vector<std::string>& descriptions,
                               std::int64_t round, std::chrono::milliseconds timeout) {
  return agree(server, descriptions, round,
               std::vector<std::chrono::milliseconds>(descriptions.size(), timeout));
}

TEST(NcclSplitAgreement, RanksSplittingTheSamePartitionAgreeAndLeaveNoKeys) {
  store::Server server;
  store::Client probe(options_for(server), std::chrono::seconds(30));
  const std::int64_t keys_before = probe.num_keys();
  const std::string same = split_description("tp", {Parts{{0, 1}, {2, 3}}, 0});
  for (std::int64_t round = 0; round < 3; ++round) {
    const std::vector<std::string> errors =
        agree(server, {same, same, same, same}, round, std::chrono::seconds(30));
    EXPECT_EQ(errors, std::vector<std::string>(4)) << "round " << round;
  }
  EXPECT_EQ(probe.num_keys(), keys_before);
}

// Rank 2 first uses another partition: every rank gets CollectiveMismatch before the split, and
// the round's keys are gone.
TEST(NcclSplitAgreement, ADifferentPartitionIsAMismatchOnEveryRank) {
  store::Server server;
  store::Client probe(options_for(server), std::chrono::seconds(30));
  const std::int64_t keys_before = probe.num_keys();
  const std::string tp = split_description("tp", {Parts{{0, 1}, {2, 3}}, 0});
  const std::string dp = split_description("dp", {Parts{{0, 2}, {1, 3}}, 0});
  const std::vector<std::string> errors =
      agree(server, {tp, tp, dp, tp}, 7, std::chrono::seconds(30));
  for (int rank = 0; rank < 4; ++rank) {
    const std::string& error = errors[static_cast<std::size_t>(rank)];
    EXPECT_NE(error.find("chorus::CollectiveMismatch: [rank " + std::to_string(rank) +
                         "] create_comm on group 'tp' [..]: nccl: ranks disagree on split #7 of "
                         "the world"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find(rank == 2 ? "rank 2 splits partition 'dp' [[0, 2], [1, 3]], rank 0 "
                                     "splits partition 'tp' [[0, 1], [2, 3]]"
                                   : "splits partition 'tp' [[0, 1], [2, 3]], rank 2 splits "
                                     "partition 'dp' [[0, 2], [1, 3]]"),
              std::string::npos)
        << error;
  }
  EXPECT_EQ(probe.num_keys(), keys_before);
}

// Rank 2 never arrives; rank 0 stops waiting first and marks rank 2's key, so rank 1, still
// waiting with a long deadline, learns it at once instead of waiting for its own deadline.
TEST(NcclSplitAgreement, ARankStillWaitingLearnsThatAnotherGaveUp) {
  store::Server server;
  const std::string tp = split_description("tp", {Parts{{0}, {1}, {2}}, 0});
  const std::vector<std::string> errors =
      agree(server, {tp, tp, ""}, 0,
            {std::chrono::milliseconds(200), std::chrono::minutes(5), std::chrono::minutes(5)});
  EXPECT_NE(errors[0].find("nccl: world ranks [2] did not reach split #0"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("chorus::Timeout: [rank 1] create_comm on group 'tp' [..]: nccl: "
                           "split #0 (partition 'tp' [[0], [1], [2]]) did not happen: world rank "
                           "2 had not reached it when rank 0 stopped waiting for it at its "
                           "deadline"),
            std::string::npos)
      << errors[1];
}

// Rank 1 arrives after rank 0 stopped waiting: it must not go on into the split (where it would
// wait alone in NCCL), but end in Timeout at once, naming who gave up.
TEST(NcclSplitAgreement, ARankArrivingAfterAnotherGaveUpDoesNotEnterTheSplit) {
  store::Server server;
  const std::string tp = split_description("tp", {Parts{{0}, {1}}, 0});
  const std::vector<std::string> first = agree(server, {tp, ""}, 3, std::chrono::milliseconds(200));
  EXPECT_NE(first[0].find("nccl: world ranks [1] did not reach split #3"), std::string::npos)
      << first[0];
  const std::vector<std::string> late = agree(server, {"", tp}, 3, std::chrono::seconds(30));
  EXPECT_NE(late[1].find("chorus::Timeout: [rank 1] create_comm on group 'tp' [..]: nccl: "
                         "reached split #3 (partition 'tp' [[0], [1]]) too late: rank 0 stopped "
                         "waiting for it at its deadline"),
            std::string::npos)
      << late[1];
}

// Ranks 1 and 3 never reach the split: the others time out naming them, without waiting in NCCL.
// Whichever of ranks 0 and 2 stops waiting first names both; the other either does the same (its
// deadline passed too) or finds the first one's marks and names the first missing rank.
TEST(NcclSplitAgreement, RanksThatNeverArriveAreNamedInTheTimeout) {
  store::Server server;
  const std::string tp = split_description("tp", {Parts{{0, 1}, {2, 3}}, 0});
  const std::vector<std::string> errors =
      agree(server, {tp, "", tp, ""}, 0, std::chrono::milliseconds(300));
  int naming_both = 0;
  for (const int rank : {0, 2}) {
    const std::string& error = errors[static_cast<std::size_t>(rank)];
    const std::string prefix = "chorus::Timeout: [rank " + std::to_string(rank) +
                               "] create_comm on group 'tp' [..]: nccl: ";
    const bool names_both =
        error.find(prefix +
                   "world ranks [1, 3] did not reach split #0 (partition 'tp' [[0, 1], "
                   "[2, 3]]) by the deadline") != std::string::npos;
    const bool found_marks =
        error.find(prefix +
                   "split #0 (partition 'tp' [[0, 1], [2, 3]]) did not happen: world "
                   "rank 1 had not reached it when rank " +
                   std::to_string(2 - rank) + " stopped waiting") != std::string::npos;
    EXPECT_TRUE(names_both || found_marks) << error;
    naming_both += names_both ? 1 : 0;
  }
  EXPECT_GE(naming_both, 1);
}

// ---- Note [NCCL collective check]: agreement on each operation through the store

TEST(NcclCollectiveCheck, DescriptionsNameTheOpsAndLeaveOutAllToAllCounts) {
  using transport::OpKind;
  using transport::OpSignature;
  const OpSignature sum{OpKind::AllReduce, DType::Float32, 4, 4, ReduceOp::Kind::Sum, -1,
                        std::nullopt};
  const OpSignature gather{OpKind::AllGather, DType::BFloat16, 2, 6, ReduceOp::Kind::Sum, -1,
                           std::nullopt};
  EXPECT_EQ(check_description("all_reduce_coalesced", {sum, gather}),
            "all_reduce_coalesced all_reduce(Float32, send=4, recv=4, sum), "
            "all_gather(BFloat16, send=2, recv=6)");
  const OpSignature a2a_one{OpKind::AllToAll,    DType::Int64, 3,           5,
                            ReduceOp::Kind::Sum, -1,           std::nullopt};
  const OpSignature a2a_two{OpKind::AllToAll,    DType::Int64, 7,           1,
                            ReduceOp::Kind::Sum, -1,           std::nullopt};
  EXPECT_EQ(check_description("all_to_all_single", {a2a_one}),
            check_description("all_to_all_single", {a2a_two}))
      << "uneven splits differ by design";
  EXPECT_EQ(check_description("all_to_all_single", {a2a_one}),
            "all_to_all_single all_to_all(Int64)");
  // Core's lowered dtypes (Note [Lowering]) are named: Bool against UInt8 disagrees.
  const OpSignature a2a_bool{OpKind::AllToAll,    DType::UInt8, 3,          3,
                             ReduceOp::Kind::Sum, -1,           DType::Bool};
  EXPECT_EQ(check_description("all_to_all_single", {a2a_bool}),
            "all_to_all_single all_to_all(Bool as UInt8)");
  const OpSignature complex_sum{OpKind::AllReduce, DType::Float32, 4, 4, ReduceOp::Kind::Sum, -1,
                                DType::Complex64};
  EXPECT_EQ(check_description("all_reduce", {complex_sum}),
            "all_reduce all_reduce(Complex64 as Float32, send=4, recv=4, sum)");
}

// Note [Layout digest] in core: equal counts in another shape or along another dim describe
// differently; all_to_all's digest (of its rows) is kept although its counts are left out.
TEST(NcclCollectiveCheck, DescriptionsCarryTheLayoutDigest) {
  using transport::OpKind;
  using transport::OpSignature;
  const OpSignature flat{OpKind::AllReduce, DType::Float32,       6, 6, ReduceOp::Kind::Sum, -1,
                         std::nullopt,      0x1111222233334444ULL};
  OpSignature square = flat;
  square.layout = 0x5555666677778888ULL;
  EXPECT_EQ(check_description("all_reduce", {flat}),
            "all_reduce all_reduce(Float32, send=6, recv=6, sum) [shapes/dims 33334444]");
  EXPECT_NE(check_description("all_reduce", {flat}), check_description("all_reduce", {square}));
  OpSignature rows{OpKind::AllToAll, DType::Int64, 3, 5, ReduceOp::Kind::Sum, -1,
                   std::nullopt,     0xabcULL};
  EXPECT_EQ(check_description("all_to_all_single", {rows}),
            "all_to_all_single all_to_all(Int64) [shapes/dims 00000abc]");
}

// Runs check_collective for operation `seq` of the group `members` (global ranks), each member
// a thread with its own client; a member with an empty description never arrives. Returns each
// member's error text ("" when it agreed).
// `late`: the last member starts that much after the others (a member that is merely slow).
// `splits[i]`: member i's all_to_all split sizes (none when `splits` is empty). `round`: the
// check round (-1: the round numbered as the operation, as on a communicator whose every check
// went ahead).
std::vector<std::string> check(store::Server& server, const std::vector<int>& members,
                               const std::vector<std::string>& descriptions, std::int64_t seq,
                               std::chrono::milliseconds timeout,
                               std::chrono::milliseconds grace = std::chrono::seconds(5),
                               std::chrono::milliseconds late = std::chrono::milliseconds(0),
                               const std::vector<std::vector<SplitSizes>>& splits = {},
                               std::int64_t round = -1) {
  std::vector<std::string> errors(members.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (descriptions[i].empty()) {
      continue;
    }
    threads.emplace_back([&, i] {
      store::Client client(options_for(server), std::chrono::seconds(30));
      const ErrorContext context{members[i], "all_reduce", seq, "'tp' [1, 3, 5]"};
      if (i + 1 == members.size()) {
        std::this_thread::sleep_for(late);  // makes the member late, synchronises nothing
      }
      try {
        check_collective(client, "tp/1,3,5,", members, static_cast<int>(i), seq,
                         round >= 0 ? round : seq, descriptions[i],
                         splits.empty() ? std::vector<SplitSizes>{} : splits[i], context, timeout,
                         grace);
      } catch (const Error& error) {
        errors[i] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  return errors;
}

TEST(NcclCollectiveCheck, MembersIssuingTheSameOperationGoAheadAndLeaveNoKeys) {
  store::Server server;
  store::Client probe(options_for(server), std::chrono::seconds(30));
  const std::int64_t keys_before = probe.num_keys();
  const std::string op = "all_reduce all_reduce(Float32, send=4, recv=4, sum)";
  for (std::int64_t seq = 0; seq < 3; ++seq) {
    EXPECT_EQ(check(server, {1, 3, 5}, {op, op, op}, seq, std::chrono::seconds(30)),
              std::vector<std::string>(3))
        << "operation #" << seq;
  }
  EXPECT_EQ(probe.num_keys(), keys_before);
}

TEST(NcclCollectiveCheck, ADifferentOperationIsAMismatchOnEveryMember) {
  store::Server server;
  const std::string sum = "all_reduce all_reduce(Float32, send=4, recv=4, sum)";
  const std::string max = "all_reduce all_reduce(Float32, send=4, recv=4, max)";
  const std::vector<std::string> errors =
      check(server, {1, 3, 5}, {sum, max, sum}, 9, std::chrono::seconds(30));
  for (std::size_t i = 0; i < 3; ++i) {
    const int rank = std::vector<int>{1, 3, 5}[i];
    EXPECT_NE(errors[i].find("chorus::CollectiveMismatch: [rank " + std::to_string(rank) +
                             "] all_reduce #9 on group 'tp' [1, 3, 5]: nccl: ranks disagree on "
                             "operation #9 of group 'tp' [1, 3, 5]: rank " +
                             std::to_string(rank) + " issued "),
              std::string::npos)
        << errors[i];
    EXPECT_NE(errors[i].find(rank == 3 ? "issued " + max + "; rank 1 issued " + sum
                                       : "issued " + sum + "; rank 3 issued " + max),
              std::string::npos)
        << errors[i];
    EXPECT_NE(errors[i].find("(--check-collectives)"), std::string::npos) << errors[i];
  }
}

TEST(NcclCollectiveCheck, AMemberThatNeverArrivesIsNamed) {
  store::Server server;
  const std::string op = "broadcast broadcast(UInt8, send=8, recv=8, root=0)";
  const std::vector<std::string> errors =
      check(server, {1, 3, 5}, {op, "", op}, 2, std::chrono::milliseconds(300));
  for (const std::size_t i : {std::size_t{0}, std::size_t{2}}) {
    EXPECT_NE(errors[i].find("chorus::Timeout: "), std::string::npos) << errors[i];
    // Named by the member whose deadline passed, or found in its marks by the other one.
    EXPECT_TRUE(errors[i].find("ranks [3] did not reach operation #2") != std::string::npos ||
                errors[i].find("did not happen: rank 3 had not reached it") != std::string::npos)
        << errors[i];
    EXPECT_NE(errors[i].find("operation #2 (" + op + ")"), std::string::npos) << errors[i];
  }
  EXPECT_TRUE(errors[1].empty());
}

// The grace for the store calls after the wait starts afresh at each call: a member that waited
// longer than the grace for a slow one still counts out (it used to time out on the store and
// lose its connection, while the slow one went on alone).
TEST(NcclCollectiveCheck, AMemberThatWaitedLongerThanTheGraceStillAgrees) {
  store::Server server;
  store::Client probe(options_for(server), std::chrono::seconds(30));
  const std::int64_t keys_before = probe.num_keys();
  const std::string op = "all_reduce all_reduce(Float32, send=4, recv=4, sum)";
  EXPECT_EQ(check(server, {1, 3, 5}, {op, op, op}, 0, std::chrono::seconds(30),
                  std::chrono::milliseconds(100), std::chrono::milliseconds(400)),
            std::vector<std::string>(3));
  EXPECT_EQ(probe.num_keys(), keys_before);
}

// ... and a member whose deadline is longer than the grace still marks the absent keys and names
// the absent member (it used to fail on the store before marking anything).
TEST(NcclCollectiveCheck, AnAbsentMemberIsNamedWhenTheDeadlineExceedsTheGrace) {
  store::Server server;
  const std::string op = "all_reduce all_reduce(Float32, send=4, recv=4, sum)";
  const std::vector<std::string> errors =
      check(server, {1, 3, 5}, {op, op, ""}, 4, std::chrono::milliseconds(500),
            std::chrono::milliseconds(100));
  for (const std::size_t i : {std::size_t{0}, std::size_t{1}}) {
    EXPECT_TRUE(errors[i].find("ranks [5] did not reach operation #4") != std::string::npos ||
                errors[i].find("did not happen: rank 5 had not reached it") != std::string::npos)
        << errors[i];
  }
  // The absent member, arriving now, finds the marks instead of going ahead alone.
  const std::vector<std::string> late =
      check(server, {1, 3, 5}, {"", "", op}, 4, std::chrono::seconds(30));
  EXPECT_NE(late[2].find("reached operation #4 (" + op + ") too late"), std::string::npos)
      << late[2];
}

// Core gives a failed operation's sequence number back (Note [Transport contract]), so a retry is
// the same operation number; each member counts the check rounds it entered, and the retry is a
// fresh round, not the failed round's marked keys. Member 5's call failed before its check, so it
// never entered round 4: members 1 and 3 time out there. In the retry 1 and 3 enter round 5 at
// once (their keys are published there, not among round 4's marks), while 5 enters round 4,
// meets the marks ("too late"), and then joins them in round 5.
TEST(NcclCollectiveCheck, ARetryOfATimedOutOperationIsAFreshRound) {
  store::Server server;
  const std::string op = "all_reduce all_reduce(Float32, send=4, recv=4, sum)";
  const std::vector<std::string> timed_out =
      check(server, {1, 3, 5}, {op, op, ""}, 4, std::chrono::milliseconds(300));
  for (const std::size_t i : {std::size_t{0}, std::size_t{1}}) {
    EXPECT_NE(timed_out[i].find("chorus::Timeout: "), std::string::npos) << timed_out[i];
  }
  std::vector<std::string> retried;
  std::thread one_and_three([&] {
    retried = check(server, {1, 3, 5}, {op, op, ""}, 4, std::chrono::seconds(30),
                    std::chrono::seconds(5), std::chrono::milliseconds(0), {}, 5);
  });
  store::Client five(options_for(server), std::chrono::seconds(30));
  // Errors are kept, not thrown, so the thread is always joined before the assertions.
  const auto error_of = [](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const Error& error) {
      return error.what();
    }
    return "";
  };
  const std::string round_5 = "chorus/nccl/check/tp/1,3,5,/5/";
  const std::string wait_error = error_of([&] {
    five.wait({round_5 + "1", round_5 + "3"}, std::chrono::seconds(10));
  });
  const ErrorContext context{5, "all_reduce", 4, "'tp' [1, 3, 5]"};
  const auto member_5_in_round = [&](std::int64_t round_index) {
    return error_of([&] {
      check_collective(five, "tp/1,3,5,", {1, 3, 5}, 2, 4, round_index, op, {}, context,
                       std::chrono::seconds(30));
    });
  };
  const std::string late = member_5_in_round(4);
  const std::string in_step = member_5_in_round(5);
  one_and_three.join();
  EXPECT_EQ(wait_error, "");
  EXPECT_NE(late.find("reached operation #4 (" + op + ") too late"), std::string::npos) << late;
  EXPECT_EQ(in_step, "");
  EXPECT_EQ(retried, std::vector<std::string>(3));
}

TEST(NcclCollectiveCheck, PremulSumFactorsAreComparedBitForBit) {
  using transport::OpKind;
  using transport::OpSignature;
  const OpSignature third{
      OpKind::AllReduce, DType::Float32, 4, 4, ReduceOp::premul_sum(1.0 / 3), -1, std::nullopt};
  const OpSignature rounded{
      OpKind::AllReduce, DType::Float32, 4, 4, ReduceOp::premul_sum(0.3333333), -1, std::nullopt};
  // The texts differ too (they printed alike with six digits, before 2026-12-03).
  EXPECT_NE(third.to_string(), rounded.to_string());
  EXPECT_NE(check_description("all_reduce", {third}), check_description("all_reduce", {rounded}));
}

TEST(NcclCollectiveCheck, AGroupOfOneHasNothingToCompare) {
  store::Server server;
  store::Client client(options_for(server), std::chrono::seconds(30));
  const std::int64_t keys_before = client.num_keys();
  check_collective(client, "tp/4,", {4}, 0, 0, 0, "all_reduce x", {},
                   ErrorContext{4, "all_reduce", 0, "[4]"}, std::chrono::milliseconds(1));
  EXPECT_EQ(client.num_keys(), keys_before);
}

// Split sizes of an uneven all_to_all over members 1, 3, 5 that agree pairwise: member i sends
// member j i + 2j + 1 elements (itself included).
std::vector<std::vector<SplitSizes>> matching_splits() {
  std::vector<std::vector<SplitSizes>> splits(3, std::vector<SplitSizes>(1));
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 3; ++j) {
      splits[i][0].send.push_back(i + 2 * j + 1);
      splits[i][0].recv.push_back(j + 2 * i + 1);
    }
  }
  return splits;
}

const std::string kAllToAll = "all_to_all_single all_to_all(Int64)";

TEST(NcclCollectiveCheck, AllToAllSplitSizesThatMatchPairwiseAgree) {
  store::Server server;
  store::Client probe(options_for(server), std::chrono::seconds(30));
  const std::int64_t keys_before = probe.num_keys();
  EXPECT_EQ(check(server, {1, 3, 5}, {kAllToAll, kAllToAll, kAllToAll}, 3, std::chrono::seconds(30),
                  std::chrono::seconds(5), std::chrono::milliseconds(0), matching_splits()),
            std::vector<std::string>(3));
  EXPECT_EQ(probe.num_keys(), keys_before);
}

// Member 3 expects one element more from member 5 than 5 sends it: every member names that pair,
// in the same words.
TEST(NcclCollectiveCheck, AMismatchedSplitSizeIsNamedAlikeOnEveryMember) {
  store::Server server;
  std::vector<std::vector<SplitSizes>> splits = matching_splits();
  splits[1][0].recv[2] += 1;  // 5 sends 3 2 + 2 * 1 + 1 = 5 elements, 3 now expects 6
  const std::vector<std::string> errors =
      check(server, {1, 3, 5}, {kAllToAll, kAllToAll, kAllToAll}, 7, std::chrono::seconds(30),
            std::chrono::seconds(5), std::chrono::milliseconds(0), splits);
  const std::string expected =
      "all_reduce #7 on group 'tp' [1, 3, 5]: nccl: ranks disagree on the split sizes of "
      "operation #7 of group 'tp' [1, 3, 5] (" +
      kAllToAll +
      "): rank 5 sends 5 elements to rank 3, which expects 6 from it "
      "(--check-collectives)";
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(errors[i], "chorus::CollectiveMismatch: [rank " +
                             std::to_string(std::vector<int>{1, 3, 5}[i]) + "] " + expected);
  }
}

TEST(NcclCollectiveCheck, AMemberWhoseOwnSplitSizesDisagreeIsNamedOnEveryMember) {
  store::Server server;
  std::vector<std::vector<SplitSizes>> splits = matching_splits();
  splits[0][0].send[0] = 0;  // member 1 sends itself nothing but expects 1 element
  const std::vector<std::string> errors =
      check(server, {1, 3, 5}, {kAllToAll, kAllToAll, kAllToAll}, 0, std::chrono::seconds(30),
            std::chrono::seconds(5), std::chrono::milliseconds(0), splits);
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("rank 1 sends 0 elements to rank 1, which expects 1 from it"),
              std::string::npos)
        << error;
  }
}

TEST(NcclCollectiveCheck, ABatchNamesWhichOfItsAllToAllsDisagrees) {
  store::Server server;
  std::vector<std::vector<SplitSizes>> splits = matching_splits();
  for (std::vector<SplitSizes>& member : splits) {
    member.push_back(member[0]);
  }
  splits[2][1].send[0] = 9;  // the second all_to_all: 5 sends 1 nine elements, 1 expects 3
  const std::string batch = "all_to_all_coalesced all_to_all(Int64), all_to_all(Int64)";
  const std::vector<std::string> errors =
      check(server, {1, 3, 5}, {batch, batch, batch}, 1, std::chrono::seconds(30),
            std::chrono::seconds(5), std::chrono::milliseconds(0), splits);
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("(" + batch +
                         "), all_to_all 2 of 2: rank 5 sends 9 elements to rank 1, which expects "
                         "3 from it"),
              std::string::npos)
        << error;
  }
}

// Split sizes are compared only between members that issued the same operations: a different
// operation is reported as such first.
TEST(NcclCollectiveCheck, ADifferentOperationIsReportedBeforeSplitSizes) {
  store::Server server;
  std::vector<std::vector<SplitSizes>> splits = matching_splits();
  splits[1].clear();
  const std::string sum = "all_reduce all_reduce(Int64, send=4, recv=4, sum)";
  const std::vector<std::string> errors =
      check(server, {1, 3, 5}, {kAllToAll, sum, kAllToAll}, 2, std::chrono::seconds(30),
            std::chrono::seconds(5), std::chrono::milliseconds(0), splits);
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("nccl: ranks disagree on operation #2 of group 'tp' [1, 3, 5]: rank "),
              std::string::npos)
        << error;
    EXPECT_EQ(error.find("split sizes"), std::string::npos) << error;
  }
}

// A value no member of this build publishes (another program on the same store) is a mismatch
// naming the member, not a crash.
TEST(NcclCollectiveCheck, AnUnreadableValueIsAMismatchNamingItsMember) {
  store::Server server;
  store::Client stray(options_for(server), std::chrono::seconds(30));
  stray.set("chorus/nccl/check/tp/1,3,5,/6/5", kAllToAll + "\n1,x;2");
  const std::vector<std::vector<SplitSizes>> splits = matching_splits();
  const std::vector<std::string> errors =
      check(server, {1, 3, 5}, {kAllToAll, kAllToAll, ""}, 6, std::chrono::seconds(30),
            std::chrono::seconds(5), std::chrono::milliseconds(0), splits);
  for (const std::size_t i : {std::size_t{0}, std::size_t{1}}) {
    EXPECT_NE(errors[i].find("chorus::CollectiveMismatch: "), std::string::npos) << errors[i];
    EXPECT_NE(errors[i].find("nccl: rank 5 published an unreadable check value for operation #6"),
              std::string::npos)
        << errors[i];
  }
}

// ---- The pinned staging pool (Note [Pinned staging pool]), on host memory

// Host memory standing in for cudaMallocHost/cudaFreeHost, counting the calls.
struct CountingMemory {
  std::shared_ptr<std::atomic<int>> allocations = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> frees = std::make_shared<std::atomic<int>>(0);

  std::shared_ptr<detail::BlockPool> pool(std::size_t keep_bytes) const {
    return detail::BlockPool::make(
        [allocations = allocations](std::size_t bytes) {
          ++*allocations;
          return std::malloc(bytes);
        },
        [frees = frees](void* block) {
          ++*frees;
          std::free(block);
        },
        keep_bytes);
  }
};

TEST(NcclPinnedPool, SizeClassesArePowersOfTwoFromFourKiB) {
  using detail::BlockPool;
  EXPECT_EQ(BlockPool::size_class(0), 4096u);
  EXPECT_EQ(BlockPool::size_class(1), 4096u);
  EXPECT_EQ(BlockPool::size_class(4096), 4096u);
  EXPECT_EQ(BlockPool::size_class(4097), 8192u);
  EXPECT_EQ(BlockPool::size_class((std::size_t{1} << 20) + 1), std::size_t{2} << 20);
}

TEST(NcclPinnedPool, AFreedBlockIsHandedOutAgainWithoutAllocating) {
  const CountingMemory memory;
  const std::shared_ptr<detail::BlockPool> pool = memory.pool(std::size_t{1} << 20);
  void* first = nullptr;
  {
    const std::shared_ptr<void> block = pool->take(100);
    first = block.get();
    std::memset(block.get(), 7, 4096);  // the whole size class is usable
  }
  EXPECT_EQ(pool->kept_bytes(), 4096u);
  const std::shared_ptr<void> again = pool->take(4000);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool->kept_bytes(), 0u);
  const std::shared_ptr<void> other_class = pool->take(5000);
  EXPECT_NE(other_class.get(), first);
  EXPECT_EQ(memory.allocations->load(), 2);
  EXPECT_EQ(memory.frees->load(), 0);
}

TEST(NcclPinnedPool, BlocksBeyondWhatItKeepsAreFreedByFreeUnkept) {
  const CountingMemory memory;
  const std::shared_ptr<detail::BlockPool> pool = memory.pool(8192);
  {
    const std::shared_ptr<void> a = pool->take(4096);
    const std::shared_ptr<void> b = pool->take(4096);
    const std::shared_ptr<void> c = pool->take(4096);
  }
  EXPECT_EQ(pool->kept_bytes(), 8192u);
  EXPECT_EQ(memory.frees->load(), 0) << "not freed where it is given back";
  { const std::shared_ptr<void> big = pool->take(16384); }
  EXPECT_EQ(memory.frees->load(), 0) << "nor by a take, which may run under a lock";
  pool->free_unkept();
  EXPECT_EQ(memory.frees->load(), 2) << "the third block and the one that does not fit";
  EXPECT_EQ(memory.allocations->load(), 4);
}

// A Work gives its staging blocks back on the watchdog or a waiting thread, where cudaFreeHost
// (which synchronises the device) would wait for a hung kernel the watchdog has to time out:
// a block the pool does not keep is freed by free_unkept(), which the issuing thread calls before
// it takes the communicator's lock.
TEST(NcclPinnedPool, ABlockNotKeptIsFreedOnTheIssuingThreadNotWhereItIsGivenBack) {
  auto freed_on = std::make_shared<std::vector<std::thread::id>>();
  const std::shared_ptr<detail::BlockPool> pool =
      detail::BlockPool::make([](std::size_t bytes) { return std::malloc(bytes); },
                              [freed_on](void* block) {
                                freed_on->push_back(std::this_thread::get_id());
                                std::free(block);
                              },
                              4096);
  std::shared_ptr<void> large = pool->take(std::size_t{1} << 20);
  std::thread([&large] { large.reset(); }).join();
  EXPECT_TRUE(freed_on->empty());
  pool->free_unkept();
  EXPECT_EQ(*freed_on, std::vector<std::thread::id>{std::this_thread::get_id()});
}

TEST(NcclPinnedPool, BlocksNotKeptAreFreedWhenThePoolEnds) {
  const CountingMemory memory;
  {
    const std::shared_ptr<detail::BlockPool> pool = memory.pool(4096);
    { const std::shared_ptr<void> large = pool->take(std::size_t{1} << 20); }
    EXPECT_EQ(memory.frees->load(), 0);
  }
  EXPECT_EQ(memory.frees->load(), 1);
}

// A request beyond what the pool keeps is never kept: it gets whole pages, not a power of two
// (65 MiB would pin 128 MiB).
TEST(NcclPinnedPool, ARequestBeyondWhatItKeepsGetsWholePagesAndIsFreed) {
  std::vector<std::size_t> sizes;
  const std::shared_ptr<detail::BlockPool> pool = detail::BlockPool::make(
      [&sizes](std::size_t bytes) {
        sizes.push_back(bytes);
        return std::malloc(bytes);
      },
      [](void* block) { std::free(block); }, 8192);
  { const std::shared_ptr<void> big = pool->take(10000); }
  EXPECT_EQ(sizes, std::vector<std::size_t>{12288});
  EXPECT_EQ(pool->kept_bytes(), 0u);
}

TEST(NcclPinnedPool, BlocksComeBackFromAnyThreadAndOutliveTheirOwner) {
  const CountingMemory memory;
  std::shared_ptr<detail::BlockPool> pool = memory.pool(std::size_t{1} << 20);
  std::vector<std::shared_ptr<void>> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(pool->take(static_cast<std::size_t>(i + 1) * 3000));
  }
  pool.reset();  // the owner (the transport) ends first; the blocks keep the pool alive
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&blocks, t] {
      blocks[static_cast<std::size_t>(2 * t)].reset();
      blocks[static_cast<std::size_t>(2 * t + 1)].reset();
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(memory.allocations->load(), 8);
  EXPECT_EQ(memory.frees->load(), 8) << "the last block out frees every kept one";
}

// ---- Core's reductions through NCCL's mapping (on the simulator: no device)

// The simulator's transport narrowed to what NCCL's mapping allows, as NcclTransport::supports
// narrows NCCL's.
std::string nccl_refusal(transport::OpKind kind, DType dtype, const ReduceOp& reduce_op,
                         Device /*device*/) {
  return transport::op_kind_reduces(kind) ? mapping_problem(dtype, reduce_op) : std::string();
}

// Core lowers Bool to UInt8 (Note [Lowering]); its band and bor travel as min and max, which
// NCCL has, so they run; bxor on Bool and bitwise ops on integers are refused before anything
// starts, with the reason unsupported_reduction gives.
TEST(NcclMappingThroughCore, BoolBandAndBorRunAndBitwiseOnIntegersIsRefused) {
  auto refusals = std::make_shared<std::atomic<int>>(0);
  sim::SimOptions options;
  options.world_size = 2;
  options.seed_from_environment = false;
  options.wrap_transport = chorus::testing::narrow(nccl_refusal, refusals);
  std::vector<std::vector<std::string>> results(2);
  const sim::SimReport report = sim::run(options, [&] {
    std::vector<std::string>& out = results[static_cast<std::size_t>(rank())];
    const auto text = [](const Tensor& tensor) {
      std::string bits;
      for (const bool bit : tensor.to_vector<bool>()) {
        bits += bit ? '1' : '0';
      }
      return bits;
    };
    const Tensor bits = Tensor::from_vector<bool>(rank() == 0 ? std::vector<bool>{1, 1, 0, 0}
                                                              : std::vector<bool>{1, 0, 1, 0});
    out.push_back("band " + text(all_reduce(bits, "band", world())));
    out.push_back("bor " + text(all_reduce(bits, "bor", world())));
    out.push_back("rs bor " + text(reduce_scatter_tensor(bits, "bor", 0, world())));
    out.push_back("reduce band " + text(reduce(bits, "band", 0, world())));
    const std::vector<Tensor> coalesced = all_reduce_coalesced({bits, bits}, "bor", world());
    out.push_back("coalesced bor " + text(coalesced[0]) + " " + text(coalesced[1]));
    Tensor in_place = bits.clone();
    out.push_back("inplace band " + text(all_reduce_inplace(in_place, "band", world())));
    out.push_back("supported " + unsupported_reduction(DType::Bool, "band") + "|" +
                  unsupported_reduction(DType::Bool, "bor") + "|" +
                  unsupported_reduction(DType::Float32, "sum"));
    const auto refused = [&](const Tensor& input, const char* op) {
      const std::string reason = unsupported_reduction(input.dtype(), op);
      try {
        (void)all_reduce(input, op, world());
        return std::string(op) + " ran";
      } catch (const InvalidArgument& error) {
        const bool names_reason =
            !reason.empty() && std::string(error.what()).find(reason) != std::string::npos;
        return std::string(op) + " refused: " + reason + (names_reason ? "" : " (not named)");
      }
    };
    out.push_back(refused(bits, "bxor"));
    out.push_back(refused(Tensor::from_vector<std::int32_t>({6, 3}), "band"));
    // Nothing was numbered: the group still pairs up.
    out.push_back("after " + text(all_reduce(bits, "bor", world())));
  });
  ASSERT_TRUE(report.ok()) << report.to_string();
  const std::vector<std::string> common = {
      "band 1000",
      "bor 1110",
      "coalesced bor 1110 1110",
      "inplace band 1000",
      "supported ||",
      "bxor refused: nccl: reduce_op bxor on UInt8 is not supported by the NCCL backend (NCCL "
      "has no bitwise reductions)",
      "band refused: nccl: reduce_op band on Int32 is not supported by the NCCL backend (NCCL "
      "has no bitwise reductions)",
      "after 1110",
  };
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> expected = common;
    expected.insert(expected.begin() + 2, r == 0 ? "rs bor 11" : "rs bor 10");
    expected.insert(expected.begin() + 3, r == 0 ? "reduce band 1000" : "reduce band 0000");
    EXPECT_EQ(results[static_cast<std::size_t>(r)], expected) << "rank " << r;
  }
  EXPECT_GE(refusals->load(), 4);  // bxor and band on each rank (and their queries)
}

// ---- Aborting a communicator (Note [NCCL work lifecycle])

// The watchdog (or a wait) that finds one work failed aborts its communicator with that work's
// error; every other outstanding work fails too, naming its own op and sequence number. A
// CommState with no communicator or stream stands in for one: ncclCommAbort(nullptr) does
// nothing, and the CUDA calls on null handles fail harmlessly, with or without a device.
TEST(NcclAbort, EveryOutstandingWorkNamesItsOwnOpAndSequenceNumber) {
  // A CommState without communicator or stream: its CUDA and NCCL calls fail harmlessly without
  // a device. Where one is present, what null handles do to the driver was never run, and the
  // one-shot GPU check should not find out; the logic under test is the same either way.
  if (cuda_device_count().count > 0) {
    GTEST_SKIP() << "null-handle CommState: run on machines without a CUDA device";
  }
  const std::string group = "[0, 1]";
  auto state =
      std::make_shared<detail::CommState>(nullptr, nullptr, 0, group, std::chrono::seconds(1));
  const auto work_at = [&](const char* op, std::int64_t seq) {
    return std::make_shared<detail::NcclWork>(state, nullptr, detail::Started{},
                                              transport::Fingerprint{},
                                              ErrorContext{0, op, seq, group});
  };
  const std::shared_ptr<detail::NcclWork> tripped = work_at("all_reduce", 3);
  const std::shared_ptr<detail::NcclWork> behind = work_at("all_gather", 4);
  {
    const std::lock_guard lock(state->mutex());
    state->track(tripped);
    state->track(behind);
  }
  const std::string cause =
      "nccl: the operation did not complete within 1000 ms (watchdog); communicator [0, 1] "
      "aborted";
  state->abort(make_error(ErrorCode::Timeout, ErrorContext{0, "all_reduce", 3, group}, cause));
  EXPECT_TRUE(state->aborted());
  const std::vector<std::pair<std::shared_ptr<detail::NcclWork>, std::string>> expected = {
      {tripped, "all_reduce #3"}, {behind, "all_gather #4"}};
  for (const auto& [work, names] : expected) {
    ASSERT_EQ(work->status(), transport::WorkStatus::Failed) << names;  // so wait() returns
    SCOPED_TRACE(names);
    const testing::CaughtError caught = testing::expect_error<Timeout>(
        [&work = work] { work->wait(transport::Deadline::never()); }, {});
    EXPECT_TRUE(testing::contains(caught.what, names)) << caught.what;
    EXPECT_EQ(caught.detail, cause);
  }
}

// ---- Without a device

TEST(NcclNoDevice, TransportNcclFailsWithAClearError) {
  const DeviceCount devices = cuda_device_count();
  if (devices.count > 0) {
    GTEST_SKIP() << "a CUDA device is present: the gpu tests cover it";
  }
  EXPECT_NE(devices.problem.find("no CUDA device: cudaGetDeviceCount returned"), std::string::npos)
      << devices.problem;
  NcclRunOptions options;
  options.environment = parse(kGood);
  bool ran = false;
  testing::expect_error<TransportError>([&] { (void)nccl::run(options, [&] { ran = true; }); },
                                        {"no CUDA device: cudaGetDeviceCount returned"});
  EXPECT_FALSE(ran);
}

// The environment is read before the device is looked for: a job script's mistake is named as
// such on any machine, with or without a GPU.
TEST(NcclNoDevice, AMissingEnvironmentIsNamedBeforeTheDevice) {
  RunOptions options;
  options.transport = "nccl";
  bool ran = false;
  testing::expect_error<InvalidArgument>([&] { (void)chorus::run(options, [&] { ran = true; }); },
                                         {"environment variable WORLD_SIZE is not set"});
  EXPECT_FALSE(ran);
}

TEST(NcclNoDevice, TheFlagIsAccepted) {
  char program[] = "program";
  char flag[] = "--transport=nccl";
  char* argv[] = {program, flag};
  EXPECT_EQ(RunOptions::from_args(2, argv).transport, "nccl");
}

}  // namespace
}  // namespace chorus::nccl
