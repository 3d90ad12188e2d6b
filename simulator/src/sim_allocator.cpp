#include "sim_allocator.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "decision_stream.hpp"
#include "guard_pages.hpp"

namespace chorus::sim::detail {
namespace {

// Freed bytes each rank keeps reusable under LifoReuse, Quarantine and Random (as core's pool by
// default: RankOptions::host_pool_bytes_max; Pooled keeps Config::pool_bytes_max); past it a freed
// block goes back to the heap. Per rank, so whether a rank gets its own block back never depends
// on what other ranks freed (Note [Simulator allocator]).
constexpr std::size_t kCachedBytesPerRankMax = std::size_t{64} << 20;
// What a quarantined block holds (Note [Simulator allocator]).
constexpr unsigned char kQuarantineByte = 0xDD;

std::size_t page_size() {
  const long size = sysconf(_SC_PAGESIZE);
  CHORUS_CHECK_GT(size, 0);
  return static_cast<std::size_t>(size);
}

}  // namespace

SimAllocator::SimAllocator(Config config, DecisionStream& stream)
    : config_(config),
      alignment_(config.whole_pages ? page_size() : HostAllocator::kAlignment),
      cached_bytes_max_(config.policy == AllocatorPolicy::Pooled ? config.pool_bytes_max
                                                                 : kCachedBytesPerRankMax),
      stream_(&stream),
      ranks_(static_cast<std::size_t>(config.world_size)) {
  CHORUS_CHECK_GE(config_.world_size, 1);
  CHORUS_CHECK_EQ(alignment_ % HostAllocator::kAlignment, 0u);
  if (!config_.whole_pages) {
    CHORUS_CHECK(config_.policy != AllocatorPolicy::Pooled);  // that is core's pool
  }
}

SimAllocator::~SimAllocator() {
  // Every live block's deleter holds this allocator, so none is left.
  CHORUS_CHECK(live_.empty());
  for (RankLists& lists : ranks_) {
    for (const Block& block : lists.available) {
      std::free(block.data);
    }
    for (const Block& block : lists.quarantined) {
      std::free(block.data);
    }
  }
}

std::size_t SimAllocator::round_up(std::size_t nbytes) const noexcept {
  return (nbytes + alignment_ - 1) / alignment_ * alignment_;
}

std::shared_ptr<void> SimAllocator::allocate(std::size_t nbytes) {
  CHORUS_CHECK_GT(nbytes, 0u);
  RankContext* context = RankContext::current();
  CHORUS_CHECK(context != nullptr);
  const int rank = context->rank();
  CHORUS_CHECK(rank >= 0 && rank < config_.world_size);
  const std::size_t rounded = round_up(nbytes);
  std::size_t capacity = rounded;
  std::byte* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    CHORUS_CHECK(stream_ != nullptr);  // not after the world ended
    data = take_free(ranks_[static_cast<std::size_t>(rank)], rounded, &capacity);
  }
  if (data == nullptr) {
    data = static_cast<std::byte*>(std::aligned_alloc(alignment_, rounded));
    if (data == nullptr) {
      throw std::bad_alloc();
    }
  }
  CHORUS_CHECK_GE(capacity, rounded);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      const bool inserted =
          live_.emplace(reinterpret_cast<std::uintptr_t>(data), LiveBlock{capacity, rank, 0, -1})
              .second;
      CHORUS_CHECK(inserted);
    } catch (const std::bad_alloc&) {
      // Out of memory recording it: the block goes back (to the rank's free blocks, or to the
      // heap past the bound), not lost.
      make_available(ranks_[static_cast<std::size_t>(rank)], Block{data, capacity});
      throw;
    }
  }
  return std::shared_ptr<void>(data, [self = shared_from_this()](void* block) {
    self->release(static_cast<std::byte*>(block));
  });
}

