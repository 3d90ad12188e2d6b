#pragma once

// chorus::sim — a deterministic simulator of N ranks inside one process.
//
// Each rank runs the rank function as ordinary blocking code. Only one rank runs at a time; at
// every chorus API call the running rank yields to a scheduler, and one 64-bit seed decides every
// choice the scheduler makes: which rank runs next and when a collective whose ranks have all
// arrived completes. Same seed, same program -> same interleaving, same bytes.
//
// Hangs become errors: a collective no rank can ever complete raises Deadlock (with every rank's
// pending op and call site), ranks that disagree raise CollectiveMismatch (with both sides'
// fingerprints and call sites), a rank that dies gives its peers RankFailure. Deadlines run on
// virtual time, so timeouts are deterministic and instant.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/call_site.hpp"
#include "chorus/runtime.hpp"

namespace chorus::transport {
class Transport;
}

namespace chorus::sim {

// How ranks are multiplexed. Fibers switch in nanoseconds, and ASan and TSan follow them; threads
// (a rank per OS thread, handed one baton) run the same schedule, for a tool that cannot follow
// fiber switches. Auto picks fibers.
enum class ExecutorKind : std::uint8_t { Auto, Fibers, Threads };

// How schedule choices are made (Note [Decision stream], simulator/src/decision_stream.hpp).
// RandomWalk: uniform among the candidates. Pct: PCT with depth `pct_depth` (finds ordering bugs
// of depth d with probability >= 1/(n * k^(d-1))). Portfolio: one of them (and a depth in 1..3)
// picked per run from the seed, for sweeps over many seeds.
enum class Strategy : std::uint8_t { RandomWalk, Pct, Portfolio };

// Where the ranks' CPU tensor storages come from (Note [Simulator allocator],
// simulator/src/sim_allocator.hpp; docs/simulator-alloc.md). Pooled: core's default pool (exact
// size buckets). The others use the simulator's allocator, whose free blocks go back to the rank
// that allocated them: LifoReuse hands back the most recently freed block that fits (the same
// address again and again, to provoke ABA in anything keyed by address); Quarantine keeps a freed
// block unusable, filled with 0xDD, for the rank's next `quarantine_frees` frees, then reuses it
// (a write into it meanwhile is reported); Random picks among the fitting free blocks with the
// decision stream (so a run replays).
enum class AllocatorPolicy : std::uint8_t { Pooled, LifoReuse, Quarantine, Random };

// How a reduction combines its members' contributions (Note [Reduction order modes],
// simulator/src/world.hpp). Whatever the mode, the result is computed once and copied to every
// member, so it is bitwise identical on every rank (as NCCL's are). Fixed: left to right in
// group-rank order. Ring: left to right from a starting member that turns with the chunk of the
// buffer and the operation's sequence number, as NCCL's ring reduces each chunk starting after
// a different rank. Tree: pairwise, ((x0 + x1) + (x2 + x3)). Adversarial: a permutation of the
// members and a tree shape drawn from the decision stream for each reduction, to expose code
// that assumes one order (the choices all 0 give the Fixed order).
enum class ReductionOrder : std::uint8_t { Fixed, Ring, Tree, Adversarial };

// One injected fault (Note [Fault injection], simulator/src/world.hpp). It fires when rank `rank`
// starts its operation number `at_op`: 0-based, counting every transport start of that rank (a
// collective, or a coalesced batch as one); waits and polls do not count.
struct Fault {
  enum class Kind : std::uint8_t {
    // The rank dies as it starts the operation: the call throws RankFailure on that rank (and
    // again at every later call, should it catch the error), and every operation of its
    // communicators still outstanding or yet to come fails with RankFailure on the peers.
    Crash,
    // The operation fails with TransportError on every member where it would have completed
    // (raised at the wait), and later operations of that communicator fail with Aborted.
    TransportError,
    // The operation never completes: every member's wait ends in Timeout at its deadline in
    // virtual time (a watchdog), and later operations of that communicator fail with Aborted.
    // Without a deadline (an infinite timeout) the members get Deadlock instead.
    Hang,
    // The rank stalls for `delay_steps` kStepDuration of virtual time before starting the
    // operation (a slow rank). Peers whose deadline passes meanwhile get Timeout.
    Delay,
  };
  Kind kind = Kind::Crash;
  int rank = 0;
  std::uint64_t at_op = 0;
  std::uint64_t delay_steps = 0;  // Delay only: >= 1

