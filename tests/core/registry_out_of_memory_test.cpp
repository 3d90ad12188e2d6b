// The work registry when memory runs out while it links a work (Note [Registry links]): a failed
// registration throws std::bad_alloc and leaves no half-made link behind, so the storages stay
// consistent and the rank ends cleanly; and while it completes works together as unwaited (a
// drop, deferred drops, the rank's exit), which never throw: what cannot be claimed now is
// completed in a later round. And while a collective call registers its work
// (Note [Registration]): every allocation the call makes, refused in turn, either fails the call
// before its operation started or leaves the operation registered and waitable; none is made after
// the start. Its own executable: it replaces the global operator new.

#include <gtest/gtest.h>

#include <atomic>
#include <chorus/chorus.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "detail/rank_state.hpp"
#include "detail/storage.hpp"
#include "detail/tensor_access.hpp"
#include "detail/work_registry.hpp"
#include "support/fake_transport.hpp"
#include "support/refusing_new.hpp"

namespace {

// The size of the next allocation to refuse (0: none).
std::atomic<std::size_t> refuse_next_allocation_of{0};
// Every allocation is refused while set.
std::atomic<bool> refuse_every_allocation{false};

// While counting, allocations are numbered from 1, and the one numbered refuse_allocation_number
// (0: none) is refused; refused_in_transport and refused_after_start say whether core had handed
// the operation to the transport by then (in_transport_call, set by the fake transport's on_call)
// and whether the transport had started it (operation_started, set by its on_started).
std::atomic<bool> counting{false};
std::atomic<std::size_t> allocations_counted{0};
std::atomic<std::size_t> refuse_allocation_number{0};
std::atomic<bool> in_transport_call{false};
std::atomic<bool> operation_started{false};
std::atomic<bool> refused_in_transport{false};
std::atomic<bool> refused_after_start{false};

// A StampedLinks' first spilled link: the registry's only allocation when a second link is made
// (once the registry's work list has room).
constexpr std::size_t kLinkBytes =
    sizeof(chorus::detail::StampedLinks<chorus::detail::PendingWork>::Link);

}  // namespace

bool chorus::testing::refuse_allocation(std::size_t size) noexcept {
  if (refuse_every_allocation.load()) {
    return true;
  }
  std::size_t refused = size;
  if (size != 0 && refuse_next_allocation_of.compare_exchange_strong(refused, 0)) {
    return true;
  }
  if (counting.load()) {
    std::size_t number = allocations_counted.fetch_add(1) + 1;
    if (refuse_allocation_number.compare_exchange_strong(number, 0)) {
      refused_in_transport.store(in_transport_call.load());
      refused_after_start.store(operation_started.load());
      return true;
    }
  }
  return false;
}

namespace chorus {
namespace {

using testing::FakeTransport;
using testing::FakeWork;

// A transport work that completes when waited.
std::shared_ptr<FakeWork> fake_work() {
  auto fake =
      std::make_shared<FakeWork>(transport::Fingerprint{1, 0, {}},
                                 std::vector<std::pair<transport::Buffer, transport::Buffer>>{});
  fake->complete_when_waited();
  return fake;
}

std::shared_ptr<detail::PendingWork> pending(RankContext& context,
                                             const std::shared_ptr<FakeWork>& fake,
                                             std::int64_t seq = 0) {
  return std::make_shared<detail::PendingWork>(fake, detail::WorkInfo{0, "test", seq, "[0]", {}},
                                               nullptr, context.state().transport_ptr(),
                                               std::chrono::hours(1));
}

// A batch of claims (works completed together as unwaited) holds its first inline and allocates
// for the second: that allocation fails.
const std::size_t kSecondClaimBytes = detail::WorkRegistry::second_claim_bytes();

// Expects the report to list works 0 and 1 in that order, as drops or as leftovers at exit.
void expect_two_lines(const std::vector<UnwaitedWork>& unwaited, bool at_rank_exit) {
  ASSERT_EQ(unwaited.size(), 2u);
  for (std::size_t i = 0; i < unwaited.size(); ++i) {
    EXPECT_EQ(unwaited[i].seq, static_cast<std::int64_t>(i));
    EXPECT_EQ(unwaited[i].at_rank_exit, at_rank_exit);
  }
}

// A second work on one storage spills the storage's list: that allocation fails.
TEST(RegistryOutOfMemory, ASecondWorkOnAStorageThatCannotBeLinkedIsNotRegistered) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  {
    ScopedRankBinding binding(&context);
    detail::WorkRegistry& registry = *context.state().registry();
    Tensor tensor = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3});
    detail::Storage* storage = detail::TensorAccess::storage(tensor).get();
    const auto first_fake = fake_work();
    const auto second_fake = fake_work();
    registry.add(pending(context, first_fake), storage);
    const auto second = pending(context, second_fake);
    refuse_next_allocation_of = kLinkBytes;
    EXPECT_THROW(registry.add(second, storage), std::bad_alloc);
    ASSERT_EQ(refuse_next_allocation_of.load(), 0u) << "the refused allocation was the registry's";
    EXPECT_EQ(registry.size(), 1u);
    EXPECT_TRUE(tensor.is_pending());
    wait_tensor(tensor);
    EXPECT_EQ(registry.size(), 0u);
    EXPECT_FALSE(tensor.is_pending());
    EXPECT_EQ(first_fake->waits(), 1);
    EXPECT_EQ(second_fake->waits(), 0) << "never registered, never waited";
    // Registering it again once memory is back works.
    registry.add(second, storage);
    EXPECT_TRUE(tensor.is_pending());
    tensor = Tensor();  // dropped: completed as unwaited
    EXPECT_EQ(registry.size(), 0u);
  }
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(summary.error, nullptr);
  EXPECT_EQ(summary.unwaited.size(), 1u);
}

