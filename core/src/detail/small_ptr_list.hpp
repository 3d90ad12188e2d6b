#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace chorus::detail {

// A list of distinct pointers in insertion order that holds its first element inline: the
// registry's lists (a storage's pending works, a work's storages) almost always hold one, and
// then they never touch the heap. Not thread-safe.
template <class T>
class SmallPtrList {
 public:
  bool empty() const noexcept { return first_ == nullptr; }
  std::size_t size() const noexcept { return first_ == nullptr ? 0 : 1 + rest_.size(); }
  T* front() const noexcept { return first_; }

  bool contains(const T* item) const noexcept {
    return item == first_ || std::find(rest_.begin(), rest_.end(), item) != rest_.end();
  }
  // Appends `item` (not null, not listed).
  void push_back(T* item) {
    if (first_ == nullptr) {
      first_ = item;
    } else {
      rest_.push_back(item);
    }
  }
  // Removes `item` if listed; the others keep their order.
  void erase(const T* item) noexcept {
    if (item != first_) {
      std::erase(rest_, item);
      return;
    }
    if (rest_.empty()) {
      first_ = nullptr;
      return;
    }
    first_ = rest_.front();
    rest_.erase(rest_.begin());
  }
  void clear() noexcept {
    first_ = nullptr;
    rest_.clear();
  }
  template <class F>
  void for_each(F f) const {
    if (first_ == nullptr) {
      return;
    }
    f(first_);
    for (T* item : rest_) {
      f(item);
    }
  }

 private:
  T* first_ = nullptr;    // null: the list is empty (then so is rest_)
  std::vector<T*> rest_;  // the elements after the first
};

}  // namespace chorus::detail
