// The proofs of docs/errors.md: one TEST per row of its tables, named as the row names it.
//
// Each test provokes exactly the row's bad input, on the simulator (inside a rank) or directly
// for rank-free APIs, and checks the exact error type (the dynamic type, and code()) and the
// detail text the document quotes. Collective errors are also checked for the context prefix
// "chorus::<Code>: [rank R] <op> #<seq> on group <group>: ". Cross-rank failures catch the error
// on every rank and check every rank's type. Nothing sleeps: timeouts run on the simulator's
// virtual time.
//
// Rows that show a bug are DISABLED_ tests, each with a comment saying what goes wrong; they
// assert the behaviour the document promises, so enabling one shows the bug.

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chorus/chorus.hpp>
#include <chorus/kernels.hpp>
#include <chrono>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/fake_transport.hpp"
#include "support/scoped_environment.hpp"
#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers (distinct names: several test files link into one binary; the shared ones are in
// tests/support).

using testing::caught_error;
using testing::CaughtError;
using testing::contains;
using testing::error_code_of;
using testing::expect_error;
using testing::expect_error_on_rank;
using testing::quiet_options;
using testing::run_catching;
using testing::run_quietly;

// As expect_error<E>, for an error outside any rank and any group: what() is
// "chorus::<Code>: <op>: <detail>".
template <class E>
void errdoc_expect_plain(const std::function<void()>& statement, const std::string& op,
                         const std::string& detail, int line = __builtin_LINE()) {
  const CaughtError caught = expect_error<E>(statement, {detail}, line);
  const std::string prefix =
      "chorus::" + std::string(error_code_name(error_code_of<E>())) + ": " + op + ": ";
  EXPECT_EQ(caught.what.rfind(prefix, 0), 0u)
      << "line " << line << ": \"" << caught.what << "\" does not start with \"" << prefix << "\"";
  EXPECT_EQ(caught.context.rank, -1) << "line " << line;
}

// expect_error_on_rank<E> with one detail fragment: what() is "chorus::<Code>: [rank R] <op>
// #<seq> on group <group>: <detail>" with R the calling rank (no "#<seq>" when seq is -1, no group
// part when `group` is empty).
template <class E>
CaughtError errdoc_expect_on_rank(const std::function<void()>& statement, const std::string& op,
                                  std::int64_t seq, const std::string& group,
                                  const std::string& detail, int line = __builtin_LINE()) {
  return expect_error_on_rank<E>(statement, {detail}, {op, seq, group}, line);
}

// errdoc_expect_on_rank on every rank of a `world_size`-rank simulation.
template <class E>
void errdoc_expect_on_every_rank(int world_size, const std::function<void()>& statement,
                                 const std::string& op, std::int64_t seq, const std::string& group,
                                 const std::string& detail, int line = __builtin_LINE()) {
  run_quietly(world_size,
              [&] { errdoc_expect_on_rank<E>(statement, op, seq, group, detail, line); });
}

// Checks that rank `r`'s outcome is `code` with `detail` in it, and that its context names the
// rank, `op`, `seq` and `group`.
void errdoc_expect_outcome(const std::vector<CaughtError>& outcomes, int r, ErrorCode code,
                           const std::string& op, std::int64_t seq, const std::string& group,
                           const std::string& detail, int line = __builtin_LINE()) {
  const CaughtError& outcome = outcomes[static_cast<std::size_t>(r)];
  ASSERT_TRUE(outcome.code.has_value()) << "line " << line << ": rank " << r << " got no error";
  EXPECT_EQ(*outcome.code, code) << "line " << line << ": rank " << r << ": " << outcome.what;
  EXPECT_EQ(outcome.context.rank, r) << "line " << line;
  EXPECT_EQ(outcome.context.op, op) << "line " << line;
  EXPECT_EQ(outcome.context.seq, seq) << "line " << line;
  EXPECT_EQ(outcome.context.group, group) << "line " << line;
  EXPECT_TRUE(contains(outcome.detail, detail))
      << "line " << line << ": rank " << r << ": \"" << outcome.detail << "\" lacks \"" << detail
      << "\"";
  const std::string prefix = "chorus::" + std::string(error_code_name(code)) + ": [rank " +
                             std::to_string(r) + "] " + op + " #" + std::to_string(seq) +
                             " on group " + group + ": ";
  EXPECT_EQ(outcome.what.rfind(prefix, 0), 0u) << "line " << line << ": " << outcome.what;
}

Tensor errdoc_bytes(std::int64_t n, DType dtype = DType::UInt8) { return Tensor::ones({n}, dtype); }

// A foreign DLPack producer on the stack: owns the shape and stride arrays and counts deleter
// calls. Not movable (the DLTensor points into it).
struct ErrdocProducer {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  int deleter_calls = 0;
  DLManagedTensor managed{};

  ErrdocProducer(void* data, DLDataType dtype, DLDevice device, std::vector<std::int64_t> sizes,
                 std::vector<std::int64_t> steps = {})
      : shape(std::move(sizes)), strides(std::move(steps)) {
    DLTensor& dl = managed.dl_tensor;
    dl.data = data;
    dl.device = device;
    dl.ndim = static_cast<int>(shape.size());
    dl.dtype = dtype;
    dl.shape = shape.data();
    dl.strides = strides.empty() ? nullptr : strides.data();
    dl.byte_offset = 0;
    managed.manager_ctx = this;
    managed.deleter = [](DLManagedTensor* self) {
      ++static_cast<ErrdocProducer*>(self->manager_ctx)->deleter_calls;
    };
  }
  ErrdocProducer(const ErrdocProducer&) = delete;
  ErrdocProducer& operator=(const ErrdocProducer&) = delete;
};

constexpr DLDataType kErrdocFloat32{kDLFloat, 32, 1};
constexpr DLDevice kErrdocCpu{kDLCPU, 0};

// A record of an all_reduce sum of one Float32 [2] over [0, 1].
OpRecord errdoc_record(const std::string& op = "all_reduce") {
  OpRecord record;
  record.op = op;
  record.reduce_op = ReduceOp(ReduceOp::Kind::Sum);
  record.ranks = {0, 1};
  record.group_size = 2;
  record.input_shapes = {{2}};
  record.dtype = DType::Float32;
  record.output_shapes = {{2}};
  return record;
}

// One record as JSON, every field present, with `from` replaced by `to` (once) when given.
std::string errdoc_json(const std::string& from = "", const std::string& to = "") {
  std::string record =
      R"({"op": "all_reduce", "reduce_op": "sum", "tag": "", "ranks": [0, 1], )"
      R"("group_size": 2, "input_shapes": [[2]], "dtype": "Float32", "dims": [], "src": -1, )"
      R"("src_dst": [], "rank": 0, "seq": 0, "output_shapes": [[2]], "meta": false})";
  if (!from.empty()) {
    const std::size_t at = record.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) {
      record.replace(at, from.size(), to);
    }
  }
  return "[" + record + "]";
}

// RunOptions::from_args on `args` (argv[0] added).
RunOptions errdoc_from_args(std::vector<std::string> args) {
  args.insert(args.begin(), "program");
  std::vector<char*> argv;
  for (std::string& arg : args) {
    argv.push_back(arg.data());
  }
  argv.push_back(nullptr);
  return RunOptions::from_args(static_cast<int>(args.size()), argv.data());
}

// =============================================================================================
// Tensors: factories

TEST(ErrorsDocTensorFactories, NegativeSize) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::zeros({2, -1});
      },
      "Tensor::empty", "shape [2, -1] has a negative size");
}

TEST(ErrorsDocTensorFactories, TooLargeToAddress) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::empty({std::int64_t{1} << 62, 4}, DType::Float32, Device::meta());
      },
      "Tensor::empty", "shape [4611686018427387904, 4] of Float32 is too large to address");
  // No element, but the strides overflow: a size-0 dim counts as size 1 in them.
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::empty({0, std::int64_t{1} << 40, std::int64_t{1} << 40}, DType::Float32,
                            Device::meta());
      },
      "Tensor::empty",
      "shape [0, 1099511627776, 1099511627776] of Float32 is too large to address");
}

TEST(ErrorsDocTensorFactories, CudaAllocationOutsideRank) {
  constexpr const char* kDetail =
      "cannot use cuda:0 memory outside a rank: device memory belongs to a rank's launcher (wrap "
      "existing device memory with Tensor::from_blob)";
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)Tensor::ones({2}, DType::Float32, Device::cuda(0)); }, "Tensor::empty", kDetail);
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)Tensor::empty({2}, DType::Float32, Device::cuda(0)); }, "Tensor::empty", kDetail);
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor::zeros({2}).to(Device::cuda(0)); },
                                       "Tensor::to", kDetail);
}

TEST(ErrorsDocTensorFactories, CudaAllocation) {
  run_quietly(1, [] {
    constexpr const char* kDetail =
        "rank 0 on transport 'sim' has no memory for cuda:1 (RankOptions::device_memory; the NCCL "
        "launcher installs one): wrap existing device memory with Tensor::from_blob";
    errdoc_expect_on_rank<InvalidArgument>(
        [] { (void)Tensor::full({2}, 3.0, DType::Float32, Device::cuda(1)); }, "Tensor::empty", -1,
        "", kDetail);
    errdoc_expect_on_rank<InvalidArgument>([] { (void)Tensor::arange(2).to(Device::cuda(1)); },
                                           "Tensor::to", -1, "", kDetail);
  });
}

TEST(ErrorsDocTensorFactories, EmptyNegativeDeviceIndex) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)Tensor::empty({1}, DType::Float32, Device::cuda(-1)); }, "Tensor::empty",
      "device index must be >= 0, got cuda:-1");
}

TEST(ErrorsDocTensorFactories, ArangeNegative) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor::arange(-1); }, "Tensor::arange",
                                       "n must be >= 0, got -1");
}

TEST(ErrorsDocTensorFactories, FromBlobMeta) {
  float value = 0;
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)Tensor::from_blob(&value, {1}, DType::Float32, Device::meta()); },
      "Tensor::from_blob",
      "meta tensors have no memory to wrap (use Tensor::empty with Device::meta())");
}

TEST(ErrorsDocTensorFactories, FromBlobNegativeDeviceIndex) {
  float value = 0;
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)Tensor::from_blob(&value, {1}, DType::Float32, Device::cuda(-1)); },
      "Tensor::from_blob", "device index must be >= 0, got cuda:-1");
}

TEST(ErrorsDocTensorFactories, FromBlobMisaligned) {
  alignas(8) std::byte bytes[16] = {};
  int deleter_calls = 0;
  errdoc_expect_plain<InvalidArgument>(
      [&] {
        (void)Tensor::from_blob(bytes + 2, {2}, DType::Float32, Device::cpu(),
                                [&](void*) { ++deleter_calls; });
      },
      "Tensor::from_blob", "data is not aligned for Float32 (4-byte alignment needed)");
  EXPECT_EQ(deleter_calls, 0) << "a rejected from_blob leaves the memory with the caller";
}

TEST(ErrorsDocTensorFactories, FromBlobNullData) {
  int deleter_calls = 0;
  errdoc_expect_plain<InvalidArgument>(
      [&] {
        (void)Tensor::from_blob(nullptr, {2}, DType::Float32, Device::cpu(),
                                [&](void*) { ++deleter_calls; });
      },
      "Tensor::from_blob", "data is null but shape [2] has 2 elements");
  EXPECT_EQ(deleter_calls, 0) << "a rejected from_blob leaves the memory with the caller";
}

TEST(ErrorsDocTensorFactories, FromVectorCountMismatch) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2});
      },
      "Tensor::from_vector", "shape [2, 2] has 4 elements, but 3 values were given");
}

// =============================================================================================
// Tensors: views

TEST(ErrorsDocTensorViews, UndefinedTensor) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor().view({1}); }, "Tensor::view",
                                       "the tensor is undefined");
}

TEST(ErrorsDocTensorViews, DimOutOfRange) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::zeros({2, 3}).transpose(0, 2);
      },
      "Tensor::transpose", "dim 2 is out of range for 2 dims (expected -2 to 1)");
}

TEST(ErrorsDocTensorViews, DimOfZeroDimTensor) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor::zeros({}).size(0); }, "Tensor::size",
                                       "dim 0 is out of range for a 0-d tensor");
}

TEST(ErrorsDocTensorViews, ViewTwoInferredSizes) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::zeros({6}).view({-1, -1});
      },
      "Tensor::view",
      "shape [-1, -1] is invalid: only one -1 is allowed and no other negative size");
}

TEST(ErrorsDocTensorViews, ViewWrongElementCount) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor::zeros({6}).view({4}); }, "Tensor::view",
                                       "shape [4] is invalid for 6 elements");
}

TEST(ErrorsDocTensorViews, ViewNeedsCopy) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::zeros({2, 3}).transpose(0, 1).view({6});
      },
      "Tensor::view",
      "cannot view a tensor of shape [3, 2] and strides [1, 3] as shape [6] without copying "
      "(call contiguous() first)");
}

TEST(ErrorsDocTensorViews, FlattenNeedsCopy) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::zeros({2, 3}).transpose(0, 1).flatten();
      },
      "Tensor::flatten",
      "cannot flatten a tensor of shape [3, 2] and strides [1, 3] without copying (call "
      "contiguous() first)");
}

TEST(ErrorsDocTensorViews, NarrowStartOutOfRange) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor::zeros({4}).narrow(0, 5, 1); },
                                       "Tensor::narrow",
                                       "start 5 is out of range for dim 0 of size 4");
}

TEST(ErrorsDocTensorViews, NarrowLengthTooLong) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)Tensor::zeros({4}).narrow(0, 2, 3); }, "Tensor::narrow",
      "start 2 + length 3 exceeds dim 0 of size 4 (length must be >= 0)");
}

TEST(ErrorsDocTensorViews, ViewTooLargeToAddress) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::zeros({0}).view({0, std::int64_t{1} << 40, std::int64_t{1} << 40});
      },
      "Tensor::view", "shape [0, 1099511627776, 1099511627776] is too large to address");
}

