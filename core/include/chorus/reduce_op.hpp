#pragma once

// ReduceOp: the reduction of all_reduce, reduce_scatter and their coalesced forms.

#include <bit>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "chorus/dtype.hpp"

namespace chorus {

// Converts implicitly from a name, case-insensitively: "sum", "avg", "product", "min", "max",
// "band", "bor", "bxor". `ReduceOp::premul_sum(f)` multiplies every input by `f` before summing.
//
// An unknown name does not throw here (an implicit conversion cannot say which rank and op it
// belongs to): it yields an invalid ReduceOp, and the collective it is passed to raises
// InvalidArgument("Unrecognized reduce_op '<name>'") naming rank, op, sequence number and group.
// Use ReduceOp::parse() to validate eagerly.
//
// An op owns its unrecognized name: copying an invalid op with a name allocates (and may throw
// std::bad_alloc); moving never throws, and leaves the source an invalid op with no name
// (invalid_name() "").
class ReduceOp {
 public:
  enum class Kind : std::uint8_t {
    Sum,
    Avg,
    Product,
    Min,
    Max,
    BAnd,
    BOr,
    BXor,
    PremulSum,
    Invalid
  };

  constexpr ReduceOp(Kind kind) noexcept : kind_(kind) {}  // NOLINT(google-explicit-constructor)
  ReduceOp(const char* name);                              // NOLINT(google-explicit-constructor)
  ReduceOp(std::string_view name);                         // NOLINT(google-explicit-constructor)
  ReduceOp(const std::string& name);                       // NOLINT(google-explicit-constructor)

  // Note [A valid op holds no string]
  // The unrecognized name lives on the heap, behind a pointer that is null for every valid op, for
  // an empty name and for a Kind cast from a bad integer, so copying, moving and destroying a valid
  // op copies its kind, its factor and a null pointer, and tests the pointer. Every operation
  // copies and moves its op several times (the transport's op, the simulator's SimOp and
  // OpSignature); a std::string member cost ~90 instructions a move into the simulator's arrival,
  // and a copy of a valid op could not be a constant expression with clang 14.
  constexpr ReduceOp(const ReduceOp& other)
      : kind_(other.kind_),
        factor_(other.factor_),
        invalid_name_(other.invalid_name_ == nullptr ? nullptr : copy_name(*other.invalid_name_)) {}
  constexpr ReduceOp(ReduceOp&& other) noexcept
      : kind_(other.kind_), factor_(other.factor_), invalid_name_(other.invalid_name_) {
    other.invalid_name_ = nullptr;
  }
  constexpr ReduceOp& operator=(const ReduceOp& other) {
    if (this != &other) {
      ReduceOp copy(other);
      *this = std::move(copy);
    }
    return *this;
  }
  constexpr ReduceOp& operator=(ReduceOp&& other) noexcept {
    if (this != &other) {
      if (invalid_name_ != nullptr) {
        free_name(invalid_name_);
      }
      kind_ = other.kind_;
      factor_ = other.factor_;
      invalid_name_ = other.invalid_name_;
      other.invalid_name_ = nullptr;
    }
    return *this;
  }
  constexpr ~ReduceOp() {
    if (invalid_name_ != nullptr) {
      free_name(invalid_name_);
    }
  }

  // Sum of `factor * x_r` over ranks. Floating and complex dtypes only. Every rank must pass
  // the same factor (a different one is a CollectiveMismatch); NCCL also allows per-rank factors,
  // chorus does not.
  static ReduceOp premul_sum(double factor) noexcept;

  // Like the string constructor, but throws InvalidArgument for an unknown name.
  static ReduceOp parse(std::string_view name);

  constexpr Kind kind() const noexcept { return kind_; }
  // False for an unrecognized name, and for a Kind outside the enumerators (a cast from a bad
  // integer), which collectives refuse the same way instead of reaching a reduction kernel.
  constexpr bool is_valid() const noexcept { return kind_ < Kind::Invalid; }
  // The factor of premul_sum; 1 for every other op.
  constexpr double premul_factor() const noexcept { return factor_; }
  // "sum", "avg", ..., "premul_sum(0.5)", or the unrecognized name in quotes.
  std::string to_string() const;
  // The name as given, for an invalid op ("ReduceOp::Kind(42)" for a Kind outside the
  // enumerators); empty for a valid one.
  std::string invalid_name() const;

  // Whether this op may reduce `dtype` (DESIGN 2.3): bitwise ops need an integer or Bool dtype,
  // complex dtypes take only sum/avg/premul_sum, Bool takes only min/max/band/bor/bxor,
  // premul_sum needs a floating or complex dtype. Returns an empty string when allowed,
  // otherwise the reason.
  std::string check_dtype(DType dtype) const;

  // Factors compare by bit pattern: premul_sum(NaN) equals itself, and ranks must pass the same
  // factor bits to agree (chorus applies one factor to every rank's input).
  friend bool operator==(const ReduceOp& a, const ReduceOp& b) noexcept {
    return a.kind_ == b.kind_ &&
           std::bit_cast<std::uint64_t>(a.factor_) == std::bit_cast<std::uint64_t>(b.factor_) &&
           (a.invalid_name_ == b.invalid_name_ || a.name_view() == b.name_view());
  }

 private:
  // The unrecognized name as given ("" when none is kept).
  std::string_view name_view() const noexcept {
    return invalid_name_ == nullptr ? std::string_view() : std::string_view(*invalid_name_);
  }
  // Out of line: only an invalid op with a name reaches them.
  static std::string* copy_name(const std::string& name);
  static void free_name(std::string* name) noexcept;

  Kind kind_ = Kind::Sum;
  double factor_ = 1.0;
  // Note [A valid op holds no string]: null for a valid op, an empty name and a cast Kind; owned.
  std::string* invalid_name_ = nullptr;
};

std::string_view reduce_kind_name(ReduceOp::Kind kind) noexcept;
std::ostream& operator<<(std::ostream& out, const ReduceOp& op);

}  // namespace chorus
