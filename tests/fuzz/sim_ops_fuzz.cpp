// Fuzz target: op / wait / drop / finalize / reuse sequences on the simulator, checked against a
// model of the async semantics (DESIGN 2.4, Note [Work lifecycle] in
// core/src/detail/work_registry.hpp). See docs/fuzzing.md.
//
// The input is decoded into an SPMD program for a 2..4-rank simulated world, and whatever bytes
// the program does not use feed the simulator's decision stream (SimOptions::fuzz_bytes), so one
// input is one program *and* one schedule: libFuzzer mutates both.
//
//   byte 0   bits 0-1 world size 2 + (b & 3) % 3 (3 means 2); bits 2-3 allocator policy;
//            bit 4 choose_finalization; bit 5 adversarial reduction order; bit 6 PCT instead of
//            the random walk; bit 7 unused
//   byte 1   how each rank ends (2 bits per rank): wait everything, drop in order, keep past the
//            rank's end (completed at rank exit), drop in reverse order
//   byte 2   the number of instructions (b % 65; fewer if the input ends first), two bytes
//            each, then the decision stream (SimOptions::fuzz_bytes; its digest is also the seed,
//            from which PCT draws its priorities and change points)
//
// An instruction is (a, b). a % 16 < 6 is a collective every rank issues, in program order (so
// ranks agree), or an exchange in which every rank waits on a copy of a peer's result between two
// barriers; the others are local actions of rank (a / 16) % W only: waits on a result or a view
// of it, drops of a handle, narrow views, reads and writes through data_ptr (which wait), scratch
// allocations of the same size (address reuse under LifoReuse), registry and is_pending checks.
// Every collective has exact Int64 inputs, distinct per rank, input and element, so a value read is
// compared bitwise with the one the model computes.
//
// Invariants (a violation prints "chorus fuzz: invariant violated: ..." and aborts):
// - every value read (after a wait, through data_ptr, or raw once the model says not pending)
//   equals the model's, bitwise; scratch tensors keep their bytes (no pending output aliases a
//   live block);
// - is_pending() of every handle equals the model's: true from issue until the work is waited
//   through any route on any of its outputs (a coalesced call is one work);
// - work_registry_size() equals the model's count of distinct works not waited that still have a
//   live output, and is 0 at the end of a rank that waited or dropped everything;
// - the run has no rank error, no quarantined block was written, and SimReport::unwaited lists
//   exactly the works the program dropped without waiting (at_rank_exit false) and those it kept
//   past its end (at_rank_exit true), by rank, op and sequence number, without errors.
//
// CHORUS_FUZZ_DESCRIBE=1 in the environment prints each input's decoded header before its run
// ("sim_ops_fuzz: decoded world ...") and the run's schedule after it ("sim_ops_fuzz: ran steps
// ... schedule_hash ..."): what tests/fuzz/seed_corpus.py --check compares with the seeds it means.
//
// CHORUS_FUZZ_PLANT_BUG=1 in the environment corrupts the expected value of every all_reduce
// result (element 0, plus one), to prove that the checks fire (ctest sim_ops_fuzz.planted_bug).

#include <algorithm>
#include <chorus/chorus.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "chorus/sim/sim.hpp"
#include "violation.hpp"

namespace chorus::fuzz {
namespace {

bool environment_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

bool planted_bug() { return environment_flag("CHORUS_FUZZ_PLANT_BUG"); }

// ---------------------------------------------------------------------------------------------
// Decoding.

inline constexpr std::size_t kInstructionsMax = 64;
inline constexpr int kCollectiveKinds = 6;
inline constexpr std::size_t kScratchMax = 4;

enum class EndMode : std::uint8_t { WaitAll, DropInOrder, KeepPastEnd, DropReversed };

struct Instruction {
  std::uint8_t a = 0;
  std::uint8_t b = 0;
  int kind() const { return a % 16; }
  bool collective() const { return kind() < kCollectiveKinds; }
  int target(int world_size) const { return (a / 16) % world_size; }
};

struct Program {
  int world_size = 2;
  sim::AllocatorPolicy allocator = sim::AllocatorPolicy::Pooled;
  bool choose_finalization = false;
  bool adversarial_order = false;
  bool pct = false;
  std::uint8_t end_modes = 0;
  std::vector<Instruction> instructions;
  std::vector<std::uint8_t> stream;  // the decision stream's bytes