TEST(ErrorsDocTensorViews, ViewOffsetTooLargeToAddress) {
  // Strides [2^63 - 2, 2^62 - 1, 1] fit; the offset at the end of dims 1 and 2 does not.
  const std::int64_t stride = (std::int64_t{1} << 62) - 1;
  const Tensor at_end = Tensor::empty({0, 2, stride}, DType::UInt8, Device::meta()).narrow(1, 2, 0);
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)at_end.narrow(2, stride, 0); }, "Tensor::narrow",
      "storage offset 9223372036854775806 + 4611686018427387903 * stride 1 is too large to "
      "address");
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)at_end.select(2, 2); }, "Tensor::select",
      "storage offset 9223372036854775806 + 2 * stride 1 is too large to address");
}

TEST(ErrorsDocTensorViews, SelectIndexOutOfRange) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor::zeros({4}).select(0, 4); },
                                       "Tensor::select",
                                       "index 4 is out of range for dim 0 of size 4");
}

TEST(ErrorsDocTensorViews, PermuteWrongCount) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::zeros({2, 3}).permute({0});
      },
      "Tensor::permute", "dims [0] must list all 2 dims of a tensor of shape [2, 3]");
}

TEST(ErrorsDocTensorViews, PermuteRepeatedDim) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::zeros({2, 3}).permute({0, 0});
      },
      "Tensor::permute", "dims [0, 0] repeat dim 0 (expected a permutation)");
}

TEST(ErrorsDocTensorViews, ChunkCountNotPositive) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor::zeros({4}).chunk(0); }, "Tensor::chunk",
                                       "the number of chunks must be > 0, got 0");
}

TEST(ErrorsDocTensorViews, ChunkTooManyPieces) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)Tensor::zeros({0}).chunk(std::int64_t{1} << 60); }, "Tensor::chunk",
      "1152921504606846976 chunks of dim 0 of size 0 make 1152921504606846976 pieces, more than "
      "a vector can hold (");
}

TEST(ErrorsDocTensorViews, SplitNegativeSize) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::zeros({4}).split({-1, 5});
      },
      "Tensor::split", "sizes [-1, 5] must all be >= 0");
}

TEST(ErrorsDocTensorViews, SplitSizesDoNotSum) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)Tensor::zeros({4}).split({1, 2});
      },
      "Tensor::split", "sizes [1, 2] sum to 3, but dim 0 has size 4");
}

// =============================================================================================
// Tensors: data access

TEST(ErrorsDocTensorData, ToVectorTypeMismatch) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor::zeros({2}).to_vector<std::int32_t>(); },
                                       "Tensor::to_vector",
                                       "tensor has dtype Float32, requested Int32");
}

TEST(ErrorsDocTensorData, ItemTypeMismatch) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor::zeros({1}).item<double>(); },
                                       "Tensor::item",
                                       "tensor has dtype Float32, requested Float64");
}

TEST(ErrorsDocTensorData, DataPtrTypeMismatch) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)Tensor::zeros({2}, DType::Int64).data_ptr<std::int32_t>(); }, "Tensor::data_ptr",
      "tensor has dtype Int64, requested Int32");
}

TEST(ErrorsDocTensorData, ItemNotOneElement) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)Tensor::zeros({2}).item<float>(); }, "Tensor::item",
      "expected a tensor with 1 element, got shape [2] (2 elements)");
}

TEST(ErrorsDocTensorData, UndefinedTensor) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor().to_vector<float>(); },
                                       "Tensor::to_vector", "the tensor is undefined");
}

TEST(ErrorsDocTensorData, MetaTensorHasNoData) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)Tensor::empty({2}, DType::Float32, Device::meta()).to_vector<float>(); },
      "Tensor::to_vector", "meta tensor of shape [2] has no data (meta tensors carry shapes only)");
}

TEST(ErrorsDocTensorData, HostAccessOnCuda) {
  float values[2] = {1, 2};
  errdoc_expect_plain<InvalidArgument>(
      [&] {
        (void)Tensor::from_blob(values, {2}, DType::Float32, Device::cuda(0)).to_vector<float>();
      },
      "Tensor::to_vector",
      "host data access on a cuda:0 tensor; chorus has no device kernels (copy it to the host "
      "with to(Device::cpu()) first)");
}

// Device memory wrapped with from_blob (host memory posing as cuda:0: every one of these is
// refused before any byte is copied).
Tensor errdoc_cuda_matrix(float (&values)[6]) {
  return Tensor::from_blob(values, {2, 3}, DType::Float32, Device::cuda(0));
}

TEST(ErrorsDocDeviceCopies, PackingNonContiguous) {
  float values[6] = {};
  const Tensor matrix = errdoc_cuda_matrix(values);
  constexpr const char* kDetail =
      "packing the elements of a cuda:0 tensor of shape [3, 2] needs a device kernel, and chorus "
      "has none (chorus copies whole contiguous device tensors only)";
  errdoc_expect_plain<InvalidArgument>([&] { (void)matrix.transpose(0, 1).to(Device::cpu()); },
                                       "Tensor::to", kDetail);
  errdoc_expect_plain<InvalidArgument>([&] { (void)matrix.transpose(0, 1).clone(); },
                                       "Tensor::clone", kDetail);
}

TEST(ErrorsDocDeviceCopies, ConvertingTheDtype) {
  float values[6] = {};
  const Tensor matrix = errdoc_cuda_matrix(values);
  constexpr const char* kDetail =
      "converting the dtype of a cuda:0 tensor of shape [2, 3] needs a device kernel, and chorus "
      "has none (convert on the host: to(Device::cpu()).to(dtype))";
  errdoc_expect_plain<InvalidArgument>([&] { (void)matrix.to(DType::Float64); }, "Tensor::to",
                                       kDetail);
  Tensor doubles = Tensor::zeros({2, 3}, DType::Float64);
  errdoc_expect_plain<InvalidArgument>([&] { doubles.copy_(matrix); }, "Tensor::copy_", kDetail);
}

TEST(ErrorsDocDeviceCopies, WritingNonContiguous) {
  float values[6] = {};
  Tensor transposed = errdoc_cuda_matrix(values).transpose(0, 1);
  errdoc_expect_plain<InvalidArgument>(
      [&] {
        transposed.copy_(Tensor::zeros({3, 2}));
      },
      "Tensor::copy_",
      "writing non-contiguous elements of a cuda:0 tensor of shape [3, 2] needs a device kernel, "
      "and chorus has none (chorus copies whole contiguous device tensors only)");
}

TEST(ErrorsDocDeviceCopies, ReadingNonContiguous) {
  float values[6] = {};
  float others[6] = {};
  Tensor destination = errdoc_cuda_matrix(others).view({3, 2});
  const Tensor source = errdoc_cuda_matrix(values).transpose(0, 1);
  errdoc_expect_plain<InvalidArgument>(
      [&] { destination.copy_(source); }, "Tensor::copy_",
      "reading non-contiguous elements of a cuda:0 tensor of shape [3, 2] needs a device kernel, "
      "and chorus has none (chorus copies whole contiguous device tensors only)");
}

TEST(ErrorsDocDeviceCopies, ToMeta) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)Tensor::zeros({2}).to(Device::meta()); }, "Tensor::to",
      "cannot copy between cpu and meta: meta tensors carry shapes "
      "only");
}

TEST(ErrorsDocTensorData, CopyShapesDiffer) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        Tensor destination = Tensor::zeros({2});
        destination.copy_(Tensor::zeros({3}));
      },
      "Tensor::copy_", "shapes differ: destination [2], source [3]");
}

TEST(ErrorsDocTensorData, CopyUndefinedDestination) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        Tensor destination;
        destination.copy_(Tensor::zeros({2}));
      },
      "Tensor::copy_", "the destination is undefined");
}

TEST(ErrorsDocTensorData, CopyUndefinedSource) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        Tensor destination = Tensor::zeros({2});
        destination.copy_(Tensor());
      },
      "Tensor::copy_", "the source is undefined");
}

TEST(ErrorsDocTensorData, CopyIntoStrideZeroDestination) {
  float value = 0;
  ErrdocProducer producer(&value, kErrdocFloat32, kErrdocCpu, {2}, {0});
  {
    Tensor broadcast_view = Tensor::from_dlpack(&producer.managed);
    errdoc_expect_plain<InvalidArgument>(
        [&] { broadcast_view.copy_(Tensor::ones({2})); }, "Tensor::copy_",
        "the destination has stride 0 in dim 0, so several elements share one memory location");
  }
  EXPECT_EQ(producer.deleter_calls, 1);
}

// =============================================================================================
// Tensors: DLPack

TEST(ErrorsDocDLPack, ExportMeta) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)Tensor::empty({2}, DType::Float32, Device::meta()).to_dlpack(); },
      "Tensor::to_dlpack", "meta tensor of shape [2] has no data (meta tensors carry shapes only)");
}

TEST(ErrorsDocDLPack, ExportUndefined) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor().to_dlpack(); }, "Tensor::to_dlpack",
                                       "the tensor is undefined");
}

TEST(ErrorsDocDLPack, ImportNull) {
  errdoc_expect_plain<InvalidArgument>([] { (void)Tensor::from_dlpack(nullptr); },
                                       "Tensor::from_dlpack", "managed tensor is null");
}

TEST(ErrorsDocDLPack, ImportUnsupportedDType) {
  float values[8] = {};
  ErrdocProducer producer(values, DLDataType{kDLFloat, 32, 4}, kErrdocCpu, {2});
  errdoc_expect_plain<InvalidArgument>([&] { (void)Tensor::from_dlpack(&producer.managed); },
                                       "Tensor::from_dlpack",
                                       "unsupported DLPack dtype (code 2, bits 32, lanes 4)");
  EXPECT_EQ(producer.deleter_calls, 0) << "a rejected import leaves ownership with the caller";
}

TEST(ErrorsDocDLPack, ImportUnsupportedDevice) {
  float values[2] = {};
  ErrdocProducer producer(values, kErrdocFloat32, DLDevice{kDLCUDAHost, 0}, {2});
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)Tensor::from_dlpack(&producer.managed); }, "Tensor::from_dlpack",
      "unsupported DLPack device (type 3, id 0): expected kDLCPU or kDLCUDA");
  EXPECT_EQ(producer.deleter_calls, 0);
}

TEST(ErrorsDocDLPack, ImportMissingShape) {
  float values[2] = {};
  ErrdocProducer producer(values, kErrdocFloat32, kErrdocCpu, {2});
  producer.managed.dl_tensor.shape = nullptr;
  errdoc_expect_plain<InvalidArgument>([&] { (void)Tensor::from_dlpack(&producer.managed); },
                                       "Tensor::from_dlpack", "invalid ndim 1 or missing shape");
  EXPECT_EQ(producer.deleter_calls, 0);
}

TEST(ErrorsDocDLPack, ImportNegativeStride) {
  float values[2] = {};
  ErrdocProducer producer(values, kErrdocFloat32, kErrdocCpu, {2}, {-1});
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)Tensor::from_dlpack(&producer.managed); }, "Tensor::from_dlpack",
      "shape [2] with strides [-1] is not supported (sizes and strides must be >= 0)");
  EXPECT_EQ(producer.deleter_calls, 0);
}

TEST(ErrorsDocDLPack, ImportTooLarge) {
  float values[2] = {};
  ErrdocProducer producer(values, kErrdocFloat32, kErrdocCpu, {std::int64_t{1} << 62}, {1});
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)Tensor::from_dlpack(&producer.managed); }, "Tensor::from_dlpack",
      "shape [4611686018427387904] with strides [1] is too large to address");
  EXPECT_EQ(producer.deleter_calls, 0);
  // numel() * element size overflows although the span is one element (stride 0).
  ErrdocProducer broadcast(values, kErrdocFloat32, kErrdocCpu, {(std::int64_t{1} << 62) + 1}, {0});
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)Tensor::from_dlpack(&broadcast.managed); }, "Tensor::from_dlpack",
      "shape [4611686018427387905] with strides [0] is too large to address");
  // size * stride overflows in a dim although the span (2^62 + 1 bytes) fits.
  ErrdocProducer extent(values, DLDataType{kDLUInt, 8, 1}, kErrdocCpu, {2},
                        {std::int64_t{1} << 62});
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)Tensor::from_dlpack(&extent.managed); }, "Tensor::from_dlpack",
      "shape [2] with strides [4611686018427387904] is too large to address");
  // Null (row-major) strides of an empty shape overflow.
  ErrdocProducer empty(nullptr, kErrdocFloat32, kErrdocCpu,
                       {0, std::int64_t{1} << 40, std::int64_t{1} << 40});
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)Tensor::from_dlpack(&empty.managed); }, "Tensor::from_dlpack",
      "shape [0, 1099511627776, 1099511627776] with strides (row-major) is too large to address");
  EXPECT_EQ(broadcast.deleter_calls + extent.deleter_calls + empty.deleter_calls, 0);
}

TEST(ErrorsDocDLPack, ImportMisaligned) {
  alignas(8) std::int32_t values[3] = {};
  ErrdocProducer producer(values, DLDataType{kDLInt, 32, 1}, kErrdocCpu, {2});
  producer.managed.dl_tensor.byte_offset = 2;
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)Tensor::from_dlpack(&producer.managed); }, "Tensor::from_dlpack",
      "data + byte_offset 2 is not aligned for Int32 (4-byte alignment needed)");
  EXPECT_EQ(producer.deleter_calls, 0);
}

TEST(ErrorsDocDLPack, ImportByteOffsetTooLarge) {
  float values[2] = {};
  ErrdocProducer producer(values, kErrdocFloat32, kErrdocCpu, {2});
  producer.managed.dl_tensor.byte_offset = std::numeric_limits<std::uint64_t>::max();
  errdoc_expect_plain<InvalidArgument>([&] { (void)Tensor::from_dlpack(&producer.managed); },
                                       "Tensor::from_dlpack",
                                       "byte_offset 18446744073709551615 is too large to address");
  EXPECT_EQ(producer.deleter_calls, 0);
}

