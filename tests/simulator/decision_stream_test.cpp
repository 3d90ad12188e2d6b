// The decision stream's sources, strategies and replay tokens (Note [Decision stream]).

#include "decision_stream.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chorus/error.hpp"
#include "rng.hpp"
#include "shrink.hpp"
#include "support/expect_error.hpp"

namespace chorus::sim::detail {
namespace {

// InputModified rests on checksum_bytes: any single changed bit, in a full 64-byte block, in the
// leftover words or in the leftover bytes, changes the checksum, and so does swapping two
// different words.
TEST(ChecksumBytes, EveryChangedBitAndSwappedWordChangesIt) {
  for (const std::size_t size : {1u, 7u, 8u, 9u, 63u, 64u, 65u, 72u, 200u, 256u}) {
    std::vector<unsigned char> bytes(size);
    for (std::size_t i = 0; i < size; ++i) {
      bytes[i] = static_cast<unsigned char>(i * 37 + 11);
    }
    const std::uint64_t original = checksum_bytes(bytes.data(), size);
    EXPECT_EQ(checksum_bytes(bytes.data(), size), original);
    for (std::size_t i = 0; i < size; ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        bytes[i] ^= static_cast<unsigned char>(1U << bit);
        EXPECT_NE(checksum_bytes(bytes.data(), size), original) << size << " " << i << " " << bit;
        bytes[i] ^= static_cast<unsigned char>(1U << bit);
      }
    }
    for (std::size_t a = 0; a + 8 <= size; a += 8) {
      for (std::size_t b = a + 8; b + 8 <= size; b += 8) {
        std::vector<unsigned char> swapped = bytes;
        std::swap_ranges(swapped.begin() + static_cast<std::ptrdiff_t>(a),
                         swapped.begin() + static_cast<std::ptrdiff_t>(a + 8),
                         swapped.begin() + static_cast<std::ptrdiff_t>(b));
        EXPECT_NE(checksum_bytes(swapped.data(), size), original) << size << " " << a << " " << b;
      }
    }
  }
  EXPECT_NE(checksum_bytes(nullptr, 0), checksum_bytes("\0", 1));
}

// rng.hpp's promise: a seed means the same stream on every platform and compiler. The values
// are those of the published algorithms (splitmix64 seeding xoshiro256**, below's multiply-shift
// and hash_bytes' FNV-style loop), computed apart from this code, so any change to the stream
// fails here instead of silently giving every seed (and every fuzz input) another schedule.
TEST(Rng, ASeedGivesTheReferenceStream) {
  std::uint64_t state = 0;
  EXPECT_EQ(splitmix64(state), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(splitmix64(state), 0x6e789e6aa1b965f4ULL);
  Rng zero(0);
  for (const std::uint64_t expected : {0x99ec5f36cb75f2b4ULL, 0xbf6e1f784956452aULL,
                                       0x1a5f849d4933e6e0ULL, 0x6aa594f1262d2d2cULL}) {
    EXPECT_EQ(zero.next(), expected);
  }
  Rng small(20261206);
  std::vector<std::uint64_t> drawn;
  for (int i = 0; i < 12; ++i) {
    drawn.push_back(small.below(10));
  }
  EXPECT_EQ(drawn, (std::vector<std::uint64_t>{7, 8, 5, 5, 4, 0, 0, 1, 4, 5, 2, 8}));
  Rng large(20261206);  // the high half of the product: the top bits of each draw
  EXPECT_EQ(large.below(std::uint64_t{1} << 63), 6792275628349824043ULL);
  EXPECT_EQ(large.below(std::uint64_t{1} << 63), 7781826471635494843ULL);
  // Empty, the tail loop alone, and two words then a byte.
  const std::vector<unsigned char> seventeen = {1,  2,  3,  4,  5,  6,  7,  8, 9,
                                                10, 11, 12, 13, 14, 15, 16, 17};
  EXPECT_EQ(hash_bytes(nullptr, 0), 0xc3817c016ba4ff30ULL);
  EXPECT_EQ(hash_bytes("chorus", 6), 0xaa5bd6970af0484dULL);
  EXPECT_EQ(hash_bytes(seventeen.data(), seventeen.size()), 0x1bede09c9013c62bULL);
}

std::vector<Decision> ranks(std::initializer_list<int> list) {
  std::vector<Decision> out;
  for (int r : list) {
    out.push_back(Decision{Decision::Kind::RunRank, r, 0, -1});
  }
  return out;
}

TEST(DecisionStream, PrngSourceMatchesTheSeededGenerator) {
  // The default source draws exactly what the scheduler's Rng draws, so seeds keep their runs.
  DecisionStream stream(prng_source(42), Strategy::RandomWalk, 2, 0, 42, false);
  Rng rng(42);
  const std::vector<Decision> candidates = ranks({0, 1, 2});
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(stream.choose_schedule(candidates), rng.below(3)) << "choice " << i;
  }
  EXPECT_EQ(stream.choices().size(), 100u);
  EXPECT_FALSE(stream.exhausted());
}

TEST(DecisionStream, RecordedSourceReplaysThenAnswersZero) {
  DecisionStream stream(recorded_source({2, 1, 7}), Strategy::Pct, 3, 0, 0, true);
  const std::vector<Decision> candidates = ranks({0, 1, 2});
  EXPECT_EQ(stream.choose_schedule(candidates), 2u);
  EXPECT_EQ(stream.choose_schedule(candidates), 1u);
  EXPECT_EQ(stream.choose_schedule(candidates), 1u);  // 7 folded into range: 7 % 3
  EXPECT_FALSE(stream.exhausted());
  EXPECT_EQ(stream.choose(5), 0u);
  EXPECT_TRUE(stream.exhausted());
  const std::span<const std::uint64_t> choices = stream.choices();
  EXPECT_EQ(std::vector<std::uint64_t>(choices.begin(), choices.end()),
            (std::vector<std::uint64_t>{2, 1, 1, 0}));
}

// Note [Recycled choice buffer]: a stream takes over the list of the one before it on its thread,
// room and old entries: it still records only its own choices, and no more than its record_max.
TEST(DecisionStream, ARecycledListHoldsOnlyThisStreamsChoicesUpToRecordMax) {
  const auto drawn = [](std::uint64_t seed, int count) {
    Rng rng(seed);
    std::vector<std::uint64_t> out;
    for (int i = 0; i < count; ++i) {
      out.push_back(rng.below(7));
    }
    return out;
  };
  const auto recorded = [](const DecisionStream& stream) {
    const std::span<const std::uint64_t> choices = stream.choices();
    return std::vector<std::uint64_t>(choices.begin(), choices.end());
  };
  {
    DecisionStream longer(prng_source(1), Strategy::RandomWalk, 2, 0, 1, false);
    for (int i = 0; i < 300; ++i) {
      longer.choose(7);
    }
    EXPECT_EQ(recorded(longer), drawn(1, 300));
  }
  {
    DecisionStream capped(prng_source(2), Strategy::RandomWalk, 2, 0, 2, false, 3);
    for (int i = 0; i < 10; ++i) {
      capped.choose(7);
    }
    EXPECT_EQ(recorded(capped), drawn(2, 3));
    EXPECT_TRUE(capped.overflowed());
  }
  DecisionStream shorter(prng_source(3), Strategy::RandomWalk, 2, 0, 3, false);
  for (int i = 0; i < 5; ++i) {
    shorter.choose(7);
  }
  EXPECT_EQ(recorded(shorter), drawn(3, 5));
  EXPECT_FALSE(shorter.overflowed());
}

TEST(DecisionStream, BytesSourceReadsOneByteForSmallChoicesThenFallsBackToAPrng) {
  const std::vector<std::uint8_t> bytes = {5, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  DecisionStream stream(bytes_source(bytes), Strategy::RandomWalk, 2, 0, 0, false);
  EXPECT_EQ(stream.choose(4), 1u);  // 5 % 4
  const std::uint64_t wide = 0x0807060504030201ULL;
  EXPECT_EQ(stream.choose(1000), wide % 1000);  // 8 bytes, little-endian
  EXPECT_EQ(stream.choose(4), 1u);              // 9 % 4: the last byte
  EXPECT_FALSE(stream.exhausted());
  const std::uint64_t after = stream.choose(4);
  EXPECT_TRUE(stream.exhausted());
  // The fallback is seeded from the input, so the same bytes give the same tail.
  DecisionStream again(bytes_source(bytes), Strategy::RandomWalk, 2, 0, 0, false);
  again.choose(4);
  again.choose(1000);
  again.choose(4);
  EXPECT_EQ(again.choose(4), after);
}

// Once a choice finds too few bytes left, the bytes are done: the 1-byte choices after it are
// the PRNG's too, not the leftover bytes.
TEST(DecisionStream, BytesSourceLeftoverBytesAreNotReadAfterTheFallback) {
  const std::vector<std::uint8_t> bytes = {7, 6, 5, 4};
  DecisionStream stream(bytes_source(bytes), Strategy::RandomWalk, 2, 0, 0, false);
  (void)stream.choose(1000);  // needs 8 bytes
  EXPECT_TRUE(stream.exhausted());
  std::vector<std::uint64_t> after;
  for (int i = 0; i < 4; ++i) {
    after.push_back(stream.choose(256));
  }
  EXPECT_NE(after, (std::vector<std::uint64_t>{7, 6, 5, 4}));
}

TEST(PctPicker, DepthOneRunsTheHighestPriorityRankWhileItIsRunnable) {
  PctPicker pct(1, 100, Rng(7));
  const std::vector<Decision> all = ranks({0, 1, 2, 3});
  const std::size_t first = pct.pick(all);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(pct.pick(all), first) << "step " << i;  // no change points at depth 1
  }
}

TEST(PctPicker, AChangePointDemotesTheRunningRank) {
  // Depth 2 over 1 expected step: the single change point is at step 0, so the rank chosen
  // first is demoted right away and a different rank runs from then on.
  PctPicker pct(2, 1, Rng(11));
  const std::vector<Decision> all = ranks({0, 1, 2});
  const std::size_t first = pct.pick(all);
  const std::size_t second = pct.pick(all);
  EXPECT_NE(first, second);
  EXPECT_EQ(pct.pick(all), second);
}

TEST(PctPicker, DepthThreeCanSwitchBackToARankItLeft) {
  // Two ranks, two change points among the first 2 steps. A depth-3 bug needs the run to go
  // A, B, A: the rank lowered second must be able to drop below the one lowered first. Each
  // point lowers to the priority of its draw, not of its turn, so about half the seeds whose two
  // points fall on different steps switch back. (Before: priorities in step order, never.)
  int switched_back = 0;
  int switched_once = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    PctPicker pct(3, 2, Rng(seed));
    const std::vector<Decision> all = ranks({0, 1});
    const std::size_t a = pct.pick(all);
    const std::size_t b = pct.pick(all);
    const std::size_t c = pct.pick(all);
    switched_back += (a != b && c == a) ? 1 : 0;
    switched_once += (a != b && c == b) ? 1 : 0;
  }
  EXPECT_GT(switched_back, 20);
  EXPECT_GT(switched_once, 20);
}

