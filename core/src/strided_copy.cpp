#include "detail/strided_copy.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "chorus/check.hpp"
#include "detail/tensor_access.hpp"

namespace chorus::detail {
namespace {

// ---- Strided byte copies. Element offsets are tracked as integers and turned into pointers only
// when an element is touched, so stepping past the end of a dim never forms an invalid pointer.

// Dims after dropping size-1 dims and merging neighbours that are contiguous in both operands.
struct CopyPlan {
  Shape sizes;
  Shape dst_strides;
  Shape src_strides;
};

CopyPlan plan_copy(const Shape& sizes, const Shape& dst_strides, const Shape& src_strides) {
  CopyPlan plan;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) {
      continue;
    }
    // Merges with the previous dim when that steps over exactly this dim's extent in both. An
    // extent that overflows (never, for a tensor's layout: Note [Addressable layouts] in
    // tensor.cpp) equals no stride, so it is never merged.
    std::int64_t dst_extent = 0;
    std::int64_t src_extent = 0;
    const bool overflow = __builtin_mul_overflow(sizes[i], dst_strides[i], &dst_extent) ||
                          __builtin_mul_overflow(sizes[i], src_strides[i], &src_extent);
    if (!overflow && !plan.sizes.empty() && plan.dst_strides.back() == dst_extent &&
        plan.src_strides.back() == src_extent) {
      plan.sizes.back() *= sizes[i];
      plan.dst_strides.back() = dst_strides[i];
      plan.src_strides.back() = src_strides[i];
    } else {
      plan.sizes.push_back(sizes[i]);
      plan.dst_strides.push_back(dst_strides[i]);
      plan.src_strides.push_back(src_strides[i]);
    }
  }
  return plan;
}

template <std::size_t kElementSize>
void copy_run(std::byte* dst, std::ptrdiff_t dst_step, const std::byte* src,
              std::ptrdiff_t src_step, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    std::memcpy(dst + i * dst_step, src + i * src_step, kElementSize);
  }
}

// Copies `count` elements of `element_size` bytes, `dst_step` / `src_step` bytes apart.
void copy_elements(std::size_t element_size, std::byte* dst, std::ptrdiff_t dst_step,
                   const std::byte* src, std::ptrdiff_t src_step, std::int64_t count) {
  const auto element_bytes = static_cast<std::ptrdiff_t>(element_size);
  if (dst_step == element_bytes && src_step == element_bytes) {
    std::memcpy(dst, src, static_cast<std::size_t>(count) * element_size);
    return;
  }
  switch (element_size) {
    case 1:
      return copy_run<1>(dst, dst_step, src, src_step, count);
    case 2:
      return copy_run<2>(dst, dst_step, src, src_step, count);
    case 4:
      return copy_run<4>(dst, dst_step, src, src_step, count);
    case 8:
      return copy_run<8>(dst, dst_step, src, src_step, count);
    case 16:
      return copy_run<16>(dst, dst_step, src, src_step, count);
    default:
      CHORUS_CHECK(false && "unexpected element size");
  }
}

}  // namespace

void strided_copy(void* dst, const Shape& dst_strides, const void* src, const Shape& src_strides,
                  const Shape& sizes, std::size_t element_size) {
  CHORUS_CHECK_EQ(sizes.size(), dst_strides.size());
  CHORUS_CHECK_EQ(sizes.size(), src_strides.size());
  if (shape_numel(sizes) == 0) {
    return;
  }
  CHORUS_CHECK(dst != nullptr && src != nullptr);
  auto* dst_bytes = static_cast<std::byte*>(dst);
  const auto* src_bytes = static_cast<const std::byte*>(src);
  const CopyPlan plan = plan_copy(sizes, dst_strides, src_strides);
  if (plan.sizes.empty()) {  // a single element
    std::memcpy(dst_bytes, src_bytes, element_size);
    return;
  }

  const auto element_bytes = static_cast<std::ptrdiff_t>(element_size);
  const std::size_t inner = plan.sizes.size() - 1;
  const std::int64_t inner_count = plan.sizes[inner];
  const std::ptrdiff_t inner_dst_step = plan.dst_strides[inner] * element_bytes;
  const std::ptrdiff_t inner_src_step = plan.src_strides[inner] * element_bytes;

  // Odometer over the outer dims; offsets in elements.
  std::vector<std::int64_t> index(inner, 0);
  std::int64_t dst_offset = 0;
  std::int64_t src_offset = 0;
  while (true) {
    copy_elements(element_size, dst_bytes + dst_offset * element_bytes, inner_dst_step,
                  src_bytes + src_offset * element_bytes, inner_src_step, inner_count);
    std::size_t d = inner;
    while (true) {
      if (d == 0) {
        return;  // every outer dim wrapped around: done
      }
      --d;
      ++index[d];
      dst_offset += plan.dst_strides[d];
      src_offset += plan.src_strides[d];
      if (index[d] < plan.sizes[d]) {
        break;
      }
      dst_offset -= plan.dst_strides[d] * plan.sizes[d];
      src_offset -= plan.src_strides[d] * plan.sizes[d];
      index[d] = 0;
    }
  }
}

std::int64_t shared_location_dim(const Shape& sizes, const Shape& strides) noexcept {
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > 1 && strides[i] == 0) {
      return static_cast<std::int64_t>(i);
    }
  }
  return -1;
}

}  // namespace chorus::detail
