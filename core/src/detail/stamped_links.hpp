#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "chorus/check.hpp"

namespace chorus::detail {

// The registry's links (Note [Registry links]): a list of distinct targets, each stamped with
// the target's generation when it was linked, in insertion order. The first link is held inline:
// a storage's pending works and a work's storages almost always number one, and then the list
// never touches the heap. A link is made in two steps (Note [Registration]): reserve() makes room,
// and may throw; push_back() fills it, and cannot. Room once made is kept (erase and clear keep
// the capacity), and the room reserved stays free of other links until filled or released. Not
// thread-safe.
template <class T>
class StampedLinks {
 public:
  struct Link {
    T* target = nullptr;
    std::uint64_t stamp = 0;  // the target's generation when linked
  };

  bool empty() const noexcept { return first_.target == nullptr; }
  std::size_t size() const noexcept { return empty() ? 0 : 1 + rest_.size(); }
  const Link& front() const noexcept { return first_; }

  bool contains(const T* target) const noexcept {
    // rest_ nearly always empty: tested first, not through std::any_of's unrolled set-up.
    return target == first_.target ||
           (!rest_.empty() && std::any_of(rest_.begin(), rest_.end(), [target](const Link& link) {
             return link.target == target;
           }));
  }
  // Makes room for `count` more links besides those reserved already, so that as many
  // push_back()s allocate nothing. Grows the heap part geometrically, and only when the room
  // already there is short (a first link never allocates). Throws only std::bad_alloc, and then
  // changes nothing.
  void reserve(std::size_t count) {
    if (count == 1 && reserved_ == 0 && empty()) {
      reserved_ = 1;  // the inline link: the usual case, no room to count
      return;
    }
    const std::size_t needed = size() + reserved_ + count;  // the inline link included
    if (needed > 1 + rest_.capacity()) {
      rest_.reserve(std::max(needed - 1, 2 * rest_.capacity()));
    }
    reserved_ += count;
  }
  // Gives back room that reserve() made and no push_back() filled.
  void release(std::size_t count) noexcept {
    CHORUS_CHECK_LE(count, reserved_);
    reserved_ -= count;
  }
  // Appends a link to `target` (not null, not linked) in room reserve() made. Allocates nothing.
  // Its checks run in debug builds only: the registry, its one user, links what it reserved
  // (Note [Registration's own checks] in work_registry.cpp).
  void push_back(T* target, std::uint64_t stamp) noexcept {
    CHORUS_DCHECK(target != nullptr);
    CHORUS_DCHECK_GT(reserved_, 0u);
    --reserved_;
    if (first_.target == nullptr) {
      CHORUS_DCHECK(rest_.empty());
      first_ = Link{target, stamp};
    } else {
      CHORUS_DCHECK_LT(rest_.size(), rest_.capacity());  // reserved: no reallocation
      rest_.push_back(Link{target, stamp});
    }
  }
  // Room reserved and not yet filled.
  std::size_t reserved() const noexcept { return reserved_; }
  // Removes the link to `target` if there is one; the others keep their order.
  void erase(const T* target) noexcept {
    if (target != first_.target) {
      std::erase_if(rest_, [target](const Link& link) { return link.target == target; });
      return;
    }
    if (rest_.empty()) {
      first_ = Link{};
      return;
    }
    first_ = rest_.front();
    rest_.erase(rest_.begin());
  }
  void clear() noexcept {
    first_ = Link{};
    rest_.clear();
  }
  // Calls f on each link, in order. One call site of `f`, so that the compiler inlines it (two,
  // one for the inline link and one in the loop, left the registry's lambdas out of line: a call
  // and a frame per link).
  template <class F>
  void for_each(F f) const {
    if (first_.target == nullptr) {
      return;
    }
    const Link* next = rest_.data();
    const Link* const end = next + rest_.size();
    for (const Link* link = &first_;; link = next++) {
      f(*link);
      if (next == end) {
        return;
      }
    }
  }

 private:
  Link first_;              // target null: the list is empty (then so is rest_)
  std::vector<Link> rest_;  // the links after the first
  // Links reserve() made room for and push_back() has not filled yet: always
  // size() + reserved_ <= 1 + rest_.capacity().
  std::size_t reserved_ = 0;
};

}  // namespace chorus::detail