// A work under two storages spills its own list at the second: that allocation (made when the
// registration reserves its room, Note [Registration]) fails, and neither storage keeps a link or
// a reservation.
TEST(RegistryOutOfMemory, AWorkWhoseSecondStorageCannotBeLinkedLeavesTheFirstUntouched) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  {
    ScopedRankBinding binding(&context);
    detail::WorkRegistry& registry = *context.state().registry();
    Tensor a = Tensor::from_vector(std::vector<std::int32_t>{1});
    Tensor b = Tensor::from_vector(std::vector<std::int32_t>{2});
    {
      // One work registered and waited first: the registry's work list keeps room for one.
      Tensor warm = Tensor::from_vector(std::vector<std::int32_t>{0});
      registry.add(pending(context, fake_work()), detail::TensorAccess::storage(warm).get());
      wait_tensor(warm);
    }
    const auto fake = fake_work();
    const auto work = pending(context, fake);
    const std::vector<detail::Storage*> storages = {detail::TensorAccess::storage(a).get(),
                                                    detail::TensorAccess::storage(b).get()};
    refuse_next_allocation_of = kLinkBytes;
    EXPECT_THROW(registry.add(work, storages), std::bad_alloc);
    ASSERT_EQ(refuse_next_allocation_of.load(), 0u) << "the refused allocation was the registry's";
    EXPECT_EQ(registry.size(), 0u);
    EXPECT_FALSE(a.is_pending());
    EXPECT_FALSE(b.is_pending());
    EXPECT_EQ(a.to_vector<std::int32_t>(), std::vector<std::int32_t>{1});
    // b holds no link to the failed work: a new work on it is its only one.
    const auto next_fake = fake_work();
    registry.add(pending(context, next_fake), detail::TensorAccess::storage(b).get());
    EXPECT_EQ(registry.size(), 1u);
    wait_tensor(b);
    EXPECT_EQ(registry.size(), 0u);
    EXPECT_EQ(next_fake->waits(), 1);
    a = Tensor();
    b = Tensor();
    EXPECT_EQ(fake->waits(), 0);
  }
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(summary.error, nullptr);
  EXPECT_TRUE(summary.unwaited.empty());
}

// ~Storage of a storage with two pending works: the first is completed at the drop, the second,
// for which no claim can be made, is left as a deferred drop (it terminated the process: the drop
// is noexcept).
TEST(RegistryOutOfMemory, ADropThatCannotClaimASecondWorkDefersIt) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  {
    ScopedRankBinding binding(&context);
    detail::WorkRegistry& registry = *context.state().registry();
    Tensor tensor = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3});
    const auto first = fake_work();
    const auto second = fake_work();
    registry.add(pending(context, first, 0), detail::TensorAccess::storage(tensor).get());
    registry.add(pending(context, second, 1), detail::TensorAccess::storage(tensor).get());
    refuse_next_allocation_of = kSecondClaimBytes;
    tensor = Tensor();
    ASSERT_EQ(refuse_next_allocation_of.load(), 0u) << "the refused allocation was the registry's";
    EXPECT_EQ(first->waits(), 1) << "completed at the drop";
    EXPECT_EQ(second->waits(), 0) << "deferred";
    EXPECT_EQ(second->drops(), 1);
    EXPECT_EQ(registry.size(), 1u);
    EXPECT_EQ(work_registry_size(), 0u);  // completes the deferred drop
    EXPECT_EQ(second->waits(), 1);
    expect_two_lines(registry.unwaited(), /*at_rank_exit=*/false);
  }
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(summary.error, nullptr);
}

