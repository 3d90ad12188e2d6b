// bench_nccl: the host overhead of chorus on the NCCL transport, against raw ncclAllReduce in the
// same process (issue 6, item 6; docs/performance.md, "NCCL host overhead (bench_nccl)").
//
//   build/nccl/bench/bench_nccl [--min-bytes=8] [--max-bytes=64M] [--step=2] [--iters=0]
//       [--warmup=5] [--reps=5] [--timeout-ms=600000]
//
// One rank on one CUDA device (NCCL 2.28 allows one rank per GPU). Started alone it hosts the
// rendezvous store itself and runs as rank 0 of a world of 1, like the gpu test job; under
// `chorus launch -n 1` it uses the launcher's. Without a CUDA device it prints why and exits 77
// (the gpu tests' skip code).
//
// What is timed, per size (float32 elements, sum): `iters` back-to-back operations, each issued
// and completed before the next, alternating a chorus batch and a raw batch `reps` times (which
// goes first alternates too); the printed time per operation is the median over the reps (for an
// even count the mean of the two middle ones, as bench_mpi and bench_store take it).
// `time_ratio` is chorus time / raw time: above 1 chorus is slower (bench_mpi's `busbw_ratio`
// is the other way up, chorus busbw / raw busbw).
// - chorus: chorus::all_reduce_inplace on device memory wrapped with Tensor::from_blob (which
//   returns after ordering the legacy default stream behind the operation, DESIGN 2.4), then
//   cudaStreamSynchronize of that stream, as the raw side synchronises its own.
// - raw: ncclAllReduce in place on a buffer of the same size, on a communicator of its own
//   (ncclCommInitRank, one rank, default blocking config) and a non-blocking stream of its own,
//   then cudaStreamSynchronize: the same issue-and-complete per operation, written by hand.
// So "added" is everything chorus adds per operation on top of raw NCCL, enqueue and completion
// both: validation, the work registry, the transport's event and stream ordering, its polled
// waits.
//
// The second table is the enqueue alone (issue 6's "chorus adds under 2 us per op"): `iters`
// operations issued back to back with no host wait between them, then one device synchronise
// outside the timed loop.
// - chorus: `out = chorus::all_reduce(input, "sum", group); chorus::wait_tensor(out);` on a CUDA
//   tensor core allocated, i.e. validation, a fresh CUDA output (cudaMallocAsync; it is freed
//   once the watchdog saw the operation finish, off the timed thread), the work registry, the
//   transport's events and the stream wait of DESIGN 2.4 (Work::wait_on: the host does not
//   block; core keeps the work until it finished, Note [Stream-waited works]).
// - raw: ncclAllReduce from the input into an output buffer on the raw communicator's stream.
//
// Exactness: before timing, each path's buffer is filled with ones * (rank + 1) and reduced once;
// every element must equal the sum over ranks of (rank + 1), bitwise. With one rank the timed
// operations keep that value, and it is checked again after them. `#wrong` counts differing
// elements of both paths; any makes the exit status 1.

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chorus/chorus.hpp>
#include <chorus/nccl/nccl.hpp>
#include <chorus/store/store.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "sweep_flags.hpp"