TEST(ErrorsDocDLPack, ImportNullData) {
  ErrdocProducer producer(nullptr, kErrdocFloat32, kErrdocCpu, {2});
  errdoc_expect_plain<InvalidArgument>([&] { (void)Tensor::from_dlpack(&producer.managed); },
                                       "Tensor::from_dlpack",
                                       "data is null but shape [2] is not empty");
  EXPECT_EQ(producer.deleter_calls, 0);
}

// =============================================================================================
// Groups

constexpr const char* kErrdocOutsideRank =
    "called outside a rank: call it from the rank function given to chorus::run or "
    "chorus::sim::run";

TEST(ErrorsDocGroups, WorldOutsideRank) {
  errdoc_expect_plain<InvalidArgument>([] { (void)world(); }, "world", kErrdocOutsideRank);
}

TEST(ErrorsDocGroups, RankOutsideRank) {
  errdoc_expect_plain<InvalidArgument>([] { (void)rank(); }, "rank", kErrdocOutsideRank);
  errdoc_expect_plain<InvalidArgument>([] { (void)world_size(); }, "world_size",
                                       kErrdocOutsideRank);
  errdoc_expect_plain<InvalidArgument>([] { (void)local_device(); }, "local_device",
                                       kErrdocOutsideRank);
}

TEST(ErrorsDocGroups, NewGroupOutsideRank) {
  errdoc_expect_plain<InvalidArgument>([] { (void)new_group({0}); }, "new_group",
                                       kErrdocOutsideRank);
}

TEST(ErrorsDocGroups, NewGroupEmpty) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)new_group({}); }, "new_group", -1, "",
      "ranks is empty: a group needs at least one rank");
}

TEST(ErrorsDocGroups, NewGroupDuplicateRank) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)new_group({0, 0});
      },
      "new_group", -1, "", "ranks [0, 0] holds rank 0 more than once");
}

TEST(ErrorsDocGroups, NewGroupRankOutOfRange) {
  run_quietly(2, [] {
    errdoc_expect_on_rank<InvalidArgument>(
        [] {
          (void)new_group({0, 2});
        },
        "new_group", -1, "", "ranks [0, 2] holds rank 2, out of range [0, 2)");
    errdoc_expect_on_rank<InvalidArgument>([] { (void)new_group({-1}); }, "new_group", -1, "",
                                           "ranks [-1] holds rank -1, out of range [0, 2)");
  });
}

TEST(ErrorsDocGroups, ExpandEmptyGroup) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)expand_group(std::vector<int>{}); }, "expand_group", -1, "[]",
      "group is empty: a group needs at least one rank");
}

TEST(ErrorsDocGroups, ExpandDuplicateRank) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)expand_group({1, 1});
      },
      "expand_group", -1, "[1, 1]", "group [1, 1] holds rank 1 more than once");
}

TEST(ErrorsDocGroups, ExpandRankOutOfRange) {
  run_quietly(2, [] {
    errdoc_expect_on_rank<InvalidArgument>(
        [] {
          (void)expand_group({0, 5});
        },
        "expand_group", -1, "[0, 5]", "group [0, 5] holds rank 5, out of range [0, 2)");
  });
  // Outside a rank the world size is unknown: only negative ranks are refused.
  expect_error<InvalidArgument>([] { (void)expand_group({-1}); },
                                {"group [-1] holds rank -1, out of range non-negative"});
}

TEST(ErrorsDocGroups, MpmdUnequalSubLists) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      3,
      [] {
        (void)expand_group({{0, 1}, {2}});
      },
      "expand_group", -1, "[[0, 1], [2]]", "group sizes must be identical found 2 and 1");
}

TEST(ErrorsDocGroups, MpmdEmptyList) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)expand_group(GroupSpec(std::vector<std::vector<int>>{})); }, "expand_group", -1,
      "[]", "group is an empty list of rank lists");
}

TEST(ErrorsDocGroups, MpmdRankInTwoSubLists) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      3,
      [] {
        (void)expand_group({{0, 1}, {1, 2}});
      },
      "expand_group", -1, "[[0, 1], [1, 2]]",
      "group (flattened) [0, 1, 1, 2] holds rank 1 more than once");
}

TEST(ErrorsDocGroups, MpmdCallerInNoSubList) {
  run_quietly(3, [] {
    if (rank() != 2) {
      return;
    }
    errdoc_expect_on_rank<InvalidArgument>(
        [] {
          (void)all_reduce(errdoc_bytes(1), "sum", std::vector<std::vector<int>>{{0}, {1}});
        },
        "all_reduce", -1, "[0, 1] in sub-groups of 1", "rank 2 is not a member of the group");
  });
}

TEST(ErrorsDocGroups, MultiDimMeshAlone) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)expand_group(DeviceMesh({1, 2}, {0, 1}));
      },
      "expand_group", -1, "mesh [1, 2] of [0, 1]",
      "Only 1D mesh is supported, pass in MeshDim{mesh, dim} together if mesh > 1D (mesh shape "
      "[1, 2])");
}

TEST(ErrorsDocGroups, MeshDimCallerNotInMesh) {
  run_quietly(3, [] {
    if (rank() != 2) {
      return;
    }
    errdoc_expect_on_rank<InvalidArgument>(
        [] {
          (void)expand_group(MeshDim{DeviceMesh({2}, {0, 1}), 0});
        },
        "expand_group", -1, "dim 0 of mesh [2] of [0, 1]", "rank 2 is not in the mesh [0, 1]");
  });
}

TEST(ErrorsDocGroups, MeshDimOutsideRank) {
  expect_error<InvalidArgument>(
      [] {
        (void)expand_group(MeshDim{DeviceMesh({2}, {0, 1}), 0});
      },
      {kErrdocOutsideRank});
}

TEST(ErrorsDocGroups, MeshDimDimOutOfRange) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)expand_group(MeshDim{DeviceMesh({2}, {0, 1}), 1});
      },
      "expand_group", -1, "dim 1 of mesh [2] of [0, 1]",
      "MeshDim dim 1 is out of range for a 1-d mesh (expected [-1, 0])");
}

TEST(ErrorsDocGroups, MeshDimDimOutOfRangeInCollectiveNamesOpAndGroup) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)all_reduce(errdoc_bytes(1), "sum", MeshDim{DeviceMesh({2}, {0, 1}), 1});
      },
      "all_reduce", -1, "dim 1 of mesh [2] of [0, 1]",
      "MeshDim dim 1 is out of range for a 1-d mesh (expected [-1, 0])");
}

TEST(ErrorsDocGroups, MeshShapeDoesNotMatchRanks) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)DeviceMesh({2, 2}, {0, 1, 2});
      },
      "DeviceMesh", "mesh shape [2, 2] holds 4 ranks but 3 were given");
}

TEST(ErrorsDocGroups, MeshShapeEmpty) {
  errdoc_expect_plain<InvalidArgument>([] { (void)DeviceMesh({}, {0}); }, "DeviceMesh",
                                       "mesh shape is empty: a mesh needs at least one dim");
}

TEST(ErrorsDocGroups, MeshShapeNotPositive) {
  errdoc_expect_plain<InvalidArgument>([] { (void)DeviceMesh({0}, {}); }, "DeviceMesh",
                                       "mesh shape [0] has a non-positive size");
}

TEST(ErrorsDocGroups, MeshRankRepeatedOrNegative) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)DeviceMesh({2}, {0, 0});
      },
      "DeviceMesh", "mesh ranks [0, 0] hold a negative or repeated rank 0");
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)DeviceMesh({2}, {0, -3});
      },
      "DeviceMesh", "mesh ranks [0, -3] hold a negative or repeated rank -3");
}

// =============================================================================================
// ReduceOp

TEST(ErrorsDocReduceOp, ParseUnknownName) {
  errdoc_expect_plain<InvalidArgument>([] { (void)ReduceOp::parse("mean"); }, "ReduceOp::parse",
                                       "Unrecognized reduce_op 'mean': expected one of sum, avg, "
                                       "product, min, max, band, bor, bxor");
}

TEST(ErrorsDocReduceOp, ParsePremulSumWithoutFactor) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)ReduceOp::parse("premul_sum"); }, "ReduceOp::parse",
      "Unrecognized reduce_op 'premul_sum': expected one of sum, avg, product, min, max, band, "
      "bor, bxor (premul_sum needs a factor: use ReduceOp::premul_sum(f))");
}

TEST(ErrorsDocReduceOp, UnknownNameInCollective) {
  run_quietly(2, [] {
    const ReduceOp unknown("mean");  // converting never throws
    EXPECT_FALSE(unknown.is_valid());
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)all_reduce(Tensor::ones({2}), unknown, world()); }, "all_reduce", 0, "[0, 1]",
        "Unrecognized reduce_op 'mean': expected one of sum, avg, product, min, max, band, bor, "
        "bxor");
  });
}

TEST(ErrorsDocReduceOp, KindOutsideTheEnumerators) {
  run_quietly(2, [] {
    const ReduceOp bad(static_cast<ReduceOp::Kind>(42));
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)all_reduce(Tensor::ones({2}), bad, world()); }, "all_reduce", 0, "[0, 1]",
        "Unrecognized reduce_op 'ReduceOp::Kind(42)': expected one of sum, avg, product, min, "
        "max, band, bor, bxor");
  });
}

TEST(ErrorsDocReduceOp, BitwiseOnFloating) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)all_reduce(Tensor::ones({2}), "band", world()); }, "all_reduce", 0, "[0, 1]",
      "reduce_op band is not supported for dtype Float32: bitwise ops need an integer or Bool "
      "dtype");
}

TEST(ErrorsDocReduceOp, ComplexTakesOnlySums) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)all_reduce(Tensor::ones({2}, DType::Complex64), "max", world()); },
      "all_reduce", 0, "[0, 1]",
      "reduce_op max is not supported for dtype Complex64: complex dtypes take only sum, avg and "
      "premul_sum");
}

TEST(ErrorsDocReduceOp, BoolTakesOnlyMinMaxBitwise) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)reduce_scatter_tensor(Tensor::ones({2}, DType::Bool), "sum", 0, world()); },
      "reduce_scatter_tensor", 0, "[0, 1]",
      "reduce_op sum is not supported for dtype Bool: Bool takes only min, max, band, bor and "
      "bxor");
}

TEST(ErrorsDocReduceOp, PremulSumOnInteger) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] { (void)reduce(Tensor::ones({2}, DType::Int32), ReduceOp::premul_sum(2.0), 0, world()); },
      "reduce", 0, "[0, 1]",
      "reduce_op premul_sum(2) is not supported for dtype Int32: premul_sum needs a floating or "
      "complex dtype");
}

// =============================================================================================
// Collectives: common to all

TEST(ErrorsDocCollectives, CalledOutsideRank) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)all_reduce(Tensor::ones({2}), "sum", {0}); }, "all_reduce",
      "called outside a rank: call collectives from the rank function given to chorus::run or "
      "chorus::sim::run");
  errdoc_expect_plain<InvalidArgument>([] { (void)work_registry_size(); }, "work_registry_size",
                                       "called outside a rank");
}

TEST(ErrorsDocCollectives, NotAMember) {
  run_quietly(3, [] {
    const ProcessGroup pair = new_group({0, 1});  // local: rank 2 may create it
    if (rank() != 2) {
      return;
    }
    errdoc_expect_on_rank<InvalidArgument>([&] { (void)broadcast(Tensor::ones({2}), 0, pair); },
                                           "broadcast", -1, "[0, 1]",
                                           "rank 2 is not a member of the group");
  });
}

TEST(ErrorsDocCollectives, InvalidGroup) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)all_reduce(Tensor::ones({2}), "sum", {0, 0});
      },
      "all_reduce", -1, "[0, 0]", "group [0, 0] holds rank 0 more than once");
}

TEST(ErrorsDocCollectives, UndefinedInput) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)all_gather_tensor(Tensor(), 0, world()); }, "all_gather_tensor", 0, "[0, 1]",
      "input is an undefined tensor");
}

TEST(ErrorsDocCollectives, UndefinedInputOfCoalesced) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)all_reduce_coalesced({Tensor::ones({2}), Tensor()}, "sum", world());
      },
      "all_reduce_coalesced", 0, "[0, 1]", "input 1 is an undefined tensor");
}

TEST(ErrorsDocCollectives, MetaInputOutsideTracing) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] { (void)all_reduce(Tensor::empty({2}, DType::Float32, Device::meta()), "sum", world()); },
      "all_reduce", 0, "[0, 1]",
      "input is a meta tensor: meta tensors carry no data to communicate (inside a TraceScope "
      "they are traced for their shapes, without communication)");
}

TEST(ErrorsDocCollectives, MetaAndRealInputsMixed) {
  run_quietly(2, [] {
    TraceScope scope;
    errdoc_expect_on_rank<InvalidArgument>(
        [] {
          (void)all_reduce_coalesced(
              {Tensor::empty({2}, DType::Float32, Device::meta()), Tensor::ones({2})}, "sum",
              world());
        },
        "all_reduce_coalesced", -1, "[0, 1]",
        "input 1 is not a meta tensor but the inputs before it are meta: a call traces all-meta "
        "inputs or communicates real ones, not a mix");
  });
}

TEST(ErrorsDocCollectives, TransportCannotRunIt) {
  run_quietly(2, [] {
    float values[2] = {1, 2};
    const Tensor on_device = Tensor::from_blob(values, {2}, DType::Float32, Device::cuda(0));
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)all_reduce(on_device, "sum", world()); }, "all_reduce", 0, "[0, 1]",
        "transport 'sim' cannot run all_reduce on input (Float32 on cuda:0): the simulator moves "
        "host memory only");
    std::complex<float> pairs[2] = {};
    const Tensor complex_on_device =
        Tensor::from_blob(pairs, {2}, DType::Complex64, Device::cuda(0));
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)all_gather_tensor(complex_on_device, 0, world()); }, "all_gather_tensor", 0,
        "[0, 1]",
        "transport 'sim' cannot run all_gather on input (Complex64 lowered to Float32 on cuda:0): "
        "the simulator moves host memory only");
  });
}

