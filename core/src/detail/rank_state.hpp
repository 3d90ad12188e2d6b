#pragma once

// Everything chorus keeps for one rank (behind RankContext's public face).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/device.hpp"
#include "chorus/dtype.hpp"
#include "chorus/group.hpp"
#include "chorus/reduce_op.hpp"
#include "chorus/runtime.hpp"
#include "chorus/tensor.hpp"
#include "chorus/transport/group_label.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "chorus/transport/transport.hpp"
#include "detail/current_streams.hpp"
#include "detail/host_pool.hpp"
#include "detail/work_registry.hpp"

namespace chorus {
class TraceScope;
}

namespace chorus::detail {

// A communicator as core tracks it: created lazily at the first collective that passes
// validation (creation is collective on real transports, so a rank must not create one for an
// op it then rejects), and the sequence counter of Note [Transport contract].
struct CommSlot {
  std::shared_ptr<transport::Comm> comm;
  std::int64_t next_seq = 0;
  transport::GroupLabel label;  // "[0, 1]" or "'tag' [0, 1]" (Note [Shared group labels])
};

class RankState {
 public:
  RankState(std::shared_ptr<transport::Transport> transport, RankOptions options);
  // Parks the host pool for the next rank on this thread (Note [Spare host pools]).
  ~RankState();
  RankState(const RankState&) = delete;
  RankState& operator=(const RankState&) = delete;

  // Note [Reused rank states]: end_rank() drops everything of the rank that ended (its
  // transport, options, registry, communicators and every value it computed), keeping only what
  // a fresh state would make again identically, and empty room; restart() makes the state the
  // one the constructor would make for `transport` and `options`. Throws as the constructor
  // does; the state may be destroyed afterwards either way.
  void end_rank() noexcept;
  void restart(std::shared_ptr<transport::Transport> transport, RankOptions options);

  // The largest world whose ranks' states are reused (Note [Reused rank states]): a kept state
  // keeps room that grows with the world's size, as Note [Recycled rooms] caps what is kept.
  static constexpr int kReusedWorldSizeMax = 64;

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  transport::Transport& transport() noexcept { return *transport_; }
  const std::shared_ptr<transport::Transport>& transport_ptr() const noexcept { return transport_; }
  const RankOptions& options() const noexcept { return options_; }
  const std::shared_ptr<WorkRegistry>& registry() const noexcept { return registry_; }
  const std::shared_ptr<HostPool>& host_pool() const noexcept { return host_pool_; }
  // Bytes of this rank's Device::cuda storages from options().device_memory not yet given back
  // (chorus::device_memory_allocated). Shared: the blocks' deleters may run after the rank.
  const std::shared_ptr<std::atomic<std::size_t>>& device_bytes() const noexcept {
    return device_bytes_;
  }

  // The rank's current stream per CUDA device (Note [Current stream]); shared with its works.
  const std::shared_ptr<CurrentStreams>& streams() const noexcept { return streams_; }
  // The current stream of `device`: null for a device that is not CUDA.
  void* stream_of(Device device) const {
    return device.is_cuda() ? streams_->get(device.index()) : nullptr;
  }

  // The slot of the group (tag, members); `members` holds this rank. Slots live as long as the
  // rank state, which may outlive its run (Note [Reused rank states]): a slot kept for the next
  // rank is back at sequence number 0, without its communicator.
  CommSlot& comm_slot(const std::string& tag, std::span<const int> members);
  // Creates the slot's communicator if it does not exist yet.
  transport::Comm& ensure_comm(CommSlot& slot, const std::string& tag,
                               std::span<const int> members);
  // ensure_comm for a group that is a part of a partition of the world (Note [Partitioned
  // groups]): `parts` holds the partition's parts back to back, each `part_size` ranks long;
  // `members` is the part that holds this rank. At this rank's first operation on (tag, parts)
  // the transport's create_partition_comm runs, even when the slot has its communicator.
  transport::Comm& ensure_partition_comm(CommSlot& slot, const std::string& tag,
                                         std::span<const int> members, std::span<const int> parts,
                                         int part_size);

  // 0, 1, ..., world_size() - 1 (chorus::world()): the process's list for this world size, looked
  // up at the first call and held without a count (Note [Shared world lists]).
  const std::shared_ptr<const std::vector<int>>& world_ranks();
  // That list if world_ranks() looked it up, else null.
  const std::vector<int>* built_world_ranks() const noexcept { return world_ranks_.get(); }

  // The ExpandedGroup a collective expands its group into, one per collective in progress on
  // this rank (calls nest: tracing waits inside a call), and its release when the call is done,
  // in reverse order. Kept from call to call, so their rank lists and tags keep their heap
  // blocks: expanding a group allocates nothing once the rank ran a collective.
  // `index` is where push_expanded_group put it (expanded_groups_in_use() - 1 then).
  ExpandedGroup& push_expanded_group();
  void pop_expanded_group(std::size_t index) noexcept;
  std::size_t expanded_groups_in_use() const noexcept { return expanded_groups_in_use_; }

