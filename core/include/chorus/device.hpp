#pragma once

// Where a tensor's storage lives.

#include <cstdint>
#include <ostream>
#include <string>

namespace chorus {

class Device {
 public:
  enum class Kind : std::uint8_t {
    CPU,   // host memory; waits block the calling thread
    CUDA,  // device memory; waits order the caller's current stream after the collective
    Meta,  // shape and dtype only, no storage (tracing, shape functions)
  };

  static constexpr Device cpu() noexcept { return Device(Kind::CPU, 0); }
  static constexpr Device cuda(int index = 0) noexcept { return Device(Kind::CUDA, index); }
  static constexpr Device meta() noexcept { return Device(Kind::Meta, 0); }

  constexpr Device() noexcept = default;  // cpu

  constexpr Kind kind() const noexcept { return kind_; }
  constexpr int index() const noexcept { return index_; }
  constexpr bool is_cpu() const noexcept { return kind_ == Kind::CPU; }
  constexpr bool is_cuda() const noexcept { return kind_ == Kind::CUDA; }
  constexpr bool is_meta() const noexcept { return kind_ == Kind::Meta; }

  // "cpu", "cuda:1", "meta".
  std::string to_string() const;

  friend constexpr bool operator==(Device a, Device b) noexcept {
    return a.kind_ == b.kind_ && a.index_ == b.index_;
  }

 private:
  constexpr Device(Kind kind, int index) noexcept : kind_(kind), index_(index) {}

  Kind kind_ = Kind::CPU;
  int index_ = 0;
};

std::ostream& operator<<(std::ostream& out, Device device);

}  // namespace chorus