namespace {

constexpr int kSkip = 77;
constexpr int kItersMax = 10000;
constexpr int kRepsMax = 101;

struct BenchOptions {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{64} << 20;
  std::size_t step = 2;  // size multiplier between rows: 8 B .. 64 MiB in 24 rows
  int iters = 0;         // 0: by size (kItersSmall up to 1 MiB, kItersLarge above)
  int warmup = 5;
  int reps = 5;
  // How long a wait may take before chorus throws Timeout (RunOptions::timeout).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

constexpr int kItersSmall = 200;
constexpr int kItersLarge = 20;
constexpr std::size_t kLargeBytes = std::size_t{1} << 20;

BenchOptions parse_options(int argc, char** argv) {
  BenchOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto [key, value] = chorus::bench::split_flag(arg);
    if (chorus::bench::apply_sweep_flag(options, key, value)) {
      continue;
    }
    if (key == "--transport") {
      // chorus::run's flag: accepted, and always nccl.
    } else if (key == "--timeout-ms") {
      const long long milliseconds = std::stoll(value);
      if (milliseconds <= 0) {
        throw std::invalid_argument("--timeout-ms must be positive");
      }
      options.timeout = std::chrono::milliseconds(milliseconds);
    } else {
      throw std::invalid_argument("unknown argument '" + arg + "'");
    }
  }
  if (options.min_bytes < sizeof(float) || options.min_bytes > options.max_bytes ||
      options.step < 2 || options.iters < 0 || options.iters > kItersMax || options.warmup < 0 ||
      options.reps < 1 || options.reps > kRepsMax) {
    throw std::invalid_argument(
        "need 4 <= min-bytes <= max-bytes, step >= 2, 0 <= iters <= 10000, warmup >= 0, "
        "1 <= reps <= 101");
  }
  return options;
}

void check_cuda(cudaError_t code, const char* call) {
  if (code != cudaSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(code) + " (" +
                             cudaGetErrorString(code) + ")");
  }
}

void check_nccl(ncclResult_t code, const char* call) {
  if (code != ncclSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + ncclGetErrorString(code));
  }
}

// Device memory for `count` floats, freed with cudaFree.
std::shared_ptr<float> device_floats(std::size_t count) {
  void* data = nullptr;
  check_cuda(cudaMalloc(&data, std::max<std::size_t>(count, 1) * sizeof(float)), "cudaMalloc");
  return {static_cast<float*>(data), [](float* pointer) { cudaFree(pointer); }};
}

