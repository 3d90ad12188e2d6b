#include "chorus/device.hpp"

#include <ostream>
#include <string>

namespace chorus {

std::string Device::to_string() const {
  switch (kind_) {
    case Kind::CPU:
      return "cpu";
    case Kind::CUDA:
      return "cuda:" + std::to_string(index_);
    case Kind::Meta:
      return "meta";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& out, Device device) { return out << device.to_string(); }

}  // namespace chorus
