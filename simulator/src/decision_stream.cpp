#include "decision_stream.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/transport/recycled_blocks.hpp"

namespace chorus::sim::detail {
namespace {

// One per seeded run: recycled (Note [Recycled blocks]).
class PrngSource final : public ChoiceSource, public transport::RecycledNew<PrngSource> {
 public:
  explicit PrngSource(std::uint64_t seed) : rng_(seed) {}
  std::uint64_t next(std::uint64_t n) override { return rng_.below(n); }
  Rng* prng() noexcept override { return &rng_; }

 private:
  Rng rng_;
};

class RecordedSource final : public ChoiceSource {
 public:
  explicit RecordedSource(std::vector<std::uint64_t> choices) : choices_(std::move(choices)) {}
  std::uint64_t next(std::uint64_t n) override {
    if (position_ >= choices_.size()) {
      exhausted_ = true;
      return 0;
    }
    // A recorded index out of range (a list from a generator, or a run that diverged) is folded
    // into range rather than refused: RapidCheck's lists need not know n.
    return choices_[position_++] % n;
  }
  bool exhausted() const noexcept override { return exhausted_; }

 private:
  std::vector<std::uint64_t> choices_;
  std::size_t position_ = 0;
  bool exhausted_ = false;
};

class BytesSource final : public ChoiceSource {
 public:
  explicit BytesSource(std::span<const std::uint8_t> bytes)
      : bytes_(bytes.begin(), bytes.end()), rng_(hash_bytes(bytes.data(), bytes.size())) {}
  std::uint64_t next(std::uint64_t n) override {
    const std::size_t width = n <= 256 ? 1 : 8;
    if (position_ + width > bytes_.size()) {
      // From here on every choice is the PRNG's: the bytes left over are not read later.
      position_ = bytes_.size();
      exhausted_ = true;
      return rng_.below(n);
    }
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < width; ++i) {
      value |= static_cast<std::uint64_t>(bytes_[position_ + i]) << (8 * i);
    }
    position_ += width;
    return value % n;
  }
  bool exhausted() const noexcept override { return exhausted_; }

 private:
  std::vector<std::uint8_t> bytes_;
  std::size_t position_ = 0;
  Rng rng_;
  bool exhausted_ = false;
};

// The schedule steps PCT considers when no estimate is given: change points fall among them.
constexpr std::uint64_t kPctDefaultSteps = 256;

// Note [Recycled choice buffer]
// A stream records every choice; growing a fresh vector by doubling in every run page-faults on
// each new block once runs are long (a 16k-decision run spent a fifth of its time there). The
// list's memory therefore passes from a finished stream to the next one on the same thread, up
// to kRecycledChoicesMax entries; callers copy choices() out (SimWorld::run does). The list's
// size is its room, kept across runs: the next stream overwrites the old entries as it records
// (DecisionStream::next_choice_ is past them), so a run neither clears nor refills it.
constexpr std::size_t kRecycledChoicesMax = std::size_t{1} << 20;
thread_local std::vector<std::uint64_t> recycled_choices;

}  // namespace

std::unique_ptr<ChoiceSource> prng_source(std::uint64_t seed) {
  return std::make_unique<PrngSource>(seed);
}
std::unique_ptr<ChoiceSource> recorded_source(std::vector<std::uint64_t> choices) {
  return std::make_unique<RecordedSource>(std::move(choices));
}
std::unique_ptr<ChoiceSource> bytes_source(std::span<const std::uint8_t> bytes) {
  return std::make_unique<BytesSource>(bytes);
}

// ---- PCT

PctPicker::PctPicker(int depth, std::uint64_t expected_steps, Rng rng)
    : depth_(std::max(depth, 1)), rng_(rng) {
  const std::uint64_t steps = expected_steps > 0 ? expected_steps : kPctDefaultSteps;
  // The i-th change point drawn lowers to priority i, whenever it falls: sorting the points by
  // step keeps each one's priority, so the order in which lowered priorities are handed out is
  // random. (Handing out 1, 2, ... in step order would let a rank lowered later always outrank
  // one lowered earlier, and no run could switch back to a rank it left: depth 3 would find
  // nothing depth 2 does not.)
  for (int i = 1; i < depth_; ++i) {
    change_points_.push_back(ChangePoint{rng_.below(steps), static_cast<std::uint64_t>(i)});
  }
  std::stable_sort(change_points_.begin(), change_points_.end(),
                   [](const ChangePoint& a, const ChangePoint& b) { return a.step < b.step; });
}