  EndMode end_mode(int rank_index) const {
    return static_cast<EndMode>((end_modes >> (2 * rank_index)) & 3);
  }
};

Program decode(const std::uint8_t* data, std::size_t size) {
  const auto byte_at = [&](std::size_t i) -> std::uint8_t { return i < size ? data[i] : 0; };
  Program program;
  const std::uint8_t flags = byte_at(0);
  // Only bits 0-1: the other bits are fields of their own (the whole byte % 3 mixed them in).
  program.world_size = 2 + (flags & 3) % 3;
  program.allocator = static_cast<sim::AllocatorPolicy>((flags >> 2) & 3);
  program.choose_finalization = ((flags >> 4) & 1) != 0;
  program.adversarial_order = ((flags >> 5) & 1) != 0;
  program.pct = ((flags >> 6) & 1) != 0;
  program.end_modes = byte_at(1);
  const std::size_t count = byte_at(2) % (kInstructionsMax + 1);
  std::size_t next = 3;
  for (std::size_t i = 0; i < count && next + 1 < size; ++i, next += 2) {
    program.instructions.push_back(Instruction{data[next], data[next + 1]});
  }
  if (next < size) {
    program.stream.assign(data + next, data + size);
  }
  return program;
}

// FNV-1a, 64 bits: the seed of a run from its decision stream's bytes.
std::uint64_t digest(const std::vector<std::uint8_t>& bytes) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (std::uint8_t byte : bytes) {
    hash = (hash ^ byte) * 0x100000001b3ULL;
  }
  return hash;
}

// ---------------------------------------------------------------------------------------------
// Exact inputs and expected results.

// Element i of input `part` on rank r: distinct for every (rank, part, element).
std::int64_t input_value(int r, int part, std::int64_t i) {
  return (std::int64_t{r + 1} << 32) + (std::int64_t{part} << 16) + i;
}

std::vector<std::int64_t> input_values(int r, int part, std::int64_t count) {
  std::vector<std::int64_t> values;
  for (std::int64_t i = 0; i < count; ++i) {
    values.push_back(input_value(r, part, i));
  }
  return values;
}

Tensor input_tensor(int part, const Shape& shape) {
  std::int64_t count = 1;
  for (std::int64_t size : shape) {
    count *= size;
  }
  return Tensor::from_vector(input_values(rank(), part, count), shape);
}

enum class Reduction : std::uint8_t { Sum, Max, Min, BXor };

const char* reduction_name(Reduction reduction) {
  switch (reduction) {
    case Reduction::Sum:
      return "sum";
    case Reduction::Max:
      return "max";
    case Reduction::Min:
      return "min";
    case Reduction::BXor:
      return "bxor";
  }
  return "sum";
}

// The reduction over every rank of element i of `part` (integers wrap: computed unsigned).
std::int64_t reduced_value(int world_size, Reduction reduction, int part, std::int64_t i) {
  std::uint64_t acc = static_cast<std::uint64_t>(input_value(0, part, i));
  std::int64_t best = input_value(0, part, i);
  for (int r = 1; r < world_size; ++r) {
    const std::int64_t value = input_value(r, part, i);
    acc = reduction == Reduction::BXor ? acc ^ static_cast<std::uint64_t>(value)
                                       : acc + static_cast<std::uint64_t>(value);
    best = reduction == Reduction::Max ? std::max(best, value) : std::min(best, value);
  }
  if (reduction == Reduction::Max || reduction == Reduction::Min) {
    return best;
  }
  return static_cast<std::int64_t>(acc);
}

// ---------------------------------------------------------------------------------------------
// The model of one rank.

struct StorageModel {
  std::vector<std::int64_t> expected;  // row-major, the whole storage
  std::size_t work = 0;
  int handles = 0;  // live Tensors viewing it
};

struct WorkModel {
  std::string op;
  std::int64_t seq = -1;
  std::vector<std::size_t> storages;
  int live_storages = 0;
  bool waited = false;
  bool dropped = false;  // every output died before a wait: reported as unwaited
};

// A Tensor the program holds: the whole result or a narrow view of it (always contiguous, so its
// elements are [begin, begin + count) of the storage).
struct Handle {
  Tensor tensor;
  std::size_t storage = 0;
  std::int64_t begin = 0;
  std::int64_t count = 0;
};

struct Scratch {
  Tensor tensor;
  std::vector<std::int64_t> expected;
};

class RankModel;

// A copy of a handle one rank lends another during an exchange (RankModel::exchange).
struct Lent {
  RankModel* owner = nullptr;
  Handle handle;
};

// What SimReport::unwaited must list.
using UnwaitedKey = std::tuple<int, bool, std::int64_t, std::string>;  // rank, exit, seq, op

class RankModel {
 public:
  RankModel(const Program& program, int r, std::vector<UnwaitedKey>& unwaited,
            std::vector<Lent>& lent)
      : program_(program), rank_(r), unwaited_(unwaited), lent_(lent) {}