std::byte* SimAllocator::take_free(RankLists& lists, std::size_t rounded, std::size_t* capacity) {
  std::vector<Block>& available = lists.available;
  std::size_t index = available.size();  // none yet
  switch (config_.policy) {
    case AllocatorPolicy::Pooled:
    case AllocatorPolicy::LifoReuse:
    case AllocatorPolicy::Quarantine: {
      const bool exact = config_.policy == AllocatorPolicy::Pooled;
      for (std::size_t i = available.size(); i-- > 0;) {
        if (exact ? available[i].capacity == rounded : available[i].capacity >= rounded) {
          index = i;
          break;
        }
      }
      break;
    }
    case AllocatorPolicy::Random: {
      std::vector<std::size_t> fitting;
      for (std::size_t i = 0; i < available.size(); ++i) {
        if (available[i].capacity >= rounded) {
          fitting.push_back(i);
        }
      }
      if (fitting.size() == 1) {
        index = fitting.front();
      } else if (fitting.size() > 1) {
        index = fitting[stream_->choose(fitting.size())];
        mark("alloc.random");
      }
      break;
    }
  }
  if (index == available.size()) {
    return nullptr;
  }
  const Block block = available[index];
  available.erase(available.begin() + static_cast<std::ptrdiff_t>(index));
  CHORUS_CHECK_GE(lists.cached_bytes, block.capacity);
  lists.cached_bytes -= block.capacity;
  if (config_.policy == AllocatorPolicy::LifoReuse) {
    mark("alloc.lifo_reuse");
  } else if (config_.policy == AllocatorPolicy::Quarantine) {
    mark("alloc.quarantine.reuse");
  }
  *capacity = block.capacity;
  return block.data;
}

void SimAllocator::release(std::byte* data) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(data));
  CHORUS_CHECK(it != live_.end());
  if (it->second.guards > 0) {
    // Freed while protected (a failure path that never completed it): make it usable again.
    unguard(it->first, it->second);
    for (auto owner = guarded_by_owner_.begin(); owner != guarded_by_owner_.end();) {
      owner = owner->second == it->first ? guarded_by_owner_.erase(owner) : std::next(owner);
    }
  }
  const Block block{data, it->second.capacity};
  RankLists& lists = ranks_[static_cast<std::size_t>(it->second.rank)];
  const int rank = it->second.rank;
  live_.erase(it);
  if (config_.policy != AllocatorPolicy::Quarantine) {
    make_available(lists, block);
    return;
  }
  std::memset(block.data, kQuarantineByte, block.capacity);
  try {
    lists.quarantined.push_back(block);
  } catch (const std::bad_alloc&) {
    make_available(lists, block);  // out of memory: reusable at once, unquarantined
    return;
  }
  mark("alloc.quarantine");
  while (lists.quarantined.size() > config_.quarantine_frees) {
    const Block served = lists.quarantined.front();
    lists.quarantined.pop_front();
    check_quarantine_pattern(served, rank);
    make_available(lists, served);
  }
}

void SimAllocator::make_available(RankLists& lists, Block block) noexcept {
  if (lists.cached_bytes + block.capacity > cached_bytes_max_) {
    std::free(block.data);
    return;
  }
  try {
    lists.available.push_back(block);
    lists.cached_bytes += block.capacity;
  } catch (...) {
    std::free(block.data);  // out of memory for the list
  }
}

void SimAllocator::check_quarantine_pattern(const Block& block, int rank) noexcept {
  for (std::size_t i = 0; i < block.capacity; ++i) {
    if (static_cast<unsigned char>(block.data[i]) != kQuarantineByte) {
      mark("alloc.quarantine.overwritten");
      if (config_.print_overwrites) {
        std::fprintf(stderr,
                     "chorus sim: a block of %zu bytes that rank %d freed was written (byte %zu) "
                     "while in quarantine: a write through a dangling pointer\n",
                     block.capacity, rank, i);
      }
      return;
    }
  }
}

void SimAllocator::mark(const char* name) noexcept {
  try {
    ++marks_[name];
  } catch (const std::bad_alloc&) {
    // Out of memory: the count is lost, never the block at hand.
  }
}

void SimAllocator::check_quarantine() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t rank = 0; rank < ranks_.size(); ++rank) {
    RankLists& lists = ranks_[rank];
    while (!lists.quarantined.empty()) {
      const Block served = lists.quarantined.front();
      lists.quarantined.pop_front();
      check_quarantine_pattern(served, static_cast<int>(rank));
      make_available(lists, served);
    }
  }
}

void SimAllocator::detach() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  stream_ = nullptr;
}

std::map<std::string, std::uint64_t, std::less<>> SimAllocator::marks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return marks_;
}

