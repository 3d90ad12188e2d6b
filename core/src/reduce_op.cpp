#include "chorus/reduce_op.hpp"

#include <array>
#include <charconv>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "chorus/check.hpp"
#include "detail/errors.hpp"

namespace chorus {
namespace {

struct NamedKind {
  std::string_view name;
  ReduceOp::Kind kind;
};

constexpr std::array<NamedKind, 8> kNamedKinds = {{
    {"sum", ReduceOp::Kind::Sum},
    {"avg", ReduceOp::Kind::Avg},
    {"product", ReduceOp::Kind::Product},
    {"min", ReduceOp::Kind::Min},
    {"max", ReduceOp::Kind::Max},
    {"band", ReduceOp::Kind::BAnd},
    {"bor", ReduceOp::Kind::BOr},
    {"bxor", ReduceOp::Kind::BXor},
}};

bool equals_ignoring_case(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    // ASCII only (names are ASCII), without std::tolower's locale call per character.
    const char c = a[i];
    const char lower = c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
    if (lower != b[i]) {
      return false;
    }
  }
  return true;
}

}  // namespace

ReduceOp::ReduceOp(const char* name) : ReduceOp(std::string_view(name == nullptr ? "" : name)) {}
ReduceOp::ReduceOp(const std::string& name) : ReduceOp(std::string_view(name)) {}

ReduceOp::ReduceOp(std::string_view name) : kind_(Kind::Invalid) {
  for (const NamedKind& named : kNamedKinds) {
    if (equals_ignoring_case(name, named.name)) {
      kind_ = named.kind;
      return;
    }
  }
  if (!name.empty()) {  // Note [A valid op holds no string]: "" is kept as null
    invalid_name_ = new std::string(name);
  }
}

std::string* ReduceOp::copy_name(const std::string& name) { return new std::string(name); }

void ReduceOp::free_name(std::string* name) noexcept { delete name; }

ReduceOp ReduceOp::premul_sum(double factor) noexcept {
  ReduceOp op(Kind::PremulSum);
  op.factor_ = factor;
  return op;
}

ReduceOp ReduceOp::parse(std::string_view name) {
  ReduceOp op(name);
  if (!op.is_valid()) {
    detail::throw_invalid("ReduceOp::parse", op.check_dtype(DType::Float32));
  }
  return op;
}

std::string ReduceOp::invalid_name() const {
  if (is_valid() || kind_ == Kind::Invalid) {
    return std::string(name_view());
  }
  return "ReduceOp::Kind(" + std::to_string(static_cast<int>(kind_)) + ")";
}

std::string ReduceOp::to_string() const {
  if (!is_valid()) {
    return "'" + invalid_name() + "'";
  }
  if (kind_ == Kind::PremulSum) {
    // The shortest text that reads back as the same double: ranks must pass bit-identical
    // factors, so a mismatch report must never print two different ones alike (six digits
    // printed 1/3 and 0.3333333 both as 0.333333).
    std::array<char, 32> digits{};
    const auto written = std::to_chars(digits.data(), digits.data() + digits.size(), factor_);
    CHORUS_CHECK(written.ec == std::errc());
    return "premul_sum(" + std::string(digits.data(), written.ptr) + ")";
  }
  return std::string(reduce_kind_name(kind_));
}

std::string ReduceOp::check_dtype(DType dtype) const {
  if (!is_valid()) {
    std::string hint;
    if (equals_ignoring_case(name_view(), "premul_sum")) {
      hint = " (premul_sum needs a factor: use ReduceOp::premul_sum(f))";
    }
    return "Unrecognized reduce_op '" + invalid_name() +
           "': expected one of sum, avg, product, min, max, band, bor, bxor" + hint;
  }
  const bool bitwise = kind_ == Kind::BAnd || kind_ == Kind::BOr || kind_ == Kind::BXor;
  const auto refuse = [&](std::string_view why) {
    std::string out = "reduce_op ";
    out += to_string();
    out += " is not supported for dtype ";
    out += dtype_name(dtype);
    out += ": ";
    out += why;
    return out;
  };
  if (bitwise && (is_floating(dtype) || is_complex(dtype))) {
    return refuse("bitwise ops need an integer or Bool dtype");
  }
  if (is_complex(dtype) && kind_ != Kind::Sum && kind_ != Kind::Avg && kind_ != Kind::PremulSum) {
    return refuse("complex dtypes take only sum, avg and premul_sum");
  }
  if (dtype == DType::Bool && !bitwise && kind_ != Kind::Min && kind_ != Kind::Max) {
    return refuse("Bool takes only min, max, band, bor and bxor");
  }
  if (kind_ == Kind::PremulSum && !is_floating(dtype) && !is_complex(dtype)) {
    return refuse("premul_sum needs a floating or complex dtype");
  }
  return {};
}

std::string_view reduce_kind_name(ReduceOp::Kind kind) noexcept {
  switch (kind) {
    case ReduceOp::Kind::Sum:
      return "sum";
    case ReduceOp::Kind::Avg:
      return "avg";
    case ReduceOp::Kind::Product:
      return "product";
    case ReduceOp::Kind::Min:
      return "min";
    case ReduceOp::Kind::Max:
      return "max";
    case ReduceOp::Kind::BAnd:
      return "band";
    case ReduceOp::Kind::BOr:
      return "bor";
    case ReduceOp::Kind::BXor:
      return "bxor";
    case ReduceOp::Kind::PremulSum:
      return "premul_sum";
    case ReduceOp::Kind::Invalid:
      return "invalid";
  }
  return "invalid";
}

std::ostream& operator<<(std::ostream& out, const ReduceOp& op) { return out << op.to_string(); }

}  // namespace chorus