  static Fault crash(int rank, std::uint64_t at_op) { return {Kind::Crash, rank, at_op, 0}; }
  static Fault transport_error(int rank, std::uint64_t at_op) {
    return {Kind::TransportError, rank, at_op, 0};
  }
  static Fault hang(int rank, std::uint64_t at_op) { return {Kind::Hang, rank, at_op, 0}; }
  static Fault delay(int rank, std::uint64_t at_op, std::uint64_t steps) {
    return {Kind::Delay, rank, at_op, steps};
  }
  // "crash at rank 1's operation 2", "delay at rank 0's operation 1 by 40 steps".
  std::string to_string() const;
  friend bool operator==(const Fault&, const Fault&) = default;
};

// Faults drawn from the decision stream (Note [Decision stream]): at each operation a rank starts
// while the window is open (and no explicit fault fires there), one choice among 1'000'000
// decides whether a fault fires there and which; a Delay's length is a second choice. Choice 0 is
// "no fault", so a shrunk choice list drops faults. A fired fault is recorded in
// SimReport::faults_fired as the explicit Fault that reproduces it.
struct RandomFaults {
  // Probability per started operation, in parts per million, of each kind (their sum at most
  // 1'000'000).
  std::uint32_t crash_ppm = 0;
  std::uint32_t transport_error_ppm = 0;
  std::uint32_t hang_ppm = 0;
  std::uint32_t delay_ppm = 0;
  std::uint64_t delay_steps_max = 100;  // a random Delay lasts 1 .. delay_steps_max steps
  // The window: faults are drawn only for operations started while scheduling decisions
  // 0 .. until_step - 1 run (0: no limit) and until `max_faults` of them fired.
  std::uint64_t until_step = 0;
  std::uint64_t max_faults = 1;

  bool enabled() const noexcept {
    return std::uint64_t{crash_ppm} + transport_error_ppm + hang_ppm + delay_ppm > 0 &&
           max_faults > 0;
  }
};

struct SimOptions {
  int world_size = 8;  // 1 .. kMaxWorldSize
  std::uint64_t seed = 0;
  // Virtual time a wait may take before it throws Timeout (positive; sim::run refuses others).
  // The scheduler advances virtual time by kStepDuration per decision; virtual time stops at
  // the clock's last instant rather than wrap.
  std::chrono::nanoseconds timeout = std::chrono::minutes(10);
  // Scheduling decisions before the run is declared livelocked (every unfinished rank gets
  // Deadlock).
  std::uint64_t max_steps = 50'000'000;
  // Decisions after that before a rank that still issues operations (it catches their errors
  // and retries) is stopped: its next operation unwinds it with an exception that no
  // `catch (const chorus::Error&)` or `catch (const std::exception&)` takes, and the rank fails
  // with Deadlock. Time enough for ranks that handle the budget's errors to end.
  std::uint64_t steps_after_budget = 100'000;
  // Auto can be overridden with CHORUS_SIM_EXECUTOR=fibers|threads.
  ExecutorKind executor = ExecutorKind::Auto;
  // Print the seed and a one-line replay command to stderr when a rank fails.
  bool print_failures = true;
  // While the run lasts, a SIGINT (Ctrl-C) writes the virtual time, the rank running (a rank
  // stuck in its own code stalls every rank: the simulator switches only at chorus calls) and
  // the replay command to stderr, then ends the process as SIGINT would. chorus::run sets it.
  // Not when the caller ignores SIGINT.
  bool report_on_interrupt = false;
  // Let the CHORUS_SIM_SEED environment variable override `seed` (the replay command sets it).
  bool seed_from_environment = true;
  // The program's command line (argv[0] first, unquoted) that a replay command reruns after
  // CHORUS_SIM_SEED=<seed>, and after CHORUS_SIM_REPLAY=<token>; empty: this process's whole
  // (command_line()). chorus::run passes its program's without the --seed, and the --replay,
  // flag that the variable overrides, so that the printed command names one seed or one token.
  std::vector<std::string> command_without_seed;
  std::vector<std::string> command_without_replay;
  // Decisions kept in SimReport::schedule (all of them are hashed into schedule_hash).
  std::size_t schedule_record_max = std::size_t{1} << 16;