  void run() {
    int seq = 0;
    for (std::size_t i = 0; i < program_.instructions.size(); ++i) {
      const Instruction& instruction = program_.instructions[i];
      if (instruction.collective()) {
        seq += issue(instruction, seq);
      } else if (instruction.target(program_.world_size) == rank_) {
        act(instruction);
      }
      check_pending_states("after instruction " + std::to_string(i));
    }
    finish();
  }

  // Tensors kept past the rank's end (EndMode::KeepPastEnd) with their expected values, checked
  // after the run (the rank's exit must have completed them).
  std::vector<std::pair<Tensor, std::vector<std::int64_t>>> kept;

 private:
  std::string where() const { return "rank " + std::to_string(rank_) + ": "; }

  std::size_t pending_works() const {
    std::size_t count = 0;
    for (const WorkModel& work : works_) {
      count += (!work.waited && work.live_storages > 0) ? 1 : 0;
    }
    return count;
  }

  bool model_pending(const Handle& handle) const {
    return !works_[storages_[handle.storage].work].waited;
  }

  std::vector<std::int64_t> expected_of(const Handle& handle) const {
    const std::vector<std::int64_t>& all = storages_[handle.storage].expected;
    return {all.begin() + handle.begin, all.begin() + handle.begin + handle.count};
  }

  // ---- Collectives (every rank, in program order).

  void add_result(WorkModel& work, std::size_t work_index, const Tensor& tensor,
                  std::vector<std::int64_t> expected) {
    check(static_cast<std::int64_t>(expected.size()) == tensor.numel(),
          where() + work.op + " result has " + std::to_string(tensor.numel()) +
              " elements, the model " + std::to_string(expected.size()));
    check(tensor.is_contiguous(), where() + work.op + " result is not contiguous");
    storages_.push_back(StorageModel{std::move(expected), work_index, 1});
    work.storages.push_back(storages_.size() - 1);
    work.live_storages += 1;
    handles_.push_back(Handle{tensor, storages_.size() - 1, 0, tensor.numel()});
  }

  // A collective on the world with nothing pending after it: a barrier.
  void barrier() {
    const auto sum =
        all_reduce(Tensor::ones({1}, DType::Int64), "sum", world()).item<std::int64_t>();
    check(sum == program_.world_size, where() + "barrier all_reduce gave " + std::to_string(sum));
  }

  // Every rank lends a copy of one of its handles (if it holds any); after a barrier each waits
  // on (or reads) the copy a peer lent it, drops it, and a second barrier keeps every owner from
  // acting on its own results meanwhile: a rank may wait on another rank's pending tensor, and
  // the wait retires the owner's work (its is_pending, registry and report). Two sequence numbers.
  int exchange(std::uint8_t v) {
    const int world_size = program_.world_size;
    Lent& mine = lent_[static_cast<std::size_t>(rank_)];
    mine = Lent{};
    if (!handles_.empty()) {
      mine = Lent{this, handle_at(v)};
      storages_[mine.handle.storage].handles += 1;
    }
    barrier();
    const int peer = (rank_ + 1 + (v / 8) % (world_size - 1)) % world_size;
    Lent& theirs = lent_[static_cast<std::size_t>(peer)];
    if (theirs.owner != nullptr) {
      RankModel& owner = *theirs.owner;
      Handle handle = std::move(theirs.handle);
      theirs = Lent{};
      const std::string route = " on rank " + std::to_string(rank_);
      if ((v & 0x40) != 0) {
        const std::vector<std::int64_t> values = handle.tensor.to_vector<std::int64_t>();
        owner.waited(handle);
        owner.check_values(handle, values.data(), "to_vector" + route);
      } else {
        (void)wait_tensor(handle.tensor);
        owner.waited(handle);
        owner.check_raw(handle, "wait_tensor" + route);
      }
      handle.tensor = Tensor();
      owner.drop_model(handle);
    }
    barrier();
    return 2;
  }