TEST(DecisionStream, PortfolioResolvesToAConcreteStrategyFromTheSeed) {
  int pct = 0;
  for (std::uint64_t seed = 0; seed < 64; ++seed) {
    DecisionStream stream(prng_source(seed), Strategy::Portfolio, 2, 0, seed, false);
    EXPECT_NE(stream.strategy(), Strategy::Portfolio);
    pct += stream.strategy() == Strategy::Pct ? 1 : 0;
    DecisionStream same(prng_source(seed), Strategy::Portfolio, 2, 0, seed, false);
    EXPECT_EQ(same.strategy(), stream.strategy());
  }
  EXPECT_GT(pct, 0);
  EXPECT_LT(pct, 64);
}

TEST(ReplayToken, RoundTripsWorldSizeAndChoices) {
  const std::vector<std::uint64_t> choices = {0, 1, 127, 128, 300, 0xffffffffffffffffULL, 5};
  const std::string token = encode_replay_token(12, "order=tree", choices);
  EXPECT_EQ(token.rfind("chorus-replay:3:" + build_fingerprint() + ":12:order=tree:7:", 0), 0u)
      << token;
  const ReplayToken decoded = decode_replay_token(token);
  EXPECT_EQ(decoded.world_size, 12);
  EXPECT_EQ(decoded.shape, "order=tree");
  EXPECT_EQ(decoded.choices, choices);
  EXPECT_EQ(decode_replay_token(encode_replay_token(1, "-", {})).choices.size(), 0u);
}

