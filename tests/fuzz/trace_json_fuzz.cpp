// Fuzz target: the OpRecord JSON parser (chorus::from_json, core/src/trace_data.cpp), fed raw
// bytes. See docs/fuzzing.md.
//
// Invariants (a violation prints "chorus fuzz: invariant violated: ..." and aborts):
// - from_json either returns records or throws InvalidArgument whose message names the offset
//   ("at offset N: ..."); no other exception, no crash, no sanitizer report;
// - what it accepts round-trips: to_json(from_json(to_json(r))) is the same text as to_json(r),
//   and from_json(to_json(r)) == r for records without NaN premul factors (NaN != NaN).
// With CHORUS_FUZZ_EXPECT=parsed (or refused) every input must be accepted (or refused):
// ctest trace_json_fuzz.seeds_parsed / .seeds_refused (violation.hpp).

#include <chorus/error.hpp>
#include <chorus/reduce_op.hpp>
#include <chorus/trace.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "violation.hpp"

namespace chorus::fuzz {
namespace {

bool has_nan_factor(const std::vector<OpRecord>& records) {
  for (const OpRecord& record : records) {
    if (record.reduce_op.has_value() && record.reduce_op->kind() == ReduceOp::Kind::PremulSum &&
        std::isnan(record.reduce_op->premul_factor())) {
      return true;
    }
  }
  return false;
}

void run_one(std::string_view text) {
  std::vector<OpRecord> records;
  try {
    records = from_json(text);
  } catch (const InvalidArgument& error) {
    if (std::string_view(error.what()).find("at offset ") == std::string_view::npos) {
      violated(std::string("from_json's error names no offset: ") + error.what());
    }
    check_outcome(false, std::string("from_json (") + error.what() + ")");
    return;
  } catch (const std::exception& error) {
    violated(std::string("from_json threw something other than InvalidArgument: ") + error.what());
  }
  check_outcome(true, "from_json");
  const std::string json = to_json(records);
  std::vector<OpRecord> again;
  try {
    again = from_json(json);
  } catch (const std::exception& error) {
    violated("from_json refused to_json's output: " + std::string(error.what()) + "\n" + json);
  }
  if (to_json(again) != json) {
    violated("to_json(from_json(to_json(r))) differs from to_json(r):\n" + json + "\n" +
             to_json(again));
  }
  if (!has_nan_factor(records) && again != records) {
    violated("from_json(to_json(r)) != r:\n" + json);
  }
}

}  // namespace
}  // namespace chorus::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  chorus::fuzz::run_one(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
