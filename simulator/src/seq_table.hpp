#pragma once

// Note [Flat slot table]
// ~~~~~~~~~~~~~~~~~~~~~~
// A communicator's outstanding operations (SimGroup::slots) are few (each member waits on its
// operations soon after issuing them: one to three outstanding in a typical run), looked up by
// seq at every arrival, made at the first arrival and taken away at completion, nearly always in
// seq order. A std::map rebalanced its tree twice an operation (an insert and an extract, about a
// hundred instructions in libstdc++'s out-of-line rebalancing) and chased pointers to find one.
// SeqTable keeps them sorted by seq in a vector of owning pointers: a look-up scans a handful of
// adjacent words, taking the head away moves the few behind it, adding the newest appends. The
// entries themselves stay where they were made (each one a heap block, as a map node was), so a
// Slot& or Arrival& stays valid while other entries come and go, and a node handle (Node) moves
// one between the table, the group's spares and the per-thread recycled slots without touching
// its contents, as std::map's node_type did. Iterators, unlike a map's, are invalidated by any
// insertion or removal: every loop that removes entries looks its next one up again (it did so
// for the map too, whose iterator to a removed entry died with it). The price is linear work with
// many outstanding: a member far ahead of the others (tens of thousands of operations issued and
// not waited) makes each look-up and head removal walk them (100,000 outstanding slots took ~9 s
// where the map took 0.07 s); nothing in the battery, the benchmarks or the examples comes near.

#include <boost/container/small_vector.hpp>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>
#include <utility>

#include "chorus/check.hpp"

namespace chorus::sim::detail {

template <class Value>
class SeqTable {
 public:
  struct Entry {
    std::int64_t first;
    Value second;
  };

  // Owns one entry outside a table, like std::map's node_type: empty() or key() and mapped().
  class Node {
   public:
    Node() noexcept = default;
    Node(Node&& other) noexcept : entry_(std::exchange(other.entry_, nullptr)) {}
    Node& operator=(Node&& other) noexcept {
      if (this != &other) {
        free_entry(std::exchange(entry_, std::exchange(other.entry_, nullptr)));
      }
      return *this;
    }
    // Usually moved from: only then is the entry's destructor called.
    ~Node() { free_entry(entry_); }

    bool empty() const noexcept { return entry_ == nullptr; }
    std::int64_t& key() const noexcept { return entry_->first; }
    Value& mapped() const noexcept { return entry_->second; }

   private:
    friend class SeqTable;
    explicit Node(Entry* entry) noexcept : entry_(entry) {}
    Entry* entry_ = nullptr;
  };
  using node_type = Node;

  SeqTable() = default;
  SeqTable(const SeqTable&) = delete;
  SeqTable& operator=(const SeqTable&) = delete;
  ~SeqTable() {
    for (Entry* entry : entries_) {
      delete entry;
    }
  }

  template <bool kConst>
  class Iterator {
   public:
    using Reference = std::conditional_t<kConst, const Entry&, Entry&>;
    using Pointer = std::conditional_t<kConst, const Entry*, Entry*>;
    using iterator_category = std::forward_iterator_tag;
    using value_type = Entry;
    using difference_type = std::ptrdiff_t;
    using pointer = Pointer;
    using reference = Reference;

    Iterator() noexcept = default;
    explicit Iterator(Entry* const* at) noexcept : at_(at) {}
    // A table's iterator converts to its const_iterator.
    operator Iterator<true>() const noexcept { return Iterator<true>(at_); }  // NOLINT

    Reference operator*() const noexcept { return **at_; }
    Pointer operator->() const noexcept { return *at_; }
    Iterator& operator++() noexcept {
      ++at_;
      return *this;
    }
    Iterator operator++(int) noexcept {
      Iterator was = *this;
      ++at_;
      return was;
    }
    friend bool operator==(const Iterator& a, const Iterator& b) noexcept { return a.at_ == b.at_; }

   private:
    friend class SeqTable;
    Entry* const* at_ = nullptr;
  };
  using iterator = Iterator<false>;
  using const_iterator = Iterator<true>;

