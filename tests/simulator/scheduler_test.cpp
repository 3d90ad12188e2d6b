// The simulator's scheduling: determinism from one seed, interleavings that vary with the seed,
// one rank at a time, world sizes 1..64, both executors, poisoned pending outputs, the report.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chorus/chorus.hpp>
#include <chorus/transport/transport.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "support/expect_error.hpp"
#include "support/scoped_environment.hpp"

namespace chorus {
namespace {

using sim::ExecutorKind;
using sim::SimOptions;
using sim::SimReport;

// Float32 elements [offset, offset + count) of `memory`, for a call straight on the transport.
transport::Buffer floats(std::vector<float>& memory, std::size_t offset, std::size_t count) {
  transport::Buffer buffer;
  buffer.data = memory.data() + offset;
  buffer.count = count;
  return buffer;
}

SimOptions quiet(int world_size, std::uint64_t seed, ExecutorKind executor = ExecutorKind::Auto) {
  SimOptions options;
  options.world_size = world_size;
  options.seed = seed;
  options.executor = executor;
  options.print_failures = false;
  options.seed_from_environment = false;
  return options;
}

// A program whose ranks log the order in which they pass their chorus calls, on a world group
// and on two overlapping sub-groups.
struct Trace {
  std::vector<int> order;     // rank ids in the order they resumed after each call
  std::vector<float> result;  // rank 0's final values
};

Trace traced_program(const SimOptions& options, SimReport* report = nullptr) {
  Trace trace;
  SimReport result = sim::run(options, [&trace] {
    const int r = rank();
    const int size = world_size();
    Tensor x = Tensor::full({4}, static_cast<double>(r + 1));
    Tensor a = all_reduce(x, "sum", world());
    trace.order.push_back(r);
    const std::vector<int> left = {0, size / 2};
    std::vector<int> mine = left;
    if (r != 0 && r != size / 2) {
      mine = {r};
    }
    Tensor b = all_gather_tensor(a, 0, mine);
    trace.order.push_back(r);
    Tensor c = reduce_scatter_tensor(Tensor::full({static_cast<std::int64_t>(size)}, r), "max", 0,
                                     world());
    trace.order.push_back(r);
    std::vector<float> values = b.to_vector<float>();
    values.push_back(c.item<float>());
    trace.order.push_back(r);
    if (r == 0) {
      trace.result = values;
    }
  });
  if (report != nullptr) {
    *report = result;
  }
  return trace;
}

TEST(SimScheduler, SameSeedGivesTheSameScheduleAndBytes) {
  for (std::uint64_t seed : {0ull, 1ull, 12345ull}) {
    SimReport first_report;
    SimReport second_report;
    const Trace first = traced_program(quiet(5, seed), &first_report);
    const Trace second = traced_program(quiet(5, seed), &second_report);
    EXPECT_EQ(first.order, second.order) << "seed " << seed;
    EXPECT_EQ(first_report.schedule, second_report.schedule);
    EXPECT_EQ(first_report.schedule_hash, second_report.schedule_hash);
    EXPECT_EQ(first_report.steps, second_report.steps);
    ASSERT_EQ(first.result.size(), second.result.size());
    EXPECT_EQ(0, std::memcmp(first.result.data(), second.result.data(),
                             first.result.size() * sizeof(float)));
  }
}

TEST(SimScheduler, DifferentSeedsGiveDifferentInterleavingsButTheSameBytes) {
  std::set<std::vector<int>> orders;
  std::set<std::uint64_t> hashes;
  std::vector<float> reference;
  for (std::uint64_t seed = 0; seed < 16; ++seed) {
    SimReport report;
    const Trace trace = traced_program(quiet(5, seed), &report);
    orders.insert(trace.order);
    hashes.insert(report.schedule_hash);
    if (seed == 0) {
      reference = trace.result;
    }
    EXPECT_EQ(0,
              std::memcmp(reference.data(), trace.result.data(), reference.size() * sizeof(float)))
        << "results must not depend on the schedule (seed " << seed << ")";
  }
  EXPECT_GE(orders.size(), 12u) << "16 seeds should explore distinct interleavings";
  EXPECT_EQ(hashes.size(), 16u);
}

TEST(SimScheduler, FibersAndThreadsFollowTheSameSchedule) {
  SimReport fiber_report;
  SimReport thread_report;
  const Trace fibers = traced_program(quiet(4, 99, ExecutorKind::Fibers), &fiber_report);
  const Trace threads = traced_program(quiet(4, 99, ExecutorKind::Threads), &thread_report);
  EXPECT_EQ(fibers.order, threads.order);
  EXPECT_EQ(fiber_report.schedule_hash, thread_report.schedule_hash);
}

TEST(SimScheduler, OnlyOneRankRunsAtATime) {
  for (ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    std::atomic<int> running{0};
    std::atomic<int> most{0};
    sim::run(quiet(6, 3, executor), [&] {
      for (int i = 0; i < 5; ++i) {
        const int now = ++running;
        most = std::max(most.load(), now);
        --running;
        Tensor t = all_reduce(Tensor::ones({2}), "sum", world());
        const int again = ++running;
        most = std::max(most.load(), again);
        --running;
        (void)t.to_vector<float>();  // a scheduling point: others may run now
      }
    });
    EXPECT_EQ(most.load(), 1);
  }
}

// Note [Off-rank waiters]: a thread that is not a rank may wait on a work; the completion wakes
// it. Rank 1 joins the operation only once the thread has had time to fall asleep on it (rank 0
// sleeps holding the schedule; rank 1 passes scheduling points on a communicator of its own).
TEST(SimScheduler, AThreadThatIsNotARankWakesWhenItsWorkCompletes) {
  for (ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    std::atomic<bool> waiter_asleep{false};
    std::atomic<bool> pending_when_asleep{false};
    std::atomic<int> woken{0};
    const SimReport report =
        sim::run(quiet(2, 5, executor), [&waiter_asleep, &pending_when_asleep, &woken] {
          transport::Transport& rank_transport = RankContext::current()->transport();
          const std::shared_ptr<transport::Comm> comm =
              rank_transport.create_comm("off_rank_waiter", {0, 1});
          std::vector<float> send = {1.0F};
          std::vector<float> recv = {0.0F};
          const transport::Buffer send_buffer = floats(send, 0, 1);
          const transport::Buffer recv_buffer = floats(recv, 0, 1);
          transport::OpInfo info;
          info.name = "all_reduce";
          if (rank_transport.rank() == 1) {
            const std::shared_ptr<transport::Comm> own =
                rank_transport.create_comm("off_rank_own", {1});
            for (info.seq = 0; !waiter_asleep.load(); ++info.seq) {
              own->all_reduce(send_buffer, recv_buffer, ReduceOp::Kind::Sum, info)
                  ->wait(transport::Deadline::never());
            }
            info.seq = 0;
            comm->all_reduce(send_buffer, recv_buffer, ReduceOp::Kind::Sum, info)
                ->wait(transport::Deadline::never());
            return;
          }
          info.seq = 0;
          const std::shared_ptr<transport::Work> work =
              comm->all_reduce(send_buffer, recv_buffer, ReduceOp::Kind::Sum, info);
          auto woke = std::make_shared<std::promise<void>>();
          std::future<void> woke_future = woke->get_future();
          std::thread waiter([work, woke] {
            work->wait(transport::Deadline::never());
            woke->set_value();
          });
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          pending_when_asleep = work->status() == transport::WorkStatus::Pending;
          waiter_asleep = true;
          work->wait(transport::Deadline::never());  // on the rank: rank 1 joins, it completes
          if (woke_future.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
            waiter.detach();  // asleep for good: the notify missed it
            return;
          }
          waiter.join();
          woken += 1;
        });
    EXPECT_TRUE(report.ok());
    EXPECT_TRUE(pending_when_asleep.load());
    EXPECT_EQ(woken.load(), 1) << "the thread waiting off the ranks was not woken";
  }
}

// Note [Recycled slots]: a run's communicators start from the slots an earlier run's left on the
// thread, whose arrivals were counted for another group size.
TEST(SimScheduler, RunsOfOtherSizesOnOneThreadComputeTheSameResults) {
  for (const int size : {4, 2, 6, 1, 3, 8, 2}) {
    std::vector<std::int64_t> sums(static_cast<std::size_t>(size), -1);
    std::vector<std::size_t> gathered(static_cast<std::size_t>(size), 0);
    const SimReport report = sim::run(quiet(size, 11), [&] {
      const auto r = static_cast<std::size_t>(rank());
      for (int i = 0; i < 3; ++i) {
        Tensor sum = all_reduce(Tensor::full({2}, rank() + i, DType::Int64), "sum", world());
        sums[r] = sum.to_vector<std::int64_t>()[1];
      }
      gathered[r] = all_gather_tensor(Tensor::ones({3}), 0, world()).to_vector<float>().size();
    });
    ASSERT_TRUE(report.ok()) << "world size " << size;
    for (std::size_t r = 0; r < sums.size(); ++r) {
      EXPECT_EQ(sums[r], static_cast<std::int64_t>(size) * (size - 1) / 2 + 2 * size);
      EXPECT_EQ(gathered[r], static_cast<std::size_t>(3 * size));
    }
    EXPECT_EQ(report.collectives_completed, 4u);
  }
}

// Note [Recycled rank states] and Note [Recycled blocks]: a run on a thread reuses the room of the
// runs before it there (rank states, their first group and work list, the executor, the choice
// source). None of it may show: after runs that threw, crashed, deadlocked or timed out, one
// with the same seed gives the same report, bytes and choices as the first, and so does the same
// run on a thread of its own (fresh lists), with either executor.
struct RecordedRun {
  SimReport report;
  std::vector<std::vector<float>> results;  // every rank's outputs, in order
};

RecordedRun recorded_run(ExecutorKind executor) {
  RecordedRun run;
  SimOptions options = quiet(4, 31, executor);
  options.hash_data = true;
  run.results.resize(4);
  run.report = sim::simulate(options, [&run] {
    const auto r = static_cast<std::size_t>(rank());
    const std::vector<int> pair = {static_cast<int>(r & ~std::size_t{1}), static_cast<int>(r | 1)};
    for (int i = 0; i < 3; ++i) {
      Tensor sum = all_reduce(Tensor::full({5}, rank() * 3 + i), "sum", world());
      Tensor both = all_gather_tensor(sum, 0, pair);
      const std::vector<float> values = both.to_vector<float>();
      run.results[r].insert(run.results[r].end(), values.begin(), values.end());
    }
    std::ignore = all_reduce(Tensor::ones({2}), "max", world());  // dropped un-waited
  });
  return run;
}

void expect_same_run(const RecordedRun& a, const RecordedRun& b) {
  EXPECT_EQ(a.report.to_string(), b.report.to_string());
  EXPECT_EQ(a.report.schedule, b.report.schedule);
  EXPECT_EQ(a.report.schedule_hash, b.report.schedule_hash);
  EXPECT_EQ(a.report.choices, b.report.choices);
  EXPECT_EQ(a.report.data_hash, b.report.data_hash);
  EXPECT_EQ(a.report.replay_token, b.report.replay_token);
  EXPECT_EQ(a.report.replay_command, b.report.replay_command);
  EXPECT_EQ(a.report.marks, b.report.marks);
  EXPECT_EQ(a.report.rank_errors, b.report.rank_errors);
  EXPECT_EQ(a.report.unwaited.size(), b.report.unwaited.size());
  EXPECT_EQ(a.results, b.results);
}

// Runs that end badly, in every way that leaves a rank state, a group or an executor part-used.
void failing_runs(ExecutorKind executor) {
  // A rank throws between collectives, with work still pending on the others.
  SimReport threw = sim::simulate(quiet(3, 5, executor), [] {
    Tensor pending = all_reduce(Tensor::ones({7}), "sum", world());
    if (rank() == 1) {
      throw std::runtime_error("rank 1 gives up");
    }
    std::ignore = all_reduce(pending, "sum", world()).to_vector<float>();
  });
  EXPECT_FALSE(threw.ok());
  // A crash fault, then a deadlock on a sub-group, then a timeout.
  SimOptions crash = quiet(5, 6, executor);
  crash.faults.push_back(sim::Fault::crash(2, 1));
  EXPECT_FALSE(sim::simulate(crash, [] {
                 for (int i = 0; i < 3; ++i) {
                   std::ignore = all_reduce(Tensor::ones({3}), "sum", world()).item<float>();
                 }
               }).ok());
  EXPECT_FALSE(sim::simulate(quiet(4, 7, executor), [] {
                 if (rank() != 3) {
                   std::ignore = all_reduce(Tensor::ones({2}), "sum", world()).to_vector<float>();
                 }
               }).ok());
  SimOptions hang = quiet(2, 8, executor);
  hang.faults.push_back(sim::Fault::hang(0, 0));
  hang.timeout = std::chrono::milliseconds(5);
  EXPECT_FALSE(sim::simulate(hang, [] {
                 std::ignore = all_reduce(Tensor::ones({2}), "sum", world()).to_vector<float>();
               }).ok());
  // The run function itself refused (no rank ran) and a run whose ranks threw from the start.
  SimOptions refused = quiet(2, 9, executor);
  refused.world_size = 0;
  EXPECT_THROW(sim::simulate(refused, [] {}), InvalidArgument);
  EXPECT_FALSE(
      sim::simulate(quiet(6, 10, executor), [] { throw std::logic_error("at once"); }).ok());
}

TEST(SimScheduler, ARunOnAThreadIsIndependentOfTheRunsBeforeIt) {
  for (const ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    const RecordedRun first = recorded_run(executor);
    ASSERT_TRUE(first.report.ok()) << first.report.to_string();
    EXPECT_EQ(first.report.unwaited.size(), 4u);
    failing_runs(executor);
    const RecordedRun again = recorded_run(executor);
    expect_same_run(first, again);
    RecordedRun elsewhere;
    std::thread([&] { elsewhere = recorded_run(executor); }).join();
    expect_same_run(first, elsewhere);
    // And a thread whose lists hold what the failing runs left.
    RecordedRun after_failures;
    std::thread([&] {
      failing_runs(executor);
      after_failures = recorded_run(executor);
    }).join();
    expect_same_run(first, after_failures);
  }
}

// Note [Recycled rank states], Note [Recycled group rooms] (world.cpp): a rank state's
// communicator keys, and the world's groups and their index keys, take their member lists' room
// from those before them on the thread, emptied. After a run with larger groups, a run's keys
// and groups hold its own members only (core checks each communicator's ranks against its
// group's, and the labels name them).
TEST(SimScheduler, ACommunicatorKeyHoldsOnlyItsOwnMembers) {
  for (const ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    const SimReport before = sim::simulate(quiet(6, 3, executor), [] {
      const int r = rank();
      std::ignore = all_reduce(Tensor::ones({2}), "sum", world()).to_vector<float>();
      std::ignore =
          all_reduce(Tensor::ones({2}), "sum", std::vector<int>{r & ~1, r | 1}).to_vector<float>();
    });
    ASSERT_TRUE(before.ok()) << before.to_string();
    const SimReport report = sim::simulate(quiet(4, 4, executor), [] {
      const std::vector<int> members =
          rank() % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
      std::ignore = all_reduce(Tensor::ones({2}), "sum", members);  // dropped un-waited
    });
    ASSERT_TRUE(report.ok()) << report.to_string();
    ASSERT_EQ(report.unwaited.size(), 4u);
    for (const UnwaitedWork& work : report.unwaited) {
      EXPECT_EQ(work.group, work.rank % 2 == 0 ? "[0, 2]" : "[1, 3]") << work.to_string();
    }
  }
}

// SimWorld::group_for compares a request with the group made last before it looks in the index:
// a communicator whose members or tag differ from the last group's only in part still gets its
// own group. Each rank makes its communicators back to back (no scheduling point between them),
// asking, right after the group made last, for the same members under another tag, for a tag's
// other member list, and for the first group again; the ranks that run later ask for groups made
// before the last. Every member's communicator of a (tag, members) names the same group, and no
// two keys share one (with the members alone compared, "b" would get "a"'s group).
TEST(SimScheduler, CommunicatorsOfOneKeyShareAGroupAndOthersDoNot) {
  for (const ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    constexpr int kRanks = 3;
    const std::vector<std::pair<std::string, std::vector<int>>> keys = {
        {"a", {0, 1, 2}}, {"b", {0, 1, 2}}, {"a", {1, 2}}, {"", {0, 1, 2}}, {"a", {0, 1, 2}}};
    std::vector<std::vector<std::uint64_t>> ids(kRanks);
    const SimReport report = sim::simulate(quiet(kRanks, 5, executor), [&] {
      const int me = rank();
      transport::Transport& rank_transport = RankContext::current()->transport();
      std::vector<std::uint64_t>& mine = ids[static_cast<std::size_t>(me)];
      for (const auto& [tag, members] : keys) {
        if (std::find(members.begin(), members.end(), me) == members.end()) {
          mine.push_back(0);
          continue;
        }
        const std::shared_ptr<transport::Comm> comm = rank_transport.create_comm(tag, members);
        EXPECT_EQ(comm->tag(), tag);
        EXPECT_EQ(comm->ranks(), members);
        mine.push_back(comm->id());
      }
    });
    ASSERT_TRUE(report.ok()) << report.to_string();
    // Per key, the group its members' communicators named (whichever rank ran first made it).
    std::vector<std::uint64_t> group_of_key(keys.size(), 0);
    for (std::size_t k = 0; k < keys.size(); ++k) {
      for (const int member : keys[k].second) {
        const std::uint64_t id = ids[static_cast<std::size_t>(member)][k];
        EXPECT_NE(id, 0u) << "key " << k << ", rank " << member;
        if (group_of_key[k] == 0) {
          group_of_key[k] = id;
        }
        EXPECT_EQ(id, group_of_key[k]) << "key " << k << ", rank " << member;
      }
    }
    EXPECT_EQ(group_of_key[4], group_of_key[0]);  // the first key again
    EXPECT_EQ(std::set<std::uint64_t>(group_of_key.begin(), group_of_key.end()).size(), 4u);
  }
}

// Note [Shared world lists]: chorus::world()'s list is the process's one for the world size,
// never freed. After runs of other sizes, with either executor, world() holds this run's ranks
// only, and a world kept past its run (here, each rank's, by the test) still holds its own.
TEST(SimScheduler, AWorldListHoldsItsOwnRanksAndOneKeptPastItsRunKeepsThem) {
  for (const ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    std::vector<std::optional<ProcessGroup>> kept(6);
    ASSERT_TRUE(sim::simulate(quiet(6, 1, executor), [&kept] {
                  kept[static_cast<std::size_t>(rank())].emplace(world());
                  std::ignore = all_reduce(Tensor::ones({2}), "sum", world()).to_vector<float>();
                }).ok());
    for (const int size : {8, 3, 4, 1, 4}) {
      std::vector<std::vector<int>> seen(static_cast<std::size_t>(size));
      const SimReport report = sim::simulate(quiet(size, 2, executor), [&seen] {
        seen[static_cast<std::size_t>(rank())] = world().ranks();
        std::ignore = all_reduce(Tensor::ones({2}), "sum", world()).to_vector<float>();
      });
      ASSERT_TRUE(report.ok()) << report.to_string();
      std::vector<int> expected(static_cast<std::size_t>(size));
      for (int r = 0; r < size; ++r) {
        expected[static_cast<std::size_t>(r)] = r;
      }
      for (const std::vector<int>& ranks : seen) {
        EXPECT_EQ(ranks, expected) << "world size " << size;
      }
    }
    for (const std::optional<ProcessGroup>& group : kept) {
      ASSERT_TRUE(group.has_value());
      EXPECT_EQ(group->ranks(), (std::vector<int>{0, 1, 2, 3, 4, 5}));
    }
  }
}

// Note [Shared world lists]: every rank of every run of one world size, on either executor, is
// handed the same list by world(), so a world() group kept from an earlier run of that size is
// recognised as this run's world: it reduces over every rank, before and after a call on world(),
// tagged too. One kept from a run of another size is still checked as any list is, and refused.
TEST(SimScheduler, AWorldListIsTheProcesssOneForItsSize) {
  const auto sum_over = [](const GroupSpec& group, std::string_view tag) {
    return all_reduce(Tensor::ones({1}), "sum", group, tag).item<float>();
  };
  std::optional<ProcessGroup> kept_four;
  std::optional<ProcessGroup> kept_six;
  const std::vector<int>* first_list = nullptr;
  ASSERT_TRUE(sim::simulate(quiet(4, 3, ExecutorKind::Fibers), [&] {
                if (rank() == 0) {
                  kept_four.emplace(world());
                  first_list = &world().ranks();
                }
                std::ignore = sum_over(world(), "");
              }).ok());
  ASSERT_TRUE(sim::simulate(quiet(6, 3, ExecutorKind::Fibers), [&] {
                if (rank() == 0) {
                  kept_six.emplace(world());
                }
              }).ok());
  for (const ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    std::vector<const std::vector<int>*> lists(4);
    std::vector<std::vector<float>> sums(4);
    std::vector<std::string> refusals(4);
    const SimReport report = sim::simulate(quiet(4, 5, executor), [&] {
      const auto r = static_cast<std::size_t>(rank());
      lists[r] = &world().ranks();
      sums[r].push_back(sum_over(*kept_four, ""));
      sums[r].push_back(sum_over(world(), ""));
      sums[r].push_back(sum_over(*kept_four, ""));
      sums[r].push_back(sum_over(*kept_four, "tagged"));
      sums[r].push_back(sum_over(world(), "tagged"));
      try {
        std::ignore = sum_over(*kept_six, "");
      } catch (const InvalidArgument& error) {
        refusals[r] = error.what();
      }
    });
    ASSERT_TRUE(report.ok()) << report.to_string();
    for (std::size_t r = 0; r < 4; ++r) {
      EXPECT_EQ(lists[r], first_list) << "rank " << r;
      EXPECT_EQ(sums[r], (std::vector<float>{4, 4, 4, 4, 4})) << "rank " << r;
      EXPECT_NE(refusals[r].find("process group"), std::string::npos) << refusals[r];
    }
  }
}

// Note [Shared world lists]: the world's group takes the process's label for its size, which
// must read as any group's: world() and its list spelled out "[0, ..., W - 1]" (longer than a
// string's inline room at 8 ranks), a tag before it, and a list of the same ranks in another
// order its own. Read from the context of a refused call (a meta input outside tracing).
TEST(SimScheduler, TheWorldsGroupReadsAsAnyGroupInErrors) {
  for (const ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    for (const int size : {4, 8, 4}) {
      std::vector<int> in_order(static_cast<std::size_t>(size));
      std::string ranks_text = "[";
      for (int r = 0; r < size; ++r) {
        in_order[static_cast<std::size_t>(r)] = r;
        ranks_text += (r > 0 ? ", " : "") + std::to_string(r);
      }
      ranks_text += "]";
      std::vector<int> reversed(in_order.rbegin(), in_order.rend());
      std::string reversed_text = "[";
      for (int r = size - 1; r >= 0; --r) {
        reversed_text += (r < size - 1 ? ", " : "") + std::to_string(r);
      }
      reversed_text += "]";
      std::vector<std::vector<std::string>> texts(static_cast<std::size_t>(size));
      const SimReport report = sim::simulate(quiet(size, 9, executor), [&] {
        const Tensor meta = Tensor::empty({1}, DType::Float32, Device::meta());
        const auto refusal = [&](const GroupSpec& group, std::string_view tag) {
          try {
            std::ignore = all_reduce(meta, "sum", group, tag);
          } catch (const InvalidArgument& error) {
            return std::string(error.what());
          }
          return std::string("not refused");
        };
        std::vector<std::string>& mine = texts[static_cast<std::size_t>(rank())];
        mine.push_back(refusal(reversed, ""));
        mine.push_back(refusal(world(), ""));
        mine.push_back(refusal(in_order, ""));
        mine.push_back(refusal(world(), "t"));
      });
      ASSERT_TRUE(report.ok()) << report.to_string();
      for (const std::vector<std::string>& mine : texts) {
        ASSERT_EQ(mine.size(), 4u);
        EXPECT_NE(mine[0].find("on group " + reversed_text + ": "), std::string::npos) << mine[0];
        EXPECT_NE(mine[1].find("on group " + ranks_text + ": "), std::string::npos) << mine[1];
        EXPECT_NE(mine[2].find("on group " + ranks_text + ": "), std::string::npos) << mine[2];
        EXPECT_NE(mine[3].find("on group 't' " + ranks_text + ": "), std::string::npos) << mine[3];
      }
    }
  }
}

// Note [Repeated world calls]: a call on world() takes the scratch group, members and slot of the
// rank's call before only while the scratch group holds world()'s expansion under the call's tag.
// After a call on another group (here, untagged, as world() is: a rank list, then a ProcessGroup
// of its own list), under another tag (also one of the same length), or in an earlier run of
// another size on the thread (whose rank states' blocks this run's take), world() gathers from
// every rank of its own run, and a tagged call is on its own communicator.
TEST(SimScheduler, AWorldCallReusesOnlyWorldsOwnExpansion) {
  for (const ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    for (const int size : {4, 6, 4, 2}) {
      const auto ranks = static_cast<std::size_t>(size);
      std::vector<std::vector<float>> gathered(ranks);
      const SimReport report = sim::simulate(quiet(size, 7, executor), [&gathered] {
        const int r = rank();
        const Tensor mine = Tensor::full({1}, r);
        std::vector<float>& out = gathered[static_cast<std::size_t>(r)];
        const auto gather = [&](const GroupSpec& group, std::string_view tag) {
          const std::vector<float> values =
              all_gather_tensor(mine, 0, group, tag).to_vector<float>();
          out.insert(out.end(), values.begin(), values.end());
        };
        gather(world(), "");
        gather(world(), "");
        gather(std::vector<int>{r & ~1, r | 1}, "");
        gather(world(), "");
        gather(world(), "tagged");
        gather(world(), "");
        // A ProcessGroup that is not world()'s list, then world() again.
        gather(new_group({r & ~1, r | 1}), "");
        gather(world(), "");
        // Two tags of one length: compared by their characters too.
        gather(world(), "kept_it");
        std::ignore = all_gather_tensor(mine, 0, world(), "dropped");  // dropped un-waited
      });
      ASSERT_TRUE(report.ok()) << report.to_string();
      std::vector<float> all(ranks);
      for (std::size_t r = 0; r < ranks; ++r) {
        all[r] = static_cast<float>(r);
      }
      for (std::size_t r = 0; r < ranks; ++r) {
        std::vector<float> expected;
        for (int i = 0; i < 2; ++i) {
          expected.insert(expected.end(), all.begin(), all.end());
        }
        expected.push_back(static_cast<float>(r & ~std::size_t{1}));
        expected.push_back(static_cast<float>(r | 1));
        for (int i = 0; i < 3; ++i) {
          expected.insert(expected.end(), all.begin(), all.end());
        }
        expected.push_back(static_cast<float>(r & ~std::size_t{1}));
        expected.push_back(static_cast<float>(r | 1));
        for (int i = 0; i < 2; ++i) {
          expected.insert(expected.end(), all.begin(), all.end());
        }
        EXPECT_EQ(gathered[r], expected) << "rank " << r << " of " << size;
      }
      std::string label = "'dropped' [";
      for (std::size_t r = 0; r < ranks; ++r) {
        label += (r > 0 ? ", " : "") + std::to_string(r);
      }
      label += "]";
      ASSERT_EQ(report.unwaited.size(), ranks);
      for (const UnwaitedWork& work : report.unwaited) {
        EXPECT_EQ(work.group, label) << work.to_string();
      }
    }
  }
}

// SimGroup::spare_slots: room for every slot of a group is reserved as the slots are made, so the
// completion that gives one back never allocates (recycle_slot checks it). Bursts of operations
// left outstanding, some more than the spares' inline room (4), completed in the orders the seeds
// give: every result right.
TEST(SimScheduler, ManyOutstandingOperationsGiveTheirSlotsBack) {
  constexpr int kRanks = 3;
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    std::vector<int> wrong(kRanks, 0);
    const SimReport report = sim::run(quiet(kRanks, seed), [&wrong] {
      for (const int burst : {1, 5, 3, 12, 2}) {
        std::vector<Tensor> sums;
        for (int i = 0; i < burst; ++i) {
          sums.push_back(all_reduce(Tensor::full({2}, rank() + i, DType::Int64), "sum", world()));
        }
        for (int i = 0; i < burst; ++i) {
          const std::int64_t expected = kRanks * (kRanks - 1) / 2 + kRanks * i;
          if (sums[static_cast<std::size_t>(i)].to_vector<std::int64_t>()[1] != expected) {
            ++wrong[static_cast<std::size_t>(rank())];
          }
        }
      }
    });
    ASSERT_TRUE(report.ok()) << "seed " << seed;
    EXPECT_EQ(report.collectives_completed, 23u) << "seed " << seed;
    EXPECT_EQ(wrong, std::vector<int>(kRanks, 0)) << "seed " << seed;
  }
}

// Twelve operations outstanding on one group (SimGroup::slots), and a member that returns without
// joining the later six, leaving those it joined un-waited, fails the later ones while the
// earlier are still outstanding: failed slots behind the oldest, walked over by on_rank_exit
// (docs/performance.md, 2026-12-07 08:40 UTC, tried them in a ring). On the transport
// seam, so that the member's return does not wait for its operations (core's results would). In
// every seed's run the operations rank 2 joined complete with the right sums and the others fail
// with Deadlock, and a replay of the run's choices makes the same schedule.
TEST(SimScheduler, OperationsFailedBehindTheOldestLeaveTheRestOutstanding) {
  constexpr int kRanks = 3;
  constexpr std::size_t kIssued = 12;
  constexpr std::size_t kJoined = 6;  // by rank 2, which waits on none of them
  std::vector<std::vector<float>> sends(kRanks);
  std::vector<std::vector<float>> recvs(kRanks);
  // Per rank and operation: 'r' its right sum, 'd' a Deadlock, '?' anything else.
  std::vector<std::string> outcomes(kRanks);
  const auto program = [&] {
    const auto me = static_cast<std::size_t>(rank());
    const std::shared_ptr<transport::Comm> comm =
        RankContext::current()->transport().create_comm("ring", {0, 1, 2});
    const std::size_t joined = me == 2 ? kJoined : kIssued;
    sends[me].assign(kIssued, 0.0F);
    recvs[me].assign(kIssued, 0.0F);
    std::vector<std::shared_ptr<transport::Work>> works;
    transport::OpInfo info;
    info.name = "all_reduce";
    for (std::size_t i = 0; i < joined; ++i) {
      sends[me][i] = static_cast<float>(me + i);
      info.seq = static_cast<std::int64_t>(i);
      works.push_back(comm->all_reduce(floats(sends[me], i, 1), floats(recvs[me], i, 1),
                                       ReduceOp::Kind::Sum, info));
    }
    if (me == 2) {
      return;  // its operations complete un-waited
    }
    std::string& outcome = outcomes[me];
    outcome.clear();
    for (std::size_t i = 0; i < joined; ++i) {
      try {
        works[i]->wait(transport::Deadline::never());
        outcome += recvs[me][i] == static_cast<float>(3 + 3 * i) ? 'r' : '?';
      } catch (const Error& error) {
        outcome += error.code() == ErrorCode::Deadlock ? 'd' : '?';
      }
    }
  };
  const std::string expected = std::string(kJoined, 'r') + std::string(kIssued - kJoined, 'd');
  for (std::uint64_t seed = 0; seed < 16; ++seed) {
    const SimReport first = sim::run(quiet(kRanks, seed), program);
    EXPECT_EQ(outcomes, (std::vector<std::string>{expected, expected, ""})) << "seed " << seed;
    EXPECT_EQ(first.collectives_completed, std::uint64_t{kJoined}) << "seed " << seed;
    SimOptions replay = quiet(kRanks, seed);
    replay.choices = first.choices;
    const SimReport again = sim::run(replay, program);
    EXPECT_EQ(again.schedule_hash, first.schedule_hash) << "seed " << seed;
    EXPECT_EQ(again.steps, first.steps) << "seed " << seed;
    EXPECT_EQ(outcomes, (std::vector<std::string>{expected, expected, ""})) << "seed " << seed;
  }
}

// Note [Ops built in place] (simulator/src/sim_transport.cpp): a comm builds each op in its own
// list, which start swaps into the arrival; an operation that fails at once never reaches an
// arrival, so its ops stay in the list, and the comm must empty it for the next operation (a left
// op would be started again with the next one, or stop the process at the next call's check that
// no batch is open). Here operation #0 is a collective mismatch, which aborts the communicator:
// the later ones, alone and batched, each fail at once, on the same comm, run after run.
TEST(SimScheduler, OperationsFailingAtOnceLeaveNothingStagedInTheirComm) {
  constexpr int kRanks = 2;
  std::vector<std::vector<float>> sends(kRanks);
  std::vector<std::vector<float>> recvs(kRanks);
  // Per rank and operation: 'm' a CollectiveMismatch, 'a' Aborted, '?' anything else.
  std::vector<std::string> outcomes(kRanks);
  const auto program = [&] {
    const auto me = static_cast<std::size_t>(rank());
    const std::shared_ptr<transport::Comm> comm =
        RankContext::current()->transport().create_comm("pair", {0, 1});
    sends[me].assign(4, 1.0F);
    recvs[me].assign(4, 0.0F);
    std::string& outcome = outcomes[me];
    outcome.clear();
    const auto record = [&](const std::shared_ptr<transport::Work>& work) {
      try {
        work->wait(transport::Deadline::never());
        outcome += '?';
      } catch (const Error& error) {
        outcome += error.code() == ErrorCode::CollectiveMismatch ? 'm'
                   : error.code() == ErrorCode::Aborted          ? 'a'
                                                                 : '?';
      }
    };
    transport::OpInfo info;
    info.name = "all_reduce";
    info.seq = 0;  // rank 0 reduces one element, rank 1 two: a mismatch
    record(comm->all_reduce(floats(sends[me], 0, me + 1), floats(recvs[me], 0, me + 1),
                            ReduceOp::Kind::Sum, info));
    for (std::int64_t seq = 1; seq <= 2; ++seq) {
      info.seq = seq;
      record(comm->all_reduce(floats(sends[me], 0, 1), floats(recvs[me], 0, 1), ReduceOp::Kind::Sum,
                              info));
    }
    info.seq = 3;
    comm->begin_group();
    EXPECT_EQ(comm->all_reduce(floats(sends[me], 0, 1), floats(recvs[me], 0, 1),
                               ReduceOp::Kind::Sum, info),
              nullptr);
    EXPECT_EQ(comm->all_reduce(floats(sends[me], 1, 2), floats(recvs[me], 1, 2),
                               ReduceOp::Kind::Max, info),
              nullptr);
    record(comm->end_group(info));
    info.seq = 4;
    record(comm->all_reduce(floats(sends[me], 3, 1), floats(recvs[me], 3, 1), ReduceOp::Kind::Sum,
                            info));
  };
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    const SimReport first = sim::run(quiet(kRanks, seed), program);
    EXPECT_EQ(outcomes, (std::vector<std::string>{"maaaa", "maaaa"})) << "seed " << seed;
    EXPECT_EQ(first.collectives_completed, 0U) << "seed " << seed;
    SimOptions replay = quiet(kRanks, seed);
    replay.choices = first.choices;
    const SimReport again = sim::run(replay, program);
    EXPECT_EQ(again.schedule_hash, first.schedule_hash) << "seed " << seed;
    EXPECT_EQ(outcomes, (std::vector<std::string>{"maaaa", "maaaa"})) << "seed " << seed;
  }
}