  // Issues the collective of `instruction` as sequence number `seq`; returns the sequence numbers
  // it took.
  int issue(const Instruction& instruction, int seq) {
    if (instruction.kind() == 4 && (instruction.b & 0x80) != 0) {
      return exchange(instruction.b);
    }
    const int world_size = program_.world_size;
    const int r = rank_;
    const std::uint8_t v = instruction.b;
    const int part = 2 * seq;  // inputs `part` and `part + 1`
    const std::int64_t n = 1 + v % 5;
    const auto w = static_cast<std::int64_t>(world_size);
    const std::size_t work_index = works_.size();
    works_.push_back(WorkModel{"", seq, {}, 0, false, false});
    std::vector<std::pair<Tensor, std::vector<std::int64_t>>> results;
    std::string op;

    switch (instruction.kind()) {
      case 0: {  // all_reduce
        const auto reduction = static_cast<Reduction>((v / 8) % 4);
        op = "all_reduce";
        Tensor out = all_reduce(input_tensor(part, {n}), reduction_name(reduction), world());
        std::vector<std::int64_t> expected;
        for (std::int64_t i = 0; i < n; ++i) {
          expected.push_back(reduced_value(world_size, reduction, part, i));
        }
        if (planted_bug()) {
          expected[0] += 1;
        }
        results.emplace_back(out, expected);
        break;
      }
      case 1: {  // all_gather_tensor along dim 0 of [n] or dim 1 of [2, n] (a completion fixup)
        op = "all_gather_tensor";
        std::vector<std::int64_t> expected;
        if ((v & 0x80) == 0) {
          Tensor out = all_gather_tensor(input_tensor(part, {n}), 0, world());
          for (int j = 0; j < world_size; ++j) {
            for (std::int64_t i = 0; i < n; ++i) {
              expected.push_back(input_value(j, part, i));
            }
          }
          results.emplace_back(out, expected);
        } else {
          Tensor out = all_gather_tensor(input_tensor(part, {2, n}), 1, world());
          for (std::int64_t row = 0; row < 2; ++row) {
            for (int j = 0; j < world_size; ++j) {
              for (std::int64_t i = 0; i < n; ++i) {
                expected.push_back(input_value(j, part, row * n + i));
              }
            }
          }
          results.emplace_back(out, expected);
        }
        break;
      }
      case 2: {  // reduce_scatter_tensor along dim 0 of [W k] or dim 1 of [2, W k]
        op = "reduce_scatter_tensor";
        const auto reduction = (v & 0x40) != 0 ? Reduction::Max : Reduction::Sum;
        const std::int64_t k = n;
        std::vector<std::int64_t> expected;
        if ((v & 0x80) == 0) {
          Tensor out = reduce_scatter_tensor(input_tensor(part, {w * k}), reduction_name(reduction),
                                             0, world());
          for (std::int64_t i = 0; i < k; ++i) {
            expected.push_back(reduced_value(world_size, reduction, part, r * k + i));
          }
          results.emplace_back(out, expected);
        } else {
          Tensor out = reduce_scatter_tensor(input_tensor(part, {2, w * k}),
                                             reduction_name(reduction), 1, world());
          for (std::int64_t row = 0; row < 2; ++row) {
            for (std::int64_t i = 0; i < k; ++i) {
              expected.push_back(
                  reduced_value(world_size, reduction, part, row * w * k + r * k + i));
            }
          }
          results.emplace_back(out, expected);
        }
        break;
      }
      case 3: {  // all_to_all_single, equal or uneven splits
        op = "all_to_all_single";
        std::vector<std::int64_t> expected;
        if ((v & 0x80) == 0) {
          const std::int64_t k = n;
          Tensor out =
              all_to_all_single(input_tensor(part, {w * k}), std::nullopt, std::nullopt, world());
          for (int j = 0; j < world_size; ++j) {
            for (std::int64_t i = 0; i < k; ++i) {
              expected.push_back(input_value(j, part, r * k + i));
            }
          }
          results.emplace_back(out, expected);
        } else {
          // Rank src sends split(src, dst) rows to dst (0 rows too).
          const auto split = [v](int src, int dst) -> std::int64_t {
            return (src + 2 * dst + v) % 3;
          };
          std::vector<std::int64_t> input_splits;
          std::vector<std::int64_t> output_splits;
          std::int64_t input_rows = 0;
          for (int j = 0; j < world_size; ++j) {
            input_splits.push_back(split(r, j));
            output_splits.push_back(split(j, r));
            input_rows += split(r, j);
          }
          Tensor out = all_to_all_single(input_tensor(part, {input_rows}), output_splits,
                                         input_splits, world());
          for (int j = 0; j < world_size; ++j) {
            std::int64_t offset = 0;  // where rank j's rows for this rank start in its input
            for (int d = 0; d < r; ++d) {
              offset += split(j, d);
            }
            for (std::int64_t i = 0; i < split(j, r); ++i) {
              expected.push_back(input_value(j, part, offset + i));
            }
          }
          results.emplace_back(out, expected);
        }
        break;
      }
      case 4: {  // broadcast (bit 7: an exchange, above)
        op = "broadcast";
        const int src = (v / 8) % world_size;
        Tensor out = broadcast(input_tensor(part, {n}), src, world());
        results.emplace_back(out, input_values(src, part, n));
        break;
      }
      default: {  // the coalesced forms: two outputs, one work
        const std::int64_t n2 = 1 + (v / 8) % 3;
        switch ((v / 32) % 3) {
          case 0: {
            op = "all_reduce_coalesced";
            std::vector<Tensor> outs = all_reduce_coalesced(
                {input_tensor(part, {n}), input_tensor(part + 1, {n2})}, "sum", world());
            check(outs.size() == 2, where() + op + " returned " + std::to_string(outs.size()));
            for (std::size_t t = 0; t < 2; ++t) {
              const int p = part + static_cast<int>(t);
              std::vector<std::int64_t> expected;
              for (std::int64_t i = 0; i < (t == 0 ? n : n2); ++i) {
                expected.push_back(reduced_value(world_size, Reduction::Sum, p, i));
              }
              results.emplace_back(outs[t], expected);
            }
            break;
          }
          case 1: {
            op = "all_gather_into_tensor_coalesced";
            std::vector<Tensor> outs = all_gather_into_tensor_coalesced(
                {input_tensor(part, {n}), input_tensor(part + 1, {n2})}, world());
            check(outs.size() == 2, where() + op + " returned " + std::to_string(outs.size()));
            for (std::size_t t = 0; t < 2; ++t) {
              const int p = part + static_cast<int>(t);
              std::vector<std::int64_t> expected;
              for (int j = 0; j < world_size; ++j) {
                for (std::int64_t i = 0; i < (t == 0 ? n : n2); ++i) {
                  expected.push_back(input_value(j, p, i));
                }
              }
              results.emplace_back(outs[t], expected);
            }
            break;
          }
          default: {
            op = "reduce_scatter_tensor_coalesced";
            std::vector<Tensor> outs = reduce_scatter_tensor_coalesced(
                {input_tensor(part, {w * n}), input_tensor(part + 1, {w * n2})}, "sum", {0, 0},
                world());
            check(outs.size() == 2, where() + op + " returned " + std::to_string(outs.size()));
            for (std::size_t t = 0; t < 2; ++t) {
              const int p = part + static_cast<int>(t);
              const std::int64_t k = t == 0 ? n : n2;
              std::vector<std::int64_t> expected;
              for (std::int64_t i = 0; i < k; ++i) {
                expected.push_back(reduced_value(world_size, Reduction::Sum, p, r * k + i));
              }
              results.emplace_back(outs[t], expected);
            }
            break;
          }
        }
        break;
      }
    }
    works_[work_index].op = op;
    for (auto& [tensor, expected] : results) {
      check(tensor.is_pending(), where() + op + " #" + std::to_string(seq) +
                                     ": a result is not pending right after issue");
      add_result(works_[work_index], work_index, tensor, std::move(expected));
    }
    return 1;
  }