  iterator begin() noexcept { return iterator(entries_.data()); }
  iterator end() noexcept { return iterator(entries_.data() + entries_.size()); }
  const_iterator begin() const noexcept { return const_iterator(entries_.data()); }
  const_iterator end() const noexcept { return const_iterator(entries_.data() + entries_.size()); }

  std::size_t size() const noexcept { return entries_.size(); }
  bool empty() const noexcept { return entries_.empty(); }

  // The first entry whose seq is at least (lower_bound) or above (upper_bound) `seq`.
  iterator lower_bound(std::int64_t seq) noexcept { return iterator(first_from(seq, false)); }
  iterator upper_bound(std::int64_t seq) noexcept { return iterator(first_from(seq, true)); }
  iterator find(std::int64_t seq) noexcept {
    Entry* const* at = first_from(seq, false);
    return at != end_address() && (*at)->first == seq ? iterator(at) : end();
  }
  const_iterator find(std::int64_t seq) const noexcept {
    return const_cast<SeqTable&>(*this).find(seq);  // NOLINT: the same look-up, read only
  }
  bool contains(std::int64_t seq) const noexcept { return find(seq) != end(); }
  std::size_t count(std::int64_t seq) const noexcept { return contains(seq) ? 1 : 0; }
  // The entry of `seq`, which must be there.
  Value& at(std::int64_t seq) noexcept {
    const iterator it = find(seq);
    CHORUS_CHECK(it != end());
    return it->second;
  }
  const Value& at(std::int64_t seq) const noexcept {
    return const_cast<SeqTable&>(*this).at(seq);  // NOLINT: the same look-up, read only
  }

  // Room for one more entry, so that the next insert allocates nothing. Throws std::bad_alloc.
  void reserve_one() {
    if (entries_.size() == entries_.capacity()) {
      entries_.reserve(2 * entries_.capacity());
    }
  }
  // A new entry of `seq` (not in the table) with a default Value. Throws std::bad_alloc; then
  // the table is as it was.
  iterator try_emplace(std::int64_t seq) {
    reserve_one();
    return insert(Node(new Entry{seq, Value()}));
  }
  // Puts `node`'s entry (its key not in the table) in its place by seq. Allocates nothing after
  // reserve_one; throws std::bad_alloc without it when it must grow, `node` keeping its entry.
  iterator insert(Node&& node) {
    CHORUS_CHECK(!node.empty());
    reserve_one();  // before the entry leaves the node
    const std::int64_t seq = node.key();
    Entry** at = first_from(seq, false);
    CHORUS_CHECK(at == end_address() || (*at)->first != seq);
    const auto index = static_cast<std::size_t>(at - entries_.data());
    entries_.insert(entries_.begin() + static_cast<std::ptrdiff_t>(index),
                    std::exchange(node.entry_, nullptr));
    return iterator(entries_.data() + index);
  }
  // Takes the entry at `it` out of the table.
  Node extract(const_iterator it) noexcept {
    const auto index = static_cast<std::size_t>(it.at_ - entries_.data());
    CHORUS_CHECK_LT(index, entries_.size());
    Node node(entries_[index]);
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(index));
    return node;
  }
  // Removes and frees the entry at `it`.
  void erase(const_iterator it) noexcept { (void)extract(it); }

 private:
  // Out of line and cold: a node is nearly always empty (moved from) when it dies.
  [[gnu::noinline]] static void delete_entry(Entry* entry) noexcept { delete entry; }
  static void free_entry(Entry* entry) noexcept {
    if (entry != nullptr) [[unlikely]] {
      delete_entry(entry);
    }
  }
  Entry** end_address() noexcept { return entries_.data() + entries_.size(); }
  // The first entry whose seq is at least `seq` (above it, when `above`). A scan from the back:
  // the table holds a handful of entries, and the one asked for is nearly always the newest (a
  // later member's arrival) or none yet (the first member's, about to append).
  Entry** first_from(std::int64_t seq, bool above) noexcept {
    Entry** const first = entries_.data();
    Entry** at = end_address();
    while (at != first && (above ? at[-1]->first > seq : at[-1]->first >= seq)) {
      --at;
    }
    return at;
  }

  // By seq, ascending; owned. Inline for a few: a group made by every run allocates none.
  boost::container::small_vector<Entry*, 4> entries_;
};

}  // namespace chorus::sim::detail
