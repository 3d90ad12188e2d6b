// The global operator new and delete of the out-of-memory tests (refusing_new.hpp): malloc and
// free, with the allocations the test's refuse_allocation picks refused.

#include "support/refusing_new.hpp"

#include <cstdlib>
#include <new>

#include "chorus/transport/recycled_blocks.hpp"

namespace {

// Every allocation reaches the operator new below, none is served from a recycled block (Note
// [Recycled blocks]): the tests refuse each allocation in turn.
const bool recycling_off = [] {
  chorus::transport::testing::recycle_blocks_enabled.store(false);
  return true;
}();

}  // namespace

void* operator new(std::size_t size) {
  if (chorus::testing::refuse_allocation(size)) {
    throw std::bad_alloc();
  }
  if (void* block = std::malloc(size != 0 ? size : 1)) {
    return block;
  }
  throw std::bad_alloc();
}
void operator delete(void* block) noexcept { std::free(block); }
void operator delete(void* block, std::size_t) noexcept { std::free(block); }
