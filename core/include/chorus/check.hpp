#pragma once

// Invariant checks for programmer errors inside chorus (not for caller misuse, which raises
// chorus::Error). A failed check prints the condition, both values and file:line to stderr and
// aborts: an invariant that does not hold means the process state cannot be trusted.
// CHORUS_CHECK* run in every build. CHORUS_DCHECK* run in debug builds only (Note [Debug-only
// checks]).

#include <sstream>
#include <string>

namespace chorus::detail {

// Both only run when a check fails: cold, and never inlined, not even into a [[gnu::flatten]]
// function (the reduction kernels' fold_blocks), whose every other call is.
[[noreturn, gnu::cold, gnu::noinline]] void check_failed(const char* condition, const char* file,
                                                         int line, const std::string& values);

template <class A, class B>
[[gnu::cold, gnu::noinline]] std::string format_check_values(const A& a, const B& b) {
  std::ostringstream out;
  out << "(" << a << " vs " << b << ")";
  return out.str();
}

}  // namespace chorus::detail

#define CHORUS_CHECK(condition)                                           \
  do {                                                                    \
    if (!(condition)) [[unlikely]] {                                      \
      ::chorus::detail::check_failed(#condition, __FILE__, __LINE__, ""); \
    }                                                                     \
  } while (false)

#define CHORUS_CHECK_OP(op, a, b)                                                 \
  do {                                                                            \
    const auto& chorus_check_a = (a);                                             \
    const auto& chorus_check_b = (b);                                             \
    if (!(chorus_check_a op chorus_check_b)) [[unlikely]] {                       \
      ::chorus::detail::check_failed(                                             \
          #a " " #op " " #b, __FILE__, __LINE__,                                  \
          ::chorus::detail::format_check_values(chorus_check_a, chorus_check_b)); \
    }                                                                             \
  } while (false)

#define CHORUS_CHECK_EQ(a, b) CHORUS_CHECK_OP(==, a, b)
#define CHORUS_CHECK_NE(a, b) CHORUS_CHECK_OP(!=, a, b)
#define CHORUS_CHECK_LT(a, b) CHORUS_CHECK_OP(<, a, b)
#define CHORUS_CHECK_LE(a, b) CHORUS_CHECK_OP(<=, a, b)
#define CHORUS_CHECK_GT(a, b) CHORUS_CHECK_OP(>, a, b)
#define CHORUS_CHECK_GE(a, b) CHORUS_CHECK_OP(>=, a, b)

// Note [Debug-only checks]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A CHORUS_DCHECK states an invariant that chorus itself makes true by construction on a path run
// per operation or per scheduling step (a work's own fields, a pool set for a rank's life, a slot
// its caller just checked), where the check's loads and branches show in the simulator's
// schedules per second. Debug builds (dev, asan-ubsan, tsan: the CI's test builds) and the
// libFuzzer build (`fuzz`, optimised, so NDEBUG, but built with CHORUS_DEBUG_CHECKS: the fuzzers
// are where such a bug would show) check it like a CHORUS_CHECK; release builds compile it to
// nothing: the operands are not evaluated, so a
// DCHECK's condition must have no effect the program needs, and its loads cost nothing (an
// expansion to `(void)(condition)` could keep them). A caller's misuse, a transport's or a peer's
// error is never a DCHECK: those keep their typed errors or CHORUS_CHECKs in every build.
#if defined(NDEBUG) && !defined(CHORUS_DEBUG_CHECKS)
#define CHORUS_DCHECK_IS_ON 0
#define CHORUS_DCHECK(condition) \
  do {                           \
  } while (false)
#define CHORUS_DCHECK_OP(op, a, b) \
  do {                             \
  } while (false)
#else
#define CHORUS_DCHECK_IS_ON 1
#define CHORUS_DCHECK(condition) CHORUS_CHECK(condition)
#define CHORUS_DCHECK_OP(op, a, b) CHORUS_CHECK_OP(op, a, b)
#endif

#define CHORUS_DCHECK_EQ(a, b) CHORUS_DCHECK_OP(==, a, b)
#define CHORUS_DCHECK_NE(a, b) CHORUS_DCHECK_OP(!=, a, b)
#define CHORUS_DCHECK_LT(a, b) CHORUS_DCHECK_OP(<, a, b)
#define CHORUS_DCHECK_LE(a, b) CHORUS_DCHECK_OP(<=, a, b)
#define CHORUS_DCHECK_GT(a, b) CHORUS_DCHECK_OP(>, a, b)
#define CHORUS_DCHECK_GE(a, b) CHORUS_DCHECK_OP(>=, a, b)