// `bytes` in base64url without padding, one group of three bytes at a time: the plain encoding
// the tests compare the token's with.
std::string base64url(const std::vector<std::uint8_t>& bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string text;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    std::uint32_t v = std::uint32_t{bytes[i]} << 16;
    if (i + 1 < bytes.size()) {
      v |= std::uint32_t{bytes[i + 1]} << 8;
    }
    if (i + 2 < bytes.size()) {
      v |= bytes[i + 2];
    }
    text += kAlphabet[(v >> 18) & 63];
    text += kAlphabet[(v >> 12) & 63];
    if (i + 1 < bytes.size()) {
      text += kAlphabet[(v >> 6) & 63];
    }
    if (i + 2 < bytes.size()) {
      text += kAlphabet[v & 63];
    }
  }
  return text;
}

// The choices' text is LEB128 bytes in base64url (Note [Replay tokens]); the token writes the
// characters straight from the values, so compare it with the two steps done one after the other,
// for every tail length (0, 1, 2 bytes past the last whole group), one-byte values only and
// values of 1 to 10 bytes after a run of one-byte ones.
TEST(ReplayToken, ChoicesTextIsLeb128InBase64Url) {
  const auto reference = [](const std::vector<std::uint64_t>& choices) {
    std::vector<std::uint8_t> bytes;
    for (std::uint64_t value : choices) {
      for (; value >= 0x80; value >>= 7) {
        bytes.push_back(static_cast<std::uint8_t>((value & 0x7f) | 0x80));
      }
      bytes.push_back(static_cast<std::uint8_t>(value));
    }
    return base64url(bytes);
  };
  Rng rng(20261205);
  std::vector<std::uint64_t> choices;
  for (int i = 0; i < 315; ++i) {  // the last wide value has 64 bits
    const std::string token = encode_replay_token(4, "-", choices);
    ASSERT_EQ(token.substr(token.rfind(':') + 1), reference(choices)) << i;
    // One-byte values, as a schedule's mostly are; past the first 30, every fifth is wider: 8
    // bits (two bytes, the first a one-byte value would have), then 9, ... 64 (the text is then
    // grown past its size for one byte per value).
    if (i >= 30 && i % 5 == 0) {
      const int bits = 8 + (i - 30) / 5;
      choices.push_back((rng.next() >> (64 - bits)) | (std::uint64_t{1} << (bits - 1)));
    } else {
      choices.push_back(rng.next() >> 57);
    }
  }
}