  // ---- Local actions (this rank only).

  Handle& handle_at(std::uint8_t b) { return handles_[b % handles_.size()]; }

  // The model's side of any wait route on `handle`: the whole work is waited.
  void waited(const Handle& handle) { works_[storages_[handle.storage].work].waited = true; }

  void check_values(const Handle& handle, const std::int64_t* data, const std::string& route) {
    const std::vector<std::int64_t> expected = expected_of(handle);
    const WorkModel& work = works_[storages_[handle.storage].work];
    for (std::size_t i = 0; i < expected.size(); ++i) {
      if (data[i] != expected[i]) {
        violated(where() + work.op + " #" + std::to_string(work.seq) + " read through " + route +
                 ": value mismatch at element " + std::to_string(handle.begin + to_signed(i)) +
                 ": " + std::to_string(data[i]) + ", expected " + std::to_string(expected[i]));
      }
    }
  }

  static std::int64_t to_signed(std::size_t i) { return static_cast<std::int64_t>(i); }

  // Reads `handle` without waiting; only when the model says it is not pending.
  void check_raw(const Handle& handle, const std::string& route) {
    check(!model_pending(handle), where() + "raw read of a pending handle (harness bug)");
    check_values(handle, static_cast<const std::int64_t*>(handle.tensor.unsafe_data_ptr()), route);
  }