std::uint64_t PctPicker::priority_of(const Decision& decision) {
  // Initial priorities are random values above every change-point priority (1 .. depth - 1);
  // ties (probability 2^-60) break by candidate order.
  const auto assign = [&](std::vector<std::uint64_t>& table, std::size_t index) {
    if (table.size() <= index) {
      table.resize(index + 1, 0);
    }
    if (table[index] == 0) {
      table[index] = static_cast<std::uint64_t>(depth_) + 1 + (rng_.next() >> 4);
    }
    return table[index];
  };
  if (decision.kind == Decision::Kind::RunRank) {
    return assign(rank_priority_, static_cast<std::size_t>(decision.rank));
  }
  return assign(complete_priority_, static_cast<std::size_t>(decision.comm_id));
}

std::size_t PctPicker::pick(std::span<const Decision> candidates) {
  CHORUS_CHECK(!candidates.empty());
  std::size_t best = 0;
  std::uint64_t best_priority = 0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const std::uint64_t priority = priority_of(candidates[i]);
    if (priority > best_priority) {
      best = i;
      best_priority = priority;
    }
  }
  // A change point: the chosen candidate drops below every initial priority.
  while (next_change_ < change_points_.size() && change_points_[next_change_].step == step_) {
    const Decision& chosen = candidates[best];
    const std::uint64_t lowered = change_points_[next_change_].priority;
    if (chosen.kind == Decision::Kind::RunRank) {
      rank_priority_[static_cast<std::size_t>(chosen.rank)] = lowered;
    } else {
      complete_priority_[static_cast<std::size_t>(chosen.comm_id)] = lowered;
    }
    ++next_change_;
  }
  ++step_;
  return best;
}

// ---- DecisionStream

DecisionStream::DecisionStream(std::unique_ptr<ChoiceSource> source, Strategy strategy,
                               int pct_depth, std::uint64_t pct_steps, std::uint64_t seed,
                               bool replaying, std::size_t record_max)
    : source_(std::move(source)),
      prng_(source_->prng()),
      strategy_(strategy),
      replaying_(replaying),
      choices_(std::exchange(recycled_choices, {})),
      record_max_(record_max) {
  // The recycled list's entries are room, overwritten before they are read (choices() ends at
  // next_choice_); only its size is capped, which keeps its memory.
  if (choices_.size() > record_max_) {
    choices_.resize(record_max_);
  }
  place_cursor(0);
  // The strategy's own randomness (PCT priorities, the portfolio's pick) comes from the seed,
  // not from the choice source: it is not recorded, because the indices it leads to are.
  Rng strategy_rng(hash_combine(seed, 0x5043545f70637421ULL));
  if (strategy_ == Strategy::Portfolio) {
    strategy_ = strategy_rng.below(2) == 0 ? Strategy::RandomWalk : Strategy::Pct;
    pct_depth = 1 + static_cast<int>(strategy_rng.below(3));
  }
  if (strategy_ == Strategy::Pct && !replaying_) {
    pct_ = std::make_unique<PctPicker>(pct_depth, pct_steps, strategy_rng);
  }
}

std::uint64_t DecisionStream::record_growing(std::uint64_t index) {
  const std::size_t count = recorded();
  CHORUS_CHECK_EQ(count, choices_.size());  // record() stores while there is room
  if (count >= record_max_) {
    overflowed_ = true;
    return index;
  }
  // Doubling, as push_back would, but never past record_max_.
  constexpr std::size_t kChoicesRoomMin = 64;
  choices_.resize(std::min(std::max(2 * choices_.size(), kChoicesRoomMin), record_max_));
  place_cursor(count);  // Note [Choice cursor]: the resize may have moved the list
  *next_choice_++ = index;
  return index;
}

