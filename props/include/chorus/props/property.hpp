#pragma once

// chorus::props — properties of SPMD programs, written once and run by any runner (Note
// [Property runners], chorus/props/runner.hpp): on the simulator, where RapidCheck shrinks the
// case and the schedule together, or on a real transport, where every rank generates the same
// cases and the ranks agree on each verdict.
//
// A property is a generator of cases (a RapidCheck rc::Gen, from the world size alone, so every
// rank can generate the same case) and a check that every rank runs on the case:
//
//   struct MyCase { std::int64_t rows; };
//   void showValue(const MyCase& c, std::ostream& out) { out << "rows=" << c.rows; }
//
//   props::Property my_layer_property() {
//     return props::make_property<MyCase>(
//         "user.my_layer", "my tensor-parallel layer equals the single-rank layer",
//         [](const props::World&) {
//           return rc::gen::build<MyCase>(rc::gen::set(&MyCase::rows, rc::gen::inRange(1, 9)));
//         },
//         [](const MyCase& c, props::Env& env) {
//           const Tensor out = my_layer(input(c), world());
//           env.require_bitwise_equal(out, single_rank_layer(c), "my_layer output");
//         });
//   }
//
// Checks throw PropertyFailure (Env::require*); any other exception a rank throws fails the case
// too. Every rank must reach the same collectives (the check is SPMD code), and every rank's
// work registry must be empty when the check returns (the runners check it).

#include <rapidcheck.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/chorus.hpp"

namespace chorus::props {

// What a case generator may depend on: the same on every rank of a run.
struct World {
  int size = 1;
};

// A failed check: what differs, on which rank.
class PropertyFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A case of any type, shared read-only by every rank of a simulated run, with its description.
class Case {
 public:
  Case() = default;
  template <class T>
  explicit Case(T value)
      : value_(std::make_shared<const T>(std::move(value))),
        type_(&typeid(T)),
        text_(rc::toString(*std::static_pointer_cast<const T>(value_))) {}

  // The value; T must be the type it was made from (CHORUS_CHECKed).
  template <class T>
  const T& as() const {
    CHORUS_CHECK(type_ != nullptr && *type_ == typeid(T));
    return *std::static_pointer_cast<const T>(value_);
  }
  const std::string& text() const noexcept { return text_; }

 private:
  std::shared_ptr<const void> value_;
  const std::type_info* type_ = nullptr;
  std::string text_;
};

inline void showValue(const Case& c, std::ostream& out) { out << c.text(); }

// What a check may use besides the case: assertions that say which rank failed, and a digest of
// the results it records (the simulator's schedule-independence runs compare it across
// schedules). One Env per rank per run; not shared between ranks or threads.
//
// How a failed require* reports depends on the runner. On the simulator it throws
// PropertyFailure at once. In lockstep on a real transport (Note [Property runners]) it records
// the first failure and returns false, so the check goes on and this rank still reaches every
// collective its peers reach; the runner reports the recorded failure when the check returns.
// fail() and require_throws always throw: after them a lockstep check leaves its peers to the
// transport's deadline.
class Env {
 public:
  enum class OnFailure { Throw, Record };

  explicit Env(int rank, OnFailure on_failure = OnFailure::Throw)
      : rank_(rank), on_failure_(on_failure) {}

  int rank() const noexcept { return rank_; }

  // Throws PropertyFailure "rank R: <what>" (whatever OnFailure says).
  [[noreturn]] void fail(std::string_view what) const;
  // Fails with "rank R: <what>" unless `condition`. Returns `condition`.
  bool require(bool condition, std::string_view what);
  // Fails unless `actual` has `expected`'s dtype and shape and the same bytes (waits on both).
  // The message names the first differing element with its value and bytes. Returns whether
  // they are equal.
  bool require_bitwise_equal(const Tensor& actual, const Tensor& expected, std::string_view what);
  // Throws PropertyFailure unless calling `body` throws an error of type E (a chorus::Error
  // subclass); returns its message.
  template <class E, class F>
  std::string require_throws(F&& body, std::string_view what) const;

  // OnFailure::Record: the first failure's message (empty if none) and how many failed.
  const std::string& first_failure() const noexcept { return first_failure_; }
  int failures() const noexcept { return failures_; }

  // Mixes `tensor`'s dtype, shape and bytes (waits) into this rank's result digest: what a
  // Needs::schedule_independent property's runs under other schedules compare. Such a check must
  // record its results: a property none of whose cases recorded anything, on any rank, fails on
  // the simulator runner.
  void record(const Tensor& tensor);
  std::uint64_t digest() const noexcept { return digest_; }
  int records() const noexcept { return records_; }  // record calls so far

 private:
  // Throws, or records and returns false.
  bool failed(std::string_view what);

  int rank_ = 0;
  OnFailure on_failure_ = OnFailure::Throw;
  std::string first_failure_;
  int failures_ = 0;
  std::uint64_t digest_ = 0xcbf29ce484222325ull;
  int records_ = 0;
};

// Which runs a property needs; the runners skip a property whose needs they cannot meet, and say
// why in the summary.
struct Needs {
  // Needs the simulator's control (schedules, faults, allocator policy, cross-rank mismatches
  // that would hang or abort a real communicator).
  bool simulator_only = false;
  // The smallest world the property means something on.
  int world_size_min = 1;
  // Simulator allocator policy to run under (e.g. LifoReuse for address-reuse properties).
  sim::AllocatorPolicy allocator = sim::AllocatorPolicy::Pooled;
  // The simulator runner also runs each case under other schedules and reduction orders and
  // requires every rank's Env digest (Env::record) to be the same in all of them. A property
  // none of whose cases records anything, on any rank, fails: it compared nothing.
  bool schedule_independent = false;
};

struct Property {
  std::string name;         // "family.name", e.g. "reduce.all_reduce"
  std::string description;  // one line
  Needs needs;
  std::function<rc::Gen<Case>(World)> cases;
  std::function<void(const Case&, Env&)> check;
};

// A Property from a typed generator and check. T must be copyable and printable by RapidCheck
// (rc::toString: standard types, or a showValue(const T&, std::ostream&) overload), and is
// spelled out (make_property<MyCase>): it cannot be deduced from lambdas. The check runs on every
// rank: on a real transport concurrently, so what it captures must be safe to share. Names must
// not contain ':' or whitespace (replay tokens carry them).
template <class T>
Property make_property(std::string name, std::string description,
                       std::function<rc::Gen<T>(World)> cases,
                       std::function<void(const T&, Env&)> check, Needs needs = {}) {
  Property property;
  property.name = std::move(name);
  property.description = std::move(description);
  property.needs = needs;
  property.cases = [cases = std::move(cases)](World world) {
    return rc::gen::map(cases(world), [](T value) { return Case(std::move(value)); });
  };
  property.check = [check = std::move(check)](const Case& c, Env& env) { check(c.as<T>(), env); };
  return property;
}

template <class E, class F>
std::string Env::require_throws(F&& body, std::string_view what) const {
  try {
    std::forward<F>(body)();
  } catch (const E& error) {
    return error.what();
  } catch (const std::exception& error) {
    fail(std::string(what) + ": threw the wrong error: " + error.what());
  }
  fail(std::string(what) + ": threw nothing");
}

}  // namespace chorus::props