  // Drops handle `index`: its Tensor dies here, before the model hears of it.
  void drop_handle(std::size_t index) {
    Handle handle = std::move(handles_[index]);
    handles_.erase(handles_.begin() + static_cast<std::ptrdiff_t>(index));
    handle.tensor = Tensor();
    drop_model(handle);
  }

  // The model's side of a handle's death (the Tensor itself dies with the caller's copy).
  void drop_model(const Handle& handle) {
    StorageModel& storage = storages_[handle.storage];
    storage.handles -= 1;
    if (storage.handles > 0) {
      return;
    }
    WorkModel& work = works_[storage.work];
    work.live_storages -= 1;
    if (work.live_storages == 0 && !work.waited) {
      work.dropped = true;
      unwaited_.emplace_back(rank_, false, work.seq, work.op);
    }
  }

  void check_registry(const std::string& when) {
    const std::size_t size = work_registry_size();
    check(size == pending_works(), where() + "work_registry_size() " + std::to_string(size) + " " +
                                       when + ", the model " + std::to_string(pending_works()));
  }

  void check_pending_states(const std::string& when) {
    for (const Handle& handle : handles_) {
      const bool pending = handle.tensor.is_pending();
      if (pending != model_pending(handle)) {
        const WorkModel& work = works_[storages_[handle.storage].work];
        violated(where() + work.op + " #" + std::to_string(work.seq) + ": is_pending() " +
                 (pending ? "true" : "false") + " " + when + ", the model " +
                 (pending ? "false" : "true"));
      }
    }
  }

  void check_scratch() {
    for (const Scratch& scratch : scratch_) {
      const auto* data = static_cast<const std::int64_t*>(scratch.tensor.unsafe_data_ptr());
      for (std::size_t i = 0; i < scratch.expected.size(); ++i) {
        check(data[i] == scratch.expected[i],
              where() + "scratch tensor changed at element " + std::to_string(i) + ": " +
                  std::to_string(data[i]) + ", expected " + std::to_string(scratch.expected[i]));
      }
    }
  }

