#pragma once

// Note [Decision stream]
// Every nondeterministic choice the simulator makes — which rank runs next, when a ready
// collective completes (and, as the simulator grows, reduction orders, allocator reuse, faults)
// — is one call to DecisionStream::choose(n), which returns an index in [0, n). The stream
// records every index it returned; that list *is* the run: feeding it back through a Recorded
// source replays the run exactly, whatever produced it (a seed, PCT, RapidCheck, fuzzer bytes).
//
// Sources of choices:
// - Prng: a seeded xoshiro256** (the default; same seed -> same run).
// - Recorded: a list of indices (replay, RapidCheck-generated lists); past the end of the list
//   every choice is 0 (the "simplest" choice, so shrinking a list towards shorter and smaller
//   converges), and exhausted() says so.
// - Bytes: raw fuzzer input, one little-endian value per choice (1 byte when n <= 256, else 8),
//   then a PRNG seeded from a digest of the input once the bytes run out.
// Strategies on top (which index a *schedule* choice takes): uniform random walk, PCT (PCT
// picks the runnable candidate of highest priority, with d - 1 priority change points), and a
// portfolio that picks one of them per run from the seed. A strategy only turns candidates
// into an index; what is recorded is the index, so a replay needs no strategy.
//
// A replay token is
// "chorus-replay:<format version>:<build fingerprint>:<world size>:<run shape>:<count>:<choices>"
// (choices as base64url of LEB128 varints; the shape is run_shape(), Note [Replay tokens]).
// Tokens from another format version, build or run shape are refused with a message saying
// which, since the same indices mean a different run there.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/sim/sim.hpp"
#include "rng.hpp"

namespace chorus::sim::detail {

// Where choices come from.
class ChoiceSource {
 public:
  virtual ~ChoiceSource() = default;
  // An index in [0, n); n >= 1.
  virtual std::uint64_t next(std::uint64_t n) = 0;
  // True once a finite source ran out and started answering by its fallback.
  virtual bool exhausted() const noexcept { return false; }
  // The generator when this source is a plain seeded PRNG (next(n) == prng()->below(n)), so the
  // stream can draw without a virtual call; null otherwise.
  virtual Rng* prng() noexcept { return nullptr; }
};

std::unique_ptr<ChoiceSource> prng_source(std::uint64_t seed);
std::unique_ptr<ChoiceSource> recorded_source(std::vector<std::uint64_t> choices);
std::unique_ptr<ChoiceSource> bytes_source(std::span<const std::uint8_t> bytes);

// PCT's state (Burckhardt et al., "A randomized scheduler with probabilistic guarantees of
// finding bugs", ASPLOS 2010): distinct random priorities per rank (and per communicator's
// completions), and depth - 1 change points drawn uniformly among the first `expected_steps`
// schedule choices; at the i-th point drawn (not the i-th to fall) the candidate chosen drops to
// priority i, below every initial priority. Always picks the candidate of highest priority.
class PctPicker {
 public:
  PctPicker(int depth, std::uint64_t expected_steps, Rng rng);
  std::size_t pick(std::span<const Decision> candidates);
  // Priority change points passed so far.
  std::size_t change_points_passed() const noexcept { return next_change_; }

 private:
  std::uint64_t priority_of(const Decision& decision);

  int depth_;
  Rng rng_;
  std::uint64_t step_ = 0;
  struct ChangePoint {
    std::uint64_t step;      // the schedule choice at which it falls
    std::uint64_t priority;  // what the chosen candidate drops to: i for the i-th point drawn
  };
  std::vector<ChangePoint> change_points_;  // sorted by step
  std::size_t next_change_ = 0;
  std::vector<std::uint64_t> rank_priority_;      // by rank; 0 = not assigned yet
  std::vector<std::uint64_t> complete_priority_;  // by comm id; 0 = not assigned yet
};

class DecisionStream {
 public:
  // The source of choices and the strategy for schedule choices. With a recorded source the
  // strategy is ignored (the indices are the run).
  // `record_max`: choices kept for choices(); beyond it they are only counted (overflowed()).
  DecisionStream(std::unique_ptr<ChoiceSource> source, Strategy strategy, int pct_depth,
                 std::uint64_t pct_steps, std::uint64_t seed, bool replaying,
                 std::size_t record_max = static_cast<std::size_t>(-1));
  // Hands the choice list's memory to the next stream on this thread (Note [Recycled choice
  // buffer] in decision_stream.cpp).
  ~DecisionStream();
  DecisionStream(const DecisionStream&) = delete;
  DecisionStream& operator=(const DecisionStream&) = delete;