// Two deferred drops settled together: the second is claimed in a second round.
TEST(RegistryOutOfMemory, DeferredDropsThatCannotAllBeClaimedAtOnceAreCompletedInRounds) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  {
    ScopedRankBinding binding(&context);
    detail::WorkRegistry& registry = *context.state().registry();
    std::vector<std::shared_ptr<FakeWork>> fakes;
    for (std::int64_t seq = 0; seq < 2; ++seq) {
      Tensor tensor = Tensor::from_vector(std::vector<std::int32_t>{1});
      fakes.push_back(fake_work());
      fakes.back()->defer_finalization_when_dropped();
      registry.add(pending(context, fakes.back(), seq),
                   detail::TensorAccess::storage(tensor).get());
    }  // both dropped, deferred
    EXPECT_EQ(registry.size(), 2u);
    refuse_next_allocation_of = kSecondClaimBytes;
    EXPECT_EQ(work_registry_size(), 0u);
    ASSERT_EQ(refuse_next_allocation_of.load(), 0u) << "the refused allocation was the registry's";
    for (const auto& fake : fakes) {
      EXPECT_EQ(fake->waits(), 1);
      EXPECT_EQ(fake->finalizations(), 1);
    }
    expect_two_lines(registry.unwaited(), /*at_rank_exit=*/false);
  }
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(summary.error, nullptr);
}

// Two leftovers at the rank's exit: the second is claimed in a second round.
TEST(RegistryOutOfMemory, LeftoversThatCannotAllBeClaimedAtOnceAreCompletedInRounds) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  std::vector<Tensor> kept;
  std::vector<std::shared_ptr<FakeWork>> fakes;
  {
    ScopedRankBinding binding(&context);
    for (std::int64_t seq = 0; seq < 2; ++seq) {
      kept.push_back(Tensor::from_vector(std::vector<std::int32_t>{1}));
      fakes.push_back(fake_work());
      context.state().registry()->add(pending(context, fakes.back(), seq),
                                      detail::TensorAccess::storage(kept.back()).get());
    }
  }
  refuse_next_allocation_of = kSecondClaimBytes;
  const RankContext::Summary summary = context.finish();
  ASSERT_EQ(refuse_next_allocation_of.load(), 0u) << "the refused allocation was the registry's";
  EXPECT_EQ(context.state().registry()->size(), 0u);
  for (const auto& fake : fakes) {
    EXPECT_EQ(fake->waits(), 1);
  }
  EXPECT_EQ(summary.error, nullptr);
  expect_two_lines(summary.unwaited, /*at_rank_exit=*/true);
}

// Note [Stream-waited works]: a Completion::Stream work still running when the rank exits is
// finished on the host there, in a noexcept function. With no memory at all the exit still takes
// it off the list and finishes it (the wait's failure cannot even be recorded) instead of
// terminating the process: it swapped the list into a local std::deque, whose constructor
// allocates in libstdc++.
TEST(RegistryOutOfMemory, AStreamWaitedWorkIsFinishedAtExitWithoutMemory) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  const std::shared_ptr<FakeWork> fake = fake_work();  // completes when the host waits
  {
    ScopedRankBinding binding(&context);
    detail::WorkRegistry& registry = *context.state().registry();
    Tensor tensor = Tensor::from_vector(std::vector<std::int32_t>{1});
    registry.add(
        std::make_shared<detail::PendingWork>(fake, detail::WorkInfo{0, "test", 0, "[0]", {}},
                                              nullptr, context.state().transport_ptr(),
                                              std::chrono::hours(1), detail::Completion::Stream),
        detail::TensorAccess::storage(tensor).get());
    wait_tensor(tensor);  // a stream wait: the host does not wait, the work stays in flight
    ASSERT_EQ(fake->stream_waits(), 1);
    ASSERT_EQ(fake->waits(), 0);
    ASSERT_EQ(registry.stream_waited_in_flight(), 1u);
    refuse_every_allocation = true;
    registry.complete_all_at_exit();
    refuse_every_allocation = false;
    EXPECT_EQ(fake->waits(), 1) << "finished on the host at exit";
    EXPECT_EQ(registry.stream_waited_in_flight(), 0u);
  }
  const RankContext::Summary summary = context.finish();
  EXPECT_EQ(summary.error, nullptr);
  EXPECT_TRUE(summary.unwaited.empty());
}

