#pragma once

// Note [Simulator allocator]
// With SimOptions::allocator other than Pooled, or with guard pages, the host storages of every
// rank (tensor factories, collective outputs) come from one SimAllocator per world, installed as
// each rank's RankOptions::host_allocator. It controls which address a new storage gets:
// - LifoReuse: the most recently freed block that fits (any larger one too), so a storage freed
//   and followed by an allocation gets the same address again and again: anything keyed by
//   address (a cache of "tensors already reduced") meets the ABA problem at once.
// - Quarantine: a freed block is filled with 0xDD and stays unusable for its rank's next
//   `quarantine_frees` frees, or until its ranks ended (check_quarantine: the last ones of a run
//   are checked too); then it is checked (a changed byte is a write after free: mark
//   "alloc.quarantine.overwritten" and a line on stderr) and reused as by LifoReuse.
// - Random: one of the fitting free blocks, picked with the decision stream (only when there is
//   more than one), so a run replays from its seed or choice list like any schedule.
// - Pooled (guard pages only): exact-size reuse, keeping at most SimOptions::host_pool_bytes_max
//   of freed blocks per rank, as core's pool.
// Free blocks go back to the rank that allocated them. A program's address-keyed state lives in
// one process, that is one rank: with per-rank lists a rank gets its own freed block back whatever
// the other ranks did meanwhile. (A world-wide list would hand the block to whichever rank
// allocates next.) The ABA still depends on the schedule for the input of a collective in
// flight: the collective holds its storage, whose block is released only when it completes.
//
// Allocation happens on the rank holding the scheduling turn (one at a time, with the threads
// executor too: the turn's hand-off orders the accesses), so drawing from the decision stream is
// safe. Blocks may be freed on any thread and after the world ended (a tensor kept past run()):
// a mutex guards the lists, and every block's deleter holds the allocator. Draws happen only in
// Random mode, so the other policies leave the choice list as it was.
// Out of memory (tests/simulator/out_of_memory_test.cpp, SimOutOfMemoryAllocator): an allocation
// that throws std::bad_alloc after taking a block gives it back, and a free never fails (a block
// the quarantine cannot list is reusable at once; a mark that cannot be counted is lost).

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/runtime.hpp"
#include "chorus/sim/sim.hpp"

namespace chorus::sim::detail {

class DecisionStream;

class SimAllocator final : public HostAllocator, public std::enable_shared_from_this<SimAllocator> {
 public:
  struct Config {
    AllocatorPolicy policy = AllocatorPolicy::LifoReuse;
    std::size_t quarantine_frees = 16;
    bool whole_pages = false;  // page-aligned blocks of whole pages (guard pages)
    int world_size = 1;
    bool print_overwrites = true;  // a line on stderr for a write into a quarantined block
    // Pooled: the freed bytes each rank keeps for reuse (SimOptions::host_pool_bytes_max, as
    // core's pool); the other policies keep kCachedBytesPerRankMax (sim_allocator.cpp).
    std::size_t pool_bytes_max = std::size_t{64} << 20;
  };

  // Keeps `stream` until detach().
  SimAllocator(Config config, DecisionStream& stream);
  ~SimAllocator() override;
  SimAllocator(const SimAllocator&) = delete;
  SimAllocator& operator=(const SimAllocator&) = delete;

  // On the rank holding the turn (Note [Simulator allocator]).
  std::shared_ptr<void> allocate(std::size_t nbytes) override;

  // The ranks ended: checks every block still in quarantine (each rank's last `quarantine_frees`
  // frees, which no later free pushed out) and makes it reusable, so a write into one is marked
  // while the run's report can still count it. Blocks freed afterwards are quarantined as before.
  void check_quarantine() noexcept;
  // The world ends: no allocation from here on (blocks may still be freed).
  void detach() noexcept;
  // Marks passed so far ("alloc.lifo_reuse", ...), for SimReport::marks.
  std::map<std::string, std::uint64_t, std::less<>> marks() const;

  // ---- Guard pages (Note [Guard pages]); whole_pages only.
  // Protects the block holding [data, data + nbytes) on behalf of `owner` (a work), with the
  // fault report `what`; `step` and `replay` are read at fault time (add_guarded_range). False,
  // leaving it unprotected, when no live block of this allocator holds that range (caller memory:
  // from_blob; mark "guard.unowned"), when another work already protects the block (two pending
  // outputs in one storage: the simulator must write the first one's results while the second is
  // pending; mark "guard.shared"), or when the process-wide table of guarded ranges is full
  // ("guard.table_full").
  bool protect(const void* data, std::size_t nbytes, const void* owner, const std::string& what,
               const std::uint64_t* step, const char* replay = nullptr);
  // Unprotects every block protected on behalf of `owner`. Cheap when there is none.
  void unprotect(const void* owner) noexcept;

 private:
  struct Block {
    std::byte* data = nullptr;
    std::size_t capacity = 0;
  };
  struct LiveBlock {
    std::size_t capacity = 0;
    int rank = -1;
    int guards = 0;                     // outputs of `guard_owner` that protect it
    int guard_entry = -1;               // its guarded range while guards > 0
    const void* guard_owner = nullptr;  // the one work whose outputs protect it
  };
  struct RankLists {
    std::vector<Block> available;   // reusable, oldest first
    std::deque<Block> quarantined;  // Quarantine: oldest first
    std::size_t cached_bytes = 0;   // in `available`
  };

  std::size_t round_up(std::size_t nbytes) const noexcept;
  // A free block of `rank` for `rounded` bytes, per the policy, or null; under the lock.
  std::byte* take_free(RankLists& lists, std::size_t rounded, std::size_t* capacity);
  void release(std::byte* data) noexcept;
  // Makes a block available again (or frees it past cached_bytes_max_); under the lock.
  void make_available(RankLists& lists, Block block) noexcept;
  void check_quarantine_pattern(const Block& block, int rank) noexcept;
  // Counts the mark `name` (a literal); under the lock. Out of memory the count is lost: a free
  // (noexcept) or an allocation that already took its block must not fail for a mark.
  void mark(const char* name) noexcept;
  void unguard(std::uintptr_t address, LiveBlock& live) noexcept;

  const Config config_;
  const std::size_t alignment_;
  const std::size_t cached_bytes_max_;  // per rank (Config::pool_bytes_max)
  mutable std::mutex mutex_;
  DecisionStream* stream_;
  std::vector<RankLists> ranks_;
  std::map<std::uintptr_t, LiveBlock> live_;  // allocated blocks by address
  std::multimap<const void*, std::uintptr_t> guarded_by_owner_;
  std::map<std::string, std::uint64_t, std::less<>> marks_;
};

// SimOptions::cuda_devices: rank `rank`'s "cuda:<rank>" memory (Note [Device memory]), host
// memory aligned to HostAllocator::kAlignment whose fresh blocks hold 0xA5 bytes (device memory
// is not zeroed either); copies and zero fills are memcpy and memset. Allocating for another
// device is an InvalidArgument, as on NCCL.
std::shared_ptr<DeviceMemory> make_simulated_device_memory(int rank);

}  // namespace chorus::sim::detail
