// async.*: pending results (DESIGN 2.4): waits in any order and by any route, from other
// threads, idempotent; views share the pending state and never wait; the work registry counts
// exactly the distinct pending works and drains; freed addresses reused at once never confuse it.

#include <iterator>
#include <thread>

#include "battery/cases.hpp"
#include "battery/families.hpp"

namespace chorus::props::families {
namespace {

std::vector<int> world_ranks(int world_size) {
  std::vector<int> ranks(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    ranks[static_cast<std::size_t>(r)] = r;
  }
  return ranks;
}

// A shape with at least one element (empty results are covered by reduce.*).
rc::Gen<Shape> gen_nonempty_shape() {
  return rc::gen::exec([] {
    Shape shape;
    const int dims = *rc::gen::inRange(1, 3);
    for (int d = 0; d < dims; ++d) {
      shape.push_back(*rc::gen::inRange(1, 4));
    }
    return shape;
  });
}

// ---- Waits in any order, by any route

enum class WaitRoute { Tensor, View, DataAccess, WaitTensors, OtherThread };
constexpr const char* kRouteNames[] = {"wait_tensor", "wait_tensor(view)", "data access",
                                       "wait_tensors", "another thread"};
// Drawn with gen_index: every route at every case size (rc::gen::inRange scales with the size).
constexpr int kWaitRouteCount = static_cast<int>(std::size(kRouteNames));
static_assert(kWaitRouteCount == static_cast<int>(WaitRoute::OtherThread) + 1);

struct WaitCase {
  Shape shape;
  std::vector<int> order;         // which result is waited k-th
  std::vector<WaitRoute> routes;  // how the k-th wait is made
  std::vector<bool> twice;        // the k-th result is waited again afterwards
  std::uint64_t data_seed = 0;
};

void showValue(const WaitCase& c, std::ostream& out) {
  out << c.order.size() << " all_reduces of " << shape_text(c.shape) << ", waited:";
  for (std::size_t k = 0; k < c.order.size(); ++k) {
    out << " #" << c.order[k] << " by " << kRouteNames[static_cast<int>(c.routes[k])]
        << (c.twice[k] ? " (twice)" : "");
  }
  out << ", data seed " << c.data_seed;
}

rc::Gen<WaitCase> gen_wait_case(const World&) {
  return rc::gen::exec([] {
    WaitCase c;
    c.shape = *gen_nonempty_shape();
    const int count = *rc::gen::inRange(1, 6);
    c.order = *gen_permutation(count);
    for (int k = 0; k < count; ++k) {
      c.routes.push_back(static_cast<WaitRoute>(*gen_index(kWaitRouteCount)));
      c.twice.push_back(*gen_flag());
    }
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

void check_wait_orders(const WaitCase& c, Env& env) {
  const std::vector<int> all = world_ranks(world_size());
  const std::size_t count = c.order.size();
  std::vector<Tensor> results;
  std::vector<Tensor> views;
  for (std::size_t i = 0; i < count; ++i) {
    results.push_back(all_reduce(exact_input(c.data_seed + i, env.rank(), c.shape, DType::Int64),
                                 "sum", world()));
    env.require(results.back().is_pending(), "a result is pending from its issue");
    views.push_back(results.back().flatten().narrow(0, 0, 1));
    env.require(views.back().is_pending() && results.back().is_pending(),
                "a view shares the pending state and taking it does not wait");
  }
  env.require(work_registry_size() == count, "the registry holds one work per pending result");
  std::vector<bool> waited(count, false);
  for (std::size_t k = 0; k < count; ++k) {
    const auto i = static_cast<std::size_t>(c.order[k]);
    const std::string route = kRouteNames[static_cast<int>(c.routes[k])];
    switch (c.routes[k]) {
      case WaitRoute::Tensor:
        (void)wait_tensor(results[i]);
        break;
      case WaitRoute::View:
        (void)wait_tensor(views[i]);
        break;
      case WaitRoute::DataAccess:
        (void)results[i].to_vector<std::int64_t>();
        break;
      case WaitRoute::WaitTensors:
        (void)wait_tensors({views[i], results[i]});
        break;
      case WaitRoute::OtherThread: {
        // The helper waits on the view; this rank keeps the transport going with its own wait
        // (on the simulator, a rank blocked outside chorus would stop everything).
        bool helper_saw_it = false;
        std::thread helper(
            [view = views[i], &helper_saw_it] { helper_saw_it = !wait_tensor(view).is_pending(); });
        (void)wait_tensor(results[i]);
        helper.join();
        env.require(helper_saw_it, "a wait from another thread returns a waited tensor");
        break;
      }
    }
    waited[i] = true;
    env.require(!results[i].is_pending() && !views[i].is_pending(),
                "after " + route + " neither the result nor its view is pending");
    env.require(work_registry_size() == count - k - 1,
                "after " + route + " the registry holds the works not yet waited (" +
                    std::to_string(count - k - 1) + "), not " +
                    std::to_string(work_registry_size()));
    for (std::size_t j = 0; j < count; ++j) {
      env.require(waited[j] || results[j].is_pending(),
                  "a result not waited stays pending while others are waited");
    }
    const Tensor expected =
        reference_reduce(c.data_seed + i, all, c.shape, DType::Int64, ReduceOp::Kind::Sum);
    env.require_bitwise_equal(results[i], expected, "result waited by " + route);
    if (c.twice[k]) {
      env.require_bitwise_equal(wait_tensor(results[i]), expected, "a second wait (idempotent)");
      env.require(work_registry_size() == count - k - 1, "a second wait changes nothing");
    }
  }
  for (const Tensor& result : results) {
    env.record(result);
  }
}

// ---- The registry drains whatever happens to results

enum class Fate { WaitThenDrop, DropUnwaited, ViewOutlivesResult, CoalescedDropOneByOne };
constexpr const char* kFateNames[] = {"wait then drop", "drop unwaited", "view outlives the result",
                                      "coalesced, outputs dropped one by one"};
// Drawn with gen_index: every fate at every case size.
constexpr int kFateCount = static_cast<int>(std::size(kFateNames));
static_assert(kFateCount == static_cast<int>(Fate::CoalescedDropOneByOne) + 1);

struct CleanupCase {
  Shape shape;
  std::vector<Fate> fates;  // one per issued call
  std::vector<int> order;   // the order calls meet their fate
  std::uint64_t data_seed = 0;
};

void showValue(const CleanupCase& c, std::ostream& out) {
  out << c.fates.size() << " calls of " << shape_text(c.shape) << ":";
  for (std::size_t k = 0; k < c.order.size(); ++k) {
    const auto i = static_cast<std::size_t>(c.order[k]);
    out << " #" << i << " " << kFateNames[static_cast<int>(c.fates[i])] << ";";
  }
  out << " data seed " << c.data_seed;
}

rc::Gen<CleanupCase> gen_cleanup_case(const World&) {
  return rc::gen::exec([] {
    CleanupCase c;
    c.shape = *gen_nonempty_shape();
    const int count = *rc::gen::inRange(1, 6);
    for (int i = 0; i < count; ++i) {
      c.fates.push_back(static_cast<Fate>(*gen_index(kFateCount)));
    }
    c.order = *gen_permutation(count);
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

void check_cleanup(const CleanupCase& c, Env& env) {
  const std::vector<int> all = world_ranks(world_size());
  const std::size_t count = c.fates.size();
  // Each call's handles: result(s) and, for ViewOutlivesResult, a view.
  std::vector<std::vector<Tensor>> handles(count);
  for (std::size_t i = 0; i < count; ++i) {
    const Tensor input = exact_input(c.data_seed + i, env.rank(), c.shape, DType::Int64);
    if (c.fates[i] == Fate::CoalescedDropOneByOne) {
      handles[i] = all_reduce_coalesced({input, input}, "sum", world());
    } else {
      const Tensor result = all_reduce(input, "sum", world());
      // Dropped from the back: the result goes first, its view outlives it.
      handles[i] = c.fates[i] == Fate::ViewOutlivesResult
                       ? std::vector<Tensor>{result.flatten(), result}
                       : std::vector<Tensor>{result};
    }
  }
  std::size_t pending = count;
  env.require(work_registry_size() == pending,
              "one work per call (a coalesced call counts 1), registry holds " +
                  std::to_string(work_registry_size()));
  for (const int index : c.order) {
    const auto i = static_cast<std::size_t>(index);
    const std::string fate = kFateNames[static_cast<int>(c.fates[i])];
    std::vector<Tensor>& held = handles[i];
    if (c.fates[i] == Fate::WaitThenDrop) {
      env.require_bitwise_equal(
          held[0], reference_reduce(c.data_seed + i, all, c.shape, DType::Int64, "sum"),
          "a waited result");
    }
    // Drop the handles one by one: the work stays registered while any is alive (unless
    // waited), and leaves when the last goes.
    while (!held.empty()) {
      held.pop_back();
      const bool gone = held.empty() || c.fates[i] == Fate::WaitThenDrop;
      const std::size_t expected = gone ? pending - 1 : pending;
      env.require(work_registry_size() == expected,
                  fate + ": registry holds " + std::to_string(work_registry_size()) +
                      " after dropping a handle, expected " + std::to_string(expected));
    }
    --pending;
  }
  env.require(work_registry_size() == 0, "the registry drains to 0");
}

// ---- Address reuse (ABA): run under the simulator's LIFO allocator, where a freed block is the
// next one handed out.

struct ReuseCase {
  Shape shape;
  int rounds = 1;
  std::uint64_t data_seed = 0;
};

void showValue(const ReuseCase& c, std::ostream& out) {
  out << c.rounds << " rounds on " << shape_text(c.shape) << ", data seed " << c.data_seed;
}

rc::Gen<ReuseCase> gen_reuse_case(const World&) {
  return rc::gen::exec([] {
    ReuseCase c;
    c.shape = *gen_nonempty_shape();
    c.rounds = *rc::gen::inRange(1, 4);
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

void check_reuse(const ReuseCase& c, Env& env) {
  const std::vector<int> all = world_ranks(world_size());
  for (int round = 0; round < c.rounds; ++round) {
    const std::uint64_t seed = c.data_seed + static_cast<std::uint64_t>(round) * 2;
    Tensor dropped =
        all_reduce(exact_input(seed, env.rank(), c.shape, DType::Int64), "sum", world());
    const void* dropped_address = dropped.unsafe_data_ptr();
    dropped = Tensor();  // dropped pending: its work is finalized, its blocks freed
    env.require(work_registry_size() == 0, "a dropped pending result leaves the registry");
    // Under LIFO reuse the next blocks of this size are the freed ones (the dropped output's and
    // its input's): one of two fresh tensors sits at the dropped output's address. It is not
    // pending, and stays as written whatever the dropped collective does.
    const Tensor fresh = Tensor::full(c.shape, 7, DType::Int64);
    const Tensor fresh_too = Tensor::full(c.shape, 7, DType::Int64);
    const bool reused = fresh.unsafe_data_ptr() == dropped_address ||
                        fresh_too.unsafe_data_ptr() == dropped_address;
    env.require(reused, "the LIFO allocator hands the dropped output's block out again");
    env.require(!fresh.is_pending() && !fresh_too.is_pending(),
                "a fresh tensor at a reused address is not pending");
    const Tensor next =
        all_reduce(exact_input(seed + 1, env.rank(), c.shape, DType::Int64), "sum", world());
    env.require(work_registry_size() == 1, "one pending work after the next call");
    env.require_bitwise_equal(next, reference_reduce(seed + 1, all, c.shape, DType::Int64, "sum"),
                              "the result of a call issued after the drop");
    env.require_bitwise_equal(fresh, Tensor::full(c.shape, 7, DType::Int64),
                              "a fresh tensor allocated after the drop (untouched)");
    env.require_bitwise_equal(fresh_too, Tensor::full(c.shape, 7, DType::Int64),
                              "a second fresh tensor allocated after the drop (untouched)");
    env.record(next);
  }
}

}  // namespace

std::vector<Property> async_properties() {
  Needs lifo;
  lifo.simulator_only = true;
  lifo.allocator = sim::AllocatorPolicy::LifoReuse;
  return {
      make_property<WaitCase>("async.wait_orders",
                              "waits in any order and by any route (view, data access, "
                              "wait_tensors, another thread) are exact and idempotent; views "
                              "never wait",
                              gen_wait_case, check_wait_orders),
      make_property<CleanupCase>("async.registry_cleanup",
                                 "the registry counts distinct pending works exactly while "
                                 "results are waited, dropped or outlived by views, and drains",
                                 gen_cleanup_case, check_cleanup),
      make_property<ReuseCase>("async.address_reuse",
                               "under LIFO address reuse a dropped pending result never "
                               "confuses the registry or writes into a new tensor",
                               gen_reuse_case, check_reuse, lifo),
  };
}

}  // namespace chorus::props::families
