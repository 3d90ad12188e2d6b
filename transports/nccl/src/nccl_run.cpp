// chorus::nccl::run — one process as one chorus rank on one CUDA device (chorus/nccl/nccl.hpp).

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/error.hpp"
#include "chorus/nccl/nccl.hpp"
#include "chorus/runtime.hpp"
#include "nccl_transport.hpp"

namespace chorus::nccl {
namespace {

// How long a failed rank spends reporting its failure to the others (exit_barrier_failed): a
// few round trips to a live store take milliseconds; this only bounds a store that went away.
constexpr std::chrono::seconds kFailureReportTimeout{10};

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

}  // namespace

namespace detail {

// Note [NCCL store]
// Rank 0 hosts the store at MASTER_ADDR:MASTER_PORT, as torch's TCPStore does under torchrun.
// When that address is taken — a launcher (chorus launch) hosts the store there already — rank 0
// connects to it like every other rank (store::AddressInUse). Any other failure to listen (an
// address not of this host) is rank 0's TransportError at once: connecting anyway would leave
// every rank waiting for a store nobody hosts until its timeout. The server lives until every rank
// passed the exit barrier, so no rank loses the store while it still sets up a communicator, nor
// while it is in the exit barrier itself: store::exit_barrier (Note [Exit barrier] in store.cpp)
// returns on rank 0 only once every other rank has made its last store call, so rank 0 may leave
// run() and destroy the server at once. (A plain Rendezvous::barrier returned to rank 0 while other
// ranks still waited for its answers, and they failed "exit barrier: ... server gone?" after a
// correct job.)
//
// A rank that failed does not wait in the exit barrier: it reports its failure there
// (store::exit_barrier_failed) and leaves, also when its transport or rank context could not be
// set up (run() then throws that error after the report), and the others' exit barrier throws
// RankFailure naming it. Rank 0 cannot when it hosts the server, which goes with it: the others'
// store calls get TransportError (server gone) at once.
StoreConnection connect_store(const Environment& environment, std::chrono::nanoseconds timeout) {
  StoreConnection connection;
  if (environment.rank == 0) {
    store::ServerOptions server_options;
    server_options.host = environment.master_addr;
    server_options.port = environment.master_port;
    try {
      connection.server = std::make_unique<store::Server>(server_options);
    } catch (const store::AddressInUse&) {
      // Taken: a launcher hosts the store there (Note [NCCL store]); connect to it.
    } catch (const Error& error) {
      // Not bindable here (MASTER_ADDR is not this host's, say). Connecting instead would only
      // wait, on every rank, for a store nobody hosts until the timeout.
      throw TransportError(ErrorContext{0, "nccl::run", -1, ""},
                           "rank 0 cannot host the store at MASTER_ADDR:MASTER_PORT (" +
                               environment.master_addr + ":" +
                               std::to_string(environment.master_port) + "): " + error.detail());
    }
  }
  store::ClientOptions client_options;
  client_options.host = environment.master_addr;
  client_options.port = environment.master_port;
  connection.client = std::make_shared<store::Client>(client_options, timeout);
  return connection;
}

}  // namespace detail

DeviceCount cuda_device_count() noexcept {
  DeviceCount result;
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess) {
    try {
      result.problem =
          "no CUDA device: cudaGetDeviceCount returned " + detail::cuda_error_text(code);
    } catch (...) {
      result.problem.clear();  // out of memory for the text: the count alone says it
    }
    return result;
  }
  result.count = count;
  if (count <= 0) {
    result.count = 0;
    result.problem = "no CUDA device: cudaGetDeviceCount returned 0 devices";
  }
  return result;
}

std::string platform_report() noexcept {
  try {
    const auto version_text = [](int version) {  // CUDA's 13000 -> "13.0"
      return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
    };
    std::string out = "NCCL ";
    int nccl_version = 0;
    if (const ncclResult_t code = ncclGetVersion(&nccl_version); code == ncclSuccess) {
      // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
      out += std::to_string(nccl_version / 10000) + "." +
             std::to_string(nccl_version % 10000 / 100) + "." + std::to_string(nccl_version % 100);
    } else {
      out += std::string("unknown (ncclGetVersion: ") + ncclGetErrorString(code) + ")";
    }
    int runtime = 0;
    int driver = 0;
    out += "; CUDA runtime ";
    out += cudaRuntimeGetVersion(&runtime) == cudaSuccess ? version_text(runtime) : "unknown";
    out += ", driver ";
    const cudaError_t driver_code = cudaDriverGetVersion(&driver);
    out += driver_code != cudaSuccess ? "unknown (" + detail::cuda_error_text(driver_code) + ")"
           : driver == 0              ? "none"
                                      : version_text(driver);
    const DeviceCount devices = cuda_device_count();
    if (devices.count == 0) {
      return out + "; " + devices.problem;
    }
    for (int device = 0; device < devices.count; ++device) {
      cudaDeviceProp props{};
      out += "; cuda:" + std::to_string(device) + " ";
      out += cudaGetDeviceProperties(&props, device) == cudaSuccess ? props.name : "unknown";
      int pools = 0;
      const cudaError_t code =
          cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
      out += " (memory pools: ";
      out += code != cudaSuccess ? "unknown, " + detail::cuda_error_text(code)
             : pools != 0        ? "yes"
                                 : "NO: chorus cannot allocate CUDA storage here";
      out += ")";
    }
    return out;
  } catch (...) {
    return "platform report: out of memory";
  }
}

