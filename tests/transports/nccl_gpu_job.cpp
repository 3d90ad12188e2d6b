// Real collectives on the NCCL transport (label gpu, docs/nccl.md): one rank on one CUDA device
// through chorus::run --transport=nccl, CPU tensors (staged through the device) and CUDA tensors
// (device memory wrapped with from_blob, and core's own Device::cuda storages). Exact inputs,
// bitwise comparison.
//
// Without a CUDA device it prints "skipped: no CUDA device" and exits with kSkip (ctest's
// SKIP_RETURN_CODE). Started alone, it hosts the store itself (MASTER_PORT: a free port).

#include <cuda_runtime.h>

#include <chorus/chorus.hpp>
#include <chorus/nccl/nccl.hpp>
#include <chorus/store/store.hpp>
#include <chrono>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "device_scope.hpp"

namespace {

constexpr int kSkip = 77;
int failures = 0;

template <class T>
void expect_equal(const std::vector<T>& actual, const std::vector<T>& expected, const char* what) {
  if (actual != expected) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  } else {
    std::printf("ok: %s\n", what);
  }
}

// The values of a host tensor, for a failure message: real parts as doubles (complex as "re+imi").
std::string values_text(const chorus::Tensor& host) {
  std::string out;
  if (chorus::is_complex(host.dtype())) {
    for (const std::complex<double>& value :
         host.to(chorus::DType::Complex128).to_vector<std::complex<double>>()) {
      out += (out.empty() ? "" : ", ") + std::to_string(value.real()) + "+" +
             std::to_string(value.imag()) + "i";
    }
  } else {
    for (const double value : host.to(chorus::DType::Float64).to_vector<double>()) {
      out += (out.empty() ? "" : ", ") + std::to_string(value);
    }
  }
  return "[" + out + "]";
}

// `actual` (on any device) has the dtype, shape and element bytes of the host tensor `expected`.
void expect_bits(const chorus::Tensor& actual, const chorus::Tensor& expected,
                 const std::string& what) {
  const chorus::Tensor host = actual.to(chorus::Device::cpu());
  if (host.bitwise_equal(expected)) {
    std::printf("ok: %s\n", what.c_str());
    return;
  }
  std::fprintf(stderr, "FAILED: %s: got %s %s, expected %s %s\n", what.c_str(),
               std::string(chorus::dtype_name(host.dtype())).c_str(), values_text(host).c_str(),
               std::string(chorus::dtype_name(expected.dtype())).c_str(),
               values_text(expected).c_str());
  ++failures;
}

// "premul_sum(0.5)".
std::string premul_text(double factor) {
  char text[32];
  std::snprintf(text, sizeof(text), "premul_sum(%g)", factor);
  return text;
}

