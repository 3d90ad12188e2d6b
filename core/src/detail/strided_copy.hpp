#pragma once

// Raw strided element copy: no waiting, no checks beyond CHECKs. For core internals that must
// not go through the pending-storage choke point (completion fixups run *inside* a wait).

#include <cstddef>
#include <cstdint>

#include "chorus/tensor.hpp"

namespace chorus::detail {

// Copies the elements of an N-d array of `sizes`: element (i0, ..., in) goes from
// src + sum(ik * src_strides[k]) to dst + sum(ik * dst_strides[k]) (strides in elements of
// `element_size` bytes). The two regions must not overlap.
void strided_copy(void* dst, const Shape& dst_strides, const void* src, const Shape& src_strides,
                  const Shape& sizes, std::size_t element_size);

// The first dim in which several elements of an array of `sizes` and `strides` share one memory
// location (stride 0, size > 1), or -1: such an array cannot be written element by element.
std::int64_t shared_location_dim(const Shape& sizes, const Shape& strides) noexcept;

}  // namespace chorus::detail