TEST(ErrorsDocCollectives, NonContiguousCudaInput) {
  run_quietly(2, [] {
    float values[6] = {};
    const Tensor transposed = errdoc_cuda_matrix(values).transpose(0, 1);
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)all_reduce(transposed, "sum", world()); }, "all_reduce", 0, "[0, 1]",
        "input is a non-contiguous cuda:0 tensor of shape [3, 2]: packing it needs a device "
        "kernel, and chorus has none (pass a contiguous one)");
  });
}

TEST(ErrorsDocCollectives, InputsOnDifferentDevices) {
  run_quietly(2, [] {
    float values[6] = {};
    const Tensor on_device = errdoc_cuda_matrix(values);
    errdoc_expect_on_rank<InvalidArgument>(
        [&] {
          (void)all_reduce_coalesced({Tensor::zeros({2}), on_device}, "sum", world());
        },
        "all_reduce_coalesced", 0, "[0, 1]",
        "input 1 is on cuda:0 but the inputs before it are on cpu: a call's tensors share one "
        "device");
  });
}

// One rank of world 1 on the fake transport, which takes CUDA buffers: the errors below come
// after the transport's own check, which the simulator (host memory only) fails first.
class ErrdocCudaRank {
 public:
  ErrdocCudaRank()
      : transport_(std::make_shared<testing::FakeTransport>()),
        context_(transport_),
        binding_(&context_) {
    transport_->accepts_cuda_buffers = true;
  }
  testing::FakeTransport& transport() { return *transport_; }

 private:
  std::shared_ptr<testing::FakeTransport> transport_;
  RankContext context_;
  ScopedRankBinding binding_;
};

TEST(ErrorsDocCollectives, CudaAlongAnotherDim) {
  ErrdocCudaRank rank;
  float values[6] = {};
  const Tensor matrix = errdoc_cuda_matrix(values);
  errdoc_expect_on_rank<InvalidArgument>(
      [&] { (void)all_gather_tensor(matrix, 1, {0}); }, "all_gather_tensor", 0, "[0]",
      "all_gather along dim 1 on cuda:0 rearranges blocks with a host copy once the transport is "
      "done; chorus does not yet order a strided device copy after it on the stream (use dim 0, "
      "or copy to the host with to(Device::cpu()))");
  errdoc_expect_on_rank<InvalidArgument>(
      [&] {
        (void)reduce_scatter_tensor(matrix.view({3, 2}), "sum", 1, {0});
      },
      "reduce_scatter_tensor", 0, "[0]", "reduce_scatter along dim 1 on cuda:0 rearranges blocks");
  errdoc_expect_on_rank<InvalidArgument>(
      [&] {
        (void)reduce_scatter_tensor_coalesced({matrix, matrix}, "sum", {0, 1}, {0});
      },
      "reduce_scatter_tensor_coalesced", 0, "[0]",
      "reduce_scatter of input 1 along dim 1 on cuda:0 rearranges blocks");
  EXPECT_TRUE(rank.transport().works().empty());
}

TEST(ErrorsDocCollectives, InplaceOutputDevice) {
  run_quietly(2, [] {
    float values[6] = {};
    Tensor on_device = errdoc_cuda_matrix(values).view({6});
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { all_gather_tensor_inplace(on_device, Tensor::zeros({3}), world()); },
        "all_gather_tensor_inplace", 0, "[0, 1]", "output is on cuda:0 but the input is on cpu");
  });
}

TEST(ErrorsDocCollectives, InplaceOutputNonContiguousCuda) {
  ErrdocCudaRank rank;
  float values[6] = {};
  float others[6] = {};
  Tensor transposed = errdoc_cuda_matrix(values).transpose(0, 1);
  const Tensor input = errdoc_cuda_matrix(others).view({3, 2});
  errdoc_expect_on_rank<InvalidArgument>(
      [&] { all_gather_tensor_inplace(transposed, input, {0}); }, "all_gather_tensor_inplace", 0,
      "[0]",
      "output is a non-contiguous cuda:0 tensor: writing it needs a device kernel, and chorus has "
      "none");
  EXPECT_TRUE(rank.transport().works().empty());
}

TEST(ErrorsDocCollectives, RejectedCallConsumesNoSequenceNumber) {
  std::vector<float> sums(2);
  run_quietly(2, [&] {
    if (rank() == 0) {
      errdoc_expect_on_rank<InvalidArgument>(
          [] { (void)reduce_scatter_tensor(Tensor::ones({3}), "sum", 0, world()); },
          "reduce_scatter_tensor", 0, "[0, 1]", "is not divisible by the group size 2");
    }
    // Rank 1 never made the bad call: the next collectives still pair up as #0.
    TraceScope scope;
    sums[static_cast<std::size_t>(rank())] =
        all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
    ASSERT_EQ(scope.records().size(), 1u);
    EXPECT_EQ(scope.records()[0].seq, 0);
  });
  EXPECT_EQ(sums, (std::vector<float>{2, 2}));
}

// =============================================================================================
// Collectives: per op

TEST(ErrorsDocCollectives, AllGatherDimOutOfRange) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)all_gather_tensor(Tensor::ones({2, 2}), 2, world());
      },
      "all_gather_tensor", 0, "[0, 1]",
      "gather_dim 2 is out of range for a 2-d input (expected [-2, 1])");
}

TEST(ErrorsDocCollectives, AllGatherDimOutOfRangeZeroDim) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)all_gather_tensor(Tensor::ones({}), 1, world()); }, "all_gather_tensor", 0,
      "[0, 1]",
      "gather_dim 1 is out of range for a 0-d input (gathered as one element along dim 0: "
      "expected 0 or -1)");
}

TEST(ErrorsDocCollectives, ReduceScatterZeroDim) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)reduce_scatter_tensor(Tensor::ones({}), "sum", 0, world()); },
      "reduce_scatter_tensor", 0, "[0, 1]",
      "input is 0-d: reduce_scatter needs a dimension to scatter");
}

TEST(ErrorsDocCollectives, ReduceScatterDimOutOfRange) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)reduce_scatter_tensor(Tensor::ones({4}), "sum", -2, world()); },
      "reduce_scatter_tensor", 0, "[0, 1]",
      "scatter_dim -2 is out of range for a 1-d input (expected [-1, 0])");
}

TEST(ErrorsDocCollectives, ReduceScatterNotDivisible) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)reduce_scatter_tensor(Tensor::ones({2, 5}), "sum", 1, world());
      },
      "reduce_scatter_tensor", 0, "[0, 1]",
      "input size 5 along scatter_dim 1 is not divisible by the group size 2");
}

TEST(ErrorsDocCollectives, ReduceScatterCoalescedDimsCount) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)reduce_scatter_tensor_coalesced({Tensor::ones({2}), Tensor::ones({2})}, "sum", {0},
                                              world());
      },
      "reduce_scatter_tensor_coalesced", 0, "[0, 1]",
      "scatter_dims has 1 entries for 2 inputs: expected one per input");
}

TEST(ErrorsDocCollectives, ReduceScatterCoalescedNotDivisible) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)reduce_scatter_tensor_coalesced({Tensor::ones({2}), Tensor::ones({3})}, "sum", {0, 0},
                                              world());
      },
      "reduce_scatter_tensor_coalesced", 0, "[0, 1]",
      "input 1 size 3 along scatter_dim 0 is not divisible by the group size 2");
}

TEST(ErrorsDocCollectives, AllToAllZeroDim) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)all_to_all_single(Tensor::ones({}), std::nullopt, std::nullopt, world()); },
      "all_to_all_single", 0, "[0, 1]", "input is 0-d: all_to_all_single splits dimension 0");
}

TEST(ErrorsDocCollectives, AllToAllOneSplitAbsent) {
  run_quietly(2, [] {
    errdoc_expect_on_rank<InvalidArgument>(
        [] {
          (void)all_to_all_single(Tensor::ones({2}), std::vector<std::int64_t>{1, 1}, std::nullopt,
                                  world());
        },
        "all_to_all_single", 0, "[0, 1]",
        "only output_split_sizes was given: pass both split lists, or neither for the equal split");
    errdoc_expect_on_rank<InvalidArgument>(
        [] {
          (void)all_to_all_single(Tensor::ones({2}), std::nullopt, std::vector<std::int64_t>{1, 1},
                                  world());
        },
        "all_to_all_single", 0, "[0, 1]",
        "only input_split_sizes was given: pass both split lists, or neither for the equal split");
  });
}

TEST(ErrorsDocCollectives, AllToAllEqualSplitNotDivisible) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)all_to_all_single(Tensor::ones({3}), std::nullopt, std::nullopt, world()); },
      "all_to_all_single", 0, "[0, 1]",
      "input size 3 along dim 0 is not divisible by the group size 2 (no split sizes given, so "
      "the split is equal)");
}

TEST(ErrorsDocCollectives, AllToAllSplitListLength) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)all_to_all_single(Tensor::ones({2}), std::vector<std::int64_t>{2},
                                std::vector<std::int64_t>{1, 1}, world());
      },
      "all_to_all_single", 0, "[0, 1]",
      "output_split_sizes [2] has 1 entries: expected one per group rank (2)");
}

TEST(ErrorsDocCollectives, AllToAllNegativeSplit) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)all_to_all_single(Tensor::ones({2}), std::vector<std::int64_t>{1, 1},
                                std::vector<std::int64_t>{3, -1}, world());
      },
      "all_to_all_single", 0, "[0, 1]", "input_split_sizes [3, -1] has a negative entry at 1");
}

TEST(ErrorsDocCollectives, AllToAllInputSplitsDoNotSum) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)all_to_all_single(Tensor::ones({4}), std::vector<std::int64_t>{2, 2},
                                std::vector<std::int64_t>{1, 1}, world());
      },
      "all_to_all_single", 0, "[0, 1]",
      "input_split_sizes [1, 1] sum to 2, but the input has 4 rows along dim 0");
}

// BUG: the split sums in all_to_all_rule (core/src/shape_rules.cpp) are plain int64 additions.
// Splits whose sum overflows are undefined behaviour and in practice wrap: on 3 ranks, split
// lists like {INT64_MAX, INT64_MAX, 4} "sum" to 2 on inputs of 2 rows, so validation passes, the
// ranks' per-peer counts agree, the wire
// counts wrap the same way in size_t (so the transport's count checks pass too), and the
// simulator then copies INT64_MAX elements: a segfault (observed) instead of InvalidArgument.
// (Only output splits that overflow give a negative output size, refused by Tensor::empty with
// op "Tensor::empty" and no group.) Expected: InvalidArgument from all_to_all_single naming the
// overflow.
TEST(ErrorsDocCollectives, AllToAllSplitSumOverflowIsInvalidArgument) {
  run_quietly(3, [] {
    // Rank r sends 4 rows to rank 2 - r and INT64_MAX rows to the others (a symmetric matrix,
    // so every pair of ranks agrees): each list sums to 2^64 + 2, which wraps to 2.
    constexpr std::int64_t kHuge = std::numeric_limits<std::int64_t>::max();
    std::vector<std::int64_t> splits = {kHuge, kHuge, kHuge};
    splits[static_cast<std::size_t>(2 - rank())] = 4;
    errdoc_expect_on_rank<InvalidArgument>(
        [&] {
          (void)all_to_all_single(Tensor::ones({2}), splits, splits, world()).to_vector<float>();
        },
        "all_to_all_single", 0, "[0, 1, 2]", "overflow");
  });
}

// The same row's "or output_split_sizes ...": an output list whose sum overflows (here to a
// negative row count) is refused by name too, eagerly and by the shape function, not passed on as
// a shape for Tensor::empty to refuse.
TEST(ErrorsDocCollectives, AllToAllOutputSplitSumOverflowIsInvalidArgument) {
  constexpr std::int64_t kHuge = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::int64_t> output_splits = {kHuge, kHuge, 4};
  const std::vector<std::int64_t> input_splits = {1, 1, 0};
  const std::string detail =
      "output_split_sizes [9223372036854775807, 9223372036854775807, 4] overflow int64 when "
      "summed";
  errdoc_expect_on_every_rank<InvalidArgument>(
      3, [&] { (void)all_to_all_single(Tensor::ones({2}), output_splits, input_splits, world()); },
      "all_to_all_single", 0, "[0, 1, 2]", detail);
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)meta::all_to_all_single_shape({2}, output_splits, input_splits, 3); },
      "all_to_all_single_shape", detail);
}

TEST(ErrorsDocCollectives, BroadcastSrcNotAGroupRank) {
  run_quietly(3, [] {
    if (rank() == 0) {
      return;
    }
    errdoc_expect_on_rank<InvalidArgument>(
        [] {
          (void)broadcast(Tensor::ones({2}), 2, {1, 2});
        },
        "broadcast", 0, "[1, 2]",
        "src 2 is not a group rank: expected [0, 1] (an index into the group's ranks, not a "
        "global rank)");
  });
}

TEST(ErrorsDocCollectives, ReduceDstNotAGroupRank) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)reduce(Tensor::ones({2}), "sum", -1, world()); }, "reduce", 0, "[0, 1]",
      "dst -1 is not a group rank: expected [0, 1] (an index into the group's ranks, not a "
      "global rank)");
}

TEST(ErrorsDocCollectives, PermuteWrongLength) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2, [] { (void)permute_tensor(Tensor::ones({2}), {1}, world()); }, "permute_tensor", 0,
      "[0, 1]", "src_dst [1] has 1 entries: expected one per group rank (2)");
}

