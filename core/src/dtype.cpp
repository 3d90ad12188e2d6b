#include "chorus/dtype.hpp"

#include <ostream>
#include <string_view>

namespace chorus {

std::string_view dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::Bool:
      return "Bool";
    case DType::UInt8:
      return "UInt8";
    case DType::Int8:
      return "Int8";
    case DType::Int32:
      return "Int32";
    case DType::Int64:
      return "Int64";
    case DType::Float16:
      return "Float16";
    case DType::BFloat16:
      return "BFloat16";
    case DType::Float32:
      return "Float32";
    case DType::Float64:
      return "Float64";
    case DType::Complex64:
      return "Complex64";
    case DType::Complex128:
      return "Complex128";
  }
  // Only reachable through a value cast from outside the enumerators; a name beats a crash here
  // because this is what error messages print.
  return "InvalidDType";
}

std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }

}  // namespace chorus