void fill(float* data, std::size_t count, float value) {
  const std::vector<float> host(count, value);
  check_cuda(cudaMemcpy(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
             "cudaMemcpy");
}

// Elements of `data` that differ bitwise from `expected`.
std::size_t count_wrong(const float* data, std::size_t count, float expected) {
  std::vector<float> host(count);
  check_cuda(cudaMemcpy(host.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost),
             "cudaMemcpy");
  return static_cast<std::size_t>(std::count_if(host.begin(), host.end(), [&](float value) {
    return std::memcmp(&value, &expected, sizeof(float)) != 0;
  }));
}

// The device chorus::run selected for this rank (LOCAL_RANK % device count).
int current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

// Median microseconds per operation of each path.
struct Medians {
  double chorus_us = 0;
  double raw_us = 0;
};

// Warms both paths up, then times `reps` batches of `iters` operations of each, alternating which
// goes first. `time_chorus(n)` and `time_raw(n)` return the microseconds of n operations.
template <class TimeChorus, class TimeRaw>
Medians alternate(const BenchOptions& options, int iters, TimeChorus time_chorus,
                  TimeRaw time_raw) {
  (void)time_chorus(options.warmup);
  (void)time_raw(options.warmup);
  std::vector<double> chorus_us;
  std::vector<double> raw_us;
  for (int rep = 0; rep < options.reps; ++rep) {
    if (rep % 2 == 0) {
      chorus_us.push_back(time_chorus(iters) / iters);
      raw_us.push_back(time_raw(iters) / iters);
    } else {
      raw_us.push_back(time_raw(iters) / iters);
      chorus_us.push_back(time_chorus(iters) / iters);
    }
  }
  return Medians{median(chorus_us), median(raw_us)};
}

void print_columns() {
  std::printf("%12s %8s %12s %12s %10s %10s %7s\n", "size(B)", "iters", "chorus(us)", "raw(us)",
              "added(us)", "time_ratio", "#wrong");
}

void print_row(std::size_t bytes, int iters, const Medians& medians, std::size_t wrong) {
  std::printf("%12zu %8d %12.2f %12.2f %10.2f %10.2f %7zu\n", bytes, iters, medians.chorus_us,
              medians.raw_us, medians.chorus_us - medians.raw_us,
              medians.raw_us > 0 ? medians.chorus_us / medians.raw_us : 0.0, wrong);
  std::fflush(stdout);
}

// The raw side: a one-rank-per-process NCCL communicator of the same world, made through the
// store like chorus's (rank 0's unique id), and a non-blocking stream.
class RawNccl {
 public:
  RawNccl(int rank, int world_size) {
    const chorus::nccl::Environment environment = chorus::nccl::read_environment();
    chorus::store::ClientOptions client_options;
    client_options.host = environment.master_addr;
    client_options.port = environment.master_port;
    chorus::store::Client client(client_options, std::chrono::seconds(60));
    chorus::store::PrefixStore prefix("bench_nccl/raw/", client);
    chorus::store::Rendezvous rendezvous(prefix, rank, world_size);
    const std::string bytes = chorus::nccl::exchange_unique_id(
        rendezvous, sizeof(ncclUniqueId),
        [] {
          ncclUniqueId id{};
          check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
          return std::string(id.internal, sizeof(id.internal));
        },
        std::chrono::seconds(60));
    ncclUniqueId id{};
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
    check_nccl(ncclCommInitRank(&comm_, world_size, id, rank), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~RawNccl() {
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }
  RawNccl(const RawNccl&) = delete;
  RawNccl& operator=(const RawNccl&) = delete;

  // Enqueues only: no synchronisation.
  void enqueue_all_reduce(const float* input, float* output, std::size_t count) {
    check_nccl(ncclAllReduce(input, output, count, ncclFloat32, ncclSum, comm_, stream_),
               "ncclAllReduce");
  }

  void all_reduce(float* data, std::size_t count) {
    check_nccl(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_),
               "ncclAllReduce");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// One row: chorus and raw on `bytes` bytes. Returns the number of wrong elements.
std::size_t run_size(const BenchOptions& options, RawNccl& raw, std::size_t bytes) {
  const std::size_t count = bytes / sizeof(float);
  const int rank = chorus::rank();
  const int world_size = chorus::world_size();
  const float input = static_cast<float>(rank + 1);
  const float expected = static_cast<float>(world_size) * static_cast<float>(world_size + 1) / 2;
  const auto group = chorus::world();

  std::shared_ptr<float> chorus_data = device_floats(count);
  chorus::Tensor tensor = chorus::Tensor::from_blob(
      chorus_data.get(), {static_cast<std::int64_t>(count)}, chorus::DType::Float32,
      chorus::Device::cuda(current_device()), [keep = chorus_data](void*) {});
  std::shared_ptr<float> raw_data = device_floats(count);

  // Exactness, before timing: ones * (rank + 1), reduced once.
  fill(chorus_data.get(), count, input);
  chorus::all_reduce_inplace(tensor, "sum", group);
  std::size_t wrong = count_wrong(chorus_data.get(), count, expected);
  fill(raw_data.get(), count, input);
  raw.all_reduce(raw_data.get(), count);
  wrong += count_wrong(raw_data.get(), count, expected);

  const int iters =
      options.iters > 0 ? options.iters : (bytes <= kLargeBytes ? kItersSmall : kItersLarge);
  const auto time_chorus = [&](int n) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      chorus::all_reduce_inplace(tensor, "sum", group);  // returns after a stream wait
      check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
    }
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
        .count();
  };
  const auto time_raw = [&](int n) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      raw.all_reduce(raw_data.get(), count);
    }
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
        .count();
  };
  const Medians medians = alternate(options, iters, time_chorus, time_raw);
  if (world_size == 1) {  // sums over one rank keep the value: check the timed runs too
    wrong += count_wrong(chorus_data.get(), count, expected);
    wrong += count_wrong(raw_data.get(), count, expected);
  }
  if (rank == 0) {
    print_row(bytes, iters, medians, wrong);
  }
  return wrong;
}