  // Throws the first error recorded while completing a dropped work, once (Note [Work
  // lifecycle], step 3).
  void raise_deferred_error();
  // At every collective and explicit wait: completes drops deferred during unwinding (unless an
  // exception is in flight now), then raises a deferred error. Inline up to the registry's flags.
  void settle_unwaited() {
    if (registry_->may_need_settling()) {
      settle_unwaited_now();
    }
  }

  // Note [Supported calls]
  // Every collective asks the transport whether it runs its op kind on the input's wire dtype,
  // wire reduction and device (Transport::supports, a virtual call that returns a string).
  // Transport::supports is a function of its arguments, so the rank remembers the last
  // combination the transport accepted, keyed by what the wire ones are made from (the input's
  // dtype and the caller's reduction), and a call that repeats it skips the question.
  struct SupportedCall {
    transport::OpKind kind = transport::OpKind::AllReduce;
    DType dtype = DType::Float32;
    bool reduces = false;
    ReduceOp::Kind reduce_kind = ReduceOp::Kind::Sum;
    std::uint64_t premul_factor_bits = 0;
    Device device;
    friend bool operator==(const SupportedCall&, const SupportedCall&) = default;
  };
  std::optional<SupportedCall> last_supported;

  // Note [Repeated world calls]
  // Most collectives name chorus::world(), call after call. Expanding it into the rank's first
  // scratch group (comparing its tag and ranks with what the group already holds), finding the
  // rank's block and looking up the slot cost ~150 instructions a collective, to learn what the
  // call before found. So the slot of world()'s group is kept here while the first scratch group
  // holds world()'s expansion (its tag in the scratch group): an outermost call on world() whose
  // tag is the one the scratch group holds takes the group, its members (all of it) and this slot
  // as they are. Null otherwise: every outermost call that expands a group clears it before it
  // expands (an expansion that throws leaves the scratch group changed) and sets it afterwards
  // only for world(). Only world()'s list qualifies: it is never freed (Note [Shared world lists]
  // in runtime.cpp), so no other list can take its address, and it is valid by construction
  // (expand_group_into checks no list of it either). Every rank state starts with it null (the
  // member's initializer), one made in a recycled block too (Note [Recycled rank states]); a
  // reused one (Note [Reused rank states]) keeps it only with its slot, emptied of the run's
  // communicator, and world()'s expansion, for a world of the same size: a communicator never
  // outlives its run.
  CommSlot* world_slot = nullptr;

  // Note [Remembered layout digests]
  // Every collective digests its input's sizes into the send buffer (Note [Layout digest] in
  // collectives.cpp): ~30 instructions an all_reduce for a 1-d input, to find the digest the call
  // before found, since a loop of collectives passes tensors of one layout (one tensor, or fresh
  // ones whose contiguous layouts come from the per-thread cache, Note [Shared layouts]). So the
  // rank keeps the last layout it digested, with the dim and the digest: a call whose input has
  // that very layout object and dim takes the digest. The layout is held, not only its address, so
  // no other layout can be made at that address while it is kept; a layout is immutable, so its
  // sizes, and their digest, never change. Dropped with the rank state (or by end_rank(), Note
  // [Reused rank states]): nothing travels between runs.
  std::shared_ptr<const TensorLayout> digested_layout;
  std::int64_t digested_dim = 0;
  std::uint64_t layout_digest = 0;
  // What all_reduce's usual path asks of its input's layout besides the digest, remembered with it
  // for digested_layout (Note [Remembered layout facts] in collectives.cpp): its element count,
  // whether a tensor with it is contiguous (Tensor::is_contiguous), and whether its strides are
  // exactly the contiguous ones (detail::has_contiguous_strides).
  std::int64_t digested_numel = 0;
  bool digested_contiguous = false;
  bool digested_contiguous_strides = false;

  // all_to_all_single's wire count lists, refilled by each call instead of allocated (Note
  // [Reused count lists] in collectives.cpp).
  std::vector<std::size_t> send_counts_scratch;
  std::vector<std::size_t> recv_counts_scratch;

  bool finished = false;
  TraceScope* trace = nullptr;  // the innermost TraceScope, or null when not tracing

 private:
  void settle_unwaited_now();
  // world_ranks()'s first call, once per rank (Note [Shared world lists] in runtime.cpp): out of
  // line, so that chorus::world(), inlined into every collective's caller, stays small.
  [[gnu::noinline]] void build_world_ranks();
  // Ends the communicator slots, each key's member list's room kept (SpareMemberLists).
  void end_slots() noexcept;
  // The communicator slots end_rank() keeps at most (Note [Reused rank states]).
  static constexpr std::size_t kKeptSlotsMax = 4;