TEST(ErrorsDocCollectives, PermuteDestinationOutOfRange) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)permute_tensor(Tensor::ones({2}), {1, 2}, world());
      },
      "permute_tensor", 0, "[0, 1]",
      "src_dst [1, 2]: group rank 1 sends to 2, which is not a group rank (expected [0, 1] or "
      "-1 for nowhere)");
}

TEST(ErrorsDocCollectives, PermuteRepeatedDestination) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        (void)permute_tensor(Tensor::ones({2}), {1, 1}, world());
      },
      "permute_tensor", 0, "[0, 1]",
      "src_dst [1, 1]: group ranks 0 and 1 both send to 1 (destinations must be distinct)");
}

// =============================================================================================
// Collectives: in-place forms

TEST(ErrorsDocCollectives, InplaceUndefinedTensor) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        Tensor undefined;
        all_reduce_inplace(undefined, "sum", world());
      },
      "all_reduce_inplace", 0, "[0, 1]", "tensor is an undefined tensor");
}

TEST(ErrorsDocCollectives, InplaceOutputUndefined) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        Tensor output;
        all_gather_tensor_inplace(output, Tensor::ones({2}), world());
      },
      "all_gather_tensor_inplace", 0, "[0, 1]", "output is an undefined tensor");
}

TEST(ErrorsDocCollectives, InplaceOutputShape) {
  run_quietly(2, [] {
    errdoc_expect_on_rank<InvalidArgument>(
        [] {
          Tensor output = Tensor::zeros({2});
          all_gather_tensor_inplace(output, Tensor::ones({2}), world());
        },
        "all_gather_tensor_inplace", 0, "[0, 1]",
        "output shape [2] does not match the result shape [4]");
    errdoc_expect_on_rank<InvalidArgument>(
        [] {
          Tensor output = Tensor::zeros({4});
          reduce_scatter_tensor_inplace(output, Tensor::ones({4}), "sum", world());
        },
        "reduce_scatter_tensor_inplace", 0, "[0, 1]",
        "output shape [4] does not match the result shape [2]");
  });
}

TEST(ErrorsDocCollectives, InplaceOutputDType) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        Tensor output = Tensor::zeros({4}, DType::Int32);
        all_gather_tensor_inplace(output, Tensor::ones({2}), world());
      },
      "all_gather_tensor_inplace", 0, "[0, 1]",
      "output dtype Int32 does not match the input dtype Float32");
}

TEST(ErrorsDocCollectives, InplaceOutputMeta) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      2,
      [] {
        Tensor output = Tensor::empty({1}, DType::Float32, Device::meta());
        reduce_scatter_tensor_inplace(output, Tensor::ones({2}), "sum", world());
      },
      "reduce_scatter_tensor_inplace", 0, "[0, 1]", "output is a meta tensor but the input is not");
}

// =============================================================================================
// Shape functions (chorus::meta): the collectives' rules, with no rank and no group.

TEST(ErrorsDocShapes, GroupSizeNotPositive) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)meta::all_gather_shape({2}, 0, 0); }, "all_gather_shape",
      "group_size 0 is not positive: a group has at least one rank");
}

TEST(ErrorsDocShapes, RuleViolation) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)meta::reduce_scatter_shape({5}, 0, 2); }, "reduce_scatter_shape",
      "input size 5 along scatter_dim 0 is not divisible by the group size 2");
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)meta::broadcast_shape({2}, 3, 2); }, "broadcast_shape",
      "src 3 is not a group rank: expected [0, 1] (an index into the group's ranks, not a global "
      "rank)");
}

// BUG: all_gather_rule (core/src/shape_rules.cpp) multiplies the gather dim by the group size
// without an overflow check: meta::all_gather_shape({2^62}, 0, 2) returns {-2^63} (signed
// overflow, undefined behaviour) instead of throwing. Under a TraceScope the same overflow
// reaches Tensor::empty, which refuses the negative size with op "Tensor::empty" and no group
// instead of an all_gather_tensor error. Expected: InvalidArgument from the shape rule.
TEST(ErrorsDocShapes, AllGatherShapeOverflowIsInvalidArgument) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)meta::all_gather_shape({std::int64_t{1} << 62}, 0, 2); }, "all_gather_shape",
      "overflow");
}

// =============================================================================================
// Tracing

TEST(ErrorsDocTracing, TraceScopeOutsideRank) {
  errdoc_expect_plain<InvalidArgument>(
      [] { TraceScope scope; }, "TraceScope",
      "constructed outside a rank: a trace records one rank's collectives, so create it inside "
      "the rank function");
}

TEST(ErrorsDocTracing, ExecuteWrongInputCount) {
  run_quietly(2, [] {
    const OpRecord record = errdoc_record();
    errdoc_expect_on_rank<InvalidArgument>(
        [&] {
          (void)execute(record, {Tensor::ones({2}), Tensor::ones({2})});
        },
        "execute", -1, "",
        "record " + record.to_string() + ": got 2 inputs for 1 recorded input shapes");
    // A collective that is not coalesced takes one input, however many shapes its record lists.
    OpRecord two_shapes = errdoc_record();
    two_shapes.input_shapes = {{2}, {2}};
    errdoc_expect_on_rank<InvalidArgument>(
        [&] {
          (void)execute(two_shapes, {Tensor::ones({2}), Tensor::ones({2})});
        },
        "execute", -1, "",
        "record " + two_shapes.to_string() +
            ": all_reduce takes one input, and the record lists 2 input shapes");
  });
}

TEST(ErrorsDocTracing, ExecuteInputDoesNotFit) {
  run_quietly(2, [] {
    const OpRecord record = errdoc_record();
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)execute(record, {Tensor::ones({3}, DType::Int32)}); }, "execute", -1, "",
        "record " + record.to_string() + ": input 0 is Int32 [3], the record expects Float32 [2]");
    // The recorded shape in another dtype is refused too.
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)execute(record, {Tensor::ones({2}, DType::Int32)}); }, "execute", -1, "",
        "record " + record.to_string() + ": input 0 is Int32 [2], the record expects Float32 [2]");
  });
}

TEST(ErrorsDocTracing, ExecuteBadGroupSize) {
  run_quietly(2, [] {
    OpRecord record = errdoc_record();
    record.group_size = 0;
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)execute(record, {Tensor::ones({2})}); }, "execute", -1, "",
        "record " + record.to_string() + ": group_size 0 does not divide the 2 ranks");
  });
}

TEST(ErrorsDocTracing, ExecuteMissingReduceOp) {
  run_quietly(2, [] {
    OpRecord record = errdoc_record();
    record.reduce_op.reset();
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)execute(record, {Tensor::ones({2})}); }, "execute", -1, "",
        "record " + record.to_string() + ": it has no reduce_op, which all_reduce needs");
  });
}

TEST(ErrorsDocTracing, ExecuteMissingDims) {
  run_quietly(2, [] {
    OpRecord record = errdoc_record("all_gather_tensor");
    record.reduce_op.reset();
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)execute(record, {Tensor::ones({2})}); }, "execute", -1, "",
        "record " + record.to_string() + ": it has 0 dims; all_gather_tensor needs one per input");
  });
}

TEST(ErrorsDocTracing, ExecuteUnknownOp) {
  run_quietly(2, [] {
    const OpRecord record = errdoc_record("all_scatter");
    errdoc_expect_on_rank<InvalidArgument>(
        [&] { (void)execute(record, {Tensor::ones({2})}); }, "execute", -1, "",
        "record " + record.to_string() + ": 'all_scatter' is not a collective chorus knows");
  });
}

TEST(ErrorsDocTracing, ExecuteArgumentTheCollectiveRefuses) {
  run_quietly(2, [] {
    OpRecord record = errdoc_record("broadcast");
    record.reduce_op.reset();
    record.src = 5;
    errdoc_expect_on_rank<InvalidArgument>([&] { (void)execute(record, {Tensor::ones({2})}); },
                                           "broadcast", 0, "[0, 1]",
                                           "src 5 is not a group rank: expected [0, 1]");
  });
}

TEST(ErrorsDocTracing, AdjointOfNonLinearAllReduce) {
  OpRecord forward = errdoc_record();
  forward.reduce_op = ReduceOp(ReduceOp::Kind::Max);
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)adjoint(forward); }, "adjoint",
      "record " + forward.to_string() +
          ": has no adjoint collective: max is not linear (only sum, avg and premul_sum are)");
}

TEST(ErrorsDocTracing, AdjointOfScaledReduceScatter) {
  OpRecord forward = errdoc_record("reduce_scatter_tensor");
  forward.reduce_op = ReduceOp(ReduceOp::Kind::Avg);
  forward.dims = {0};
  forward.output_shapes = {{1}};
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)adjoint(forward); }, "adjoint",
      "record " + forward.to_string() +
          ": has no adjoint collective: avg scales the sum, so its adjoint is an all_gather "
          "followed by that scale, not one collective; use sum and scale separately");
}

TEST(ErrorsDocTracing, AdjointOfNonSumReduce) {
  OpRecord forward = errdoc_record("reduce");
  forward.reduce_op = ReduceOp(ReduceOp::Kind::Product);
  forward.src = 0;
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)adjoint(forward); }, "adjoint",
      "record " + forward.to_string() +
          ": has no adjoint collective: product is not linear, or scales the sum (only a sum "
          "reduce is broadcast's adjoint)");
}

TEST(ErrorsDocTracing, AdjointOfCoalescedReduceScatterOffDimZero) {
  OpRecord forward = errdoc_record("reduce_scatter_tensor_coalesced");
  forward.input_shapes = {{2, 2}};
  forward.dims = {1};
  forward.output_shapes = {{2, 1}};
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)adjoint(forward); }, "adjoint",
      "record " + forward.to_string() +
          ": has no adjoint collective: its adjoint gathers along scatter dim 1, but "
          "all_gather_into_tensor_coalesced gathers along dim 0 only; use reduce_scatter_tensor "
          "per tensor");
}

TEST(ErrorsDocTracing, AdjointOfUnknownOp) {
  const OpRecord forward = errdoc_record("all_scatter");
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)adjoint(forward); }, "adjoint",
      "record " + forward.to_string() + ": 'all_scatter' is not a collective chorus knows");
}

TEST(ErrorsDocTracing, AdjointOfInvalidRecord) {
  OpRecord forward = errdoc_record("reduce_scatter_tensor");
  forward.input_shapes = {{3}};
  forward.dims = {0};
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)adjoint(forward); }, "adjoint",
      "record " + forward.to_string() +
          ": input size 3 along scatter_dim 0 is not divisible by the group size 2");
}

// The shape rules divide by the group size: a record whose group_size is 0 (OpRecord's default)
// once crashed adjoint with a division by zero.
TEST(ErrorsDocTracing, AdjointOfNonPositiveGroupSize) {
  for (const std::string op : {"all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single"}) {
    for (const int group_size : {0, -1}) {
      OpRecord forward = errdoc_record(op);
      forward.input_shapes = {{4}};
      forward.dims = {0};
      forward.group_size = group_size;
      errdoc_expect_plain<InvalidArgument>([&] { (void)adjoint(forward); }, "adjoint",
                                           "record " + forward.to_string() + ": group_size " +
                                               std::to_string(group_size) + " is not positive");
    }
  }
}

// replay's default inputs check the record's shapes before counting their elements (a negative
// size once made a std::length_error, a product past int64 undefined behaviour).
TEST(ErrorsDocTracing, ReplayOfAnImpossibleShape) {
  run_quietly(2, [] {
    const Shape negative = {-1};
    const Shape huge = {std::int64_t{1} << 32, std::int64_t{1} << 32};
    for (const auto& [shape, why] : {std::pair{negative, "shape [-1] has a negative size"},
                                     std::pair{huge,
                                               "shape [4294967296, 4294967296] of Int64 is "
                                               "too large to address"}}) {
      OpRecord record = errdoc_record();
      record.input_shapes = {shape};
      record.output_shapes = {shape};
      (void)expect_error<InvalidArgument>([&] { (void)replay({record}); }, {why}, __LINE__);
    }
  });
}

TEST(ErrorsDocTracing, FromJsonSyntax) {
  EXPECT_NO_THROW((void)from_json(errdoc_json())) << "the base record is valid";
  errdoc_expect_plain<InvalidArgument>([] { (void)from_json("[1,]"); }, "from_json",
                                       "at offset 3: expected a value, found ']'");
  errdoc_expect_plain<InvalidArgument>([] { (void)from_json("["); }, "from_json",
                                       "at offset 1: expected a value, found the end of input");
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)from_json("[] x"); }, "from_json",
      "at offset 3: expected the end of input after the top-level value, found 'x'");
}

TEST(ErrorsDocTracing, FromJsonTooDeep) {
  errdoc_expect_plain<InvalidArgument>([] { (void)from_json(std::string(40, '[')); }, "from_json",
                                       "at offset 33: values nested deeper than 32 levels");
}

TEST(ErrorsDocTracing, FromJsonNotAnArray) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)from_json("{}"); }, "from_json",
      "at offset 0: expected an array of records, found an object");
}

TEST(ErrorsDocTracing, FromJsonRecordNotAnObject) {
  errdoc_expect_plain<InvalidArgument>([] { (void)from_json("[1]"); }, "from_json",
                                       "at offset 1: expected an object for record 0, found the "
                                       "number 1");
}

TEST(ErrorsDocTracing, FromJsonMissingField) {
  errdoc_expect_plain<InvalidArgument>([] { (void)from_json(errdoc_json(R"("tag": "", )", "")); },
                                       "from_json",
                                       R"(at offset 1: record 0 lacks the required field "tag")");
}

TEST(ErrorsDocTracing, FromJsonUnknownField) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)from_json(errdoc_json(R"("tag": "")", R"("tga": "")")); }, "from_json",
      R"(unknown field "tga" in record 0)");
}

TEST(ErrorsDocTracing, FromJsonWrongType) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)from_json(errdoc_json(R"("group_size": 2)", R"("group_size": "2")")); },
      "from_json", R"(expected an integer for "group_size", found a string)");
}

