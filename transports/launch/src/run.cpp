#include "chorus/run.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "chorus/error.hpp"
#include "chorus/sim/sim.hpp"

namespace chorus {
namespace {

[[noreturn]] void bad_flag(const std::string& flag, const std::string& value,
                           const std::string& expected) {
  throw InvalidArgument(ErrorContext{-1, "RunOptions::from_args", -1, ""},
                        "flag " + flag + "='" + value + "' is invalid: expected " + expected);
}

std::uint64_t parse_unsigned(const std::string& flag, const std::string& value) {
  if (value.empty() || value[0] == '-') {
    bad_flag(flag, value, "an unsigned integer");
  }
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(value.c_str(), &end, 0);
  if (end == nullptr || *end != '\0') {
    bad_flag(flag, value, "an unsigned integer");
  }
  return parsed;
}

}  // namespace

RunOptions RunOptions::from_args(int argc, char** argv) {
  RunOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (const auto equals = arg.find('='); arg.rfind("--", 0) == 0 && equals != std::string::npos) {
      value = arg.substr(equals + 1);
      arg = arg.substr(0, equals);
      has_value = true;
    }
    const bool known =
        arg == "--transport" || arg == "--ranks" || arg == "--seed" || arg == "--timeout-ms";
    if (!known) {
      options.args.push_back(argv[i]);
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        bad_flag(arg, "", "a value");
      }
      value = argv[++i];
    }
    if (arg == "--transport") {
      if (value != "sim" && value != "mpi" && value != "nccl") {
        bad_flag(arg, value, "one of sim, mpi, nccl");
      }
      options.transport = value;
    } else if (arg == "--ranks") {
      const std::uint64_t ranks = parse_unsigned(arg, value);
      if (ranks < 1 || ranks > static_cast<std::uint64_t>(sim::kMaxWorldSize)) {
        bad_flag(arg, value, "1 to " + std::to_string(sim::kMaxWorldSize));
      }
      options.ranks = static_cast<int>(ranks);
    } else if (arg == "--seed") {
      options.seed = parse_unsigned(arg, value);
    } else {
      options.timeout = std::chrono::milliseconds(parse_unsigned(arg, value));
    }
  }
  return options;
}

int run(const RunOptions& options, std::function<void()> rank_main) {
  if (options.transport != "sim") {
    throw InvalidArgument(ErrorContext{-1, "chorus::run", -1, ""},
                          "transport '" + options.transport +
                              "' is not built into this chorus yet; use --transport=sim");
  }
  sim::SimOptions sim_options;
  sim_options.world_size = options.ranks;
  sim_options.seed = options.seed;
  sim_options.timeout = options.timeout;
  const sim::SimReport report = sim::simulate(sim_options, std::move(rank_main));
  if (report.ok() && !report.unwaited.empty()) {
    std::fprintf(stderr, "%s", report.to_string().c_str());  // failures printed already
  }
  return report.ok() ? 0 : 1;
}

}  // namespace chorus