// Note: judge_arrival compares each arrival with the lowest other member that arrived
// (SimGroup::Slot::lowest_arrived, kept at each arrival and reset with the slot). Operation #3
// takes a slot that operations #0 to #2 used before it, so a member left over from them would be
// named (or, not arrived yet, read without a work): the mismatch must name the lowest member
// that arrived before the one that disagreed, whatever the arrival order. Run on the whole world
// and on ranks 1 to 3, whose group ranks are not their ranks (a group rank named as a rank would
// be off by one); some seed must let a lower member arrive after a higher one, or the lowest
// would never have moved down.
TEST(SimScheduler, AMismatchOnARecycledSlotNamesTheLowestMemberArrivedBefore) {
  constexpr int kRanks = 4;
  for (const std::vector<int>& members :
       {std::vector<int>{0, 1, 2, 3}, std::vector<int>{1, 2, 3}}) {
    std::vector<std::vector<float>> sends(kRanks);
    std::vector<std::vector<float>> recvs(kRanks);
    std::vector<std::string> errors(kRanks);
    const auto program = [&] {
      const auto me = static_cast<std::size_t>(rank());
      if (std::find(members.begin(), members.end(), rank()) == members.end()) {
        return;
      }
      const std::shared_ptr<transport::Comm> comm =
          RankContext::current()->transport().create_comm("members", members);
      sends[me].assign(2, 1.0F);
      recvs[me].assign(2, 0.0F);
      errors[me].clear();
      transport::OpInfo info;
      info.name = "all_reduce";
      for (std::int64_t seq = 0; seq <= 3; ++seq) {
        info.seq = seq;
        // Operation #3: rank 3 reduces two elements, the others one.
        const std::size_t count = seq == 3 && me == 3 ? 2 : 1;
        try {
          comm->all_reduce(floats(sends[me], 0, count), floats(recvs[me], 0, count),
                           ReduceOp::Kind::Sum, info)
              ->wait(transport::Deadline::never());
        } catch (const Error& error) {
          errors[me] = error.what();
        }
      }
    };
    int arrivals_out_of_order = 0;
    for (std::uint64_t seed = 0; seed < 16; ++seed) {
      SimOptions options = quiet(kRanks, seed);
      options.record_events = true;
      const SimReport report = sim::run(options, program);
      EXPECT_EQ(report.collectives_completed, 3U) << "seed " << seed;
      // The members that arrived at operation #3 before the one that disagreed.
      const std::string& error = errors[static_cast<std::size_t>(members.front())];
      const std::size_t at = error.find("issued all_reduce(Float32, send=");
      ASSERT_NE(at, std::string::npos) << error;
      const std::size_t named = error.rfind("rank ", at);
      const std::size_t second = error.find("; rank ", at);
      ASSERT_NE(second, std::string::npos) << error;
      const int reference = std::stoi(error.substr(named + 5));
      const int judged = std::stoi(error.substr(second + 7));
      int lowest_before = kRanks;
      int last_before = -1;
      for (const sim::SimEvent& event : report.events) {
        if (event.kind != sim::SimEvent::Kind::Arrive || event.seq != 3) {
          continue;
        }
        if (event.rank == judged) {
          break;
        }
        if (event.rank < last_before) {
          ++arrivals_out_of_order;
        }
        last_before = event.rank;
        lowest_before = std::min(lowest_before, event.rank);
      }
      EXPECT_EQ(reference, lowest_before) << "seed " << seed << ": " << error;
      // Every member fails with that text, under its own context.
      const std::string detail = error.substr(error.find("ranks disagree on operation #3"));
      for (const int member : members) {
        const std::string& text = errors[static_cast<std::size_t>(member)];
        EXPECT_NE(text.find(detail), std::string::npos) << "seed " << seed << ": " << text;
      }
    }
    EXPECT_GT(arrivals_out_of_order, 0) << "no seed let a lower member arrive after a higher one";
  }
}