  // ---- The decision stream (Note [Decision stream], simulator/src/decision_stream.hpp): where
  // every choice comes from. By default a PRNG seeded with `seed`, through `strategy`.
  Strategy strategy = Strategy::RandomWalk;
  int pct_depth = 2;  // PCT's bug depth d, 1 to kPctDepthMax (Strategy::Pct)
  // PCT's estimate k of the run's length in scheduling decisions: its d - 1 change points fall
  // uniformly among the first k (0: 256). Closer to the real length finds bugs more often.
  std::uint64_t pct_steps = 0;
  // Follow these choice indices instead (a replay, or a RapidCheck-generated list; indices are
  // taken modulo the number of options, and every choice past the end is 0).
  std::optional<std::vector<std::uint64_t>> choices;
  // Take choices from raw fuzzer bytes (then from a PRNG seeded with a digest of them).
  std::optional<std::vector<std::uint8_t>> fuzz_bytes;
  // A replay token (SimReport::replay_token) to follow; with seed_from_environment, the
  // CHORUS_SIM_REPLAY environment variable sets it. A token from another format version or build
  // is refused (InvalidArgument).
  std::string replay;
  // Choices kept for SimReport::choices and the replay token (a longer run has no token).
  std::size_t choices_record_max = std::size_t{1} << 20;
  // Hash every collective's output bytes at completion into SimReport::data_hash.
  bool hash_data = false;
  // The buffer checks (Note [Buffer checks], simulator/src/world.hpp): pending
  // outputs hold poison until completion, and inputs are checksummed at issue and at completion
  // (InputModified). They read or write every buffer twice more than the collective does; off
  // only for measuring throughput (`chorus bench`), where early reads and modified inputs then go
  // unnoticed.
  bool check_buffers = true;

  // ---- Simulated CUDA devices (docs/simulator.md, "Simulated CUDA devices"): each rank r poses
  // as the owner of cuda:r, as a rank on NCCL owns its GPU. local_device() is cuda:r, Device::
  // cuda(r) storages are host memory handed out as device memory (fresh blocks hold 0xA5 bytes,
  // as fresh device memory holds garbage), collectives run on them and their results are
  // waited "on the stream" (the simulator blocks the rank until the collective completed, a
  // stronger order than a real stream's), and core refuses host access to them as on a GPU. So
  // a program's device placement — what it keeps on the device, what it copies back with
  // to(Device::cpu()), which device each tensor is on — is checked before it meets a GPU.
  bool cuda_devices = false;

  // ---- Allocator (docs/simulator-alloc.md): where the ranks' tensor storages come from.
  AllocatorPolicy allocator = AllocatorPolicy::Pooled;
  // AllocatorPolicy::Pooled: the bytes each rank's pool keeps (RankOptions::host_pool_bytes_max;
  // with guard pages, the simulator's page pool: docs/simulator-alloc.md; `chorus bench` raises it
  // to keep its largest outputs).
  std::size_t host_pool_bytes_max = std::size_t{64} << 20;
  // AllocatorPolicy::Quarantine: how many later frees of its rank a freed block waits out.
  std::size_t quarantine_frees = 16;
  // Guard pages: every storage gets whole pages, and from issue to completion each pending output
  // the simulator's allocator made is mprotect'ed PROT_NONE, so touching it without waiting (a
  // raw unsafe_data_ptr() access) faults; the simulator then prints which rank touched which
  // collective's output (op, seq, group, call site) at which step, and aborts the process.
  // Outputs wrapping caller memory (from_blob) are not guarded. Installs a process-wide SIGSEGV
  // handler (other faults go to the previous handler). Refused (InvalidArgument) in ASan/TSan
  // builds, whose runtimes own SIGSEGV.
  bool guard_pending_outputs = false;