// A dropped work whose completion fails while no memory is left: neither the report's line nor
// the explained error can be made, and the deferred errors have no room, yet the rank still
// fails, with the transport's own error.
TEST(RegistryOutOfMemory, ADroppedWorkThatFailsWithoutMemoryStillFailsTheRank) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  const auto fake =
      std::make_shared<FakeWork>(transport::Fingerprint{1, 0, {}},
                                 std::vector<std::pair<transport::Buffer, transport::Buffer>>{});
  fake->fail(std::make_exception_ptr(
      TransportError(ErrorContext{0, "fake", 0, ""}, "the link went down")));
  {
    ScopedRankBinding binding(&context);
    detail::WorkRegistry& registry = *context.state().registry();
    Tensor tensor = Tensor::from_vector(std::vector<std::int32_t>{1});
    registry.add(pending(context, fake, 0), detail::TensorAccess::storage(tensor).get());
    refuse_every_allocation = true;
    tensor = Tensor();  // the drop completes the work, which fails
    refuse_every_allocation = false;
    EXPECT_EQ(fake->waits(), 1);
    EXPECT_TRUE(registry.unwaited().empty()) << "the report's line was refused";
  }
  const RankContext::Summary summary = context.finish();
  ASSERT_NE(summary.error, nullptr) << "the failure was lost";
  try {
    std::rethrow_exception(summary.error);
  } catch (const TransportError& e) {
    EXPECT_EQ(e.detail(), "the link went down");
  } catch (...) {
    ADD_FAILURE() << "not the transport's error";
  }
}

// Three failed drops, the second's recorded with no memory at all: the errors come out in the
// order they happened, the second from its room of its own; the third, deferred while the
// second still waits there, is lost rather than raised before it.
TEST(RegistryOutOfMemory, DeferredErrorsKeepTheirOrderWhenOneHadNoRoom) {
  auto transport = std::make_shared<FakeTransport>();
  RankContext context(transport);
  ScopedRankBinding binding(&context);
  detail::WorkRegistry& registry = *context.state().registry();
  for (int i = 0; i < 3; ++i) {
    const auto fake =
        std::make_shared<FakeWork>(transport::Fingerprint{1, i, {}},
                                   std::vector<std::pair<transport::Buffer, transport::Buffer>>{});
    fake->fail(std::make_exception_ptr(
        TransportError(ErrorContext{0, "fake", i, ""}, "failure " + std::to_string(i))));
    Tensor tensor = Tensor::from_vector(std::vector<std::int32_t>{1});
    registry.add(pending(context, fake, i), detail::TensorAccess::storage(tensor).get());
    refuse_every_allocation = i == 1;
    tensor = Tensor();  // the drop completes the work, which fails
    refuse_every_allocation = false;
  }
  std::vector<std::string> raised;
  while (const std::exception_ptr error = registry.take_deferred_error()) {
    try {
      std::rethrow_exception(error);
    } catch (const TransportError& e) {
      raised.push_back(e.detail());
    }
  }
  ASSERT_EQ(raised.size(), 2u);
  EXPECT_NE(raised[0].find("failure 0"), std::string::npos) << raised[0];
  EXPECT_EQ(raised[1], "failure 1") << "the transport's own error: no memory to explain it";
}

// ---- Registration (Note [Registration]).

// One kind of collective call, on inputs made before the allocations are counted. It moves its
// results into `results` (room made beforehand), so it allocates nothing after the call returns;
// an in-place call's results are its inputs. On one rank every result equals its input.
struct CallKind {
  const char* name;
  std::function<std::vector<Tensor>()> make_inputs;
  std::function<void(std::vector<Tensor>& inputs, std::vector<Tensor>& results)> call;
  bool results_are_inputs = false;
};