class SimWorldSize : public ::testing::TestWithParam<int> {};

TEST_P(SimWorldSize, AllReduceOfRanksIsTheTriangularNumber) {
  const int size = GetParam();
  std::vector<std::int64_t> seen(static_cast<std::size_t>(size), -1);
  SimReport report = sim::run(quiet(size, 7), [&] {
    Tensor sum = all_reduce(Tensor::full({3}, rank(), DType::Int64), "sum", world());
    seen[static_cast<std::size_t>(rank())] = sum.to_vector<std::int64_t>()[2];
  });
  for (std::int64_t value : seen) {
    EXPECT_EQ(value, static_cast<std::int64_t>(size) * (size - 1) / 2);
  }
  EXPECT_EQ(report.collectives_completed, 1u);
  EXPECT_EQ(report.world_size, size);
  EXPECT_TRUE(report.ok());
  EXPECT_TRUE(report.unwaited.empty());
}

// 65 and 130 ranks span two and three words of the runnable set (Note [Runnable set]).
INSTANTIATE_TEST_SUITE_P(Sizes, SimWorldSize, ::testing::Values(1, 2, 3, 7, 16, 64, 65, 130));

// Ranks past the first 64 block and wake in every strategy: pairs of ranks wait on each other,
// so the runnable set changes at every decision, and the scheduler may only ever run a runnable
// rank (SimWorld::execute checks it).
TEST(SimScheduler, ManyRanksBlockAndWakeUnderEveryStrategy) {
  constexpr int kRanks = 130;
  for (sim::Strategy strategy :
       {sim::Strategy::RandomWalk, sim::Strategy::Pct, sim::Strategy::Portfolio}) {
    SimOptions options = quiet(kRanks, 11);
    options.strategy = strategy;
    std::vector<float> seen(kRanks, -1.0f);
    const auto program = [&seen] {
      const int r = rank();
      const int partner = r ^ 1;
      const std::vector<int> pair = {std::min(r, partner), std::max(r, partner)};
      Tensor sum = all_reduce(Tensor::full({2}, r), "sum", pair);
      Tensor all = all_reduce(Tensor::ones({1}), "sum", world());
      seen[static_cast<std::size_t>(r)] = sum.to_vector<float>()[1] + all.item<float>();
    };
    const SimReport first = sim::run(options, program);
    ASSERT_TRUE(first.ok());
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(seen[static_cast<std::size_t>(r)], static_cast<float>(2 * (r / 2 * 2) + 1 + kRanks))
          << "rank " << r;
    }
    const SimReport again = sim::run(options, program);
    EXPECT_EQ(again.schedule_hash, first.schedule_hash);
    EXPECT_EQ(again.steps, first.steps);
  }
}