  // ---- Reduction order (Note [Reduction order modes], simulator/src/world.hpp).
  // The order of every reduction (all_reduce, reduce_scatter, reduce; every ReduceOp; batched
  // and coalesced operations). Adversarial draws its choices from the decision stream, so a
  // replay token replays the orders too when run with the same mode; the other modes draw none.
  ReductionOrder reduction_order = ReductionOrder::Fixed;

  // ---- Faults (Note [Fault injection], simulator/src/world.hpp; docs/simulator-faults.md).
  // After a fault every rank ends, never hangs: peers get RankFailure, TransportError, Timeout
  // or Aborted (Deadlock for a hang nobody waits on with a deadline) naming the rank, op,
  // sequence number and group. An invalid plan (a rank outside the world, a Delay of 0 steps,
  // probabilities above 1'000'000 ppm in all) makes sim::run throw InvalidArgument.
  std::vector<Fault> faults;   // explicit faults, each firing at most once
  RandomFaults random_faults;  // drawn from the decision stream only when enabled()
  // The liveness phase (0: off): once no fault can fire any more (every explicit fault fired or
  // its rank ended, and the random window closed) and none is in effect (no rank delayed, no
  // hung operation left that a wait has not timed out), every rank must finish within this many
  // scheduling decisions. Else the run ends: outstanding operations fail with Deadlock naming
  // the stuck ranks and what each is blocked on, later ones too, and SimReport::stuck_ranks
  // lists them.
  std::uint64_t liveness_steps = 0;

  // ---- Events and timelines (docs/simulator-timeline.md): what each rank did, when, for
  // SimReport::events, to_perfetto_json and to_svg_timeline. Off by default: the log costs an
  // allocation or two per event.
  bool record_events = false;
  // Events kept in SimReport::events; later ones are counted in SimReport::events_not_recorded.
  std::size_t events_record_max = std::size_t{1} << 20;
  // When non-empty, the run's SVG timeline (to_svg_timeline) / Chrome trace JSON
  // (to_perfetto_json) is written to this file at the end of the run, failing or not; either one
  // turns record_events on. With seed_from_environment, CHORUS_SIM_TIMELINE / CHORUS_SIM_TRACE
  // set them. A path that cannot be written (its directory missing or read-only, the file
  // read-only) throws InvalidArgument before the run; a write that fails at the end (a full disk)
  // throws it after the run.
  std::string timeline_path;
  std::string trace_path;

  // ---- Finalization (docs/simulator-finalize.md): when core finalizes a result dropped
  // un-waited (Note [Work lifecycle], core/src/detail/work_registry.hpp). A real runtime does
  // not fix that moment (a garbage collector's timing). When true, each such drop on a simulated
  // rank takes one choice of the decision stream: 0 finalizes it at once, as when off (so
  // shrinking a failing list goes toward it; mark "finalize.now"); 1 defers it to the rank's
  // next collective, wait_tensor, wait_tensors or work_registry_size call, or to its end (mark
  // "finalize.deferred"), where a failure of the operation is then raised. It is still reported
  // once, as dropped, with its call site. Off: no choice is drawn.
  bool choose_finalization = false;