  int rank_;
  int world_size_;
  std::shared_ptr<transport::Transport> transport_;
  RankOptions options_;
  // The simulator makes these for every rank of every run: the registry, the device byte count
  // and the streams come from RecyclingAllocator (Note [Recycled blocks]), the host pool from the
  // thread's spare pools (Note [Spare host pools]).
  std::shared_ptr<WorkRegistry> registry_;
  std::shared_ptr<HostPool> host_pool_;
  std::shared_ptr<std::atomic<std::size_t>> device_bytes_ =
      std::allocate_shared<std::atomic<std::size_t>>(
          transport::RecyclingAllocator<std::atomic<std::size_t>>{}, 0);
  std::shared_ptr<CurrentStreams> streams_ =
      std::allocate_shared<CurrentStreams>(transport::RecyclingAllocator<CurrentStreams>{});
  std::shared_ptr<const std::vector<int>> world_ranks_;  // set by world_ranks(), ownerless
  // The outermost call's group inline, nested calls' groups (tracing waits inside a call) each
  // in a block of its own: references stay valid, and a rank allocates none of them up front (a
  // std::deque allocates two blocks when made, per rank and per simulated run).
  ExpandedGroup first_expanded_group_;
  // Note [Recycled rank states]
  // A simulated run makes a RankContext, with its RankState, per rank and ends them with the run,
  // so everything a rank state allocates on its first collective was allocated again every run.
  // The RankState's block (and the simulator's RankContext's) is recycled per thread (Note
  // [Recycled blocks]), and so is the room of its first expanded group (ranks and tag) and of
  // its work registry's list (WorkRegistry::works_, only when it ends with no work listed),
  // allocations of the rank's first collective, and of each communicator key's member list
  // (comms_): the destructor empties them and keeps them for the next RankState (registry) made
  // on the thread, which takes them empty (checked, or, for a member list, by construction: Note
  // [Recycled rooms]). chorus::world()'s list is no rank's: one per world size for the process
  // (Note [Shared world lists]).
  // Only room travels between runs, never a value: a rank sees the state a fresh one would
  // have. Off under AddressSanitizer and while the out-of-memory tests refuse allocations, as
  // every recycled block (recycling_enabled()).
  struct SpareExpandedGroupsTag {};
  using SpareExpandedGroups =
      transport::RecycledObjects<ExpandedGroup, transport::kRecycledBlocksMax,
                                 SpareExpandedGroupsTag>;
  std::vector<std::unique_ptr<ExpandedGroup>> nested_expanded_groups_;
  std::size_t expanded_groups_in_use_ = 0;
  using CommKey = std::pair<std::string, std::vector<int>>;
  // Each run's ranks make their slots anew: the nodes are recycled (Note [Recycled blocks]), and
  // the room of each key's member list (Note [Recycled rank states], Note [Recycled rooms]).
  struct SpareMemberListsTag {};
  using SpareMemberLists = transport::RecycledRooms<std::vector<int>, SpareMemberListsTag,
                                                    transport::kRecycledBlocksMax>;
  std::map<CommKey, CommSlot, std::less<CommKey>,
           transport::RecyclingAllocator<std::pair<const CommKey, CommSlot>>>
      comms_;
  // The partitions this rank has set up (ensure_partition_comm), as (tag, part size, parts back
  // to back); looked up without building a key.
  struct PartitionKey {
    std::string_view tag;
    int part_size = 0;
    std::span<const int> parts;
  };
  struct PartitionEntry {
    std::string tag;
    int part_size = 0;
    std::vector<int> parts;
    PartitionKey key() const noexcept { return {tag, part_size, parts}; }
  };
  struct PartitionLess {
    using is_transparent = void;
    static bool less(const PartitionKey& a, const PartitionKey& b) noexcept {
      if (a.tag != b.tag) {
        return a.tag < b.tag;
      }
      if (a.part_size != b.part_size) {
        return a.part_size < b.part_size;
      }
      return std::ranges::lexicographical_compare(a.parts, b.parts);
    }
    bool operator()(const PartitionEntry& a, const PartitionEntry& b) const noexcept {
      return less(a.key(), b.key());
    }
    bool operator()(const PartitionEntry& a, const PartitionKey& b) const noexcept {
      return less(a.key(), b);
    }
    bool operator()(const PartitionKey& a, const PartitionEntry& b) const noexcept {
      return less(a, b.key());
    }
  };
  std::set<PartitionEntry, PartitionLess> partitions_;
  // The slot comm_slot returned last, and its key (both in comms_, whose nodes never move):
  // consecutive collectives mostly use one group, and comparing is cheaper than building a key.
  const CommKey* last_key_ = nullptr;
  CommSlot* last_slot_ = nullptr;
};

}  // namespace chorus::detail