TEST(SimScheduler, VirtualTimeAdvancesOneStepPerDecision) {
  SimReport report = sim::run(
      quiet(3, 0), [] { (void)wait_tensor(all_reduce(Tensor::ones({1}), "sum", world())); });
  EXPECT_EQ(report.virtual_time, sim::kStepDuration * static_cast<std::int64_t>(report.steps));
  EXPECT_EQ(report.schedule.size(), report.steps);
}

// Note [Simulator scheduling]: a wait on a work that already finished returns at once, without a
// scheduling point (what a rank does between two of its scheduling points no other rank can see,
// so a decision there would add no interleaving). Waiting a finished work again and again takes no
// decision: the run makes the decisions of the run without those waits, on every seed.
TEST(SimScheduler, AWaitOnAFinishedWorkTakesNoDecision) {
  const auto program = [](int extra_waits) {
    return [extra_waits] {
      transport::Transport& rank_transport = RankContext::current()->transport();
      const std::shared_ptr<transport::Comm> comm =
          rank_transport.create_comm("finished_waits", {0, 1});
      std::vector<float> send = {1.0F};
      std::vector<float> recv = {0.0F};
      transport::OpInfo info;
      info.name = "all_reduce";
      for (info.seq = 0; info.seq < 3; ++info.seq) {
        const std::shared_ptr<transport::Work> work =
            comm->all_reduce(floats(send, 0, 1), floats(recv, 0, 1), ReduceOp::Kind::Sum, info);
        work->wait(transport::Deadline::never());
        ASSERT_EQ(work->status(), transport::WorkStatus::Completed);
        for (int i = 0; i < extra_waits; ++i) {
          work->wait(transport::Deadline::never());  // finished: no scheduling point
        }
      }
    };
  };
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    const SimReport plain = sim::run(quiet(2, seed), program(0));
    const SimReport waited = sim::run(quiet(2, seed), program(5));
    EXPECT_EQ(waited.steps, plain.steps) << "seed " << seed;
    EXPECT_EQ(waited.schedule_hash, plain.schedule_hash) << "seed " << seed;
    EXPECT_EQ(waited.choices, plain.choices) << "seed " << seed;
  }
}