  // ---- Test hook: when set, each rank's transport is this function of the simulator's (the
  // rank's transport in every chorus call), so a test can plant a transport bug — a wrong
  // reduction on one rank, a work that reports completion before its data is written — and check
  // that a property catches it. Not part of the run shape: a replay must set it again.
  std::function<std::shared_ptr<transport::Transport>(std::shared_ptr<transport::Transport>)>
      wrap_transport;
};

// Spellings of the option enums, shared by the launcher's flags (--strategy=pct), replay
// tokens' run shapes and marks ("reduction.tree", "fault.crash").
std::string_view name(Strategy strategy) noexcept;       // random, pct, portfolio
std::string_view name(ReductionOrder order) noexcept;    // fixed, ring, tree, adversarial
std::string_view name(AllocatorPolicy policy) noexcept;  // pooled, lifo, quarantine, random
std::string_view name(Fault::Kind kind) noexcept;        // crash, transport_error, hang, delay

// Every value of the option enums that a flag or a token names, in declaration order.
inline constexpr std::array kStrategies{Strategy::RandomWalk, Strategy::Pct, Strategy::Portfolio};
inline constexpr std::array kReductionOrders{ReductionOrder::Fixed, ReductionOrder::Ring,
                                             ReductionOrder::Tree, ReductionOrder::Adversarial};
inline constexpr std::array kAllocatorPolicies{AllocatorPolicy::Pooled, AllocatorPolicy::LifoReuse,
                                               AllocatorPolicy::Quarantine,
                                               AllocatorPolicy::Random};
inline constexpr std::array kFaultKinds{Fault::Kind::Crash, Fault::Kind::TransportError,
                                        Fault::Kind::Hang, Fault::Kind::Delay};

// The value among `values` that name() spells `spelling` (named("tree", kReductionOrders));
// nullopt for any other text.
template <class Enum, std::size_t N>
std::optional<Enum> named(std::string_view spelling, const std::array<Enum, N>& values) noexcept {
  for (const Enum value : values) {
    if (name(value) == spelling) {
      return value;
    }
  }
  return std::nullopt;
}

// The spellings of `values`, in order, joined by ", " ("fixed, ring, tree, adversarial"): what a
// message about an unknown name offers instead.
template <class Enum, std::size_t N>
std::string spelled(const std::array<Enum, N>& values) {
  std::string joined;
  for (const Enum value : values) {
    joined += (joined.empty() ? "" : ", ") + std::string(name(value));
  }
  return joined;
}

// The seed a run with `options` uses (SimReport::seed): CHORUS_SIM_SEED when
// options.seed_from_environment and the variable is set (it wins over `seed`), else
// options.seed. For a program that prints its seed before its run ends. Throws InvalidArgument
// for a malformed variable, as run does. Never blocks.
std::uint64_t resolved_seed(const SimOptions& options);

// This process's command line, each argument quoted for the shell and preceded by a space: what
// a replay command ("CHORUS_SIM_SEED=<seed>" + command_line()) reruns. Read once per process.
std::string command_line();
// `words` in command_line()'s form: each quoted for the shell and preceded by a space.
std::string command_line(std::span<const std::string> words);

inline constexpr int kMaxWorldSize = 1024;
// The longest injected delay, in steps (2^40 us of virtual time, about 12.7 days): longer ones
// would overflow virtual time.
inline constexpr std::uint64_t kDelayStepsMax = std::uint64_t{1} << 40;
inline constexpr std::chrono::nanoseconds kStepDuration = std::chrono::microseconds(1);
// The deepest PCT run takes (SimOptions::pct_depth): d - 1 change points are drawn up front, and
// the bugs PCT is for need d of 1 to 3; a deeper one is a mistyped option, not a search.
inline constexpr int kPctDepthMax = 64;

using chorus::UnwaitedWork;

// One choice of the scheduler.
struct Decision {
  enum class Kind : std::uint8_t {
    RunRank,     // resume `rank` until its next chorus call
    CompleteOp,  // complete operation `seq` of communicator `comm_id` on all its ranks
  };
  Kind kind = Kind::RunRank;
  int rank = -1;
  std::uint64_t comm_id = 0;
  std::int64_t seq = -1;

  std::string to_string() const;  // "run 3" / "complete comm 2 #5"
  friend bool operator==(const Decision&, const Decision&) = default;
};

// One thing a rank did, in the order the simulator saw it (SimOptions::record_events).
struct SimEvent {
  enum class Kind : std::uint8_t {
    Issue,      // the rank started the operation (a transport call)
    Arrive,     // its arrival was registered at the operation's rendezvous
    Complete,   // the scheduler completed the operation (the bytes moved, on every member)
    WaitBegin,  // the rank blocked waiting for the operation (possibly another rank's)
    WaitEnd,    // ... and was woken (completed, failed or timed out)
    Drop,       // every result tensor of the operation died before a wait (core's drop)
    Finalize,   // core completed the operation nobody waited (after a drop or at rank exit)
    Fail,       // the operation failed on this rank
    // The rank's function ended. No operation: op and group empty, seq -1, comm_id 0, owner the
    // rank, site unknown. detail: "returned", "threw <what the error says>", or the injected
    // crash's description ("rank 3 crashed (injected fault: ...)").
    End,
  };
  Kind kind = Kind::Issue;
  std::uint64_t step = 0;            // scheduling decisions taken before it
  std::chrono::nanoseconds time{0};  // virtual time
  int rank = -1;                     // the rank it happened on
  std::string op;                    // "all_reduce", "all_reduce_coalesced", ...
  std::uint64_t comm_id = 0;         // the communicator (Decision::comm_id)
  std::string group;                 // its label: "[0, 1]" or "'tp' [0, 1]"
  std::int64_t seq = -1;             // the operation's number on that communicator
  int owner = -1;                    // whose work it is (a rank may wait on another's tensor)
  CallSite site;                     // where the owner issued it
  // Fail: the error ("Timeout: ..."); Finalize: "at rank exit" or "after a drop", plus
  // ", failed" when completing it failed.
  std::string detail;

