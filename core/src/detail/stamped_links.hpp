#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace chorus::detail {

// The registry's links (Note [Registry links]): a list of distinct targets, each stamped with
// the target's generation when it was linked, in insertion order. The first link is held inline:
// a storage's pending works and a work's storages almost always number one, and then the list
// never touches the heap. Not thread-safe.
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
    return target == first_.target ||
           std::any_of(rest_.begin(), rest_.end(),
                       [target](const Link& link) { return link.target == target; });
  }
  // Appends a link to `target` (not null, not linked). Throws only std::bad_alloc, and then
  // changes nothing.
  void push_back(T* target, std::uint64_t stamp) {
    if (first_.target == nullptr) {
      first_ = Link{target, stamp};
    } else {
      rest_.push_back(Link{target, stamp});
    }
  }
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
  template <class F>
  void for_each(F f) const {
    if (first_.target == nullptr) {
      return;
    }
    f(first_);
    for (const Link& link : rest_) {
      f(link);
    }
  }

 private:
  Link first_;              // target null: the list is empty (then so is rest_)
  std::vector<Link> rest_;  // the links after the first
};

}  // namespace chorus::detail