// Note [Waits without a lock]: a work reaches its world through the address it was made with only
// while that world lives. A work kept past its run is polled and waited from a rank of a later run
// (on the same thread, with fibers): it answers from its status, takes no scheduling point of the
// later world, and that run makes the decisions it makes without those calls.
TEST(SimScheduler, AWorkOfAnEndedWorldTakesNoDecisionOfALaterOne) {
  for (ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    std::shared_ptr<transport::Work> kept;
    const SimReport first = sim::run(quiet(2, 0, executor), [&kept] {
      transport::Transport& rank_transport = RankContext::current()->transport();
      const std::shared_ptr<transport::Comm> comm = rank_transport.create_comm("kept", {0, 1});
      std::vector<float> send = {1.0F};
      std::vector<float> recv = {0.0F};
      transport::OpInfo info;
      info.name = "all_reduce";
      info.seq = 0;
      std::shared_ptr<transport::Work> work =
          comm->all_reduce(floats(send, 0, 1), floats(recv, 0, 1), ReduceOp::Kind::Sum, info);
      work->wait(transport::Deadline::never());
      if (rank_transport.rank() == 0) {
        kept = std::move(work);
      }
    });
    ASSERT_TRUE(first.ok()) << first.to_string();
    ASSERT_NE(kept, nullptr);
    const auto program = [&kept](bool poll_kept) {
      return [&kept, poll_kept] {
        if (poll_kept) {
          for (int i = 0; i < 3; ++i) {
            EXPECT_TRUE(kept->is_completed());
            kept->wait(transport::Deadline::never());
          }
        }
        (void)all_reduce(Tensor::ones({1}), "sum", world()).to_vector<float>();
      };
    };
    for (std::uint64_t seed = 0; seed < 4; ++seed) {
      const SimReport plain = sim::run(quiet(2, seed, executor), program(false));
      const SimReport polled = sim::run(quiet(2, seed, executor), program(true));
      ASSERT_TRUE(polled.ok()) << polled.to_string();
      EXPECT_EQ(polled.steps, plain.steps) << "seed " << seed;
      EXPECT_EQ(polled.schedule_hash, plain.schedule_hash) << "seed " << seed;
      EXPECT_EQ(polled.choices, plain.choices) << "seed " << seed;
    }
    EXPECT_EQ(kept->status(), transport::WorkStatus::Completed);
  }
}