  // "step 12 t=12us rank 1 complete all_reduce #0 on [0, 1] (a.cpp:3 (f))"; for End
  // "step 40 t=40us rank 1 end: returned".
  std::string to_string() const;
};

// "issue", "arrive", "complete", "wait_begin", "wait_end", "drop", "finalize", "fail", "end".
std::string_view event_kind_name(SimEvent::Kind kind) noexcept;

struct SimReport {
  // What made the run's choices: its seed, or a decision list (SimOptions::choices, which a replay
  // token sets), where `seed` played no part, or fuzzer bytes (SimOptions::fuzz_bytes), where
  // `seed` gives PCT its priorities and change points (Strategy::Pct) and plays no other part.
  enum class ChoiceSource { Seed, List, FuzzBytes };

  int world_size = 0;
  std::uint64_t seed = 0;  // the seed actually used (ChoiceSource::Seed; FuzzBytes under PCT)
  ChoiceSource choice_source = ChoiceSource::Seed;
  std::uint64_t steps = 0;          // scheduling decisions taken
  std::uint64_t schedule_hash = 0;  // digest of every decision: same seed -> same hash
  std::vector<Decision> schedule;   // the first SimOptions::schedule_record_max decisions
  std::uint64_t collectives_completed = 0;
  std::chrono::nanoseconds virtual_time{0};
  std::vector<UnwaitedWork> unwaited;    // every rank's, in rank order
  std::vector<std::string> rank_errors;  // per rank: what() of its uncaught error, or empty
  std::exception_ptr first_error;        // the first rank error the simulator saw, or null
  int first_error_rank = -1;             // the rank that raised first_error, or -1
  // Reruns this exact schedule: "CHORUS_SIM_SEED=<seed> <command line>" (CHORUS_SIM_REPLAY=<token>
  // for a list-driven run) when the run reads the environment (seed_from_environment), else
  // "(set SimOptions::seed = <seed>: ...)" or "(set SimOptions::replay = \"<token>\": ...)".
  std::string replay_command;
  Strategy strategy = Strategy::RandomWalk;  // the strategy used (Portfolio resolved)
  std::vector<std::uint64_t> choices;  // every choice index, in order (Note [Decision stream])
  bool choices_exhausted = false;      // a recorded list ran out (later choices were 0)
  std::string replay_token;            // follows exactly these choices; empty if too long
  std::uint64_t data_hash = 0;         // with SimOptions::hash_data: every output's bytes
  // Named marks the simulator passed, with how often: each fault kind, strategy, allocator
  // policy and reduction order leaves one where it acts ("fault.crash", "strategy.pct", ...), so a
  // test can assert that the mechanism it means to exercise actually fired.
  std::map<std::string, std::uint64_t, std::less<>> marks;

  // ---- Faults (SimOptions::faults, random_faults, liveness_steps).
  std::vector<Fault> faults_fired;  // in firing order; random ones as the explicit Fault
  std::vector<int> stuck_ranks;     // ranks that broke the liveness phase's budget, ascending

  // ---- Events and timelines
  std::vector<std::uint64_t> ops_issued;  // per rank: operations it started (always counted)
  std::vector<SimEvent> events;           // with SimOptions::record_events, in order
  std::uint64_t events_not_recorded = 0;  // past SimOptions::events_record_max

