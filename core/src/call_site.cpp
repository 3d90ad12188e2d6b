#include "chorus/call_site.hpp"

#include <string>

namespace chorus {

std::string CallSite::to_string() const {
  if (!known()) {
    return "<unknown>";
  }
  std::string out = file_name_;
  out += ':';
  out += std::to_string(line_);
  if (function_name_ != nullptr && function_name_[0] != '\0') {
    out += " (";
    out += function_name_;
    out += ')';
  }
  return out;
}

}  // namespace chorus