  // One choice among n of any kind (reduction order, allocator, fault, ...). Inline, always
  // (Note [Inlined hot helpers] in world.cpp): the scheduler makes one per decision. The check
  // names no values (n can only be 0): a check that prints them takes its operands' addresses, and
  // their stores to the stack stayed on the path that passes.
  [[gnu::always_inline]] std::uint64_t choose(std::uint64_t n) {
    CHORUS_CHECK(n >= 1);
    return record(prng_ != nullptr ? prng_->below(n) : source_->next(n));
  }
  // A schedule choice among `candidates`, through the strategy.
  std::size_t choose_schedule(std::span<const Decision> candidates) {
    CHORUS_CHECK(!candidates.empty());
    if (pct_ != nullptr) {
      return pick_by_pct(candidates);
    }
    return static_cast<std::size_t>(choose(candidates.size()));
  }

  // Whether schedule choices go through PCT, which looks at the candidates themselves; otherwise
  // choose_schedule(candidates) is choose(candidates.size()).
  bool schedules_by_priority() const noexcept { return pct_ != nullptr; }

  // Every index returned so far, in order (the first record_max; valid until the next choice).
  std::span<const std::uint64_t> choices() const noexcept { return {choices_.data(), recorded()}; }
  bool exhausted() const noexcept { return source_->exhausted(); }
  // More choices were made than record_max: choices() is a prefix.
  bool overflowed() const noexcept { return overflowed_; }
  // The strategy this run uses (Portfolio resolved).
  Strategy strategy() const noexcept { return strategy_; }
  // PCT's priority change points passed so far (0 for other strategies).
  std::size_t pct_change_points_passed() const noexcept {
    return pct_ != nullptr ? pct_->change_points_passed() : 0;
  }

 private:
  // Inline only while the list has room: growing it (and overflowing) is out of line, so the
  // scheduler's per-decision path carries no reallocation code and saves no registers for it
  // (a push_back, even one guarded by a capacity check, brought its reallocation inline).
  // Note [Choice cursor]: a store through next_choice_, checked against choices_end_.
  std::uint64_t record(std::uint64_t index) {
    if (next_choice_ != choices_end_) [[likely]] {
      *next_choice_++ = index;
      return index;
    }
    return record_growing(index);
  }
  std::uint64_t record_growing(std::uint64_t index);
  std::size_t recorded() const noexcept {
    return static_cast<std::size_t>(next_choice_ - choices_.data());
  }
  // Points the cursor at entry `count` of choices_ and its end at choices_'s end: after choices_
  // is made or resized.
  void place_cursor(std::size_t count) noexcept {
    next_choice_ = choices_.data() + count;
    choices_end_ = choices_.data() + choices_.size();
  }

  std::size_t pick_by_pct(std::span<const Decision> candidates);

  std::unique_ptr<ChoiceSource> source_;
  Rng* prng_;  // source_->prng(), cached
  Strategy strategy_;
  bool replaying_;
  std::unique_ptr<PctPicker> pct_;
  // The choices recorded are the entries before next_choice_; the rest, to choices_end_, is room
  // (values left from earlier runs: Note [Recycled choice buffer]), never more than record_max_
  // entries in all.
  //
  // Note [Choice cursor]
  // ~~~~~~~~~~~~~~~~~~~~
  // The scheduler records a choice per decision. Kept as a count, the check for room read the
  // vector's begin and end and divided their difference by 8, and the store read the begin again:
  // ten instructions a decision. The cursor and the room's end are kept as pointers into choices_
  // instead (set again wherever choices_ is resized: place_cursor), so a record compares two
  // loads, stores through one and moves it on. The count is their distance (recorded()).
  std::vector<std::uint64_t> choices_;
  std::uint64_t* next_choice_ = nullptr;
  std::uint64_t* choices_end_ = nullptr;
  std::size_t record_max_;
  bool overflowed_ = false;
};

// ---- Replay tokens (Note [Replay tokens] in decision_stream.cpp).
// 3: the choices' count stands before them, so a token cut at a value's boundary is refused
// instead of replaying a shorter run.
inline constexpr int kReplayFormatVersion = 3;

// What this build's simulator is: a digest of everything that changes what a list of indices
// means (the decision scheme version, the compiler, the build type, sanitizers). Hex, 16 digits.
const std::string& build_fingerprint();  // computed once, kept for the process

// The options besides the program that shape a run, as compact readable text ("-" when all are
// defaults): "order=adversarial,alloc=random,fault=crash@1.2". Equal shapes + equal choices =
// the same run.
std::string run_shape(const SimOptions& options);

std::string encode_replay_token(int world_size, std::string_view shape,
                                std::span<const std::uint64_t> choices);

struct ReplayToken {
  int world_size = 0;
  std::string shape;  // run_shape() of the options it was recorded under
  std::vector<std::uint64_t> choices;
};
// Throws InvalidArgument naming what does not match: malformed text, another format version
// ("token format 1, this build reads 2"), another build ("built by <fp>, this build is <fp>").
ReplayToken decode_replay_token(std::string_view token);

}  // namespace chorus::sim::detail