TEST(SimScheduler, PendingOutputsHoldPoisonUntilCompletion) {
  // Deterministically observe poison: rank 1 joins the world collective only after rank 0
  // joined a signal collective on another (tagged) group, which rank 0 does after looking.
  sim::run(quiet(2, 0), [] {
    const ProcessGroup signal = new_group({0, 1}, "signal");
    if (rank() == 0) {
      Tensor pending = all_reduce(Tensor::ones({3}), "sum", world());
      const auto* raw = static_cast<const float*>(pending.unsafe_data_ptr());
      EXPECT_TRUE(pending.is_pending());
      EXPECT_TRUE(raw[0] != raw[0]) << "expected NaN poison, got " << raw[0];
      (void)all_reduce(Tensor::ones({1}), "sum", signal).to_vector<float>();
      EXPECT_EQ(pending.to_vector<float>(), std::vector<float>(3, 2.0f));
    } else {
      (void)all_reduce(Tensor::ones({1}), "sum", signal).to_vector<float>();
      (void)all_reduce(Tensor::ones({3}), "sum", world()).to_vector<float>();
    }
  });
}

// Only an output that overlaps its own input (in place) is left unpoisoned; one that merely
// follows its input in memory is poisoned like any other. Buffers built by hand at the transport
// (core stages its outputs): input memory[0, 3), output memory[3, 6). Rank 1 joins only after
// rank 0 looked, as above.
TEST(SimScheduler, AnOutputRightAfterItsInputIsPoisonedWhilePending) {
  const SimReport report = sim::run(quiet(2, 0), [] {
    transport::Transport& rank_transport = RankContext::current()->transport();
    const std::shared_ptr<transport::Comm> comm = rank_transport.create_comm("adjacent", {0, 1});
    const std::shared_ptr<transport::Comm> signal =
        rank_transport.create_comm("adjacent_signal", {0, 1});
    std::vector<float> memory = {1, 1, 1, 0, 0, 0};
    const transport::Buffer send = floats(memory, 0, 3);
    const transport::Buffer recv = floats(memory, 3, 3);
    std::vector<float> flag = {1.0F};
    std::vector<float> flag_sum = {0.0F};
    const transport::Buffer flag_send = floats(flag, 0, 1);
    const transport::Buffer flag_recv = floats(flag_sum, 0, 1);
    transport::OpInfo info;
    info.name = "all_reduce";
    info.seq = 0;
    if (rank_transport.rank() == 0) {
      const std::shared_ptr<transport::Work> work =
          comm->all_reduce(send, recv, ReduceOp::Kind::Sum, info);
      EXPECT_EQ(work->status(), transport::WorkStatus::Pending);
      for (std::size_t i = 3; i < memory.size(); ++i) {
        EXPECT_TRUE(memory[i] != memory[i])
            << "element " << i << ": expected NaN poison, got " << memory[i];
      }
      signal->all_reduce(flag_send, flag_recv, ReduceOp::Kind::Sum, info)
          ->wait(transport::Deadline::never());
      work->wait(transport::Deadline::never());
    } else {
      signal->all_reduce(flag_send, flag_recv, ReduceOp::Kind::Sum, info)
          ->wait(transport::Deadline::never());
      comm->all_reduce(send, recv, ReduceOp::Kind::Sum, info)->wait(transport::Deadline::never());
    }
    EXPECT_EQ(memory, (std::vector<float>{1, 1, 1, 2, 2, 2}));
  });
  EXPECT_TRUE(report.ok()) << report.to_string();
}

TEST(SimScheduler, AnAllGatherAlongDimOnePoisonsTheOutputTheCallerHolds) {
  // all_gather along a dim other than 0 rearranges at completion; every element of the output
  // the caller holds is poison while pending (only a staging tensor was, and the caller's
  // output showed whatever its memory held before), then the rearranged blocks.
  const SimReport report = sim::run(quiet(2, 0), [] {
    const ProcessGroup signal = new_group({0, 1}, "signal");
    const auto value = static_cast<float>(rank() + 1);
    if (rank() == 0) {
      Tensor pending = all_gather_tensor(Tensor::full({2, 2}, value), 1, world());
      EXPECT_TRUE(pending.is_pending());
      const auto* raw = static_cast<const float*>(pending.unsafe_data_ptr());
      for (int i = 0; i < 8; ++i) {
        EXPECT_TRUE(raw[i] != raw[i]) << "element " << i << ": expected NaN poison, got " << raw[i];
      }
      (void)all_reduce(Tensor::ones({1}), "sum", signal).to_vector<float>();
      EXPECT_EQ(pending.to_vector<float>(), (std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2}));
    } else {
      (void)all_reduce(Tensor::ones({1}), "sum", signal).to_vector<float>();
      EXPECT_EQ(all_gather_tensor(Tensor::full({2, 2}, value), 1, world()).to_vector<float>(),
                (std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2}));
    }
  });
  EXPECT_TRUE(report.ok()) << report.to_string();
}