  void act(const Instruction& instruction) {
    const std::uint8_t b = instruction.b;
    const int kind = instruction.kind();
    if (handles_.empty() && kind != 12 && kind != 13) {
      return;
    }
    switch (kind) {
      case 6: {  // wait_tensor on a handle (the result or a view)
        const Handle& handle = handle_at(b);
        Tensor same = wait_tensor(handle.tensor);
        waited(handle);
        check(same.shares_storage(handle.tensor), where() + "wait_tensor returned another tensor");
        check_raw(handle, "wait_tensor");
        break;
      }
      case 7: {  // wait_tensors on two handles (possibly the same work twice)
        const Handle first = handle_at(b);
        const Handle second = handle_at(static_cast<std::uint8_t>(b / 16));
        std::vector<Tensor> out = wait_tensors({first.tensor, second.tensor});
        check(out.size() == 2, where() + "wait_tensors returned " + std::to_string(out.size()));
        waited(first);
        waited(second);
        check_raw(first, "wait_tensors");
        check_raw(second, "wait_tensors");
        break;
      }
      case 8:  // drop a handle (the last one of a storage drops it; of a work, finalizes it)
        drop_handle(b % handles_.size());
        break;
      case 9: {  // a narrow view along dim 0
        const Handle& base = handle_at(b);
        const std::int64_t rows = base.tensor.size(0);
        if (rows == 0) {  // an empty all_to_all output
          break;
        }
        const std::int64_t row_elements = base.count / rows;
        const std::int64_t start = (b / 4) % rows;
        const std::int64_t length = 1 + (b / 16) % (rows - start);
        Handle view{base.tensor.narrow(0, start, length), base.storage,
                    base.begin + start * row_elements, length * row_elements};
        storages_[view.storage].handles += 1;
        handles_.push_back(std::move(view));
        break;
      }
      case 10: {  // read through data_ptr (waits)
        const Handle& handle = handle_at(b);
        const std::int64_t* data = handle.tensor.data_ptr<std::int64_t>();
        waited(handle);
        check_values(handle, data, "data_ptr");
        break;
      }
      case 11: {  // write through data_ptr (waits first): later reads must see these values
        const Handle& handle = handle_at(b);
        std::int64_t* data = handle.tensor.data_ptr<std::int64_t>();
        waited(handle);
        check_values(handle, data, "data_ptr before a write");
        std::vector<std::int64_t>& expected = storages_[handle.storage].expected;
        for (std::int64_t i = 0; i < handle.count; ++i) {
          const std::int64_t value = -(std::int64_t{b} << 20) - i - 1;
          data[i] = value;
          expected[static_cast<std::size_t>(handle.begin + i)] = value;
        }
        break;
      }
      case 12: {  // a scratch tensor the size of a result: kept, or freed at once (reuse)
        const std::int64_t count =
            handles_.empty()
                ? 1 + b % 8
                : static_cast<std::int64_t>(storages_[handle_at(b).storage].expected.size());
        Scratch scratch{Tensor::empty({count}, DType::Int64), {}};
        check(!scratch.tensor.is_pending(), where() + "a fresh tensor is pending");
        auto* data = scratch.tensor.data_ptr<std::int64_t>();
        for (std::int64_t i = 0; i < count; ++i) {
          scratch.expected.push_back(0x7000'0000 + (std::int64_t{b} << 8) + i);
          data[i] = scratch.expected.back();
        }
        if ((b & 0x80) != 0) {
          scratch_.push_back(std::move(scratch));
          if (scratch_.size() > kScratchMax) {
            scratch_.erase(scratch_.begin());
          }
        }
        break;
      }
      case 13:  // the registry count
        check_registry("at action 13");
        break;
      case 14: {  // raw reads of everything the model says is complete, and the scratch tensors
        for (const Handle& handle : handles_) {
          if (!model_pending(handle)) {
            check_raw(handle, "unsafe_data_ptr");
          }
        }
        check_scratch();
        break;
      }
      default: {  // a read through to_vector (waits)
        const Handle& handle = handle_at(b);
        const std::vector<std::int64_t> values = handle.tensor.to_vector<std::int64_t>();
        waited(handle);
        check(static_cast<std::int64_t>(values.size()) == handle.count,
              where() + "to_vector returned " + std::to_string(values.size()) + " elements");
        check_values(handle, values.data(), "to_vector");
        break;
      }
    }
  }

  void finish() {
    check_scratch();
    switch (program_.end_mode(rank_)) {
      case EndMode::WaitAll: {
        std::vector<Tensor> tensors;
        for (const Handle& handle : handles_) {
          tensors.push_back(handle.tensor);
        }
        (void)wait_tensors(tensors);
        for (const Handle& handle : handles_) {
          waited(handle);
        }
        for (const Handle& handle : handles_) {
          check_raw(handle, "wait_tensors at the end");
        }
        check_pending_states("after waiting everything");
        while (!handles_.empty()) {
          drop_handle(handles_.size() - 1);
        }
        break;
      }
      case EndMode::DropInOrder:
        while (!handles_.empty()) {
          drop_handle(0);
        }
        break;
      case EndMode::DropReversed:
        while (!handles_.empty()) {
          drop_handle(handles_.size() - 1);
        }
        break;
      case EndMode::KeepPastEnd:
        check_registry("at the end, keeping the handles");
        for (Handle& handle : handles_) {
          kept.emplace_back(handle.tensor, expected_of(handle));
        }
        // Works still pending now are completed when the rank ends, as unwaited at exit.
        for (const WorkModel& work : works_) {
          if (!work.waited && work.live_storages > 0) {
            unwaited_.emplace_back(rank_, true, work.seq, work.op);
          }
        }
        handles_.clear();
        break;
    }
    if (program_.end_mode(rank_) != EndMode::KeepPastEnd) {
      check_registry("at the end");
      check(work_registry_size() == 0, where() + "registry not empty at the end");
    }
    scratch_.clear();
  }

  const Program& program_;
  int rank_;
  std::vector<UnwaitedKey>& unwaited_;
  std::vector<Lent>& lent_;  // by rank, shared by every rank's model
  std::vector<StorageModel> storages_;
  std::vector<WorkModel> works_;
  std::vector<Handle> handles_;
  std::vector<Scratch> scratch_;
};

// ---------------------------------------------------------------------------------------------

void run_one(const std::uint8_t* data, std::size_t size) {
  const Program program = decode(data, size);
  const bool describe = environment_flag("CHORUS_FUZZ_DESCRIBE");
  if (describe) {
    std::printf(
        "sim_ops_fuzz: decoded world %d allocator %d finalization %d adversarial %d pct %d "
        "instructions %zu stream %zu\n",
        program.world_size, static_cast<int>(program.allocator),
        program.choose_finalization ? 1 : 0, program.adversarial_order ? 1 : 0, program.pct ? 1 : 0,
        program.instructions.size(), program.stream.size());
    std::fflush(stdout);
  }
  sim::SimOptions options;
  options.world_size = program.world_size;
  options.print_failures = false;
  options.seed_from_environment = false;
  options.fuzz_bytes = program.stream;
  options.allocator = program.allocator;
  options.choose_finalization = program.choose_finalization;
  options.reduction_order =
      program.adversarial_order ? sim::ReductionOrder::Adversarial : sim::ReductionOrder::Fixed;
  options.strategy = program.pct ? sim::Strategy::Pct : sim::Strategy::RandomWalk;
  // The seed is what PCT draws its priorities and change points from (its picks take no bytes):
  // a digest of the stream, so other bytes are another PCT schedule. (The input's length made
  // every input of one program and length the same schedule under PCT.)
  options.seed = digest(program.stream);

  const auto ranks = static_cast<std::size_t>(program.world_size);
  std::vector<std::vector<UnwaitedKey>> expected_unwaited(ranks);
  std::vector<std::vector<std::pair<Tensor, std::vector<std::int64_t>>>> kept(ranks);
  std::vector<Lent> lent(ranks);
  const sim::SimReport report = sim::simulate(options, [&] {
    const auto r = static_cast<std::size_t>(rank());
    RankModel model(program, rank(), expected_unwaited[r], lent);
    model.run();
    kept[r] = std::move(model.kept);
  });

  if (describe) {
    std::printf("sim_ops_fuzz: ran steps %llu schedule_hash %016llx\n",
                static_cast<unsigned long long>(report.steps),
                static_cast<unsigned long long>(report.schedule_hash));
    std::fflush(stdout);
  }
  if (!report.ok()) {
    std::string errors;
    for (const std::string& error : report.rank_errors) {
      errors += error.empty() ? "" : "\n  " + error;
    }
    violated("the run failed:" + errors);
  }
  check(report.mark_count("alloc.quarantine.overwritten") == 0,
        "a quarantined block was written after its free");

  std::vector<UnwaitedKey> expected;
  for (const std::vector<UnwaitedKey>& keys : expected_unwaited) {
    expected.insert(expected.end(), keys.begin(), keys.end());
  }
  std::vector<UnwaitedKey> actual;
  for (const UnwaitedWork& work : report.unwaited) {
    check(work.error.empty(),
          "unwaited " + work.op + " #" + std::to_string(work.seq) + " failed: " + work.error);
    actual.emplace_back(work.rank, work.at_rank_exit, work.seq, work.op);
  }
  std::sort(expected.begin(), expected.end());
  std::sort(actual.begin(), actual.end());
  if (actual != expected) {
    const auto text = [](const std::vector<UnwaitedKey>& keys) {
      std::string out;
      for (const auto& [r, at_exit, seq, op] : keys) {
        out += "\n  rank " + std::to_string(r) + " " + op + " #" + std::to_string(seq) +
               (at_exit ? " (at rank exit)" : " (dropped)");
      }
      return out;
    };
    violated("SimReport::unwaited lists" + text(actual) + "\nthe model" + text(expected));
  }

  // What a rank kept past its end was completed at its exit.
  for (std::size_t r = 0; r < ranks; ++r) {
    for (const auto& [tensor, values] : kept[r]) {
      check(!tensor.is_pending(), "a tensor kept past rank " + std::to_string(r) +
                                      "'s end is still pending after the run");
      const auto* raw = static_cast<const std::int64_t*>(tensor.unsafe_data_ptr());
      for (std::size_t i = 0; i < values.size(); ++i) {
        check(raw[i] == values[i], "a tensor kept past rank " + std::to_string(r) +
                                       "'s end: value mismatch at element " + std::to_string(i) +
                                       ": " + std::to_string(raw[i]) + ", expected " +
                                       std::to_string(values[i]));
      }
    }
  }
}

}  // namespace
}  // namespace chorus::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  chorus::fuzz::run_one(data, size);
  return 0;
}