DecisionStream::~DecisionStream() {
  if (choices_.capacity() <= kRecycledChoicesMax &&
      choices_.capacity() > recycled_choices.capacity()) {
    recycled_choices = std::move(choices_);
  }
}

std::size_t DecisionStream::pick_by_pct(std::span<const Decision> candidates) {
  return static_cast<std::size_t>(record(pct_->pick(candidates)));
}

// ---- Replay tokens
//
// Note [Replay tokens]
// "chorus-replay:<format>:<build fingerprint>:<world size>:<shape>:<count>:<choices>". The count
// guards the choices (LEB128 in base64url) against a cut at a value's boundary, which would
// otherwise replay a shorter run silently; the text must also be exactly what
// append_choices_base64url writes. The choices are a run only together with the program and the
// options that decide what a choice means or what happens around it: the reduction order
// (Adversarial draws choices), the allocator policy (Random draws), finalization (chosen: each drop
// draws), faults (random faults draw; explicit ones change the run), simulated CUDA devices (the
// program places its tensors elsewhere), the buffer checks (off, an input modified in flight
// completes instead of failing), the liveness budget, the timeout and step budget. Those travel as
// the shape (run_shape: readable, "-" for all defaults), and a replay under other options is
// refused naming both shapes, rather than silently being another run. The program is the caller's
// part: the replay command reruns the same command line.
//
// A run's token leaves out its trailing zero choices: a list that runs out gives 0 from there on
// (the stream marks it exhausted), so the shorter token replays the same run, and the run
// replaying a token (a shrunk list drops its trailing zeros too) reports that same token.

namespace {

// Bump when a choice point is added, removed or reordered: old tokens then mean other runs.
// 2: reduction orders, allocator reuse and random faults draw choices (each only in its mode).
// 3: a random fault fires on choices 1..total ppm (was: the top total of the million), and fuzz
//    bytes too few for a choice end the bytes (later 1-byte choices no longer read them).
constexpr std::uint64_t kDecisionSchemeVersion = 3;

constexpr std::string_view kTokenPrefix = "chorus-replay";
constexpr char kBase64Url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
// The two characters of every 12 bits, the first from the high 6: a group of 3 bytes is two
// look-ups instead of four (every run's token is written with them).
constexpr std::array<std::array<char, 2>, 4096> kBase64UrlPairs = [] {
  std::array<std::array<char, 2>, 4096> pairs{};
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    pairs[i] = {kBase64Url[i >> 6], kBase64Url[i & 63]};
  }
  return pairs;
}();

[[noreturn]] void bad_token(const std::string& detail) {
  throw InvalidArgument(ErrorContext{-1, "replay token", -1, ""}, detail);
}

// The number of bytes `values` take in LEB128: 7 bits of a value per byte, at least one.
std::size_t leb128_size(std::span<const std::uint64_t> values) noexcept {
  std::size_t size = values.size();
  for (const std::uint64_t value : values) {
    if (value >= 0x80) {
      size += static_cast<std::size_t>(std::bit_width(value) - 1) / 7;
    }
  }
  return size;
}

// The base64url characters of `bytes` bytes, without padding: 4 per 3 bytes, then 2 or 3 for a
// last 1 or 2.
std::size_t base64url_size(std::size_t bytes) noexcept {
  return bytes / 3 * 4 + (bytes % 3 == 0 ? 0 : bytes % 3 + 1);
}