TEST(ReplayToken, TheShapeNamesEveryOptionThatShapesTheRun) {
  SimOptions options;
  EXPECT_EQ(run_shape(options), "-");
  options.reduction_order = ReductionOrder::Adversarial;
  options.allocator = AllocatorPolicy::Quarantine;
  options.quarantine_frees = 3;
  options.guard_pending_outputs = true;
  options.cuda_devices = true;
  options.check_buffers = false;
  options.faults = {Fault::crash(1, 2), Fault::delay(0, 1, 40)};
  options.random_faults.hang_ppm = 5;
  options.choose_finalization = true;
  options.liveness_steps = 100;
  options.timeout = std::chrono::microseconds(7);
  options.max_steps = 1000;
  options.steps_after_budget = 20;
  EXPECT_EQ(run_shape(options),
            "order=adversarial,alloc=quarantine,quarantine=3,guard,cuda,checks=off,fault=crash@1.2,"
            "fault=delay@0.1x40,"
            "random_faults=c0.t0.h5.d0.x100.u0.n1,finalization=chosen,liveness=100,timeout_ns=7000,"
            "max_steps=1000,steps_after_budget=20");
  // Options that do not change the run (strategy: a replay ignores it; outputs) stay out.
  SimOptions outputs;
  outputs.strategy = Strategy::Pct;
  outputs.record_events = true;
  outputs.hash_data = true;
  EXPECT_EQ(run_shape(outputs), "-");
}

TEST(ReplayToken, ATokenFromAnotherFormatVersionIsRefused) {
  std::string token = encode_replay_token(2, "-", std::vector<std::uint64_t>{1, 0});
  token.replace(token.find(":3:"), 3, ":2:");
  testing::expect_invalid_argument([&] { (void)decode_replay_token(token); },
                                   {"the token has format version 2, this build reads 3"});
}

TEST(ReplayToken, ATokenFromAnotherBuildIsRefused) {
  std::string token = encode_replay_token(2, "-", std::vector<std::uint64_t>{1, 0});
  const std::string fingerprint = build_fingerprint();
  token.replace(token.find(fingerprint), fingerprint.size(), "0123456789abcdef");
  testing::expect_invalid_argument(
      [&] { (void)decode_replay_token(token); },
      {"written by build 0123456789abcdef, this build is " + fingerprint});
}

