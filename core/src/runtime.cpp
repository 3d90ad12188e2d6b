#include "chorus/runtime.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/transport/group_label.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "chorus/transport/transport.hpp"
#include "detail/group_internal.hpp"
#include "detail/rank_state.hpp"

namespace chorus {
namespace {

// The rank bound to this OS thread. Executors that multiplex ranks on one thread (fibers) rebind
// at every switch (RankContext::bind), so this is per rank, not per process.
//
// Note [Thread-locals in initial-exec]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The libraries are built position-independent (they may end up in a shared object), so a
// thread_local takes the general-dynamic model by default: a __tls_get_addr call that the linker
// rewrites, in an executable, into a load of the thread pointer and an add, three instructions an
// access. The simulator reads and rebinds this one, and its own current rank
// (simulator/src/world.cpp), at every rank step. In the initial-exec model an access is the
// variable's offset and one access through %fs: a shared object that holds them takes static TLS
// room, which any shared object linked at start-up has (one that is dlopen'ed later takes it from
// the loader's small surplus: three words here, 24 bytes).
[[gnu::tls_model("initial-exec")]] thread_local RankContext* current_context = nullptr;

}  // namespace

std::string UnwaitedWork::to_string() const {
  std::string out = "rank " + std::to_string(rank) + ": " + op;
  if (seq >= 0) {
    out += " #" + std::to_string(seq);
  }
  if (!group.empty()) {
    out += " on group " + group;
  }
  out += " issued at " + location.to_string();
  out += at_rank_exit ? " was still pending when the rank ended" : " was dropped un-waited";
  if (!error.empty()) {
    out += "; completing it failed: " + error;
  }
  return out;
}

namespace detail {

RankState::RankState(std::shared_ptr<transport::Transport> transport, RankOptions options)
    : rank_(transport->rank()),
      world_size_(transport->world_size()),
      transport_(std::move(transport)),
      options_(options),
      registry_(std::allocate_shared<WorkRegistry>(transport::RecyclingAllocator<WorkRegistry>{})),
      host_pool_(HostPool::make(options.host_pool_bytes_max)) {
  CHORUS_CHECK_GE(rank_, 0);
  CHORUS_CHECK_LT(rank_, world_size_);
  // Note [Recycled rank states]: the room of an earlier rank's first group, not its contents.
  if (transport::recycling_enabled()) {
    SpareExpandedGroups::take(first_expanded_group_);
    CHORUS_CHECK(first_expanded_group_.ranks.empty() && first_expanded_group_.tag.empty());
  }
}

RankState::~RankState() {
  HostPool::park(std::move(host_pool_));
  if (transport::recycling_enabled()) {  // Note [Recycled rank states]
    first_expanded_group_.tag.clear();
    first_expanded_group_.ranks.clear();
    first_expanded_group_.group_size = 0;
    SpareExpandedGroups::give(first_expanded_group_);
    end_slots();
  }
}

void RankState::end_slots() noexcept {
  // The slots end here rather than with comms_, each key's member list's room kept
  // (SpareMemberLists; one not kept ends with its node, as with comms_).
  while (!comms_.empty()) {
    auto node = comms_.extract(comms_.begin());
    SpareMemberLists::give(node.key().second);
  }
}

// Note [Reused rank states]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A simulated run makes a RankContext per rank and ends them with the run, run after run on the
// thread that runs the simulation. Beyond the blocks and rooms recycled for it (Note [Recycled
// rank states]), a fresh RankState allocated and freed again, per rank and run, its device byte
// count and its streams (two shared_ptrs), and built chorus::world()'s list (~4,000 instructions a
// schedule of 4 ranks, with the block and room handling), and ended and made again its
// communicator slots (~1,500 more). So a RankContext that ends parks its state on its thread
// (SpareRankStates in RankContext's code) and the next RankContext made there restarts it
// instead of making one: end_rank() drops everything that belongs to the rank, in the
// destructor's order (host pool parked, communicators, partitions, registry, options,
// transport), resets every value the rank computed (the remembered layout digest and supported
// call, the scratch groups' contents, the trace, finished) to the member's initial value, and
// keeps only
//   - the device byte count and the streams, where nothing else holds them (no block, no work of
//     the rank outlived it): the count is 0 then (checked, else a fresh one is made), and the
//     streams go back to a fresh one's state (CurrentStreams::reset_unshared);
//   - chorus::world()'s list, immutable and the same for every rank of a world size: restart()
//     keeps it for a world of its size, else drops it (world_ranks() builds it then);
//   - up to kKeptSlotsMax communicator slots, each without its communicator and back at sequence
//     number 0: the rest of a slot (its key and label) is a function of its key, and a slot that
//     comm_slot finds is used as one it makes (ensure_comm creates the communicator; a partition
//     is set up again, partitions_ being emptied), so a kept one is the slot a fresh state would
//     make, without the key, the node and the label made again (and last_key_ and last_slot_
//     keep pointing at it). More slots than that end, so that a program that names new groups
//     run after run does not grow the map;
//   - world_slot, where its slot is kept, with what it comes with (Note [Repeated world calls]):
//     the first scratch group's expansion of world(), a function of the world's size, as the
//     world list; restart() drops all three for a world of another size. A rank's first call on
//     world() then takes the slot as its later calls do, instead of expanding the group and
//     looking the slot up;
//   - room: the scratch groups' and count lists' heap blocks, emptied.
// restart() then sets what the constructor sets from its arguments, allocating the new registry
// and host pool first, so that running out of memory leaves a state that can still be destroyed.
// Only room and values that a fresh state would compute identically travel between runs. The
// RankStateReuse tests in core_api_test check that a restarted state holds every value a fresh
// one holds (expect_fresh) and makes its communicators again from sequence 0, that world()'s
// list and slot are kept for a world of its size only, and that streams a work still holds and
// the states of worlds above kReusedWorldSizeMax are not kept; and that what end_rank() drops is
// gone (a partition set up again, world()'s slot made again after more than kKeptSlotsMax
// slots, the transport ended with its context, no trace scope). A member
// added to RankState must be reset in end_rank() (or be one of the kept ones above). Off where
// recycling is off (recycling_enabled()), as every recycled block, and for a world larger than
// kReusedWorldSizeMax: a kept state keeps room that grows with the world's size (its slots' keys
// and labels, the scratch groups and count lists), up to kRecycledBlocksMax states a thread, and
// a rank of a large job, which makes one state, must not keep it after it (Note [Recycled rooms]
// caps rooms for the same reason): its state ends, as before reuse.
void RankState::end_rank() noexcept {
  HostPool::park(std::move(host_pool_));
  if (comms_.size() <= kKeptSlotsMax) {
    for (auto& entry : comms_) {
      entry.second.comm.reset();
      entry.second.next_seq = 0;
    }
  } else {
    end_slots();
    last_key_ = nullptr;
    last_slot_ = nullptr;
    world_slot = nullptr;
  }
  partitions_.clear();
  if (world_slot == nullptr) {  // else it stays with world()'s expansion, both kept
    first_expanded_group_.tag.clear();
    first_expanded_group_.ranks.clear();
    first_expanded_group_.group_size = 0;
  }
  for (const std::unique_ptr<ExpandedGroup>& group : nested_expanded_groups_) {
    group->tag.clear();
    group->ranks.clear();
    group->group_size = 0;
  }
  expanded_groups_in_use_ = 0;
  last_supported.reset();
  digested_layout.reset();
  digested_dim = 0;
  layout_digest = 0;
  digested_numel = 0;
  digested_contiguous = false;
  digested_contiguous_strides = false;
  send_counts_scratch.clear();
  recv_counts_scratch.clear();
  finished = false;
  trace = nullptr;
  // use_count() reads the count relaxed, which orders nothing; the count is reused only where
  // its acquire load reads 0, the value after every block's deleter (perhaps on another thread)
  // took its bytes off, and it is only ever accessed atomically. The streams order themselves
  // (CurrentStreams::reset_unshared). No fence: GCC's ThreadSanitizer refuses one.
  if (device_bytes_.use_count() != 1 || device_bytes_->load(std::memory_order_acquire) != 0) {
    device_bytes_.reset();  // restart() makes a fresh one
  }
  if (streams_.use_count() == 1) {
    streams_->reset_unshared();
  } else {
    streams_.reset();  // restart() makes a fresh one
  }
  registry_.reset();
  options_ = RankOptions{};
  transport_.reset();
}

void RankState::restart(std::shared_ptr<transport::Transport> transport, RankOptions options) {
  std::shared_ptr<WorkRegistry> registry =
      std::allocate_shared<WorkRegistry>(transport::RecyclingAllocator<WorkRegistry>{});
  std::shared_ptr<HostPool> host_pool = HostPool::make(options.host_pool_bytes_max);
  if (device_bytes_ == nullptr) {
    device_bytes_ = std::allocate_shared<std::atomic<std::size_t>>(
        transport::RecyclingAllocator<std::atomic<std::size_t>>{}, 0);
  }
  if (streams_ == nullptr) {
    streams_ =
        std::allocate_shared<CurrentStreams>(transport::RecyclingAllocator<CurrentStreams>{});
  }
  rank_ = transport->rank();
  world_size_ = transport->world_size();
  CHORUS_CHECK_GE(rank_, 0);
  CHORUS_CHECK_LT(rank_, world_size_);
  if (world_ranks_ != nullptr && world_ranks_->size() != static_cast<std::size_t>(world_size_)) {
    world_ranks_.reset();
    world_slot = nullptr;  // Note [Repeated world calls]: its expansion is another world's
    first_expanded_group_.tag.clear();
    first_expanded_group_.ranks.clear();
    first_expanded_group_.group_size = 0;
  }
  transport_ = std::move(transport);
  options_ = std::move(options);
  registry_ = std::move(registry);
  host_pool_ = std::move(host_pool);
}

const std::shared_ptr<const std::vector<int>>& RankState::world_ranks() {
  if (world_ranks_ == nullptr) {
    build_world_ranks();
  }
  return world_ranks_;
}

// Note [Shared world lists]
// chorus::world() hands out 0, 1, ..., W - 1, and every collective that names it copies the list's
// shared_ptr into its group and releases it when the call ends (~20 instructions a collective), and
// every rank of every simulated run built the list and gave it back (~190 instructions a rank). The
// list depends on the world size only, so the process keeps one per world size, made at the first
// world() of a rank of that size and never freed, and a rank state holds it through an ownerless
// shared_ptr (the aliasing constructor with an empty owner): copies and releases count nothing, and
// a group that outlives its rank, or its process's other ranks, still points at a live list. A list
// is never freed, so no other list can take its address: Note [Repeated world calls] and
// expand_group_into recognise world() by it. A world() group kept from an earlier run of the same
// size is then recognised too, and it is that run's world as much as this one's: the same ranks,
// valid for this world size. What the process keeps is one list per world size it ran, with its
// group's label: the world's communicator slot of every rank of every run copies it instead of
// formatting "[0, 1, ..., W - 1]" again (~160 instructions a rank).
// Looked up once per rank state, so its lock is once per rank per run: the sizes up to
// kSharedWorldListsFast are then found without it.
namespace {

constexpr int kSharedWorldListsFast = 64;

// A world size's list, and its group's label ("[0, 1, ..., W - 1]", the empty tag's).
struct SharedWorld {
  std::vector<int> ranks;
  transport::GroupLabel label;
};

const SharedWorld& shared_world(int size) {
  CHORUS_CHECK_GT(size, 0);
  static std::array<std::atomic<const SharedWorld*>, kSharedWorldListsFast + 1> fast{};
  if (size <= kSharedWorldListsFast) {
    if (const SharedWorld* world =
            fast[static_cast<std::size_t>(size)].load(std::memory_order_acquire)) {
      return *world;
    }
  }
  static std::mutex mutex;
  // Never destroyed: a group may still point into a list while static objects end.
  static auto* const worlds = new std::map<int, std::unique_ptr<const SharedWorld>>();
  const std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<const SharedWorld>& world = (*worlds)[size];
  if (world == nullptr) {
    std::vector<int> ranks(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      ranks[static_cast<std::size_t>(r)] = r;
    }
    transport::GroupLabel label = transport::group_label("", ranks);
    world = std::make_unique<const SharedWorld>(SharedWorld{std::move(ranks), std::move(label)});
  }
  if (size <= kSharedWorldListsFast) {
    fast[static_cast<std::size_t>(size)].store(world.get(), std::memory_order_release);
  }
  return *world;
}

}  // namespace

void RankState::build_world_ranks() {
  world_ranks_ = std::shared_ptr<const std::vector<int>>(std::shared_ptr<const void>(),
                                                         &shared_world(world_size_).ranks);
}

ExpandedGroup& RankState::push_expanded_group() {
  if (expanded_groups_in_use_ == 0) {
    ++expanded_groups_in_use_;
    return first_expanded_group_;
  }
  const std::size_t nested = expanded_groups_in_use_ - 1;
  if (nested == nested_expanded_groups_.size()) {
    nested_expanded_groups_.push_back(std::make_unique<ExpandedGroup>());
  }
  ++expanded_groups_in_use_;
  return *nested_expanded_groups_[nested];
}

void RankState::pop_expanded_group([[maybe_unused]] std::size_t index) noexcept {
  // Calls end in reverse order: each gives its group back when it ends (Call's lease, its one
  // user), so this is core's own invariant, checked in debug builds only (as Note [A call's own
  // checks] in collectives.cpp); it ran at every collective.
  CHORUS_DCHECK_EQ(index + 1, expanded_groups_in_use_);
  --expanded_groups_in_use_;
}

CommSlot& RankState::comm_slot(const std::string& tag, std::span<const int> members) {
  if (last_key_ != nullptr && last_key_->first == tag &&
      std::ranges::equal(last_key_->second, members)) {
    return *last_slot_;
  }
  // Note [Recycled rank states]: the room of an earlier rank's key, not its contents.
  std::vector<int> key_members = SpareMemberLists::take();
  key_members.assign(members.begin(), members.end());
  CommKey key{tag, std::move(key_members)};
  auto [it, inserted] = comms_.try_emplace(std::move(key));
  if (!inserted) {
    SpareMemberLists::give(key.second);  // try_emplace leaves the key of a slot it finds untouched
  }
  CommSlot& slot = it->second;
  if (slot.label.empty()) {
    // The world's group, world() or its list spelled out: its label made once for the process
    // (Note [Shared world lists]).
    if (const SharedWorld* world =
            tag.empty() && members.size() == static_cast<std::size_t>(world_size_)
                ? &shared_world(world_size_)
                : nullptr;
        world != nullptr && std::ranges::equal(members, world->ranks)) {
      slot.label = world->label;
    } else {
      slot.label = transport::group_label(tag, it->first.second);
    }
  }
  last_key_ = &it->first;
  last_slot_ = &slot;
  return slot;
}

transport::Comm& RankState::ensure_comm(CommSlot& slot, const std::string& tag,
                                        std::span<const int> members) {
  if (!slot.comm) {
    slot.comm = transport_->create_comm(tag, std::vector<int>(members.begin(), members.end()));
    CHORUS_CHECK(slot.comm != nullptr);
    CHORUS_CHECK(std::ranges::equal(slot.comm->ranks(), members));
  }
  return *slot.comm;
}

transport::Comm& RankState::ensure_partition_comm(CommSlot& slot, const std::string& tag,
                                                  std::span<const int> members,
                                                  std::span<const int> parts, int part_size) {
  CHORUS_CHECK_GT(part_size, 0);
  CHORUS_CHECK_EQ(parts.size(), static_cast<std::size_t>(world_size_));
  CHORUS_CHECK_EQ(parts.size() % static_cast<std::size_t>(part_size), 0u);
  CHORUS_CHECK_EQ(members.size(), static_cast<std::size_t>(part_size));
  const PartitionKey key{tag, part_size, parts};
  if (partitions_.find(key) == partitions_.end()) {
    // Note [Partitioned groups]: the first operation on this partition, on every world rank.
    transport::Partition partition;
    const auto size = static_cast<std::size_t>(part_size);
    for (std::size_t start = 0; start < parts.size(); start += size) {
      const std::span<const int> part = parts.subspan(start, size);
      if (std::ranges::equal(part, members)) {
        partition.index = static_cast<int>(partition.parts.size());
      }
      partition.parts.emplace_back(part.begin(), part.end());
    }
    CHORUS_CHECK_EQ(partition.problem(world_size_, rank_), std::string());
    // Recorded before the transport creates it, and taken back if that fails: running out of
    // memory recording it afterwards would leave this rank alone believing it has yet to create
    // it, so its next operation would create it again, on this rank only (a hang).
    const auto entry =
        partitions_
            .insert(PartitionEntry{tag, part_size, std::vector<int>(parts.begin(), parts.end())})
            .first;
    std::shared_ptr<transport::Comm> comm;
    try {
      comm = transport_->create_partition_comm(tag, partition, slot.comm);
    } catch (...) {
      partitions_.erase(entry);
      throw;
    }
    CHORUS_CHECK(comm != nullptr);
    if (slot.comm) {
      CHORUS_CHECK(comm == slot.comm);
    } else {
      CHORUS_CHECK(std::ranges::equal(comm->ranks(), members));
      slot.comm = std::move(comm);
    }
  }
  CHORUS_CHECK(slot.comm != nullptr);
  return *slot.comm;
}

void RankState::settle_unwaited_now() {
  if (std::uncaught_exceptions() == 0) {
    registry_->complete_deferred_drops();
  }
  registry_->settle_stream_waits();
  raise_deferred_error();
}

void RankState::raise_deferred_error() {
  if (std::exception_ptr error = registry_->take_deferred_error()) {
    std::rethrow_exception(error);
  }
}

}  // namespace detail

namespace {

// Ends a RankState made in a recycled block (make_rank_state).
struct RecycledRankStateDelete {
  void operator()(detail::RankState* state) const noexcept {
    state->~RankState();
    transport::RecyclingAllocator<detail::RankState>{}.deallocate(state, 1);
  }
};
// Note [Reused rank states]: the states of the ranks that ended on this thread, kept for the next
// RankContexts made on it; the thread's end destroys those still kept.
using SpareRankState = std::unique_ptr<detail::RankState, RecycledRankStateDelete>;
struct SpareRankStatesTag {};
using SpareRankStates =
    transport::RecycledObjects<SpareRankState, transport::kRecycledBlocksMax, SpareRankStatesTag>;

// Note [Recycled rank states]: a RankState in a recycled block, or one that a rank which ended on
// this thread left (Note [Reused rank states]).
std::unique_ptr<detail::RankState> make_rank_state(std::shared_ptr<transport::Transport> transport,
                                                   RankOptions options) {
  if (transport::recycling_enabled()) {
    SpareRankState spare;
    if (SpareRankStates::take(spare)) {
      spare->restart(std::move(transport), std::move(options));  // spare ends it if this throws
      return std::unique_ptr<detail::RankState>(spare.release());
    }
  }
  transport::RecyclingAllocator<detail::RankState> allocator;
  detail::RankState* block = allocator.allocate(1);
  try {
    return std::unique_ptr<detail::RankState>(
        new (block) detail::RankState(std::move(transport), std::move(options)));
  } catch (...) {
    allocator.deallocate(block, 1);
    throw;
  }
}

}  // namespace

RankContext::RankContext(std::shared_ptr<transport::Transport> transport, RankOptions options)
    : state_(make_rank_state(std::move(transport), std::move(options))) {}

RankContext::~RankContext() {
  // finish() normally ran; if not (a launcher bug or an exception between), still never leave a
  // collective dangling.
  if (!state_->finished) {
    state_->streams()->reset();
    state_->registry()->complete_all_at_exit();
  }
  // Note [Recycled rank states]: the block goes back to this thread's list (state_'s own delete
  // would free it), or the state to this thread's spare states (Note [Reused rank states]).
  SpareRankState state(state_.release());
  if (transport::recycling_enabled() &&
      state->world_size() <= detail::RankState::kReusedWorldSizeMax) {
    state->end_rank();
    SpareRankStates::give(state);  // moved from when kept; else `state` ends it
  }
}

int RankContext::rank() const noexcept { return state_->rank(); }
int RankContext::world_size() const noexcept { return state_->world_size(); }
transport::Transport& RankContext::transport() noexcept { return state_->transport(); }

bool RankContext::list_drops(bool on) noexcept { return state_->registry()->list_drops(on); }

RankContext::Summary RankContext::finish() noexcept {
  CHORUS_CHECK(!state_->finished);
  // What the rank left pending is completed on the legacy default stream, then on the host
  // (Note [Current stream]): the streams its function set may be destroyed by now.
  state_->streams()->reset();
  state_->registry()->complete_all_at_exit();
  state_->finished = true;
  CHORUS_CHECK_EQ(state_->registry()->size(), 0u);
  Summary summary;
  try {
    summary.unwaited = state_->registry()->unwaited();
  } catch (...) {
    // Out of memory copying the report: keep going, the rank still ends cleanly.
  }
  summary.error = state_->registry()->take_deferred_error();
  return summary;
}

RankContext* RankContext::current() noexcept { return current_context; }

RankContext* RankContext::bind(RankContext* context) noexcept {
  RankContext* previous = current_context;
  current_context = context;
  return previous;
}

}  // namespace chorus