// premul_sum(f) on one rank is f * x: the one reduction that is not a copy there (sum, avg, min,
// max, bor of a single contribution give back its bytes whatever op or datatype NCCL was handed),
// so a wrong op or datatype mapping changes the bits (Float16 bits multiplied as BFloat16 ones,
// a factor of 1 or a plain sum). The factors are powers of two and the values have few
// significant bits, so every product is exact in every dtype: NCCL (which multiplies by the
// factor rounded to the dtype, in the dtype) and the exact product agree bit for bit. On the
// host (staged) and on the rank's device.
void check_premul_sum(const chorus::ProcessGroup& group, chorus::Device gpu) {
  using chorus::DType;
  using chorus::Tensor;
  const double w = chorus::world_size();
  const std::vector<double> values = {1.5, -3.0, 0.375, 96.0, -0.0078125};
  for (const DType dtype : {DType::Float16, DType::BFloat16, DType::Float32, DType::Float64}) {
    for (const double factor : {2.0, 0.5}) {
      std::vector<double> scaled;
      for (const double value : values) {
        scaled.push_back(factor * w * value);
      }
      const Tensor input = Tensor::from_vector<double>(values).to(dtype);
      const Tensor expected = Tensor::from_vector<double>(scaled).to(dtype);
      const std::string what =
          "all_reduce " + premul_text(factor) + " " + std::string(chorus::dtype_name(dtype));
      expect_bits(chorus::all_reduce(input, chorus::ReduceOp::premul_sum(factor), group), expected,
                  what + " on cpu");
      expect_bits(chorus::all_reduce(input.to(gpu), chorus::ReduceOp::premul_sum(factor), group),
                  expected, what + " on " + gpu.to_string());
    }
  }
  // Complex64: pairs of ncclFloat32, each part multiplied by the real factor.
  const auto complex = [](std::complex<float> value, float scale) {
    return std::complex<float>(value.real() * scale, value.imag() * scale);
  };
  const std::vector<std::complex<float>> pairs = {{1.5F, -3.0F}, {0.375F, 96.0F}};
  for (const float factor : {2.0F, 0.5F}) {
    const float scale = factor * static_cast<float>(w);
    const Tensor expected = Tensor::from_vector<std::complex<float>>(
        {complex(pairs[0], scale), complex(pairs[1], scale)});
    const Tensor input = Tensor::from_vector<std::complex<float>>(pairs);
    const std::string what = "all_reduce " + premul_text(factor) + " Complex64";
    expect_bits(chorus::all_reduce(input, chorus::ReduceOp::premul_sum(factor), group), expected,
                what + " on cpu");
    expect_bits(chorus::all_reduce(input.to(gpu), chorus::ReduceOp::premul_sum(factor), group),
                expected, what + " on " + gpu.to_string());
  }
}

// The program's own stream of the current-stream section, destroyed once chorus::run returned.
cudaStream_t user_stream = nullptr;
// The stream the graph-capture section captures on, destroyed as user_stream is.
cudaStream_t capture_stream = nullptr;