TEST(ReplayToken, MalformedTokensAreRefused) {
  const std::string fingerprint = build_fingerprint();
  testing::expect_invalid_argument([] { (void)decode_replay_token("seed=5"); },
                                   {"is not a replay token"});
  testing::expect_invalid_argument(
      [&] { (void)decode_replay_token("chorus-replay:3:" + fingerprint + ":0:-:1:AA"); },
      {"world size 0 is outside [1, 1024]"});
  testing::expect_invalid_argument(
      [&] { (void)decode_replay_token("chorus-replay:3:" + fingerprint + ":2:-:1:A*"); },
      {"the choices hold '*', which is not base64url"});
  testing::expect_invalid_argument(
      [&] { (void)decode_replay_token("chorus-replay:3:" + fingerprint + ":2:-:1:A\xc3"); },
      {"the choices hold byte 0xc3, which is not base64url"});
  // One byte with the continuation bit set: a value cut in the middle.
  testing::expect_invalid_argument(
      [&] { (void)decode_replay_token("chorus-replay:3:" + fingerprint + ":2:-:1:gA"); },
      {"truncated"});
  testing::expect_invalid_argument(
      [&] { (void)decode_replay_token("chorus-replay:3:" + fingerprint + ":2:-:AA"); },
      {"has 6 fields, expected 7"});
  testing::expect_invalid_argument([] { (void)decode_replay_token("chorus-replay:3"); },
                                   {"has 2 fields, expected 7"});
  testing::expect_invalid_argument(
      [&] { (void)decode_replay_token("chorus-replay:3:" + fingerprint + ":2:-:x1:AA"); },
      {"choice count 'x1' is not a number"});
}

TEST(ReplayToken, ATokenCutOrAlteredIsRefusedNotReplayedShorter) {
  // Choices 1, 2, 3 are the bytes 01 02 03: "AQID" in base64url.
  const std::string token = encode_replay_token(2, "-", std::vector<std::uint64_t>{1, 2, 3});
  ASSERT_EQ(token.substr(token.rfind(':', token.size() - 6)), ":3:AQID") << token;
  EXPECT_EQ(decode_replay_token(token).choices, (std::vector<std::uint64_t>{1, 2, 3}));
  const std::string head = token.substr(0, token.size() - 4);  // "...:3:"
  // Cut at a value's boundary: whole bytes, so only the count shows it.
  testing::expect_invalid_argument([&] { (void)decode_replay_token(head + "AQI"); },
                                   {"says it holds 3 choices but holds 2 (truncated or altered?)"});
  testing::expect_invalid_argument([&] { (void)decode_replay_token(head + "AQ"); },
                                   {"says it holds 3 choices but holds 1"});
  // A character too many or too few for whole bytes, and bits set past the last byte.
  testing::expect_invalid_argument([&] { (void)decode_replay_token(head + "AQIDA"); },
                                   {"has 5 characters, which no whole number of bytes gives"});
  // A choice appended (bytes 01 02 03 01).
  testing::expect_invalid_argument([&] { (void)decode_replay_token(head + "AQIDAQ"); },
                                   {"says it holds 3 choices but holds 4"});
  testing::expect_invalid_argument([&] { (void)decode_replay_token(head + "AR"); },
                                   {"ends in bits past its last byte"});
  // A value of more than 64 bits: nine continuation bytes, then a tenth above 1.
  const std::vector<std::uint8_t> wide = {0xff, 0xff, 0xff, 0xff, 0xff,
                                          0xff, 0xff, 0xff, 0xff, 0x02};
  const std::string text = base64url(wide);
  testing::expect_invalid_argument(
      [&] {
        (void)decode_replay_token("chorus-replay:3:" + build_fingerprint() + ":2:-:1:" + text);
      },
      {"wider than 64 bits"});
  // The largest value still round-trips (its tenth byte is 1).
  EXPECT_EQ(decode_replay_token(
                encode_replay_token(2, "-", std::vector<std::uint64_t>{~std::uint64_t{0}}))
                .choices,
            (std::vector<std::uint64_t>{~std::uint64_t{0}}));
}

// A planted bug: the run fails when the choices hold a 3 somewhere before a later 5 (an ordering
// of two events). The hand-minimal failing list is {3, 5}.
bool planted_bug(const std::vector<std::uint64_t>& choices) {
  bool seen_three = false;
  for (std::uint64_t choice : choices) {
    if (choice == 3) {
      seen_three = true;
    } else if (choice == 5 && seen_three) {
      return true;
    }
  }
  return false;
}