TEST(SimScheduler, ABroadcastsPendingOutputIsPoisonedOnNonRootsToo) {
  // Non-roots pass their output as the broadcast's stand-in send; it is still an output. Rank 1
  // looks at its pending output while rank 0 has not yet issued the broadcast (the signal
  // collective comes first on rank 0), so the broadcast cannot have completed.
  const SimReport report = sim::run(quiet(2, 0), [] {
    const ProcessGroup signal = new_group({0, 1}, "signal");
    if (rank() == 1) {
      Tensor pending = broadcast(Tensor::full({3}, 5.0), 0, world());
      const auto* raw = static_cast<const float*>(pending.unsafe_data_ptr());
      EXPECT_TRUE(pending.is_pending());
      EXPECT_TRUE(raw[0] != raw[0]) << "expected NaN poison, got " << raw[0];
      (void)all_reduce(Tensor::ones({1}), "sum", signal).to_vector<float>();
      EXPECT_EQ(pending.to_vector<float>(), std::vector<float>(3, 7.0f));
    } else {
      (void)all_reduce(Tensor::ones({1}), "sum", signal).to_vector<float>();
      (void)broadcast(Tensor::full({3}, 7.0), 0, world()).to_vector<float>();
    }
  });
  EXPECT_TRUE(report.ok()) << report.to_string();  // and no InputModified for the stand-in
}

// The line of the dropped collective below.
constexpr int kDroppedLine = __LINE__ + 4;
TEST(SimScheduler, ReportListsUnwaitedWorksWithCallSites) {
  Tensor escaped;
  SimReport report = sim::run(quiet(3, 0), [&escaped] {
    { Tensor dropped = all_reduce(Tensor::ones({2}), "sum", world()); }
    Tensor kept = all_gather_tensor(Tensor::ones({1}), 0, world());
    if (rank() == 2) {
      escaped = kept;  // outlives the rank: completed at rank exit
    }
  });
  // Each rank drops one all_reduce and leaves one all_gather pending at exit (held by `kept`
  // until the function returns, then dropped: rank 2's copy is still alive at rank exit).
  int dropped = 0;
  int at_exit = 0;
  for (const UnwaitedWork& work : report.unwaited) {
    if (work.op == "all_reduce") {
      ++dropped;
      EXPECT_EQ(work.location.line(), kDroppedLine);
      EXPECT_FALSE(work.at_rank_exit);
    } else {
      EXPECT_EQ(work.op, "all_gather_tensor");
      at_exit += work.at_rank_exit ? 1 : 0;
    }
  }
  EXPECT_EQ(dropped, 3);
  EXPECT_EQ(report.unwaited.size(), 6u);
  EXPECT_EQ(at_exit, 1);
  EXPECT_FALSE(escaped.is_pending());
  EXPECT_EQ(escaped.to_vector<float>(), std::vector<float>(3, 1.0f));
  EXPECT_NE(report.to_string().find("never waited"), std::string::npos);
}

TEST(SimScheduler, RegistryIsEmptyAfterEveryRank) {
  sim::run(quiet(4, 11), [] {
    std::vector<Tensor> pending;
    for (int i = 0; i < 5; ++i) {
      pending.push_back(all_reduce(Tensor::ones({2}), "sum", world()));
    }
    EXPECT_EQ(work_registry_size(), 5u);
    wait_tensors(pending);
    EXPECT_EQ(work_registry_size(), 0u);
  });
}

TEST(SimScheduler, SeedFromEnvironmentOverridesTheOption) {
  SimOptions options = quiet(2, 1);
  options.seed_from_environment = true;
  const testing::ScopedEnvironment environment({{"CHORUS_SIM_SEED", "4242"}});
  SimReport report = sim::run(options, [] { (void)world(); });
  EXPECT_EQ(report.seed, 4242u);
  EXPECT_NE(report.replay_command.find("CHORUS_SIM_SEED=4242"), std::string::npos);
}

// The seed is decimal: a zero-padded seed is the same seed, and hexadecimal is refused.
TEST(SimScheduler, SeedFromEnvironmentIsDecimal) {
  SimOptions options = quiet(2, 1);
  options.seed_from_environment = true;
  const testing::ScopedEnvironment environment({{"CHORUS_SIM_SEED", "010"}});
  const std::uint64_t padded = sim::resolved_seed(options);
  environment.set("CHORUS_SIM_SEED", "0x10");
  EXPECT_THROW((void)sim::resolved_seed(options), InvalidArgument);
  EXPECT_EQ(padded, 10u);
}

// What a program prints before its run ends is the seed the run uses (SimReport::seed).
TEST(SimScheduler, ResolvedSeedIsTheSeedTheRunUses) {
  SimOptions options = quiet(2, 7);
  options.seed_from_environment = true;
  EXPECT_EQ(sim::resolved_seed(options), 7u);
  const testing::ScopedEnvironment environment({{"CHORUS_SIM_SEED", "4242"}});
  const std::uint64_t resolved = sim::resolved_seed(options);
  const SimReport report = sim::run(options, [] { (void)world(); });
  options.seed_from_environment = false;
  const std::uint64_t ignored = sim::resolved_seed(options);
  EXPECT_EQ(resolved, 4242u);
  EXPECT_EQ(report.seed, resolved);
  EXPECT_EQ(ignored, 7u);
}