// One row of the enqueue table (see the top of the file). Returns the number of wrong elements.
std::size_t run_enqueue_size(const BenchOptions& options, RawNccl& raw, std::size_t bytes) {
  const std::size_t count = bytes / sizeof(float);
  const int rank = chorus::rank();
  const int world_size = chorus::world_size();
  const float expected = static_cast<float>(world_size) * static_cast<float>(world_size + 1) / 2;
  const auto group = chorus::world();
  const chorus::Device gpu = chorus::Device::cuda(current_device());
  const auto shape = chorus::Shape{static_cast<std::int64_t>(count)};
  const chorus::Tensor input =
      chorus::Tensor::full(shape, static_cast<double>(rank + 1), chorus::DType::Float32, gpu);
  std::shared_ptr<float> raw_input = device_floats(count);
  std::shared_ptr<float> raw_output = device_floats(count);
  fill(raw_input.get(), count, static_cast<float>(rank + 1));
  chorus::Tensor out;

  const int iters =
      options.iters > 0 ? options.iters : (bytes <= kLargeBytes ? kItersSmall : kItersLarge);
  const auto time_chorus = [&](int n) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      out = chorus::all_reduce(input, "sum", group);
      chorus::wait_tensor(out);
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return us;
  };
  const auto time_raw = [&](int n) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      raw.enqueue_all_reduce(raw_input.get(), raw_output.get(), count);
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return us;
  };
  const Medians medians = alternate(options, iters, time_chorus, time_raw);
  // The last results, bitwise: chorus's read back through core (to(cpu) after the stream wait).
  std::size_t wrong = 0;
  for (const float value : out.to(chorus::Device::cpu()).to_vector<float>()) {
    wrong += std::memcmp(&value, &expected, sizeof(float)) != 0 ? 1 : 0;
  }
  wrong += count_wrong(raw_output.get(), count, expected);
  if (rank == 0) {
    print_row(bytes, iters, medians, wrong);
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions options;
  try {
    options = parse_options(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_nccl: %s\n", error.what());
    return 2;
  }
  const chorus::nccl::DeviceCount devices = chorus::nccl::cuda_device_count();
  if (devices.count == 0) {
    std::printf(
        "bench_nccl: skipped: %s; run it on a GPU machine "
        "(scripts/gpu-check.sh)\n",
        devices.problem.c_str());
    return kSkip;
  }
  // Alone: a one-rank world whose store this process hosts, as the gpu test job does.
  std::unique_ptr<chorus::store::Server> server;
  if (std::getenv("MASTER_PORT") == nullptr) {  // NOLINT(concurrency-mt-unsafe): before threads
    server = std::make_unique<chorus::store::Server>();
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(server->port()).c_str(), 1);
  }
  std::size_t wrong = 0;
  chorus::RunOptions run_options;
  run_options.transport = "nccl";
  run_options.timeout = options.timeout;
  std::printf("# bench_nccl on %s\n", chorus::nccl::platform_report().c_str());
  const int status = chorus::run(run_options, [&] {
    RawNccl raw(chorus::rank(), chorus::world_size());
    if (chorus::rank() == 0) {
      std::printf(
          "# bench_nccl: all_reduce sum float32 in place, %d rank(s); per op: issue and "
          "complete\n",
          chorus::world_size());
      std::printf(
          "# chorus: all_reduce_inplace on from_blob device memory + cudaStreamSynchronize; raw: "
          "ncclAllReduce + cudaStreamSynchronize\n");
      print_columns();
    }
    for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= options.step) {
      wrong += run_size(options, raw, bytes);
    }
    if (chorus::rank() == 0) {
      std::printf(
          "\n# enqueue only: `iters` ops back to back, one device synchronise after the timed "
          "loop\n# chorus: out = all_reduce(cuda input) + wait_tensor(out) (a stream wait); "
          "raw: ncclAllReduce(input, output)\n");
      print_columns();
    }
    for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= options.step) {
      wrong += run_enqueue_size(options, raw, bytes);
    }
  });
  if (status != 0) {
    return status;
  }
  if (wrong > 0) {
    std::fprintf(stderr, "bench_nccl: %zu wrong result elements\n", wrong);
    return 1;
  }
  return 0;
}