TEST(ErrorsDocTracing, FromJsonIntegerOutOfRange) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)from_json(errdoc_json(R"("group_size": 2)", R"("group_size": 4294967296)")); },
      "from_json",
      R"(expected an integer in [-2147483648, 2147483647] for "group_size", found 4294967296)");
}

TEST(ErrorsDocTracing, FromJsonUnknownOp) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)from_json(errdoc_json(R"("op": "all_reduce")", R"("op": "all_scatter")")); },
      "from_json", R"(unknown op "all_scatter" (expected one of all_reduce, all_gather_tensor, )");
}

TEST(ErrorsDocTracing, FromJsonUnknownReduceOp) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)from_json(errdoc_json(R"("reduce_op": "sum")", R"("reduce_op": "mean")")); },
      "from_json",
      R"(unknown reduce_op "mean" (expected one of sum, avg, product, min, max, band, bor, bxor, )"
      R"(premul_sum))");
}

TEST(ErrorsDocTracing, FromJsonPremulSumWithoutFactor) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)from_json(errdoc_json(R"("reduce_op": "sum")", R"("reduce_op": "premul_sum")")); },
      "from_json", R"(reduce_op "premul_sum" needs a "premul_factor")");
}

TEST(ErrorsDocTracing, FromJsonFactorWithoutPremulSum) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)from_json(
            errdoc_json(R"("reduce_op": "sum")", R"("reduce_op": "sum", "premul_factor": 2)"));
      },
      "from_json", R"("premul_factor" is only allowed with reduce_op "premul_sum")");
}

TEST(ErrorsDocTracing, FromJsonUnknownDType) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)from_json(errdoc_json(R"("dtype": "Float32")", R"("dtype": "Float8")")); },
      "from_json",
      R"(unknown dtype "Float8" (expected one of Bool, UInt8, Int8, Int32, Int64, Float16, )"
      R"(BFloat16, Float32, Float64, Complex64, Complex128))");
}

// =============================================================================================
// Running

TEST(ErrorsDocRunning, FromArgsUnknownTransport) {
  errdoc_expect_plain<InvalidArgument>([] { (void)errdoc_from_args({"--transport=tcp"}); },
                                       "RunOptions::from_args",
                                       "flag --transport='tcp' is invalid: expected one of sim, "
                                       "mpi, nccl");
}

TEST(ErrorsDocRunning, FromArgsRanksOutOfRange) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)errdoc_from_args({"--ranks", "0"});
      },
      "RunOptions::from_args", "flag --ranks='0' is invalid: expected 1 to 1024");
}

TEST(ErrorsDocRunning, FromArgsNotANumber) {
  errdoc_expect_plain<InvalidArgument>([] { (void)errdoc_from_args({"--seed=-3"}); },
                                       "RunOptions::from_args",
                                       "flag --seed='-3' is invalid: expected an unsigned integer "
                                       "in plain decimal (no +, leading zero or 0x)");
}

TEST(ErrorsDocRunning, FromArgsOverflow) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)errdoc_from_args({"--seed=18446744073709551616"}); }, "RunOptions::from_args",
      "flag --seed='18446744073709551616' is invalid: expected an unsigned integer below 2^64");
}

TEST(ErrorsDocRunning, FromArgsTimeoutOutOfRange) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)errdoc_from_args({"--timeout-ms=0"}); }, "RunOptions::from_args",
      "flag --timeout-ms='0' is invalid: expected 1 to 31536000000 (one year)");
}

TEST(ErrorsDocRunning, FromArgsMissingValue) {
  errdoc_expect_plain<InvalidArgument>([] { (void)errdoc_from_args({"--ranks"}); },
                                       "RunOptions::from_args",
                                       "flag --ranks='' is invalid: expected a value");
}

// Refused rather than ignored, whichever comes first on the command line, each named once;
// --seed, --timeout-ms and --check-collectives apply to every transport.
TEST(ErrorsDocRunning, FromArgsSimulatorFlagsOnAnotherTransport) {
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)errdoc_from_args(
            {"--ranks=4", "--transport=mpi", "--timeline=out.svg", "--guard-pages", "--ranks=2"});
      },
      "RunOptions::from_args",
      "--ranks, --timeline, --guard-pages are simulator flags, which --transport=mpi would ignore "
      "(its launcher sets the world: mpirun -np N, chorus launch -n N)");
  const std::vector<std::string> strategy_on_nccl = {"--transport=nccl", "--strategy", "pct"};
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)errdoc_from_args(strategy_on_nccl); }, "RunOptions::from_args",
      "--strategy is a simulator flag, which --transport=nccl would ignore");
  // A switch turned off asks for nothing a transport would ignore.
  const RunOptions everywhere =
      errdoc_from_args({"--transport=mpi", "--seed=7", "--timeout-ms=100",
                        "--check-collectives=true", "--guard-pages=false", "--sim-cuda=0"});
  EXPECT_EQ(everywhere.seed, 7U);
  EXPECT_TRUE(everywhere.check_collectives);
}

// A switch takes no value, or true, false, 1 or 0 (as chorus check's do).
TEST(ErrorsDocRunning, FromArgsSwitchValue) {
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)errdoc_from_args({"--guard-pages=yes"}); }, "RunOptions::from_args",
      "flag --guard-pages='yes' is invalid: expected no value (a switch), or true, false, 1 or 0");
  EXPECT_TRUE(errdoc_from_args({"--sim-cuda=1"}).sim_cuda);
  EXPECT_FALSE(errdoc_from_args({"--sim-cuda", "--sim-cuda=false"}).sim_cuda);
  EXPECT_FALSE(errdoc_from_args({"--check-determinism=0"}).check_determinism);
  EXPECT_TRUE(errdoc_from_args({"--check-determinism=true"}).check_determinism);
}

// The same words from the flags and from RunOptions set in code (until 2026-12-07 chorus::run
// worded it differently).
TEST(ErrorsDocRunning, FromArgsShrinkWithCheckDeterminism) {
  const std::string detail =
      "--shrink and --check-determinism (RunOptions::shrink and check_determinism) together: the "
      "check runs the schedule twice as it is; shrink a failing run without it";
  errdoc_expect_plain<InvalidArgument>(
      [] {
        (void)errdoc_from_args({"--check-determinism", "--shrink"});
      },
      "RunOptions::from_args", detail);
  RunOptions both;
  both.shrink = true;
  both.check_determinism = true;
  errdoc_expect_plain<InvalidArgument>([&] { (void)chorus::run(both, [] {}); }, "chorus::run",
                                       detail);
  EXPECT_TRUE(errdoc_from_args({"--shrink", "--check-determinism=false"}).shrink);
}

TEST(ErrorsDocRunning, TransportNotBuilt) {
  std::string built = "(built: sim";
  std::vector<std::string> names = {"gloo"};
#if defined(CHORUS_TEST_HAVE_MPI)
  built += ", mpi";
#else
  names.push_back("mpi");
#endif
#if defined(CHORUS_TEST_HAVE_NCCL)
  built += ", nccl";
#else
  names.push_back("nccl");
#endif
  built += ")";
  for (const std::string& name : names) {
    RunOptions options;
    options.transport = name;
    bool ran = false;
    errdoc_expect_plain<InvalidArgument>(
        [&] { (void)chorus::run(options, [&] { ran = true; }); }, "chorus::run",
        "transport '" + name + "' is not built into this chorus " + built);
    EXPECT_FALSE(ran);
  }
}

TEST(ErrorsDocRunning, SimWorldSizeOutOfRange) {
  errdoc_expect_plain<InvalidArgument>([] { (void)sim::run(quiet_options(0), [] {}); }, "sim::run",
                                       "world_size 0 is out of range [1, 1024]");
  errdoc_expect_plain<InvalidArgument>([] { (void)sim::run(quiet_options(1025), [] {}); },
                                       "sim::run", "world_size 1025 is out of range [1, 1024]");
}

TEST(ErrorsDocRunning, SimRunInsideRank) {
  errdoc_expect_on_every_rank<InvalidArgument>(
      1, [] { (void)sim::run(quiet_options(1), [] {}); }, "sim::run", -1, "",
      "sim::run cannot be called from inside a rank");
}

TEST(ErrorsDocRunning, SimSeedEnvironmentMalformed) {
  const testing::ScopedEnvironment seed({{"CHORUS_SIM_SEED", "12abc"}});
  sim::SimOptions options = quiet_options(1);
  options.seed_from_environment = true;
  errdoc_expect_plain<InvalidArgument>([&] { (void)sim::run(options, [] {}); }, "sim::run",
                                       "CHORUS_SIM_SEED='12abc' is not an unsigned integer");
}

TEST(ErrorsDocRunning, SimSeedEnvironmentNegativeOrTooLarge) {
  // strtoull would wrap "-1" and clamp the second and third to 2^64 - 1.
  for (const char* text : {"-1", "99999999999999999999999", "18446744073709551616", "+5", " 5"}) {
    const testing::ScopedEnvironment seed({{"CHORUS_SIM_SEED", text}});
    sim::SimOptions options = quiet_options(1);
    options.seed_from_environment = true;
    errdoc_expect_plain<InvalidArgument>(
        [&] { (void)sim::run(options, [] {}); }, "sim::run",
        "CHORUS_SIM_SEED='" + std::string(text) + "' is not an unsigned integer");
  }
}

TEST(ErrorsDocRunning, SimOptionsOutOfRange) {
  sim::SimOptions depth = quiet_options(2);
  depth.strategy = sim::Strategy::Pct;
  depth.pct_depth = 0;
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)sim::run(depth, [] {}); }, "sim::run",
      "SimOptions::pct_depth 0 is out of range: PCT's bug depth is 1 to 64");
  depth.pct_depth = sim::kPctDepthMax + 1;
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)sim::run(depth, [] {}); }, "sim::run",
      "SimOptions::pct_depth 65 is out of range: PCT's bug depth is 1 to 64");
  depth.pct_depth = std::numeric_limits<int>::max();  // would draw 2^31 change points
  errdoc_expect_plain<InvalidArgument>(
      [&] { (void)sim::run(depth, [] {}); }, "sim::run",
      "SimOptions::pct_depth 2147483647 is out of range: PCT's bug depth is 1 to 64");
  // Each enumerated field one past its last enumerator.
  sim::SimOptions order = quiet_options(2);
  order.reduction_order = static_cast<sim::ReductionOrder>(4);
  errdoc_expect_plain<InvalidArgument>([&] { (void)sim::run(order, [] {}); }, "sim::run",
                                       "SimOptions::reduction_order 4 is not a ReductionOrder");
  sim::SimOptions strategy = quiet_options(2);
  strategy.strategy = static_cast<sim::Strategy>(3);
  errdoc_expect_plain<InvalidArgument>([&] { (void)sim::run(strategy, [] {}); }, "sim::run",
                                       "SimOptions::strategy 3 is not a Strategy");
  sim::SimOptions allocator = quiet_options(2);
  allocator.allocator = static_cast<sim::AllocatorPolicy>(4);
  errdoc_expect_plain<InvalidArgument>([&] { (void)sim::run(allocator, [] {}); }, "sim::run",
                                       "SimOptions::allocator 4 is not an AllocatorPolicy");
  sim::SimOptions executor = quiet_options(2);
  executor.executor = static_cast<sim::ExecutorKind>(3);
  errdoc_expect_plain<InvalidArgument>([&] { (void)sim::run(executor, [] {}); }, "sim::run",
                                       "SimOptions::executor 3 is not an ExecutorKind");
}

TEST(ErrorsDocRunning, SimExecutorEnvironmentUnknown) {
  const testing::ScopedEnvironment executor({{"CHORUS_SIM_EXECUTOR", "coroutines"}});
  errdoc_expect_plain<InvalidArgument>(
      [] { (void)sim::run(quiet_options(1), [] {}); }, "sim::run",
      "CHORUS_SIM_EXECUTOR='coroutines': expected fibers or threads");
}

TEST(ErrorsDocRunning, KernelIsaNotSupported) {
  const kernels::Isa initial = kernels::active_isa();
  errdoc_expect_plain<InvalidArgument>([] { kernels::set_isa(static_cast<kernels::Isa>(7)); },
                                       "kernels::set_isa",
                                       "instruction set 'unknown' is not supported by this build");
  if (!kernels::isa_supported(kernels::Isa::Avx2)) {
    errdoc_expect_plain<InvalidArgument>([] { kernels::set_isa(kernels::Isa::Avx2); },
                                         "kernels::set_isa",
                                         "instruction set 'avx2' is not supported by this ");
  }
  EXPECT_EQ(kernels::active_isa(), initial);
}

// =============================================================================================
// Cross-rank failures. Every rank catches its own error; each rank's type is checked.

constexpr const char* kErrdocMismatch0 = "ranks disagree on operation #0 of group [0, 1]: rank ";

TEST(ErrorsDocCrossRank, MismatchOp) {
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    const std::vector<CaughtError> outcomes = run_catching(
        2,
        [] {
          if (rank() == 0) {
            (void)all_reduce(errdoc_bytes(4), "sum", world()).to_vector<std::uint8_t>();
          } else {
            (void)all_gather_tensor(errdoc_bytes(2), 0, world()).to_vector<std::uint8_t>();
          }
        },
        seed);
    errdoc_expect_outcome(outcomes, 0, ErrorCode::CollectiveMismatch, "all_reduce", 0, "[0, 1]",
                          kErrdocMismatch0);
    errdoc_expect_outcome(outcomes, 1, ErrorCode::CollectiveMismatch, "all_gather_tensor", 0,
                          "[0, 1]", kErrdocMismatch0);
    for (const CaughtError& outcome : outcomes) {
      EXPECT_TRUE(contains(outcome.detail, "all_reduce(UInt8, send=4, recv=4, sum) at "));
      EXPECT_TRUE(
          contains(outcome.detail, "all_gather_tensor all_gather(UInt8, send=2, recv=4) at "))
          << outcome.detail;
      EXPECT_TRUE(contains(outcome.detail, "errors_doc_test.cpp:")) << "call sites";
    }
  }
}