// Appends `choices` in LEB128, in base64url without padding (the bits past the last byte zero),
// to `out`. The bytes go straight into the characters, written in place: no list of bytes is
// made (each run makes a token). A schedule's choices are usually one byte each, so three
// values make a group, and the text is sized for that; from the first group holding a wider
// value on, the rest is counted, the text grown to fit, and the bytes gathered one at a time.
void append_choices_base64url(std::string& out, std::span<const std::uint64_t> choices) {
  const std::size_t at = out.size();
  out.resize(at + base64url_size(choices.size()));
  char* next = out.data() + at;
  const auto write_group = [&next](std::uint32_t group) {
    std::memcpy(next, kBase64UrlPairs[(group >> 12) & 4095].data(), 2);
    std::memcpy(next + 2, kBase64UrlPairs[group & 4095].data(), 2);
    next += 4;
  };
  std::size_t i = 0;
  for (; i + 3 <= choices.size(); i += 3) {
    if ((choices[i] | choices[i + 1] | choices[i + 2]) >= 0x80) {
      break;
    }
    write_group(
        static_cast<std::uint32_t>((choices[i] << 16) | (choices[i + 1] << 8) | choices[i + 2]));
  }
  // The values so far took a byte each.
  const std::size_t bytes = i + leb128_size(std::span(choices).subspan(i));
  if (bytes != choices.size()) {
    const auto written = static_cast<std::size_t>(next - (out.data() + at));
    out.resize(at + base64url_size(bytes));
    next = out.data() + at + written;
  }
  std::uint32_t group = 0;  // the group's bytes so far, the first one highest
  int in_group = 0;
  const auto put = [&](std::uint32_t byte) {
    group = (group << 8) | byte;
    if (++in_group == 3) {
      write_group(group);
      group = 0;
      in_group = 0;
    }
  };
  for (; i < choices.size(); ++i) {
    std::uint64_t value = choices[i];
    for (; value >= 0x80; value >>= 7) {
      put(static_cast<std::uint32_t>((value & 0x7f) | 0x80));
    }
    put(static_cast<std::uint32_t>(value));
  }
  if (in_group > 0) {
    const std::uint32_t v = group << (8 * (3 - in_group));  // as if zero bytes followed
    *next++ = kBase64Url[(v >> 18) & 63];
    *next++ = kBase64Url[(v >> 12) & 63];
    if (in_group == 2) {
      *next++ = kBase64Url[(v >> 6) & 63];
    }
  }
  CHORUS_CHECK(next == out.data() + out.size());
}

// 'x' for a printable ASCII character, else its byte (0x00): a message must hold neither a NUL
// nor a control character nor half of a UTF-8 sequence (whatever the locale).
std::string shown_character(char c) {
  const auto byte = static_cast<unsigned char>(c);
  if (byte >= 0x20 && byte < 0x7f) {
    return std::string("'") + c + "'";
  }
  constexpr std::string_view kHex = "0123456789abcdef";
  return std::string("byte 0x") + kHex[byte >> 4] + kHex[byte & 0xF];
}

std::vector<std::uint8_t> from_base64url(std::string_view text) {
  std::vector<std::uint8_t> out;
  std::uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    const char* found = std::strchr(kBase64Url, c);
    if (c == '\0' || found == nullptr) {
      bad_token("the choices hold " + shown_character(c) + ", which is not base64url");
    }
    bits = (bits << 6) | static_cast<std::uint32_t>(found - kBase64Url);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<std::uint8_t>((bits >> count) & 0xff));
    }
  }
  // What append_choices_base64url writes: 4 characters per 3 bytes, then 2 or 3 for a last 1 or 2,
  // with the bits past the last byte zero. Anything else was cut or altered.
  if (text.size() % 4 == 1) {
    bad_token("the choices' text has " + std::to_string(text.size()) +
              " characters, which no whole number of bytes gives (truncated?)");
  }
  if ((bits & ((std::uint32_t{1} << count) - 1)) != 0) {
    bad_token("the choices' text ends in bits past its last byte (altered?)");
  }
  return out;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) {
      return parts;
    }
    start = end + 1;
  }
}

std::string hex16(std::uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i) {
    out[static_cast<std::size_t>(i)] = kDigits[value & 15];
    value >>= 4;
  }
  return out;
}

std::string compute_build_fingerprint() {
  std::uint64_t hash = hash_combine(0, kDecisionSchemeVersion);
  const std::string_view compiler = __VERSION__;
  hash = hash_combine(hash, hash_bytes(compiler.data(), compiler.size()));
  hash = hash_combine(hash, sizeof(void*));
#ifdef NDEBUG
  hash = hash_combine(hash, 1);
#endif
#ifdef CHORUS_ASAN
  hash = hash_combine(hash, 2);
#endif
#ifdef CHORUS_TSAN
  hash = hash_combine(hash, 3);
#endif
  return hex16(hash);
}

}  // namespace