TEST(ShrinkChoices, FindsTheMinimalOrderingOfAPlantedBug) {
  const std::vector<std::uint64_t> failing = {1, 4, 2, 3, 7, 0, 6, 1, 5, 2, 9, 9, 3, 1};
  ASSERT_TRUE(planted_bug(failing));
  const ShrinkOutcome outcome = shrink_choices(failing, planted_bug);
  EXPECT_EQ(outcome.choices, (std::vector<std::uint64_t>{3, 5}));
  EXPECT_TRUE(planted_bug(outcome.choices));
  EXPECT_GT(outcome.attempts, 0u);
}

TEST(ShrinkChoices, LowersValuesAndDropsTrailingZeros) {
  // Fails whenever the first choice is at least 4: the minimum is {4}.
  const auto fails = [](const std::vector<std::uint64_t>& choices) {
    return !choices.empty() && choices[0] >= 4;
  };
  const ShrinkOutcome outcome = shrink_choices({1000, 7, 0, 3}, fails);
  EXPECT_EQ(outcome.choices, (std::vector<std::uint64_t>{4}));
}

// Lowering tries 0 before its binary search, which never probes 0 itself (0 is taken to pass):
// a choice that does not matter goes to 0, not 1.
TEST(ShrinkChoices, LowersAChoiceThatDoesNotMatterToZero) {
  // Fails whenever the second choice (0 past the end) is at least 2: the minimum is {0, 2}.
  const auto fails = [](const std::vector<std::uint64_t>& choices) {
    return choices.size() > 1 && choices[1] >= 2;
  };
  const ShrinkOutcome outcome = shrink_choices({7, 3, 9}, fails);
  EXPECT_EQ(outcome.choices, (std::vector<std::uint64_t>{0, 2}));
}

// A lowered choice can let a drop succeed that failed before it: shrinking goes round again after
// every change, a choice lowered to 0 (first) or by the binary search (second) included.
TEST(ShrinkChoices, GoesRoundAgainAfterLoweringAChoiceToZero) {
  // {1, 7, 5} fails through its third choice; once the second is 0, dropping the first leaves
  // {0, 5}, which fails through its first two.
  const auto fails = [](const std::vector<std::uint64_t>& choices) {
    const auto at = [&](std::size_t i) -> std::uint64_t {
      return i < choices.size() ? choices[i] : 0;
    };
    return (at(0) == 0 && at(1) == 5) || (at(0) >= 1 && at(2) == 5);
  };
  const ShrinkOutcome outcome = shrink_choices({1, 7, 5}, fails);
  EXPECT_EQ(outcome.choices, (std::vector<std::uint64_t>{0, 5}));
}

TEST(ShrinkChoices, GoesRoundAgainAfterABinarySearchLowersAChoice) {
  // {2, 7, 5} fails while its second choice is at least 1 (the search lowers it to 1, not 0);
  // then dropping the first choice leaves {1, 5}, which fails through its first two.
  const auto fails = [](const std::vector<std::uint64_t>& choices) {
    const auto at = [&](std::size_t i) -> std::uint64_t {
      return i < choices.size() ? choices[i] : 0;
    };
    return (at(0) == 1 && at(1) == 5) || (at(0) >= 2 && at(1) >= 1 && at(2) == 5);
  };
  const ShrinkOutcome outcome = shrink_choices({2, 7, 5}, fails);
  EXPECT_EQ(outcome.choices, (std::vector<std::uint64_t>{1, 5}));
}

// Trailing zeros are dropped even when the budget ends right after the lowering that made them:
// no later round is left to drop them.
TEST(ShrinkChoices, DropsTrailingZerosWhenTheBudgetEndsRightAfterLowering) {
  // Fails while the first choice is 1 or 2, or at least 1 with a second of at least 5. From
  // {5, 5}: two drops fail, the first choice goes 0 (passes), 2, 1, then the second goes to 0 on
  // the sixth and last attempt, leaving {1, 0}: the same run as {1}.
  const auto fails = [](const std::vector<std::uint64_t>& choices) {
    const std::uint64_t first = choices.empty() ? 0 : choices[0];
    const std::uint64_t second = choices.size() > 1 ? choices[1] : 0;
    return first >= 1 && (second >= 5 || first <= 2);
  };
  const ShrinkOutcome outcome = shrink_choices({5, 5}, fails, 6);
  EXPECT_EQ(outcome.attempts, 6u);
  EXPECT_EQ(outcome.choices, (std::vector<std::uint64_t>{1}));
}