// Rank 1 deviates from ranks 0 and 2 in one field of an otherwise equal call; every rank gets
// CollectiveMismatch naming both signatures.
void errdoc_expect_field_mismatch(const std::function<void(int)>& issue, const std::string& op,
                                  const std::string& usual, const std::string& deviant) {
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    const std::vector<CaughtError> outcomes = run_catching(
        3, [&] { issue(rank()); }, seed);
    for (int r = 0; r < 3; ++r) {
      errdoc_expect_outcome(outcomes, r, ErrorCode::CollectiveMismatch, op, 0, "[0, 1, 2]",
                            "ranks disagree on operation #0 of group [0, 1, 2]: rank ");
      const std::string& detail = outcomes[static_cast<std::size_t>(r)].detail;
      EXPECT_TRUE(contains(detail, usual)) << detail;
      EXPECT_TRUE(contains(detail, deviant)) << detail;
    }
  }
}

TEST(ErrorsDocCrossRank, MismatchDType) {
  errdoc_expect_field_mismatch(
      [](int r) {
        (void)all_reduce(errdoc_bytes(4, r == 1 ? DType::Int8 : DType::UInt8), "sum", world())
            .to(DType::UInt8);
      },
      "all_reduce", "all_reduce(UInt8, send=4, recv=4, sum)",
      "all_reduce(Int8, send=4, recv=4, sum)");
}

// The same bytes in a dtype core lowers (Note [Lowering]): n Complex64 against 2n Float32, and
// Bool against UInt8 in all_to_all_single, whose signatures compare only the dtype.
TEST(ErrorsDocCrossRank, MismatchLoweredDType) {
  errdoc_expect_field_mismatch(
      [](int r) {
        const Tensor input = r == 1 ? Tensor::ones({2}, DType::Complex64) : Tensor::ones({4});
        (void)wait_tensor(all_reduce(input, "sum", world()));
      },
      "all_reduce", "all_reduce(Float32, send=4, recv=4, sum)",
      "all_reduce(Complex64 as Float32, send=4, recv=4, sum)");
  errdoc_expect_field_mismatch(
      [](int r) {
        const Tensor input = Tensor::ones({3}, r == 1 ? DType::Bool : DType::UInt8);
        (void)wait_tensor(all_to_all_single(input, std::nullopt, std::nullopt, world()));
      },
      "all_to_all_single", "all_to_all(UInt8, send=3, recv=3)",
      "all_to_all(Bool as UInt8, send=3, recv=3)");
}

TEST(ErrorsDocCrossRank, MismatchShape) {
  errdoc_expect_field_mismatch(
      [](int r) {
        (void)all_reduce(errdoc_bytes(r == 1 ? 5 : 4), "sum", world()).to_vector<std::uint8_t>();
      },
      "all_reduce", "all_reduce(UInt8, send=4, recv=4, sum)",
      "all_reduce(UInt8, send=5, recv=5, sum)");
}

// What a mismatch message adds when only the tensors' shapes or dims differ: the signatures
// print alike (Note [Layout digest] in core).
constexpr const char* kErrdocLayoutNote = " (their tensors' shapes or gather/scatter dims differ)";

// The element counts agree, the shapes do not: each would complete with a result laid out
// wrong, so each is a CollectiveMismatch on every rank.
TEST(ErrorsDocCrossRank, MismatchShapeSameCount) {
  errdoc_expect_field_mismatch(
      [](int r) {
        const Tensor input = Tensor::ones(r == 1 ? Shape{2, 3} : Shape{6}, DType::UInt8);
        (void)all_reduce(input, "sum", world()).to_vector<std::uint8_t>();
      },
      "all_reduce", "all_reduce(UInt8, send=6, recv=6, sum) at ", kErrdocLayoutNote);
  // [2, 3] against [3, 2] along dim 1: rank 1's block would be read as a [2, 3] one.
  errdoc_expect_field_mismatch(
      [](int r) {
        const Tensor input = Tensor::ones(r == 1 ? Shape{3, 2} : Shape{2, 3}, DType::UInt8);
        (void)all_gather_tensor(input, 1, world()).to_vector<std::uint8_t>();
      },
      "all_gather_tensor", "all_gather_tensor all_gather(UInt8, send=6, recv=18) at ",
      kErrdocLayoutNote);
  errdoc_expect_field_mismatch(
      [](int r) {
        const Tensor input = Tensor::ones(r == 1 ? Shape{3, 1, 2} : Shape{3, 2}, DType::UInt8);
        (void)broadcast(input, 0, world()).to_vector<std::uint8_t>();
      },
      "broadcast", "broadcast(UInt8, send=6, recv=6, root=0) at ", kErrdocLayoutNote);
  // all_to_all_single's dim 0 may differ (uneven splits), its rows may not: [3, 2] against
  // [6, 1] send 2 elements to each rank either way.
  errdoc_expect_field_mismatch(
      [](int r) {
        const Tensor input = Tensor::ones(r == 1 ? Shape{6, 1} : Shape{3, 2}, DType::UInt8);
        (void)wait_tensor(all_to_all_single(input, std::nullopt, std::nullopt, world()));
      },
      "all_to_all_single", "all_to_all(UInt8, send=6, recv=6) at ", kErrdocLayoutNote);
  // In a coalesced batch, one op's shape is enough.
  errdoc_expect_field_mismatch(
      [](int r) {
        const std::vector<Tensor> inputs = {
            Tensor::ones({2}, DType::UInt8),
            Tensor::ones(r == 1 ? Shape{2, 2} : Shape{4}, DType::UInt8)};
        (void)wait_tensors(all_reduce_coalesced(inputs, "sum", world()));
      },
      "all_reduce_coalesced", "all_reduce(UInt8, send=4, recv=4, sum)]", kErrdocLayoutNote);
}

TEST(ErrorsDocCrossRank, MismatchScatterDim) {
  // [3, 3] along dim 0 against dim 1: the same counts, different blocks.
  errdoc_expect_field_mismatch(
      [](int r) {
        const Tensor input = Tensor::ones({3, 3}, DType::UInt8);
        (void)reduce_scatter_tensor(input, "sum", r == 1 ? 1 : 0, world())
            .to_vector<std::uint8_t>();
      },
      "reduce_scatter_tensor",
      "reduce_scatter_tensor reduce_scatter(UInt8, send=9, recv=3, sum) at ", kErrdocLayoutNote);
  errdoc_expect_field_mismatch(
      [](int r) {
        const std::vector<Tensor> inputs = {Tensor::ones({3, 3}, DType::UInt8)};
        (void)wait_tensors(
            reduce_scatter_tensor_coalesced(inputs, "sum", {r == 1 ? 1 : 0}, world()));
      },
      "reduce_scatter_tensor_coalesced", "reduce_scatter(UInt8, send=9, recv=3, sum) at ",
      kErrdocLayoutNote);
}

TEST(ErrorsDocCrossRank, MismatchGatherDim) {
  errdoc_expect_field_mismatch(
      [](int r) {
        (void)all_gather_tensor(Tensor::ones({2, 2}, DType::UInt8), r == 1 ? 1 : 0, world())
            .to_vector<std::uint8_t>();
      },
      "all_gather_tensor", "all_gather_tensor all_gather(UInt8, send=4, recv=12) at ",
      kErrdocLayoutNote);
}

// reduce, permute_tensor and all_gather_into_tensor_coalesced digest their inputs' shapes as the
// other ops do (Note [Layout digest]): [2, 3] against [6] is a CollectiveMismatch on every rank,
// not a result laid out as another rank's shape.
TEST(ErrorsDocCrossRank, MismatchShapeSameCountInReducePermuteAndCoalescedGather) {
  errdoc_expect_field_mismatch(
      [](int r) {
        const Tensor input = Tensor::ones(r == 1 ? Shape{2, 3} : Shape{6}, DType::UInt8);
        (void)reduce(input, "sum", 0, world()).to_vector<std::uint8_t>();
      },
      "reduce", "reduce(UInt8, send=6, recv=6, sum, root=0) at ", kErrdocLayoutNote);
  errdoc_expect_field_mismatch(
      [](int r) {
        const Tensor input = Tensor::ones(r == 1 ? Shape{2, 3} : Shape{6}, DType::UInt8);
        (void)permute_tensor(input, {1, 2, 0}, world()).to_vector<std::uint8_t>();
      },
      "permute_tensor", "all_to_all(UInt8, send=6, recv=6) at ", kErrdocLayoutNote);
  errdoc_expect_field_mismatch(
      [](int r) {
        const std::vector<Tensor> inputs = {
            Tensor::ones(r == 1 ? Shape{2, 3} : Shape{6}, DType::UInt8)};
        (void)wait_tensors(all_gather_into_tensor_coalesced(inputs, world()));
      },
      "all_gather_into_tensor_coalesced",
      "all_gather_into_tensor_coalesced all_gather(UInt8, send=6, recv=18) at ", kErrdocLayoutNote);
}

// What ranks compare is the normalised dim: -1 and 1 of a 2-d tensor agree.
TEST(ErrorsDocCrossRank, NegativeAndPositiveDimsAgree) {
  const std::vector<CaughtError> outcomes = run_catching(3, [] {
    const Tensor input =
        Tensor::from_vector(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6}, Shape{2, 3});
    const Tensor gathered = all_gather_tensor(input, rank() == 1 ? -1 : 1, world());
    EXPECT_EQ(gathered.sizes(), (Shape{2, 9}));
    const Tensor scattered = reduce_scatter_tensor(Tensor::ones({3, 3}, DType::Int64), "sum",
                                                   rank() == 2 ? -1 : 1, world());
    EXPECT_EQ(scattered.to_vector<std::int64_t>(), (std::vector<std::int64_t>{3, 3, 3}));
  });
  for (const CaughtError& outcome : outcomes) {
    EXPECT_FALSE(outcome.code.has_value()) << outcome.what;
  }
}

TEST(ErrorsDocCrossRank, MismatchReduceOp) {
  errdoc_expect_field_mismatch(
      [](int r) {
        (void)all_reduce(Tensor::ones({2}), ReduceOp::premul_sum(r == 1 ? 0.5 : 2.0), world())
            .to_vector<float>();
      },
      "all_reduce", "all_reduce(Float32, send=2, recv=2, premul_sum(2))",
      "all_reduce(Float32, send=2, recv=2, premul_sum(0.5))");
}

TEST(ErrorsDocCrossRank, MismatchRoot) {
  errdoc_expect_field_mismatch(
      [](int r) { (void)broadcast(Tensor::ones({2}), r == 1 ? 1 : 0, world()).to_vector<float>(); },
      "broadcast", "broadcast(Float32, send=2, recv=2, root=0)",
      "broadcast(Float32, send=2, recv=2, root=1)");
}

TEST(ErrorsDocCrossRank, MismatchGroup) {
  // Rank 0 joins {0, 1}, rank 1 joins {0, 1, 2}, rank 2 joins {1, 2}: each waits for a peer that
  // waits in another group holding both of them.
  const std::vector<CaughtError> outcomes = run_catching(3, [] {
    const std::vector<std::vector<int>> groups = {{0, 1}, {0, 1, 2}, {1, 2}};
    (void)all_reduce(errdoc_bytes(2), "sum", groups[static_cast<std::size_t>(rank())])
        .to_vector<std::uint8_t>();
  });
  const std::vector<std::string> labels = {"[0, 1]", "[0, 1, 2]", "[1, 2]"};
  for (int r = 0; r < 3; ++r) {
    errdoc_expect_outcome(outcomes, r, ErrorCode::CollectiveMismatch, "all_reduce", 0,
                          labels[static_cast<std::size_t>(r)],
                          "ranks disagree on the group of their next collective: rank ");
    EXPECT_TRUE(contains(outcomes[static_cast<std::size_t>(r)].detail,
                         "each group holds both ranks, so neither can complete"));
  }
  EXPECT_TRUE(
      contains(outcomes[0].detail, "rank 0 waits in all_reduce #0 on group [0, 1] (issued at "));
  EXPECT_TRUE(
      contains(outcomes[0].detail, "rank 1 waits in all_reduce #0 on group [0, 1, 2] (issued at "));
}

TEST(ErrorsDocCrossRank, MismatchGroupSameMembersInAnotherOrder) {
  // A group rank is a position in the list as given (docs/design.md, departures from PyTorch),
  // so {0, 1} and {1, 0} are different groups: a mismatch, not PyTorch's sorted group.
  const std::vector<CaughtError> outcomes = run_catching(2, [] {
    const std::vector<int> group = rank() == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 0};
    (void)all_reduce(errdoc_bytes(2), "sum", group).to_vector<std::uint8_t>();
  });
  const std::vector<std::string> labels = {"[0, 1]", "[1, 0]"};
  for (int r = 0; r < 2; ++r) {
    errdoc_expect_outcome(outcomes, r, ErrorCode::CollectiveMismatch, "all_reduce", 0,
                          labels[static_cast<std::size_t>(r)],
                          "ranks disagree on the group of their next collective: rank ");
  }
}

TEST(ErrorsDocCrossRank, MismatchTag) {
  const std::vector<CaughtError> outcomes = run_catching(2, [] {
    const ProcessGroup group = new_group({0, 1}, rank() == 0 ? "alpha" : "beta");
    (void)all_reduce(errdoc_bytes(2), "sum", group).to_vector<std::uint8_t>();
  });
  errdoc_expect_outcome(outcomes, 0, ErrorCode::CollectiveMismatch, "all_reduce", 0,
                        "'alpha' [0, 1]",
                        "ranks disagree on the group of their next collective: rank 0 waits in "
                        "all_reduce #0 on group 'alpha' [0, 1]");
  errdoc_expect_outcome(outcomes, 1, ErrorCode::CollectiveMismatch, "all_reduce", 0,
                        "'beta' [0, 1]", "rank 1 waits in all_reduce #0 on group 'beta' [0, 1]");
}