std::vector<CallKind> call_kinds() {
  const auto one = [] { return std::vector<Tensor>{Tensor::arange(6, DType::Int32).view({2, 3})}; };
  const ReduceOp sum("sum");
  const GroupSpec group({0});
  return {
      {"all_reduce", one,
       [sum, group](std::vector<Tensor>& inputs, std::vector<Tensor>& results) {
         results[0] = all_reduce(inputs[0], sum, group);
       }},
      {"all_gather_tensor along dim 1 (a fixup)", one,
       [group](std::vector<Tensor>& inputs, std::vector<Tensor>& results) {
         results[0] = all_gather_tensor(inputs[0], 1, group);
       }},
      {"all_reduce_coalesced (several outputs)",
       [] {
         return std::vector<Tensor>{Tensor::arange(3, DType::Int32),
                                    Tensor::arange(5, DType::Int32),
                                    Tensor::arange(2, DType::Int32)};
       },
       [sum, group](std::vector<Tensor>& inputs, std::vector<Tensor>& results) {
         results = all_reduce_coalesced(inputs, sum, group);
       }},
      {"all_reduce_inplace (the caller's storage)", one,
       [sum, group](std::vector<Tensor>& inputs, std::vector<Tensor>&) {
         all_reduce_inplace(inputs[0], sum, group);
       },
       /*results_are_inputs=*/true},
  };
}

void start_counting(std::size_t refuse) {
  allocations_counted = 0;
  in_transport_call = false;
  operation_started = false;
  refused_in_transport = false;
  refused_after_start = false;
  refuse_allocation_number = refuse;
  counting = true;
}

// Stops counting; returns the allocations counted.
std::size_t stop_counting() {
  counting = false;
  return allocations_counted.load();
}

