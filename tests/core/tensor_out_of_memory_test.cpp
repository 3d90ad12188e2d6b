// Tensor::from_dlpack and Tensor::from_blob when memory runs out: each allocation they make is
// refused in turn, and every refusal must leave the wrapped memory with the caller (its deleter
// not run), as docs/errors.md promises for their other errors. Its own executable: it replaces
// the global operator new.

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <vector>

#include "chorus/device.hpp"
#include "chorus/dtype.hpp"
#include "chorus/tensor.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "support/refusing_new.hpp"

namespace {

// How many allocations succeed before one is refused (-1: none is).
std::atomic<std::int64_t> allocations_before_refusal{-1};

// Each allocation a call makes fails in turn, until the call succeeds: the number of refusals.
// `call` returns normally on success; `after_refusal` checks the state a refusal left.
int refuse_each_allocation_in_turn(const std::function<void()>& call,
                                   const std::function<void()>& after_refusal) {
  constexpr int kAttemptsMax = 64;  // far more allocations than either factory makes
  for (int refused = 0; refused < kAttemptsMax; ++refused) {
    allocations_before_refusal = refused;
    try {
      call();
      allocations_before_refusal = -1;
      return refused;
    } catch (const std::bad_alloc&) {
      allocations_before_refusal = -1;
      after_refusal();
    }
  }
  ADD_FAILURE() << "still failing after " << kAttemptsMax << " refusals";
  return kAttemptsMax;
}

}  // namespace

bool chorus::testing::refuse_allocation(std::size_t) noexcept {
  return allocations_before_refusal.load() >= 0 && allocations_before_refusal.fetch_sub(1) == 0;
}

namespace chorus {
namespace {

TEST(TensorOutOfMemory, FromDLPackLeavesTheProducerOwningWhatItCouldNotImport) {
  std::vector<float> values{1, 2, 3, 4, 5, 6};
  std::vector<std::int64_t> shape{2, 3};
  int deleter_calls = 0;
  DLManagedTensor managed{};
  managed.dl_tensor.data = values.data();
  managed.dl_tensor.device = DLDevice{kDLCPU, 0};
  managed.dl_tensor.ndim = 2;
  managed.dl_tensor.dtype = DLDataType{kDLFloat, 32, 1};
  managed.dl_tensor.shape = shape.data();
  managed.manager_ctx = &deleter_calls;
  managed.deleter = [](DLManagedTensor* self) { ++*static_cast<int*>(self->manager_ctx); };

  Tensor imported;
  const int refusals = refuse_each_allocation_in_turn(
      [&] { imported = Tensor::from_dlpack(&managed); },
      [&] { EXPECT_EQ(deleter_calls, 0) << "a failed import ran the producer's deleter"; });
  // Shape, strides, layout text, memory, storage, layout: each one refused once.
  EXPECT_GE(refusals, 5);
  EXPECT_EQ(deleter_calls, 0);
  EXPECT_EQ(imported.to_vector<float>(), values);
  imported = Tensor();
  EXPECT_EQ(deleter_calls, 1);
}

TEST(TensorOutOfMemory, FromBlobLeavesTheCallerOwningWhatItCouldNotWrap) {
  std::vector<std::int32_t> values{1, 2, 3};
  int deleter_calls = 0;
  Tensor wrapped;
  const int refusals = refuse_each_allocation_in_turn(
      [&] {
        wrapped = Tensor::from_blob(values.data(), {3}, DType::Int32, Device::cpu(),
                                    [&](void*) { ++deleter_calls; });
      },
      [&] { EXPECT_EQ(deleter_calls, 0) << "a failed from_blob ran the caller's deleter"; });
  EXPECT_GE(refusals, 3);  // memory, storage, layout (at least)
  EXPECT_EQ(deleter_calls, 0);
  EXPECT_EQ(wrapped.to_vector<std::int32_t>(), values);
  wrapped = Tensor();
  EXPECT_EQ(deleter_calls, 1);
}

// The out-of-memory tests turn block recycling off (Note [Recycled blocks]): a tensor's Storage,
// whose block a tensor just dropped would otherwise hand to the next one, still reaches the
// refusing operator new. Under AddressSanitizer nothing is recycled anyway.
TEST(TensorOutOfMemory, RecycledBlocksAreOffSoEveryAllocationCanBeRefused) {
  EXPECT_FALSE(transport::testing::recycle_blocks_enabled.load());
  static_cast<void>(Tensor::empty({4}));  // the shape's layout, cached per thread
  const int refusals =
      refuse_each_allocation_in_turn([] { static_cast<void>(Tensor::empty({4})); }, [] {});
  // Three allocations, the storage among them; with recycling on, the storage would come from
  // the block the warm-up dropped, and only two would be refused.
  EXPECT_EQ(refusals, 3);
}

}  // namespace
}  // namespace chorus