bool SimAllocator::protect(const void* data, std::size_t nbytes, const void* owner,
                           const std::string& what, const std::uint64_t* step, const char* replay) {
  CHORUS_CHECK(config_.whole_pages);
  CHORUS_CHECK_GT(nbytes, 0u);
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.upper_bound(address);
  if (it == live_.begin()) {
    ++marks_["guard.unowned"];
    return false;
  }
  --it;
  if (address + nbytes > it->first + it->second.capacity) {
    ++marks_["guard.unowned"];
    return false;
  }
  LiveBlock& live = it->second;
  if (live.guards > 0 && live.guard_owner != owner) {
    ++marks_["guard.shared"];
    return false;
  }
  // The owner's record first: a std::bad_alloc making it leaves nothing protected, and a block
  // protected is always one that unprotect(owner) finds (Note [Operation positions]).
  const auto recorded = guarded_by_owner_.emplace(owner, it->first);
  if (live.guards == 0) {
    const int entry = add_guarded_range(reinterpret_cast<const void*>(it->first), live.capacity,
                                        what, step, replay);
    if (entry < 0) {
      guarded_by_owner_.erase(recorded);
      ++marks_["guard.table_full"];
      return false;
    }
    live.guard_entry = entry;
    live.guard_owner = owner;
    CHORUS_CHECK_EQ(mprotect(reinterpret_cast<void*>(it->first), live.capacity, PROT_NONE), 0);
  }
  live.guards += 1;
  return true;
}

void SimAllocator::unprotect(const void* owner) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [first, last] = guarded_by_owner_.equal_range(owner);
  for (auto entry = first; entry != last; ++entry) {
    auto it = live_.find(entry->second);
    CHORUS_CHECK(it != live_.end());
    CHORUS_CHECK_GT(it->second.guards, 0);
    if (--it->second.guards == 0) {
      it->second.guards = 1;  // unguard takes the last one
      unguard(it->first, it->second);
    }
  }
  guarded_by_owner_.erase(first, last);
}

void SimAllocator::unguard(std::uintptr_t address, LiveBlock& live) noexcept {
  CHORUS_CHECK_GT(live.guards, 0);
  CHORUS_CHECK_EQ(mprotect(reinterpret_cast<void*>(address), live.capacity, PROT_READ | PROT_WRITE),
                  0);
  remove_guarded_range(live.guard_entry);
  live.guards = 0;
  live.guard_owner = nullptr;
  live.guard_entry = -1;
}

namespace {

class SimulatedDeviceMemory final : public DeviceMemory {
 public:
  explicit SimulatedDeviceMemory(int rank) : device_(Device::cuda(rank)) {}

  // Streams are ignored (Note [Current stream]): a simulated stream wait is a wait of the rank,
  // which orders everything the rank does after it.
  std::shared_ptr<void> allocate(Device device, std::size_t nbytes, void* /*stream*/) override {
    check_device(device, "allocate");
    const std::size_t rounded = (nbytes + HostAllocator::kAlignment - 1) /
                                HostAllocator::kAlignment * HostAllocator::kAlignment;
    void* block = std::aligned_alloc(HostAllocator::kAlignment, rounded);
    if (block == nullptr) {
      throw std::bad_alloc();
    }
    std::memset(block, 0xA5, nbytes);
    return {block, [](void* data) { std::free(data); }};
  }

  void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t nbytes,
            void* /*stream*/) override {
    check_device(dst_device, "copy");
    check_device(src_device, "copy");
    std::memcpy(dst, src, nbytes);
  }

  void zero(void* dst, Device device, std::size_t nbytes, void* /*stream*/) override {
    check_device(device, "zero");
    std::memset(dst, 0, nbytes);
  }

 private:
  void check_device(Device device, const char* what) const {
    if (!device.is_cpu() && device != device_) {
      throw InvalidArgument(ErrorContext{device_.index(), what, -1, ""},
                            "simulated rank " + std::to_string(device_.index()) + " owns " +
                                device_.to_string() + ", not " + device.to_string());
    }
  }

  Device device_;
};

}  // namespace

std::shared_ptr<DeviceMemory> make_simulated_device_memory(int rank) {
  return std::make_shared<SimulatedDeviceMemory>(rank);
}

}  // namespace chorus::sim::detail