// Note [Fiber exception state]: a rank that reaches a chorus call inside a catch handler must
// find its own exception when it resumes, whatever other ranks threw and caught meanwhile.
TEST(SimScheduler, EachRankKeepsItsOwnExceptionStateAcrossSwitches) {
  for (ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    for (std::uint64_t seed = 0; seed < 10; ++seed) {
      sim::run(quiet(3, seed, executor), [] {
        const std::string mine = "rank " + std::to_string(rank());
        EXPECT_EQ(std::uncaught_exceptions(), 0);
        try {
          throw std::runtime_error(mine);
        } catch (...) {
          (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();  // switches
          try {
            throw;  // the exception being handled: this rank's
          } catch (const std::runtime_error& e) {
            EXPECT_EQ(std::string(e.what()), mine);
          }
          EXPECT_EQ(std::uncaught_exceptions(), 0);
        }
        // Unwinding with a switch in a destructor: the count is this rank's own.
        struct SwitchesWhileUnwinding {
          ~SwitchesWhileUnwinding() {
            EXPECT_EQ(std::uncaught_exceptions(), 1);
            (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
            EXPECT_EQ(std::uncaught_exceptions(), 1);
          }
        };
        try {
          SwitchesWhileUnwinding guard;
          throw std::runtime_error(mine);
        } catch (const std::runtime_error& e) {
          EXPECT_EQ(std::string(e.what()), mine);
        }
      });
    }
  }
}

TEST(SimScheduler, WorldSizeOutOfRangeIsRejected) {
  EXPECT_THROW(sim::run(quiet(0, 0), [] {}), InvalidArgument);
  EXPECT_THROW(sim::run(quiet(sim::kMaxWorldSize + 1, 0), [] {}), InvalidArgument);
}

TEST(SimScheduler, WorldSizeAtTheMaximumIsAccepted) {
  // On fibers: a thousand OS threads at once would test the machine's limits instead.
  const SimReport report = sim::run(quiet(sim::kMaxWorldSize, 0, ExecutorKind::Fibers), [] {});
  EXPECT_EQ(report.world_size, sim::kMaxWorldSize);
}

// CHORUS_SIM_SEED takes every uint64, the largest included (ErrorsDocRunning's
// SimSeedEnvironment tests refuse signs, spaces and 2^64), and an empty value means unset.
TEST(SimScheduler, SeedFromEnvironmentTakesTheLargestSeedAndAnEmptyValueIsUnset) {
  SimOptions options = quiet(1, 7);
  options.seed_from_environment = true;
  const testing::ScopedEnvironment environment({{"CHORUS_SIM_SEED", "18446744073709551615"}});
  EXPECT_EQ(sim::resolved_seed(options), 18446744073709551615u);
  environment.set("CHORUS_SIM_SEED", "");
  EXPECT_EQ(sim::resolved_seed(options), 7u);
}

// CHORUS_SIM_REPLAY, like CHORUS_SIM_SEED, reaches only a run that reads the environment.
TEST(SimScheduler, ReplayFromEnvironmentIsReadOnlyWithSeedFromEnvironment) {
  const testing::ScopedEnvironment environment(
      {{"CHORUS_SIM_REPLAY", "not-a-token"}, {"CHORUS_SIM_SEED", std::nullopt}});
  const SimReport report = sim::run(quiet(1, 3), [] {});
  EXPECT_EQ(report.seed, 3u);
  SimOptions reading = quiet(1, 3);
  reading.seed_from_environment = true;
  (void)testing::expect_error<InvalidArgument>([&] { (void)sim::run(reading, [] {}); },
                                               {"not-a-token"});
}

// CHORUS_SIM_EXECUTOR picks the executor of ExecutorKind::Auto only: an explicit executor
// ignores it, however it is spelt.
TEST(SimScheduler, AnExplicitExecutorIgnoresChorusSimExecutor) {
  const testing::ScopedEnvironment environment({{"CHORUS_SIM_EXECUTOR", std::string("bogus")}});
  for (const ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    EXPECT_TRUE(sim::run(quiet(1, 0, executor), [] {}).ok());
  }
  const testing::CaughtError caught =
      testing::expect_error<InvalidArgument>([] { (void)sim::run(quiet(1, 0), [] {}); }, {});
  EXPECT_EQ(caught.detail, "CHORUS_SIM_EXECUTOR='bogus': expected fibers or threads");
}

// ExecutorKind::Auto means fibers (every rank on the thread that called sim::run) unless
// CHORUS_SIM_EXECUTOR names threads (a thread of its own per rank).
TEST(SimScheduler, AutoRunsFibersUnlessChorusSimExecutorNamesThreads) {
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::thread::id> threads(2);
  const auto record = [&threads] {
    threads[static_cast<std::size_t>(rank())] = std::this_thread::get_id();
  };
  const testing::ScopedEnvironment environment({{"CHORUS_SIM_EXECUTOR", std::nullopt}});
  EXPECT_TRUE(sim::run(quiet(2, 0), record).ok());
  EXPECT_EQ(threads, (std::vector<std::thread::id>{caller, caller}));
  environment.set("CHORUS_SIM_EXECUTOR", "threads");
  EXPECT_TRUE(sim::run(quiet(2, 0), record).ok());
  EXPECT_NE(threads[0], caller);
  EXPECT_NE(threads[1], caller);
  EXPECT_NE(threads[0], threads[1]);
}

// Note [Completable groups] (world.cpp): the scheduler keeps the groups whose next operation can
// complete instead of scanning them at every decision, and debug builds check the kept set
// against the scan at every decision. Faults and failures change a group's head every way there
// is (a Hang makes a complete head no candidate, a failed head lets the next one through, a crash
// fails what its rank never joins). Runs through them under every strategy end, and replaying a
// run's choices, which takes every choice as an index among the kept candidates even where the
// run itself listed them for PCT, repeats its schedule.
TEST(SimScheduler, CompletableGroupsFollowFaultsAndFailures) {
  const auto program = [] {
    try {
      const int r = rank();
      const int size = world_size();
      Tensor x = Tensor::full({4}, static_cast<double>(r + 1));
      Tensor a = all_reduce(x, "sum", world());
      const std::vector<int> mine =
          r == 0 || r == size / 2 ? std::vector<int>{0, size / 2} : std::vector<int>{r};
      Tensor b = all_gather_tensor(a, 0, mine);
      Tensor c = reduce_scatter_tensor(Tensor::full({static_cast<std::int64_t>(size)}, r), "max", 0,
                                       world());
      Tensor d = all_reduce(x, "sum", world());
    } catch (const std::exception&) {
      // A fault's error: the run goes on.
    }
  };
  std::uint64_t hangs = 0;
  std::uint64_t replayed = 0;
  for (const sim::Strategy strategy :
       {sim::Strategy::RandomWalk, sim::Strategy::Pct, sim::Strategy::Portfolio}) {
    for (std::uint64_t seed = 0; seed < 24; ++seed) {
      SimOptions options = quiet(3 + static_cast<int>(seed % 3), seed);
      options.strategy = strategy;
      options.random_faults.crash_ppm = 30'000;
      options.random_faults.transport_error_ppm = 30'000;
      options.random_faults.hang_ppm = 30'000;
      options.random_faults.delay_ppm = 30'000;
      options.random_faults.delay_steps_max = 20;
      SimReport first;
      try {
        first = sim::run(options, program);
      } catch (const std::exception&) {
        continue;  // a rank's end raised a dropped result's failure
      }
      hangs += first.mark_count("fault.hang");
      SimOptions replay = options;
      replay.choices = first.choices;
      const SimReport again = sim::run(replay, program);
      EXPECT_EQ(again.schedule, first.schedule) << "seed " << seed;
      EXPECT_EQ(again.schedule_hash, first.schedule_hash) << "seed " << seed;
      EXPECT_EQ(again.replay_token, first.replay_token) << "seed " << seed;
      ++replayed;
    }
  }
  EXPECT_GT(hangs, 0u);
  // Most runs end without a raised failure (at least half of the 72): a change that made them
  // throw would otherwise thin the test out unnoticed.
  EXPECT_GE(replayed, 36u);
}

// The schedules themselves, pinned: what a seed decides (the draws, their order, what each
// decision hashes) and the bytes the program writes, for one fixed program under each strategy,
// a reduction order and allocator policy of their own, and a fault, on both executors. The speed
// passes promise the same schedules; a change that alters a decision, its order or its digest
// fails here (the other tests compare two runs of one build with each other). Commit 275f053
// and the speed passes merged after it on 2026-12-07 both give these values, on both
// executors.
TEST(SimScheduler, AFixedProgramsSchedulesArePinned) {
  struct Case {
    std::uint64_t seed;
    sim::Strategy strategy;
    sim::ReductionOrder order;
    sim::AllocatorPolicy allocator;
    bool delay;  // a Delay of rank 1's third operation by 40 steps
    std::uint64_t schedule_hash;
    std::uint64_t data_hash;
    std::uint64_t decisions;
  };
  const std::vector<Case> cases = {
      {1, sim::Strategy::RandomWalk, sim::ReductionOrder::Fixed, sim::AllocatorPolicy::Pooled,
       false, 0xfc98a682ac597bdfULL, 0xb1c7c94da79c48d6ULL, 60},
      {7, sim::Strategy::RandomWalk, sim::ReductionOrder::Ring, sim::AllocatorPolicy::LifoReuse,
       false, 0x193ab26b34a26aa6ULL, 0x37d03c0cbcca8d62ULL, 61},
      {42, sim::Strategy::Pct, sim::ReductionOrder::Tree, sim::AllocatorPolicy::Quarantine, false,
       0x2cdd1e826745c94dULL, 0x8ab7e620274235f5ULL, 60},
      {11, sim::Strategy::Portfolio, sim::ReductionOrder::Adversarial, sim::AllocatorPolicy::Random,
       false, 0x0515a6de479fdc48ULL, 0x3842b8ba3a192287ULL, 62},
      // The delay moves the schedule, not the bytes: the same sums as seed 1's fixed order.
      {3, sim::Strategy::RandomWalk, sim::ReductionOrder::Fixed, sim::AllocatorPolicy::Pooled, true,
       0x7f327f31bb65360aULL, 0xb1c7c94da79c48d6ULL, 61},
  };

  const auto program = [] {
    const int r = rank();
    std::vector<Tensor> sums;
    for (int i = 0; i < 8; ++i) {
      // Tenths: sums that round differently in each reduction order.
      sums.push_back(
          all_reduce(Tensor::full({64}, 0.1f * static_cast<float>(r + i)), "sum", world()));
    }
    const Tensor pair = all_gather_tensor(sums.back(), 0, std::vector<int>{r & ~1, r | 1});
    for (const Tensor& sum : sums) {
      std::ignore = wait_tensor(sum);
    }
    std::ignore = wait_tensor(pair);
  };
  for (const ExecutorKind executor : {ExecutorKind::Fibers, ExecutorKind::Threads}) {
    for (const Case& c : cases) {
      SimOptions options = quiet(4, c.seed, executor);
      options.strategy = c.strategy;
      options.reduction_order = c.order;
      options.allocator = c.allocator;
      options.hash_data = true;
      if (c.delay) {
        options.faults.push_back(sim::Fault::delay(1, 2, 40));
      }
      const SimReport report = sim::run(options, program);
      ASSERT_TRUE(report.ok()) << report.to_string();
      EXPECT_EQ(report.schedule_hash, c.schedule_hash)
          << "seed " << c.seed << std::hex << ": 0x" << report.schedule_hash;
      EXPECT_EQ(report.data_hash, c.data_hash)
          << "seed " << c.seed << std::hex << ": 0x" << report.data_hash;
      EXPECT_EQ(report.steps, c.decisions) << "seed " << c.seed;
      EXPECT_EQ(report.mark_count("fault.delay"), c.delay ? 1u : 0u) << "seed " << c.seed;
    }
  }
}

TEST(SimScheduler, RunCannotBeNestedInsideARank) {
  sim::run(quiet(1, 0), [] { EXPECT_THROW(sim::run(quiet(1, 0), [] {}), InvalidArgument); });
}

}  // namespace
}  // namespace chorus
