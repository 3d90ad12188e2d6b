#pragma once

// Element types of chorus tensors.

#include <complex>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "chorus/half.hpp"

namespace chorus {

enum class DType : std::uint8_t {
  Bool,
  UInt8,
  Int8,
  Int32,
  Int64,
  Float16,
  BFloat16,
  Float32,
  Float64,
  Complex64,
  Complex128,
};

inline constexpr int kNumDTypes = 11;

inline constexpr DType kAllDTypes[kNumDTypes] = {
    DType::Bool,    DType::UInt8,     DType::Int8,       DType::Int32,
    DType::Int64,   DType::Float16,   DType::BFloat16,   DType::Float32,
    DType::Float64, DType::Complex64, DType::Complex128,
};

// Bytes per element: 1 for Bool (one byte per value, 0 or 1), 16 for Complex128.
constexpr std::size_t element_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::Bool:
    case DType::UInt8:
    case DType::Int8:
      return 1;
    case DType::Float16:
    case DType::BFloat16:
      return 2;
    case DType::Int32:
    case DType::Float32:
      return 4;
    case DType::Int64:
    case DType::Float64:
    case DType::Complex64:
      return 8;
    case DType::Complex128:
      return 16;
  }
  return 0;
}

// Float16, BFloat16, Float32, Float64.
constexpr bool is_floating(DType dtype) noexcept {
  return dtype == DType::Float16 || dtype == DType::BFloat16 || dtype == DType::Float32 ||
         dtype == DType::Float64;
}
constexpr bool is_complex(DType dtype) noexcept {
  return dtype == DType::Complex64 || dtype == DType::Complex128;
}
// UInt8, Int8, Int32, Int64 (not Bool).
constexpr bool is_integer(DType dtype) noexcept {
  return dtype == DType::UInt8 || dtype == DType::Int8 || dtype == DType::Int32 ||
         dtype == DType::Int64;
}

// "Float32", "Complex64", ...
std::string_view dtype_name(DType dtype) noexcept;
std::ostream& operator<<(std::ostream& out, DType dtype);

// The C++ element type of each dtype, and back. Only these types are accepted by
// Tensor::from_vector / to_vector / item / data_ptr; anything else does not compile.
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::Bool;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::UInt8;
};
template <>
struct DTypeOf<std::int8_t> {
  static constexpr DType value = DType::Int8;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::Int32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::Float16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::BFloat16;
};
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::Float64;
};
template <>
struct DTypeOf<std::complex<float>> {
  static constexpr DType value = DType::Complex64;
};
template <>
struct DTypeOf<std::complex<double>> {
  static constexpr DType value = DType::Complex128;
};

template <class T>
inline constexpr DType dtype_of = DTypeOf<std::remove_cv_t<T>>::value;

}  // namespace chorus