void rank_main() {
  using chorus::Tensor;
  const auto group = chorus::world();
  const int world = chorus::world_size();
  const float w = static_cast<float>(world);

  // CPU tensors: staged through device scratch.
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4});
  expect_equal(chorus::all_reduce(x, "sum", group).to_vector<float>(),
               std::vector<float>{w, 2 * w, 3 * w, 4 * w}, "all_reduce sum f32");
  expect_equal(chorus::all_reduce(x, "avg", group).to_vector<float>(),
               std::vector<float>{1, 2, 3, 4}, "all_reduce avg f32");
  expect_equal(chorus::all_reduce(x, "max", group).to_vector<float>(),
               std::vector<float>{1, 2, 3, 4}, "all_reduce max f32");
  expect_equal(chorus::all_reduce(x, chorus::ReduceOp::premul_sum(0.5), group).to_vector<float>(),
               std::vector<float>{0.5f * w, w, 1.5f * w, 2 * w}, "all_reduce premul_sum f32");
  const Tensor ints = Tensor::from_vector<std::int32_t>({-3, 7});
  expect_equal(chorus::all_reduce(ints, "min", group).to_vector<std::int32_t>(),
               std::vector<std::int32_t>{-3, 7}, "all_reduce min i32");
  const Tensor complex = Tensor::from_vector<std::complex<double>>({{1.0, -2.0}, {0.5, 4.0}});
  expect_equal(chorus::all_reduce(complex, "sum", group).to_vector<std::complex<double>>(),
               std::vector<std::complex<double>>{{w, -2 * w}, {0.5 * w, 4 * w}},
               "all_reduce sum complex128");
  const Tensor half = Tensor::from_vector<double>({1.5, -2.25, 96.0}).to(chorus::DType::BFloat16);
  expect_bits(
      chorus::all_reduce(half, "sum", group),
      Tensor::from_vector<double>({1.5 * w, -2.25 * w, 96.0 * w}).to(chorus::DType::BFloat16),
      "all_reduce sum bf16");
  std::vector<float> gathered_expected;  // every rank contributes x: x, world times
  for (int r = 0; r < world; ++r) {
    gathered_expected.insert(gathered_expected.end(), {1, 2, 3, 4});
  }
  expect_equal(chorus::all_gather_tensor(x, 0, group).to_vector<float>(), gathered_expected,
               "all_gather values");
  expect_equal(
      chorus::reduce_scatter_tensor(chorus::all_gather_tensor(x, 0, group), "sum", 0, group)
          .to_vector<float>(),
      std::vector<float>{w, 2 * w, 3 * w, 4 * w}, "reduce_scatter of all_gather");
  expect_equal(chorus::broadcast(x, 0, group).to_vector<float>(), std::vector<float>{1, 2, 3, 4},
               "broadcast");
  if (world == 1) {
    expect_equal(chorus::all_to_all_single(x, std::nullopt, std::nullopt, group).to_vector<float>(),
                 std::vector<float>{1, 2, 3, 4}, "all_to_all_single world 1");
  }
  const std::vector<Tensor> coalesced = chorus::all_reduce_coalesced({x, x}, "sum", group);
  expect_equal(coalesced[1].to_vector<float>(), std::vector<float>{w, 2 * w, 3 * w, 4 * w},
               "all_reduce_coalesced (one NCCL group)");
  const Tensor bits = Tensor::from_vector<bool>({true, false});
  expect_equal(chorus::all_reduce(bits, "bor", group).to_vector<bool>(),
               std::vector<bool>{true, false}, "all_reduce bor Bool");

  // The rank's device: nccl::run selected it (local rank % device count) on this thread, so
  // cudaMalloc allocates there.
  const chorus::Device gpu = chorus::local_device();
  check_premul_sum(group, gpu);

  // A CUDA tensor wrapped with from_blob, in place.
  void* device_data = nullptr;
  if (cudaMalloc(&device_data, 4 * sizeof(float)) != cudaSuccess) {
    std::fprintf(stderr, "FAILED: cudaMalloc\n");
    ++failures;
    return;
  }
  const std::vector<float> host = {1, 2, 3, 4};
  cudaMemcpy(device_data, host.data(), 4 * sizeof(float), cudaMemcpyHostToDevice);
  Tensor on_device = Tensor::from_blob(device_data, {4}, chorus::DType::Float32, gpu,
                                       [](void* data) { cudaFree(data); });
  chorus::all_reduce_inplace(on_device, "sum", group);
  chorus::wait_tensor(on_device);
  std::vector<float> back(4);
  cudaMemcpy(back.data(), device_data, 4 * sizeof(float), cudaMemcpyDeviceToHost);
  expect_equal(back, std::vector<float>{w, 2 * w, 3 * w, 4 * w},
               "all_reduce_inplace on the rank's device (from_blob)");

  // CUDA tensors allocated by core (RankOptions::device_memory, which chorus::nccl::run
  // installs): results stay on the device, waits order the current stream (the legacy default
  // stream here), to(cpu) reads.
  const auto host_floats = [](const Tensor& t) {
    return t.to(chorus::Device::cpu()).to_vector<float>();
  };
  const Tensor dx = x.to(gpu);
  const Tensor dsum = chorus::all_reduce(dx, "sum", group);
  expect_equal(std::vector<int>{dsum.device() == gpu ? 1 : 0}, std::vector<int>{1},
               "all_reduce of a cuda tensor returns a cuda tensor");
  chorus::wait_tensor(dsum);
  expect_equal(std::vector<int>{dsum.is_pending() ? 0 : 1}, std::vector<int>{1},
               "wait_tensor retires a cuda result");
  expect_equal(host_floats(dsum), std::vector<float>{w, 2 * w, 3 * w, 4 * w},
               "all_reduce sum on cuda, read with to(cpu)");
  expect_equal(host_floats(chorus::all_reduce(dx, "avg", group)), std::vector<float>{1, 2, 3, 4},
               "all_reduce avg on cuda");
  expect_equal(host_floats(chorus::all_reduce(dx, chorus::ReduceOp::premul_sum(0.5), group)),
               std::vector<float>{0.5f * w, w, 1.5f * w, 2 * w}, "all_reduce premul_sum on cuda");
  // First use without an explicit wait: to(cpu) waits (on the stream), then copies.
  expect_equal(host_floats(chorus::reduce_scatter_tensor(chorus::all_gather_tensor(dx, 0, group),
                                                         "sum", 0, group)),
               std::vector<float>{w, 2 * w, 3 * w, 4 * w}, "reduce_scatter of all_gather on cuda");
  expect_equal(host_floats(chorus::broadcast(dx, 0, group)), std::vector<float>{1, 2, 3, 4},
               "broadcast on cuda");
  const std::vector<Tensor> dcoalesced =
      chorus::all_reduce_coalesced({dx, dx.clone()}, "sum", group);
  chorus::wait_tensors(dcoalesced);
  expect_equal(host_floats(dcoalesced[1]), std::vector<float>{w, 2 * w, 3 * w, 4 * w},
               "all_reduce_coalesced on cuda");
  expect_equal(host_floats(Tensor::full({2}, 2.5, chorus::DType::Float32, gpu)),
               std::vector<float>{2.5F, 2.5F}, "Tensor::full on cuda");
  Tensor dzeros = Tensor::zeros({4}, chorus::DType::Float32, gpu);
  dzeros.copy_(dsum);
  expect_equal(host_floats(dzeros), std::vector<float>{w, 2 * w, 3 * w, 4 * w},
               "copy_ device to device");
  bool refused = false;
  try {
    (void)dsum.to_vector<float>();
  } catch (const chorus::InvalidArgument&) {
    refused = true;
  }
  expect_equal(std::vector<int>{refused ? 1 : 0}, std::vector<int>{1},
               "host access to a cuda tensor is refused");
  // Many results in flight, dropped un-waited: finalized on the stream (Note [Stream-waited
  // works]); core keeps each NCCL work until the watchdog (every 10 ms) sees it finish, which
  // frees its buffers in stream order. What chorus holds (device_memory_allocated, the memory of
  // chorus's own pool, not the device's default one) must come back (bounded poll).
  const std::size_t held_before = chorus::device_memory_allocated();
  for (int i = 0; i < 64; ++i) {
    (void)chorus::all_reduce(Tensor::full({1024}, 1.0, chorus::DType::Float32, gpu), "sum", group);
  }
  const std::size_t held_after_issue = chorus::device_memory_allocated();
  std::size_t held = held_after_issue;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (held > held_before && std::chrono::steady_clock::now() < give_up) {
    cudaDeviceSynchronize();
    (void)chorus::work_registry_size();  // settles: releases the works the watchdog saw finish
    std::this_thread::yield();
    held = chorus::device_memory_allocated();
  }
  std::printf(
      "device memory held by chorus: %zu bytes before, %zu after issuing 64 dropped "
      "results, %zu after they finished\n",
      held_before, held_after_issue, held);
  expect_equal(std::vector<int>{held <= held_before ? 1 : 0}, std::vector<int>{1},
               "the memory of 64 dropped results is given back");
  expect_equal(host_floats(chorus::all_reduce(dx, "sum", group)),
               std::vector<float>{w, 2 * w, 3 * w, 4 * w}, "all_reduce after 64 dropped results");

  // A stream of the program's own as the current stream (Note [Current stream]). Non-blocking,
  // so nothing orders it with the legacy default stream: the allocation, the copies, the
  // collective, its wait and the copy out are right only if every one follows it. Slow work
  // queued on it first (memsets of a 256 MiB scratch block) keeps the input's device-to-device
  // copy pending, so a collective ordered after another stream would read the input early.
  // The stream outlives the rank (main destroys it after chorus::run returned): blocks allocated
  // on it are freed on it, possibly after the rank function returned.
  cudaStreamCreateWithFlags(&user_stream, cudaStreamNonBlocking);
  {
    const chorus::StreamGuard guard(gpu, user_stream);
    const Tensor source = Tensor::full({1 << 20}, 3.0, chorus::DType::Float32, gpu);
    const Tensor scratch = Tensor::empty({256 << 20}, chorus::DType::UInt8, gpu);
    for (int i = 0; i < 16; ++i) {
      cudaMemsetAsync(scratch.unsafe_data_ptr(), i, scratch.nbytes(), user_stream);
    }
    Tensor sx = Tensor::empty({1 << 20}, chorus::DType::Float32, gpu);
    sx.copy_(source);  // device to device: queued behind the memsets
    const Tensor ssum = chorus::all_reduce(sx, "sum", group);
    chorus::wait_tensor(ssum);
    const std::vector<float> got = host_floats(ssum);
    expect_equal(std::vector<float>{got.front(), got[got.size() / 2], got.back()},
                 std::vector<float>{3 * w, 3 * w, 3 * w},
                 "all_reduce on a non-blocking user stream, after slow work on it");
    expect_equal(host_floats(chorus::all_gather_tensor(dx, 0, group)),
                 std::vector<float>{1, 2, 3, 4}, "all_gather on a user stream, first use waits");
  }

  // A collective issued while the rank's current stream captures a CUDA graph is refused up
  // front, InvalidArgument naming the op, before the communicator is touched: once the capture
  // ends the group works. Truly in place on a tensor this rank made (and filled before the
  // capture), so core itself does no CUDA work on the capturing stream. Written without a GPU to
  // run it (docs/nccl.md).
  {
    Tensor ones = Tensor::full({4}, 1.0, chorus::DType::Float32, gpu);
    cudaDeviceSynchronize();
    cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking);
    std::string refusal = "no error";
    {
      const chorus::StreamGuard guard(gpu, capture_stream);
      cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeThreadLocal);
      try {
        chorus::all_reduce_inplace(ones, "sum", group);
      } catch (const chorus::InvalidArgument& error) {
        refusal = error.what();
      } catch (const std::exception& error) {
        refusal = std::string("another error: ") + error.what();
      }
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(capture_stream, &graph);
      if (graph != nullptr) {
        cudaGraphDestroy(graph);
      }
    }
    const bool capture_refused = refusal.find("all_reduce_inplace") != std::string::npos &&
                                 refusal.find("is capturing a CUDA graph") != std::string::npos;
    expect_equal(std::vector<int>{capture_refused ? 1 : 0}, std::vector<int>{1},
                 ("a collective under graph capture is refused up front: " + refusal).c_str());
    chorus::all_reduce_inplace(ones, "sum", group);
    expect_equal(host_floats(ones), std::vector<float>{w, w, w, w},
                 "all_reduce_inplace once the capture ended");
  }
  if (failures > 0) {
    throw std::runtime_error(std::to_string(failures) + " checks failed");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const chorus::nccl::DeviceCount devices = chorus::nccl::cuda_device_count();
  if (devices.count == 0) {
    std::printf("skipped: no CUDA device (%s)\n", devices.problem.c_str());
    return kSkip;
  }
  std::printf("nccl gpu job on %s\n", chorus::nccl::platform_report().c_str());
  std::fflush(stdout);
  // Alone: a one-rank world whose store this process hosts (rank 0 then finds the port taken
  // and connects to it, the launcher path of Note [NCCL store]).
  std::unique_ptr<chorus::store::Server> server;
  if (std::getenv("MASTER_PORT") == nullptr) {  // NOLINT(concurrency-mt-unsafe): before threads
    server = std::make_unique<chorus::store::Server>();
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(server->port()).c_str(), 1);
  }
  std::vector<char*> args(argv, argv + argc);
  std::string transport = "--transport=nccl";
  args.push_back(transport.data());
  const int status = chorus::run(
      chorus::RunOptions::from_args(static_cast<int>(args.size()), args.data()), rank_main);
  for (cudaStream_t stream : {user_stream, capture_stream}) {
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }
  // The rank ran on device 0, whose primary context stays active until the process ends: the
  // query behind Note [Device scopes] must say so (a wrong driver entry point answers nullopt).
  const std::optional<bool> context_active = chorus::nccl::detail::primary_context_active(0);
  const bool query_ok = context_active.has_value() && *context_active;
  std::printf("%s: the primary context of device 0 is reported active after the run\n",
              query_ok ? "ok" : "FAILED");
  const bool passed = status == 0 && query_ok;
  std::printf("%s\n", passed ? "nccl gpu job: passed" : "nccl gpu job: FAILED");
  return passed ? 0 : 1;
}