int run(const NcclRunOptions& options, std::function<void()> rank_main) {
  // The environment first: a job script's mistake is reported as such on any machine, also on
  // one without a GPU.
  const Environment environment = options.environment ? *options.environment : read_environment();
  const int rank = environment.rank;
  const int world_size = environment.world_size;
  const DeviceCount devices = cuda_device_count();
  if (devices.count == 0) {
    throw TransportError(ErrorContext{rank, "nccl::run", -1, ""},
                         devices.problem.empty() ? "no CUDA device" : devices.problem);
  }
  const int device = environment.local_rank % devices.count;
  if (const cudaError_t code = cudaSetDevice(device); code != cudaSuccess) {
    throw TransportError(ErrorContext{rank, "nccl::run", -1, ""},
                         "nccl: cudaSetDevice(" + std::to_string(device) +
                             ") failed: " + detail::cuda_error_text(code));
  }
  detail::StoreConnection connection = detail::connect_store(environment, options.timeout);
  int status = 0;
  std::string failure;               // describe() of this rank's error, when status is 1
  std::exception_ptr setup_failure;  // of the transport or the rank context, rethrown below
  {
    const char* split = std::getenv("CHORUS_NCCL_SPLIT");
    const bool split_partitions =
        options.split_partitions || (split != nullptr && std::string_view(split) == "1");
    std::shared_ptr<detail::NcclTransport> transport;
    std::optional<RankContext> context;
    try {
      transport = std::make_shared<detail::NcclTransport>(environment, connection.client, device,
                                                          options.timeout, split_partitions,
                                                          options.check_collectives);
      RankOptions rank_options;
      rank_options.timeout = options.timeout;
      rank_options.host_pool_bytes_max = options.host_pool_bytes_max;
      rank_options.device_memory = cuda_device_memory(device);
      context.emplace(transport, rank_options);
    } catch (...) {
      // Note [NCCL store]: the others would wait for this rank in the exit barrier until their
      // timeout, then blame nobody; it reports below, as a rank whose function threw does, and
      // then throws (the caller prints it, as every error of run()'s set-up).
      setup_failure = std::current_exception();
      status = 1;
      failure = describe(setup_failure);
    }
    if (context) {
      const ScopedRankBinding binding(&*context);
      std::exception_ptr error;
      try {
        rank_main();
      } catch (...) {
        error = std::current_exception();
      }
      if (!error) {
        RankContext::Summary summary = context->finish();
        report_unwaited(summary.unwaited);
        error = summary.error;
      }
      if (error) {
        std::fprintf(
            stderr,
            "chorus: rank %d of %d failed: %s\n"
            "chorus: aborting rank %d's NCCL communicators so no other rank waits for it\n",
            rank, world_size, describe(error).c_str(), rank);
        std::fflush(stderr);
        transport->abort_all(error);
        status = 1;
        failure = describe(error);
      }
    }
  }
  if (status != 0 && !connection.server) {
    // Note [Exit barrier]: the others wait for this rank in the exit barrier; tell them why it
    // will not come, without waiting there (a failed rank should exit at once). Best effort, on
    // a short deadline: a store error is printed, the exit status stays this rank's failure.
    // Rank 0 when it hosts the server cannot (its server goes as it exits: the others' store
    // calls get TransportError at once).
    try {
      store::PrefixStore prefix("chorus/nccl/exit", *connection.client);
      store::exit_barrier_failed(
          prefix, rank, world_size, failure,
          std::min<std::chrono::nanoseconds>(options.timeout, kFailureReportTimeout));
    } catch (const Error& report_error) {
      std::fprintf(stderr, "chorus: rank %d: could not report its failure to the other ranks: %s\n",
                   rank, report_error.what());
    }
  }
  if (setup_failure) {
    std::rethrow_exception(setup_failure);  // as before the report: run() throws set-up errors
  }
  if (status == 0) {
    // Note [NCCL store]: rank 0's server stays up until every rank is done with it.
    try {
      store::PrefixStore prefix("chorus/nccl/exit", *connection.client);
      store::exit_barrier(prefix, rank, world_size, options.timeout);
    } catch (const Error& barrier_error) {
      std::fprintf(stderr, "chorus: rank %d: exit barrier: %s\n", rank, barrier_error.what());
      status = 1;
    }
  }
  return status;
}

}  // namespace chorus::nccl