const std::string& build_fingerprint() {
  // A constant of the build, computed once: every run's replay token carries it.
  static const std::string fingerprint = compute_build_fingerprint();
  return fingerprint;
}

std::string run_shape(const SimOptions& options) {
  std::vector<std::string> parts;
  if (options.reduction_order != ReductionOrder::Fixed) {
    parts.push_back(std::string("order=") + std::string(name(options.reduction_order)));
  }
  if (options.allocator != AllocatorPolicy::Pooled) {
    parts.push_back(std::string("alloc=") + std::string(name(options.allocator)));
    if (options.allocator == AllocatorPolicy::Quarantine) {
      parts.push_back("quarantine=" + std::to_string(options.quarantine_frees));
    }
  }
  if (options.guard_pending_outputs) {
    parts.push_back("guard");  // whole pages per storage: Random's fitting blocks change
  }
  if (options.cuda_devices) {
    parts.push_back("cuda");  // local_device() and where device storages come from change
  }
  if (!options.check_buffers) {
    parts.push_back("checks=off");  // an input modified in flight completes instead of failing
  }
  for (const Fault& fault : options.faults) {
    std::string text = std::string("fault=") + std::string(name(fault.kind)) + "@" +
                       std::to_string(fault.rank) + "." + std::to_string(fault.at_op);
    if (fault.kind == Fault::Kind::Delay) {
      text += "x" + std::to_string(fault.delay_steps);
    }
    parts.push_back(std::move(text));
  }
  if (const RandomFaults& random = options.random_faults; random.enabled()) {
    parts.push_back("random_faults=c" + std::to_string(random.crash_ppm) + ".t" +
                    std::to_string(random.transport_error_ppm) + ".h" +
                    std::to_string(random.hang_ppm) + ".d" + std::to_string(random.delay_ppm) +
                    ".x" + std::to_string(random.delay_steps_max) + ".u" +
                    std::to_string(random.until_step) + ".n" + std::to_string(random.max_faults));
  }
  if (options.choose_finalization) {
    parts.push_back("finalization=chosen");
  }
  if (options.liveness_steps != 0) {
    parts.push_back("liveness=" + std::to_string(options.liveness_steps));
  }
  // The three defaults read once: a SimOptions is large, and every run's token asks for its
  // shape. Plain values, so nothing here is destroyed at exit.
  struct Defaults {
    decltype(SimOptions::timeout) timeout;
    decltype(SimOptions::max_steps) max_steps;
    decltype(SimOptions::steps_after_budget) steps_after_budget;
  };
  static const Defaults defaults = [] {
    const SimOptions fresh;
    return Defaults{fresh.timeout, fresh.max_steps, fresh.steps_after_budget};
  }();
  if (options.timeout != defaults.timeout) {
    parts.push_back("timeout_ns=" + std::to_string(options.timeout.count()));
  }
  if (options.max_steps != defaults.max_steps) {
    parts.push_back("max_steps=" + std::to_string(options.max_steps));
  }
  if (options.steps_after_budget != defaults.steps_after_budget) {
    parts.push_back("steps_after_budget=" + std::to_string(options.steps_after_budget));
  }
  if (parts.empty()) {
    return "-";
  }
  std::string shape = parts[0];
  for (std::size_t i = 1; i < parts.size(); ++i) {
    shape += "," + parts[i];
  }
  return shape;
}

namespace {

// "chorus-replay:<format>:<build fingerprint>:", the same for every token of the process: made
// once (every run makes a token, and these parts cost it more than a short run's choices).
const std::string& token_head() {
  static const std::string head = std::string(kTokenPrefix) + ":" +
                                  std::to_string(kReplayFormatVersion) + ":" + build_fingerprint() +
                                  ":";
  return head;
}

}  // namespace

