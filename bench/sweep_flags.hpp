#pragma once

// Flags shared by the benchmarks that sweep sizes against a raw library in the same run
// (bench_mpi, bench_nccl): --min-bytes, --max-bytes, --step, --iters, --warmup, --reps.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace chorus::bench {

// "64K", "8M", "1G" or a plain number of bytes.
inline std::size_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  const unsigned long long value = std::stoull(text, &used);
  std::size_t multiplier = 1;
  const std::string suffix = text.substr(used);
  if (suffix == "K" || suffix == "k") {
    multiplier = std::size_t{1} << 10;
  } else if (suffix == "M" || suffix == "m") {
    multiplier = std::size_t{1} << 20;
  } else if (suffix == "G" || suffix == "g") {
    multiplier = std::size_t{1} << 30;
  } else if (!suffix.empty()) {
    throw std::invalid_argument("bad size '" + text + "'");
  }
  return static_cast<std::size_t>(value) * multiplier;
}

// "--key=value" as (key, value); value is empty without '='.
inline std::pair<std::string, std::string> split_flag(const std::string& arg) {
  const std::size_t equals = arg.find('=');
  return {arg.substr(0, equals), equals == std::string::npos ? "" : arg.substr(equals + 1)};
}

// Applies a sweep flag to `options` (any struct with min_bytes, max_bytes, step, iters, warmup
// and reps); false when `key` is not one.
template <class Options>
bool apply_sweep_flag(Options& options, const std::string& key, const std::string& value) {
  if (key == "--min-bytes") {
    options.min_bytes = parse_bytes(value);
  } else if (key == "--max-bytes") {
    options.max_bytes = parse_bytes(value);
  } else if (key == "--step") {
    options.step = parse_bytes(value);
  } else if (key == "--iters") {
    options.iters = std::stoi(value);
  } else if (key == "--warmup") {
    options.warmup = std::stoi(value);
  } else if (key == "--reps") {
    options.reps = std::stoi(value);
  } else {
    return false;
  }
  return true;
}

}  // namespace chorus::bench