TEST(ErrorsDocCrossRank, MismatchAllToAllCounts) {
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    const std::vector<CaughtError> outcomes = run_catching(
        2,
        [] {
          // Rank 1 keeps both rows (sends 0 to rank 0, and expects both back from itself), but
          // rank 0 expects 1 row from rank 1.
          const std::vector<std::int64_t> in =
              rank() == 0 ? std::vector<std::int64_t>{1, 1} : std::vector<std::int64_t>{0, 2};
          const std::vector<std::int64_t> out =
              rank() == 0 ? std::vector<std::int64_t>{1, 1} : std::vector<std::int64_t>{1, 2};
          (void)all_to_all_single(Tensor::ones({2}), out, in, world()).to_vector<float>();
        },
        seed);
    for (int r = 0; r < 2; ++r) {
      errdoc_expect_outcome(outcomes, r, ErrorCode::CollectiveMismatch, "all_to_all_single", 0,
                            "[0, 1]",
                            "ranks disagree on operation #0 of group [0, 1]: all_to_all counts "
                            "disagree: rank 1 sends 0 elements to rank 0 (issued at ");
      EXPECT_TRUE(contains(outcomes[static_cast<std::size_t>(r)].detail,
                           ") but rank 0 expects 1 from rank 1 (issued at "));
    }
  }
}

TEST(ErrorsDocCrossRank, MismatchAllToAllOwnCounts) {
  // Rank 1 sends itself one row but expects two from itself, while every pair of different
  // ranks agrees: the copy a rank makes to itself is checked like any other pair (it was cut
  // short or padded without an error).
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    const std::vector<CaughtError> outcomes = run_catching(
        2,
        [] {
          const std::vector<std::int64_t> out =
              rank() == 0 ? std::vector<std::int64_t>{1, 1} : std::vector<std::int64_t>{1, 2};
          (void)all_to_all_single(Tensor::ones({2}), out, std::vector<std::int64_t>{1, 1}, world())
              .to_vector<float>();
        },
        seed);
    for (int r = 0; r < 2; ++r) {
      errdoc_expect_outcome(outcomes, r, ErrorCode::CollectiveMismatch, "all_to_all_single", 0,
                            "[0, 1]",
                            "ranks disagree on operation #0 of group [0, 1]: all_to_all counts "
                            "disagree: rank 1 sends 1 elements to rank 1 (issued at ");
      EXPECT_TRUE(contains(outcomes[static_cast<std::size_t>(r)].detail,
                           ") but rank 1 expects 2 from rank 1 (issued at "));
    }
  }
  // One rank alone: its only pair is its own.
  const std::vector<CaughtError> alone = run_catching(1, [] {
    (void)all_to_all_single(Tensor::full({1}, 7.0f), std::vector<std::int64_t>{3},
                            std::vector<std::int64_t>{1}, world())
        .to_vector<float>();
  });
  errdoc_expect_outcome(
      alone, 0, ErrorCode::CollectiveMismatch, "all_to_all_single", 0, "[0]",
      "all_to_all counts disagree: rank 0 sends 1 elements to rank 0 (issued at ");
}

TEST(ErrorsDocCrossRank, MismatchPermutation) {
  const std::vector<CaughtError> outcomes = run_catching(2, [] {
    // Rank 0 thinks the ranks swap; rank 1 thinks only it sends (to rank 0).
    const std::vector<int> src_dst = rank() == 0 ? std::vector<int>{1, 0} : std::vector<int>{-1, 0};
    (void)permute_tensor(Tensor::ones({2}), src_dst, world()).to_vector<float>();
  });
  for (int r = 0; r < 2; ++r) {
    errdoc_expect_outcome(outcomes, r, ErrorCode::CollectiveMismatch, "permute_tensor", 0, "[0, 1]",
                          "all_to_all counts disagree: rank 0 sends 2 elements to rank 1 (issued "
                          "at ");
    EXPECT_TRUE(contains(outcomes[static_cast<std::size_t>(r)].detail,
                         ") but rank 1 expects 0 from rank 0 (issued at "));
  }
}

TEST(ErrorsDocCrossRank, AbortedAfterMismatch) {
  const std::vector<CaughtError> outcomes = run_catching(2, [] {
    try {
      (void)all_reduce(errdoc_bytes(rank() == 0 ? 1 : 2), "sum", world()).to_vector<std::uint8_t>();
    } catch (const CollectiveMismatch&) {
    }
    (void)all_reduce(errdoc_bytes(1), "sum", world()).to_vector<std::uint8_t>();
  });
  for (int r = 0; r < 2; ++r) {
    errdoc_expect_outcome(outcomes, r, ErrorCode::Aborted, "all_reduce", 1, "[0, 1]",
                          "the communicator was aborted: operation #0 was a collective mismatch");
  }
}

TEST(ErrorsDocCrossRank, DeadlockPeerReturned) {
  const std::vector<CaughtError> outcomes = run_catching(2, [] {
    if (rank() == 0) {
      (void)all_reduce(errdoc_bytes(2), "sum", world()).to_vector<std::uint8_t>();
    }
  });
  errdoc_expect_outcome(outcomes, 0, ErrorCode::Deadlock, "all_reduce", 0, "[0, 1]",
                        "rank 1 returned from its rank function without joining this collective "
                        "(it issued no operation on this group; on NCCL this would hang)");
  EXPECT_FALSE(outcomes[1].code.has_value()) << "the rank that returned sees no error";
}

TEST(ErrorsDocCrossRank, DeadlockCycle) {
  // Each rank waits in its first group before joining its second: 0 -> 1 -> 2 -> 0.
  const std::vector<CaughtError> outcomes = run_catching(3, [] {
    const int r = rank();
    std::vector<int> first = {r, (r + 1) % 3};
    std::vector<int> second = {(r + 2) % 3, r};
    std::sort(first.begin(), first.end());
    std::sort(second.begin(), second.end());
    (void)all_reduce(errdoc_bytes(1), "sum", first).to_vector<std::uint8_t>();
    (void)all_reduce(errdoc_bytes(1), "sum", second).to_vector<std::uint8_t>();
  });
  const std::vector<std::string> labels = {"[0, 1]", "[1, 2]", "[0, 2]"};
  for (int r = 0; r < 3; ++r) {
    errdoc_expect_outcome(outcomes, r, ErrorCode::Deadlock, "all_reduce", 0,
                          labels[static_cast<std::size_t>(r)],
                          "no rank can make progress (deadlock):\n  rank 0: waiting in all_reduce "
                          "#0 on group [0, 1] (issued at ");
    EXPECT_TRUE(
        contains(outcomes[static_cast<std::size_t>(r)].detail, "; not yet joined by rank(s) 1"));
  }
}

TEST(ErrorsDocCrossRank, RankFailure) {
  std::vector<CaughtError> outcomes(3);
  EXPECT_THROW(
      sim::run(quiet_options(3),
               [&] {
                 if (rank() == 1) {
                   throw std::runtime_error("rank 1 crashed");
                 }
                 try {
                   (void)all_reduce(errdoc_bytes(2), "sum", world()).to_vector<std::uint8_t>();
                 } catch (const Error& error) {
                   outcomes[static_cast<std::size_t>(rank())] = caught_error(error);
                 }
               }),
      std::runtime_error)
      << "sim::run rethrows the dead rank's own error after every rank ended";
  for (int r : {0, 2}) {
    errdoc_expect_outcome(outcomes, r, ErrorCode::RankFailure, "all_reduce", 0, "[0, 1, 2]",
                          "rank 1 failed before joining this collective (it issued no operation "
                          "on this group): rank 1 crashed");
  }
}

TEST(ErrorsDocCrossRank, Timeout) {
  sim::SimOptions options = quiet_options(2);
  options.timeout = std::chrono::microseconds(50);  // 50 scheduling steps of virtual time
  std::vector<CaughtError> first(2);
  std::vector<CaughtError> second(2);
  sim::run(options, [&] {
    const auto r = static_cast<std::size_t>(rank());
    try {
      if (rank() == 1) {
        for (int i = 0; i < 200; ++i) {  // busy alone far past rank 0's deadline
          (void)all_reduce(errdoc_bytes(1), "sum", {1}).to_vector<std::uint8_t>();
        }
      }
      (void)all_reduce(errdoc_bytes(1), "sum", world()).to_vector<std::uint8_t>();
    } catch (const Error& error) {
      first[r] = caught_error(error);
    }
    try {
      (void)all_reduce(errdoc_bytes(1), "sum", world()).to_vector<std::uint8_t>();
    } catch (const Error& error) {
      second[r] = caught_error(error);
    }
  });
  for (int r = 0; r < 2; ++r) {
    errdoc_expect_outcome(first, r, ErrorCode::Timeout, "all_reduce", 0, "[0, 1]",
                          "rank 0's wait passed its deadline (virtual time ");
    EXPECT_TRUE(contains(first[static_cast<std::size_t>(r)].detail,
                         " s) before the collective completed, when rank(s) 1 had not "
                         "joined it yet; the communicator is aborted, as a watchdog would"));
    errdoc_expect_outcome(second, r, ErrorCode::Aborted, "all_reduce", 1, "[0, 1]",
                          "the communicator was aborted: operation #0 timed out");
  }
}

TEST(ErrorsDocCrossRank, Livelock) {
  sim::SimOptions options = quiet_options(2);
  options.max_steps = 500;
  std::vector<CaughtError> outcomes(2);
  sim::run(options, [&] {
    CaughtError& outcome = outcomes[static_cast<std::size_t>(rank())];
    try {
      if (rank() == 0) {
        while (true) {  // never joins the world collective, but keeps calling chorus
          (void)all_reduce(errdoc_bytes(1), "sum", {0}).to_vector<std::uint8_t>();
        }
      }
      (void)all_reduce(errdoc_bytes(1), "sum", world()).to_vector<std::uint8_t>();
    } catch (const Error& error) {
      outcome = caught_error(error);
    }
  });
  errdoc_expect_outcome(outcomes, 1, ErrorCode::Deadlock, "all_reduce", 0, "[0, 1]",
                        "the simulation took 500 scheduling decisions without ending (livelock?); "
                        "step budget SimOptions::max_steps exhausted");
  // Rank 0's own collective of the moment (its sequence number depends on the budget) fails the
  // same way.
  ASSERT_TRUE(outcomes[0].code.has_value());
  EXPECT_EQ(*outcomes[0].code, ErrorCode::Deadlock) << outcomes[0].what;
  EXPECT_EQ(outcomes[0].context.group, "[0]");
  EXPECT_TRUE(contains(outcomes[0].detail, "step budget SimOptions::max_steps exhausted"))
      << outcomes[0].what;
}

TEST(ErrorsDocCrossRank, InputModified) {
  const std::vector<CaughtError> outcomes = run_catching(2, [] {
    const ProcessGroup signal = new_group({0, 1}, "signal");
    Tensor input = Tensor::full({4}, 1, DType::Int32);
    if (rank() == 0) {
      Tensor sum = all_reduce(input, "sum", world());
      input.copy_(Tensor::full({4}, 100, DType::Int32));  // a data race on NCCL
      // Rank 1 joins the world collective only after this: it cannot have completed yet.
      (void)all_reduce(errdoc_bytes(1), "sum", signal).to_vector<std::uint8_t>();
      (void)sum.to_vector<std::int32_t>();
    } else {
      (void)all_reduce(errdoc_bytes(1), "sum", signal).to_vector<std::uint8_t>();
      (void)all_reduce(input, "sum", world()).to_vector<std::int32_t>();
    }
  });
  for (int r = 0; r < 2; ++r) {
    errdoc_expect_outcome(outcomes, r, ErrorCode::InputModified, "all_reduce", 0, "[0, 1]",
                          "rank 0 modified input 0 of all_reduce (issued at ");
    EXPECT_TRUE(contains(outcomes[static_cast<std::size_t>(r)].detail,
                         ") before the collective completed: the result would depend on "
                         "timing (on NCCL, a data race); wait for the collective before "
                         "writing its input"));
  }
}

TEST(ErrorsDocCrossRank, DroppedResultFailedRaisedAtNextCall) {
  const std::vector<CaughtError> outcomes = run_catching(2, [] {
    { Tensor dropped = all_reduce(errdoc_bytes(rank() + 1), "sum", world()); }
    // The drop completed the mismatched collective; its error comes out of the next call.
    (void)all_reduce(errdoc_bytes(1), "sum", {rank()}).to_vector<std::uint8_t>();
  });
  for (int r = 0; r < 2; ++r) {
    errdoc_expect_outcome(outcomes, r, ErrorCode::CollectiveMismatch, "all_reduce", 0, "[0, 1]",
                          "the result of all_reduce #0 (issued at ");
    EXPECT_TRUE(contains(outcomes[static_cast<std::size_t>(r)].detail,
                         ") was dropped un-waited, and completing it failed: ranks "
                         "disagree on operation #0 of group [0, 1]"));
  }
}

TEST(ErrorsDocCrossRank, PendingAtRankExitFailedRaisedByRun) {
  // The results outlive the rank functions: each rank ends with its collective still pending,
  // and the rank's end completes it.
  std::vector<Tensor> kept(2);
  // sim::run rethrows the failure found at the end of a rank.
  const testing::CaughtError caught = testing::expect_error<CollectiveMismatch>(
      [&] {
        sim::run(quiet_options(2), [&] {
          kept[static_cast<std::size_t>(rank())] =
              all_reduce(errdoc_bytes(rank() + 1), "sum", world());
        });
      },
      {"the result of all_reduce #0 (issued at ",
       ") was still pending when the rank ended, and completing it failed: ranks disagree on "
       "operation #0 of group [0, 1]"});
  EXPECT_EQ(caught.context.op, "all_reduce");
  EXPECT_EQ(caught.context.seq, 0);
  EXPECT_EQ(caught.context.group, "[0, 1]");
}

}  // namespace
}  // namespace chorus