std::string encode_replay_token(int world_size, std::string_view shape,
                                std::span<const std::uint64_t> choices) {
  // One string, sized first (the choices' part is most of a long run's token); the numbers are
  // written with to_chars, not made as strings.
  const std::string& head = token_head();
  char ranks_digits[16];
  const std::string_view ranks(ranks_digits,
                               std::to_chars(ranks_digits, std::end(ranks_digits), world_size).ptr);
  char count_digits[24];
  const std::string_view count(
      count_digits, std::to_chars(count_digits, std::end(count_digits), choices.size()).ptr);
  std::string token;
  // Room for one LEB128 byte per choice: a run without a choice of 0x80 or more (few
  // candidates, no random faults) never reallocates.
  token.reserve(head.size() + ranks.size() + shape.size() + count.size() + 3 +
                base64url_size(choices.size()));
  token.append(head);
  for (std::string_view part : {ranks, shape, count}) {
    token.append(part).push_back(':');
  }
  append_choices_base64url(token, choices);
  return token;
}

ReplayToken decode_replay_token(std::string_view token) {
  const std::vector<std::string_view> parts = split(token, ':');
  if (parts.size() < 2 || parts[0] != kTokenPrefix) {
    bad_token("'" + std::string(token.substr(0, 64)) +
              "' is not a replay token (expected chorus-replay:<version>:<build>:<world "
              "size>:<shape>:<count>:<choices>)");
  }
  if (parts[1] != std::to_string(kReplayFormatVersion)) {
    bad_token("the token has format version " + std::string(parts[1]) + ", this build reads " +
              std::to_string(kReplayFormatVersion) + ": replay it with the chorus that wrote it");
  }
  if (parts.size() != 7) {
    bad_token("'" + std::string(token.substr(0, 64)) + "' has " + std::to_string(parts.size()) +
              " fields, expected 7 (chorus-replay:<version>:<build>:<world "
              "size>:<shape>:<count>:<choices>)");
  }
  if (parts[2] != build_fingerprint()) {
    bad_token("the token was written by build " + std::string(parts[2]) + ", this build is " +
              build_fingerprint() +
              " (another compiler, build type or decision scheme): its choices would mean a "
              "different run here");
  }
  ReplayToken out;
  int world_size = 0;
  for (char c : parts[3]) {
    if (c < '0' || c > '9') {
      bad_token("the token's world size '" + std::string(parts[3]) + "' is not a number");
    }
    // Past the limit the value only needs to stay past it (no overflow): the range check below
    // names it, as it does a world size of 1025.
    if (world_size <= kMaxWorldSize) {
      world_size = world_size * 10 + (c - '0');
    }
  }
  if (world_size < 1 || world_size > kMaxWorldSize) {
    bad_token("the token's world size " + std::string(parts[3]) + " is outside [1, " +
              std::to_string(kMaxWorldSize) + "]");
  }
  out.world_size = world_size;
  out.shape = std::string(parts[4]);
  std::uint64_t count = 0;
  for (char c : parts[5]) {
    if (c < '0' || c > '9' || count > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) {
      bad_token("the token's choice count '" + std::string(parts[5]) + "' is not a number");
    }
    count = count * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (parts[5].empty()) {
    bad_token("the token's choice count is empty");
  }
  std::uint64_t value = 0;
  int shift = 0;
  bool open = false;
  for (std::uint8_t byte : from_base64url(parts[6])) {
    // The 10th byte of a value holds its 64th bit only.
    if (shift > 63 || (shift == 63 && (byte & 0x7f) > 1)) {
      bad_token("the token's choices hold a value wider than 64 bits");
    }
    value |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
    open = (byte & 0x80) != 0;
    if (open) {
      shift += 7;
    } else {
      out.choices.push_back(value);
      value = 0;
      shift = 0;
    }
  }
  if (open) {
    bad_token("the token's choices end in the middle of a value (truncated?)");
  }
  if (out.choices.size() != count) {
    bad_token("the token says it holds " + std::to_string(count) + " choices but holds " +
              std::to_string(out.choices.size()) + " (truncated or altered?)");
  }
  return out;
}

}  // namespace chorus::sim::detail