TEST(ShrinkChoices, StopsAtTheAttemptBudget) {
  std::size_t calls = 0;
  // Fails while at least 33 choices remain: dropping chunks takes many attempts.
  const auto fails = [&](const std::vector<std::uint64_t>& choices) {
    ++calls;
    return choices.size() >= 33;
  };
  const ShrinkOutcome outcome = shrink_choices(std::vector<std::uint64_t>(64, 9), fails, 10);
  EXPECT_EQ(outcome.attempts, 10u);
  EXPECT_EQ(calls, 10u);
}

// A spent budget stops the loops too, not only the attempts: a list of 2^20 choices (as many as
// a replay token keeps) used to be copied once per window and per index after the last attempt,
// ~3 * 2^40 element copies. Returning at all is the check.
TEST(ShrinkChoices, AListAsLongAsATokenKeepsReturnsOnceTheBudgetIsSpent) {
  std::size_t calls = 0;
  const auto passes = [&](const std::vector<std::uint64_t>& /*choices*/) {
    ++calls;
    return false;
  };
  const ShrinkOutcome outcome =
      shrink_choices(std::vector<std::uint64_t>(std::size_t{1} << 20, 5), passes, 3);
  EXPECT_EQ(outcome.attempts, 3u);
  EXPECT_EQ(calls, 3u);
  EXPECT_EQ(outcome.choices.size(), std::size_t{1} << 20);
}

TEST(DecisionStream, BytesSourceReadsOneByteForAChoiceAmong256) {
  const std::vector<std::uint8_t> bytes = {200, 7};
  DecisionStream stream(bytes_source(bytes), Strategy::RandomWalk, 2, 0, 0, false);
  EXPECT_EQ(stream.choose(256), 200u);
  EXPECT_EQ(stream.choose(4), 3u);  // 7 % 4
  EXPECT_FALSE(stream.exhausted());
}

TEST(ReplayToken, AnEmptyChoiceCountIsRefused) {
  testing::expect_invalid_argument(
      [] { (void)decode_replay_token("chorus-replay:3:" + build_fingerprint() + ":2:-::"); },
      {"the token's choice count is empty"});
}

TEST(ReplayToken, AChoiceCountPast64BitsIsRefusedNotWrapped) {
  // 2^64 + 1 would wrap to 1, the number of choices "AQ" holds.
  testing::expect_invalid_argument(
      [] {
        (void)decode_replay_token("chorus-replay:3:" + build_fingerprint() +
                                  ":2:-:18446744073709551617:AQ");
      },
      {"choice count '18446744073709551617' is not a number"});
}

TEST(ReplayToken, AGroupWhoseOnlyWideValueIs128RoundTrips) {
  const std::vector<std::uint64_t> choices = {128, 0, 0};
  const std::string token = encode_replay_token(2, "-", choices);
  EXPECT_EQ(token.substr(token.rfind(':') + 1), "gAEAAA");  // bytes 80 01 00 00
  EXPECT_EQ(decode_replay_token(token).choices, choices);
}

TEST(ReplayToken, ANulInTheChoicesIsRefused) {
  std::string token = "chorus-replay:3:" + build_fingerprint() + ":2:-:1:AQ";
  token.push_back('\0');
  testing::expect_invalid_argument([&] { (void)decode_replay_token(token); },
                                   {"the choices hold byte 0x00, which is not base64url"});
}

TEST(ReplayToken, WorldSizeBoundsAreInclusive) {
  EXPECT_EQ(
      decode_replay_token(encode_replay_token(1024, "-", std::vector<std::uint64_t>{1})).world_size,
      1024);
  testing::expect_invalid_argument(
      [] { (void)decode_replay_token("chorus-replay:3:" + build_fingerprint() + ":1025:-:1:AQ"); },
      {"world size 1025 is outside [1, 1024]"});
  // A number of more digits is out of range too, not "not a number".
  testing::expect_invalid_argument(
      [] { (void)decode_replay_token("chorus-replay:3:" + build_fingerprint() + ":99999:-:1:AQ"); },
      {"world size 99999 is outside [1, 1024]"});
}

}  // namespace
}  // namespace chorus::sim::detail
