#include "chorus/props/property.hpp"

#include <cstring>
#include <sstream>

#include "shape_text.hpp"

namespace chorus::props {

std::string shape_text(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    out << (i == 0 ? "" : ", ") << shape[i];
  }
  out << "]";
  return out.str();
}

namespace {

// The bytes of a tensor's elements in row-major order (waits).
std::vector<unsigned char> element_bytes(const Tensor& tensor) {
  const Tensor dense = tensor.contiguous();
  std::vector<unsigned char> bytes(dense.nbytes());
  if (!bytes.empty()) {
    (void)wait_tensor(dense);
    std::memcpy(bytes.data(), dense.unsafe_data_ptr(), bytes.size());
  }
  return bytes;
}

}  // namespace

void Env::fail(std::string_view what) const {
  throw PropertyFailure("rank " + std::to_string(rank_) + ": " + std::string(what));
}

bool Env::failed(std::string_view what) {
  if (on_failure_ == OnFailure::Throw) {
    fail(what);
  }
  if (failures_++ == 0) {
    first_failure_ = "rank " + std::to_string(rank_) + ": " + std::string(what);
  }
  return false;
}

bool Env::require(bool condition, std::string_view what) { return condition || failed(what); }

bool Env::require_bitwise_equal(const Tensor& actual, const Tensor& expected,
                                std::string_view what) {
  if (actual.dtype() != expected.dtype()) {
    return failed(std::string(what) + ": dtype " + std::string(dtype_name(actual.dtype())) +
                  ", expected " + std::string(dtype_name(expected.dtype())));
  }
  if (actual.sizes() != expected.sizes()) {
    return failed(std::string(what) + ": shape " + shape_text(actual.sizes()) + ", expected " +
                  shape_text(expected.sizes()));
  }
  const std::vector<unsigned char> actual_bytes = element_bytes(actual);
  const std::vector<unsigned char> expected_bytes = element_bytes(expected);
  if (actual_bytes == expected_bytes) {
    return true;
  }
  const std::size_t element = actual.element_size();
  std::size_t index = 0;
  while (index * element < actual_bytes.size() &&
         std::memcmp(actual_bytes.data() + index * element, expected_bytes.data() + index * element,
                     element) == 0) {
    ++index;
  }
  // The value and its bytes: floats that differ in a low bit print alike.
  const auto single = [&](const Tensor& t, const std::vector<unsigned char>& bytes) {
    std::string text =
        t.contiguous().flatten().narrow(0, static_cast<std::int64_t>(index), 1).to_string();
    text += " (bytes";
    static constexpr char kHex[] = "0123456789abcdef";
    for (std::size_t b = index * element; b < (index + 1) * element; ++b) {
      text += ' ';
      text += kHex[bytes[b] >> 4];
      text += kHex[bytes[b] & 15];
    }
    return text + ")";
  };
  return failed(std::string(what) + ": element " + std::to_string(index) + " (flat) is " +
                single(actual, actual_bytes) + ", expected " + single(expected, expected_bytes) +
                "; whole result " + actual.to_string(8) + ", expected " + expected.to_string(8));
}

void Env::record(const Tensor& tensor) {
  ++records_;
  const auto mix = [this](const void* data, std::size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < size; ++i) {
      digest_ = (digest_ ^ bytes[i]) * 0x100000001b3ull;
    }
  };
  const auto dtype = static_cast<std::uint8_t>(tensor.dtype());
  mix(&dtype, sizeof dtype);
  for (const std::int64_t size : tensor.sizes()) {
    mix(&size, sizeof size);
  }
  const std::vector<unsigned char> bytes = element_bytes(tensor);
  mix(bytes.data(), bytes.size());
}

}  // namespace chorus::props