// Every allocation a collective call makes is refused in turn, at every point up to its end (a
// wait inside the call included): the call either fails before its operation started (with
// std::bad_alloc, or the InvalidArgument an output's allocation becomes; the transport started
// nothing, and no sequence number was taken, the refusal in the transport's own call included),
// or its operation is registered and waitable, with the right result. After the transport started
// the operation the call allocates nothing at all, so no refusal can land there. (A refusal in
// the transport's call is also a transport call that throws: the room reserved is given back, and
// so is the sequence number.)
TEST(RegistryOutOfMemory, ACollectiveCallFailsBeforeItsOperationStartsOrRegistersIt) {
  for (const CallKind& kind : call_kinds()) {
    SCOPED_TRACE(kind.name);
    auto transport = std::make_shared<FakeTransport>();
    RankContext context(transport);
    {
      ScopedRankBinding binding(&context);
      std::size_t allocations_at_start = 0;
      transport->on_call = [] { in_transport_call = true; };
      transport->on_started = [&] {
        allocations_at_start = allocations_counted.load();
        operation_started = true;
        transport->last_work()->complete_when_waited();
      };
      std::int64_t next_seq = 0;
      std::size_t failed_before_start = 0;
      std::size_t registered_despite_refusal = 0;
      std::size_t refused_in_transport_call = 0;
      // n = 0: nothing refused. Then the n-th allocation, until a run makes fewer than n.
      for (std::size_t n = 0;; ++n) {
        ASSERT_LT(n, 10'000u) << "the sweep does not end";
        std::vector<Tensor> inputs = kind.make_inputs();
        std::vector<std::int32_t> expected;
        for (const Tensor& input : inputs) {
          const auto values = input.to_vector<std::int32_t>();
          expected.insert(expected.end(), values.begin(), values.end());
        }
        std::vector<Tensor> results(inputs.size());
        const std::size_t works_before = transport->works().size();
        std::string thrown;
        start_counting(n);
        try {
          kind.call(inputs, results);
        } catch (const std::bad_alloc&) {
          thrown = "std::bad_alloc";
        } catch (const std::exception& e) {
          thrown = e.what();
        }
        const std::size_t allocations = stop_counting();
        if (kind.results_are_inputs) {
          results = inputs;
        }
        const bool refused = n != 0 && refuse_allocation_number.load() == 0;
        refuse_allocation_number = 0;
        // The call made fewer than n allocations: every one was refused once, this is the last run.
        const bool last = n != 0 && !refused;
        if (n == 0 || last) {
          ASSERT_EQ(thrown, "");
          ASSERT_TRUE(operation_started.load());
          EXPECT_EQ(allocations - allocations_at_start, 0u)
              << "allocations after the transport started the operation";
        }
        SCOPED_TRACE("allocation " + std::to_string(n) + " refused");
        EXPECT_FALSE(refused && refused_after_start.load())
            << "an allocation after the transport started the operation";
        if (!thrown.empty()) {
          // std::bad_alloc, or the InvalidArgument an output's allocation becomes (docs/errors.md).
          EXPECT_TRUE(thrown == "std::bad_alloc" ||
                      thrown.find("cannot allocate the output") != std::string::npos)
              << thrown;
          EXPECT_FALSE(operation_started.load()) << "started, then failed: abandoned";
          EXPECT_EQ(transport->works().size(), works_before) << "the transport saw nothing";
          EXPECT_EQ(work_registry_size(), 0u);
          for (const Tensor& input : inputs) {
            EXPECT_FALSE(input.is_pending());
          }
          // Even a refusal in the transport's own call (core had handed the operation over with
          // its sequence number) takes no number: a transport call that throws started nothing,
          // and core gives the number back (Note [Transport contract]). The next operation's
          // number, checked below, is the one this call would have had.
          if (refused_in_transport.load()) {
            ++refused_in_transport_call;
          }
          ++failed_before_start;
          continue;
        }
        if (refused) {
          ++registered_despite_refusal;  // the refusal was absorbed (e.g. a report line)
        }
        // Started and registered: waitable, exactly once, with the right result.
        ASSERT_EQ(transport->works().size(), works_before + 1);
        const std::shared_ptr<FakeWork> work = transport->last_work();
        EXPECT_EQ(work->fingerprint().seq, next_seq++) << "one sequence number per operation";
        std::vector<std::int32_t> got;
        for (const Tensor& result : wait_tensors(results)) {
          const auto values = result.to_vector<std::int32_t>();
          got.insert(got.end(), values.begin(), values.end());
        }
        EXPECT_EQ(got, expected);
        EXPECT_EQ(work->waits(), 1);
        EXPECT_EQ(work_registry_size(), 0u);
        if (last) {
          break;
        }
      }
      EXPECT_GT(failed_before_start, 0u) << "the sweep refused the call's allocations";
      EXPECT_EQ(registered_despite_refusal, 0u);
      EXPECT_GT(refused_in_transport_call, 0u) << "the sweep refused the transport's allocations";
      transport->on_call = nullptr;
      transport->on_started = nullptr;
    }
    const RankContext::Summary summary = context.finish();
    EXPECT_EQ(summary.error, nullptr);
    EXPECT_TRUE(summary.unwaited.empty()) << "no operation was lost or dropped";
  }
}

// The first operation on a partitioned group (Note [Partitioned groups]) with each of its
// allocations refused in turn: however it fails, the rank creates the partition's communicator
// once, as every other rank does. One created but not recorded would be created again by the
// rank's next operation, on this rank alone: on a real transport a hang.
TEST(RegistryOutOfMemory, APartitionIsCreatedOnceHoweverItsFirstOperationRunsOutOfMemory) {
  const GroupSpec group(std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  std::size_t failed = 0;
  for (std::size_t refuse = 1;; ++refuse) {
    auto transport = std::make_shared<FakeTransport>(/*rank=*/2, /*world_size=*/4);
    RankContext context(transport);
    ScopedRankBinding binding(&context);
    const Tensor input = Tensor::ones({2}, DType::Int32);
    start_counting(refuse);
    try {
      Tensor result = all_reduce(input, "sum", group);
      stop_counting();
      transport->last_work()->complete();
    } catch (const std::bad_alloc&) {
      stop_counting();
      ++failed;
    } catch (const InvalidArgument&) {
      stop_counting();
      ++failed;
    }
    const bool last = allocations_counted.load() < refuse;  // nothing was refused
    // The next operation on the partition (or a second, after a first that failed).
    Tensor result = all_reduce(input, "sum", group);
    transport->last_work()->complete();
    EXPECT_EQ(result.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 1}));
    EXPECT_EQ(transport->partitions_created, 1) << "allocation " << refuse << " refused";
    if (last) {
      break;
    }
  }
  EXPECT_GT(failed, 0u) << "the sweep refused the call's allocations";
}

}  // namespace
}  // namespace chorus
