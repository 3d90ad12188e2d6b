#pragma once

// The global operator new of the out-of-memory tests (tests/support/refusing_new.cpp): each such
// test executable links refusing_new.cpp (chorus_out_of_memory_test in tests/CMakeLists.txt) and
// defines refuse_allocation, its own rule for which allocations fail (the k-th, every one, one of
// a given size, those of another thread ...). Replacement allocation functions cannot be inline,
// so the replacement lives in that one source file.

#include <cstddef>

namespace chorus::testing {

// Whether the allocation of `size` bytes being made now is refused (operator new then throws
// std::bad_alloc). Called for every allocation of the process, from any thread, before main too:
// it must not allocate, and what it reads must be initialised statically (atomics, thread_locals
// with constant initialisers).
bool refuse_allocation(std::size_t size) noexcept;

}  // namespace chorus::testing