  bool ok() const noexcept;  // no rank ended in an error
  // "seed 3", "following a decision list" or "choices from fuzzer bytes" (under PCT: ", PCT
  // priorities from seed 3"), as the report's, the trace's and the SVG timeline's headers say it.
  std::string choice_source_text() const;
  // How often the mark `name` was passed (0: never).
  std::uint64_t mark_count(std::string_view name) const;
  // The run report: ranks, operations per rank, decisions, collectives, injected faults, stuck
  // ranks, unwaited works with their call sites, errors, replay command.
  std::string to_string() const;
};

// Runs `rank_main` once on each of options.world_size simulated ranks and returns the report.
// Returns normally when every rank returned (including ranks that caught their errors). When a
// rank ends in an uncaught exception, every other rank still runs to its end (peers waiting on it
// get RankFailure), the failure is printed with the seed and a replay command, and the first
// rank error (in the order the simulator saw them) is rethrown. Throws InvalidArgument for a
// world size outside [1, kMaxWorldSize], other options out of range, and a timeline or trace
// path that cannot be written (SimOptions::timeline_path). When the system refuses a rank its
// stack or thread
// (an address-space limit, too many threads), no rank runs and the system's error propagates
// (std::bad_alloc, std::system_error). Not reentrant from inside a rank.
SimReport run(const SimOptions& options, std::function<void()> rank_main);

// Runs the program twice with the same options (and hash_data on) and compares the decision
// hash, the choices and the data hash. `deterministic` is false, with `difference` saying what
// differed, when the program's behaviour depends on something outside the simulator's control
// (wall-clock time, addresses, unsynchronised threads, global state kept across runs).
struct DeterminismCheck {
  bool deterministic = true;
  std::string difference;
  SimReport first;
  SimReport second;
};
DeterminismCheck check_determinism(const SimOptions& options, std::function<void()> rank_main);

// A failing run reduced to a minimal schedule (Note [Schedule shrinking]).
struct ShrinkResult {
  SimReport minimal;                   // the run of the smallest failing choice list found
  std::vector<std::uint64_t> choices;  // that list (every later choice is 0)
  std::string replay_token;            // replays it (SimOptions::replay, CHORUS_SIM_REPLAY)
  std::size_t attempts = 0;            // runs tried
  std::string timeline;                // timeline_text(minimal)
};

// Shrinks `failing` (a report of running `rank_main` with `options` that failed) by delta
// debugging over its choice list: the result fails the same way (the same failing ranks, the
// first error of the same type) with as short and small a list as `max_attempts` runs find.
// Only the minimal run writes options.timeline_path / trace_path, or, with
// seed_from_environment, CHORUS_SIM_TIMELINE / CHORUS_SIM_TRACE over them (the attempts read
// neither). Throws InvalidArgument if `failing` did not fail or holds no choice list
// (SimOptions::choices_record_max exceeded).
ShrinkResult shrink(const SimOptions& options, const std::function<void()>& rank_main,
                    const SimReport& failing, std::size_t max_attempts = 2000);

// A per-rank text timeline of a run's schedule: one line per decision, one column per rank
// ("run" when the rank was resumed) and one for completions ("comm 2 #0"); with an event log
// (SimOptions::record_events; shrink records one for its minimal run), each rank's events in
// order; then the errors.
std::string timeline_text(const SimReport& report);

// The run's events (SimReport::events) as Chrome trace event JSON, for Perfetto
// (ui.perfetto.dev) or chrome://tracing: one thread per rank ("rank r"), a span ("ph":"X") per
// operation from issue to completion or failure and per wait, instants ("ph":"i") for arrive,
// drop, finalize and fail; timestamps in microseconds of virtual time; args with seq, group, owner
// and call site. Deterministic: the same run gives the same bytes. Empty "traceEvents" without
// SimOptions::record_events.
std::string to_perfetto_json(const SimReport& report);

// The same lanes drawn as a standalone SVG image: one lane per rank, a box per operation (red
// when it failed) and per wait, markers for drops and finalizations, labels and a legend.
// Deterministic: the same run gives the same bytes.
std::string to_svg_timeline(const SimReport& report);

// As run(), but never rethrows a rank's error: it is in the report (first_error, rank_errors).
// For harnesses that want the report of a failing run (schedule, unwaited works).
SimReport simulate(const SimOptions& options, std::function<void()> rank_main);

}  // namespace chorus::sim
