// MpiWork's end (Note [Recycled Started]): a work that failed after MPI completed its requests
// is recycled, not parked until the process ends; one MPI may still write into is parked, even
// with no memory left (Note [Issue without allocation]). And a failed request's error names the
// rank it exchanged with.
// Runs under mpirun -np 1 (mpi.work_test): one MpiProcess, MPI_COMM_SELF messages to itself.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/error.hpp"
#include "mpi_transport.hpp"
#include "support/refusing_new.hpp"

namespace {

// Set around a work's destruction: every allocation of this thread is refused (the executable
// links tests/support/refusing_new.cpp).
thread_local bool refuse_every_allocation = false;
// While set, this thread's allocations are counted.
thread_local bool count_allocations = false;
thread_local std::size_t allocations_counted = 0;

}  // namespace

bool chorus::testing::refuse_allocation(std::size_t) noexcept {
  if (count_allocations) {
    ++allocations_counted;
  }
  return refuse_every_allocation;
}

namespace chorus::mpi::detail {
namespace {

// MPI starts once per process: every case shares one MpiProcess.
std::shared_ptr<MpiProcess> process() {
  static const auto shared = std::make_shared<MpiProcess>();
  return shared;
}

// A message of `sent` ints from this rank to itself, received by a receive posted for
// `expected`: both requests in one Started, the receive checked (Started::receives).
std::unique_ptr<Started> self_message(int sent, int expected, std::shared_ptr<int[]> buffer) {
  auto started = std::make_unique<Started>();
  const std::lock_guard lock(process()->mutex());
  MPI_Request receive = MPI_REQUEST_NULL;
  MPI_Request send = MPI_REQUEST_NULL;
  EXPECT_EQ(MPI_Irecv(buffer.get(), expected, MPI_INT, 0, 7, MPI_COMM_SELF, &receive), MPI_SUCCESS);
  EXPECT_EQ(MPI_Isend(buffer.get() + 4, sent, MPI_INT, 0, 7, MPI_COMM_SELF, &send), MPI_SUCCESS);
  started->requests = {receive, send};
  started->receives.push_back(Started::Receive{0, MPI_INT, expected, 0});
  started->keep_alive.push_back(std::move(buffer));
  return started;
}

WorkContext context() { return WorkContext{0, "all_to_all", 0, {}}; }

// A work as MpiComm makes one (Note [Issue without allocation]): made first, then handed its
// Started.
std::unique_ptr<MpiWork> work_of(std::unique_ptr<Started> started) {
  // Room for every request's status, as each start reserves it (request_slot, post_exchange):
  // adopt() sizes the statuses without allocating (Note [Lean polls]).
  started->statuses.reserve(started->requests.size());
  auto work = std::make_unique<MpiWork>(process(), transport::Fingerprint{}, context());
  work->adopt(std::move(started));
  return work;
}

std::exception_ptr wait_for_failure(MpiWork& work) {
  try {
    work.wait(transport::Deadline::never());
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

TEST(MpiWork, ShortMessageFailureIsRecycledNotParked) {
  const std::size_t parked = process()->parked_count();
  {
    const auto work = work_of(self_message(1, 2, std::shared_ptr<int[]>(new int[8]())));
    const std::exception_ptr error = wait_for_failure(*work);
    ASSERT_TRUE(error);
    EXPECT_THROW(std::rethrow_exception(error), CollectiveMismatch);
  }
  EXPECT_EQ(process()->parked_count(), parked);
}

TEST(MpiWork, ThrowingAfterStepIsRecycledNotParked) {
  const std::size_t parked = process()->parked_count();
  {
    std::unique_ptr<Started> started = self_message(2, 2, std::shared_ptr<int[]>(new int[8]()));
    started->after.emplace_back([] { throw std::runtime_error("planted after-step failure"); });
    const auto work = work_of(std::move(started));
    const std::exception_ptr error = wait_for_failure(*work);
    ASSERT_TRUE(error);
    EXPECT_THROW(std::rethrow_exception(error), std::runtime_error);
  }
  EXPECT_EQ(process()->parked_count(), parked);
}

// A request that completes with MPI_ERR_OTHER in its status, as a failed MPI_Isend would (a
// generalized request: Open MPI's sends to a live peer over shared memory do not fail).
MPI_Request failed_request() {
  const auto query = [](void*, MPI_Status* status) {
    MPI_Status_set_elements(status, MPI_BYTE, 0);
    MPI_Status_set_cancelled(status, 0);
    status->MPI_SOURCE = MPI_UNDEFINED;
    status->MPI_TAG = MPI_UNDEFINED;
    status->MPI_ERROR = MPI_ERR_OTHER;
    return MPI_ERR_OTHER;
  };
  const auto free = [](void*) { return MPI_SUCCESS; };
  const auto cancel = [](void*, int) { return MPI_SUCCESS; };
  MPI_Request request = MPI_REQUEST_NULL;
  const std::lock_guard lock(process()->mutex());
  EXPECT_EQ(MPI_Grequest_start(query, free, cancel, nullptr, &request), MPI_SUCCESS);
  EXPECT_EQ(MPI_Grequest_complete(request), MPI_SUCCESS);
  return request;
}

TEST(MpiWork, FailedSendNamesItsPeer) {
  // A direct exchange's failed send names the rank it went to, as a failed receive does
  // (Started::sends); here the third of three requests, "sent" to world rank 0.
  std::unique_ptr<Started> started = self_message(2, 2, std::shared_ptr<int[]>(new int[8]()));
  started->sends.push_back(Started::Send{started->requests.size(), 0});
  started->requests.push_back(failed_request());
  const auto work = work_of(std::move(started));
  const std::exception_ptr error = wait_for_failure(*work);
  ASSERT_TRUE(error);
  try {
    std::rethrow_exception(error);
  } catch (const TransportError& failure) {
    EXPECT_NE(std::string(failure.what()).find("MPI_Testall failed: "), std::string::npos)
        << failure.what();
    EXPECT_NE(std::string(failure.what()).find("(request 3 of 3, with rank 0)"), std::string::npos)
        << failure.what();
  }
}

TEST(MpiWork, PendingWorkIsStillParked) {
  // The negative space: a receive nobody sends to stays MPI's, so its buffer stays (parked).
  const std::size_t parked = process()->parked_count();
  {
    auto started = std::make_unique<Started>();
    auto buffer = std::shared_ptr<int[]>(new int[1]());
    MPI_Request receive = MPI_REQUEST_NULL;
    {
      const std::lock_guard lock(process()->mutex());
      ASSERT_EQ(MPI_Irecv(buffer.get(), 1, MPI_INT, 0, 8, MPI_COMM_SELF, &receive), MPI_SUCCESS);
    }
    started->requests = {receive};
    started->keep_alive.push_back(std::move(buffer));
    const auto work = work_of(std::move(started));
    EXPECT_FALSE(work->is_completed());
  }
  EXPECT_EQ(process()->parked_count(), parked + 1);
}

TEST(MpiWork, PendingWorkIsParkedWithEveryAllocationRefused) {
  // Note [Issue without allocation]: parking allocates nothing, so a pending work dropped when
  // no memory is left keeps its buffer with the process instead of ending it (until 2026-12-04
  // park() grew a std::vector, and its std::bad_alloc left the noexcept destructor: terminate).
  const std::size_t parked = process()->parked_count();
  // Watched, not owned: the parked buffer lives until the process ends, past this frame.
  std::weak_ptr<int> watch;
  {
    auto started = std::make_unique<Started>();
    auto buffer = std::make_shared<int>(0);
    watch = buffer;
    MPI_Request receive = MPI_REQUEST_NULL;
    {
      const std::lock_guard lock(process()->mutex());
      ASSERT_EQ(MPI_Irecv(buffer.get(), 1, MPI_INT, 0, 9, MPI_COMM_SELF, &receive), MPI_SUCCESS);
    }
    started->requests = {receive};
    started->keep_alive.push_back(std::move(buffer));
    auto work = work_of(std::move(started));
    EXPECT_FALSE(work->is_completed());
    refuse_every_allocation = true;
    work.reset();
    refuse_every_allocation = false;
  }
  EXPECT_EQ(process()->parked_count(), parked + 1);
  EXPECT_FALSE(watch.expired()) << "MPI may still write into the buffer";
}

TEST(MpiProcess, RecyclesStartedsPerThreadEmptied) {
  // Note [Recycled Started]: a recycled Started is emptied before it is kept (its buffers go
  // now), kept on the thread that recycled it, and the next take_started there gets it back
  // with its vectors' room; another thread does not see it.
  std::unique_ptr<Started> started = process()->take_started();
  Started* const node = started.get();
  auto buffer = std::make_shared<int>(0);
  const std::weak_ptr<int> watch = buffer;
  started->keep_alive.push_back(std::move(buffer));
  started->requests.reserve(8);
  started->requests.push_back(MPI_REQUEST_NULL);
  process()->recycle_started(std::move(started));
  EXPECT_TRUE(watch.expired()) << "a recycled Started keeps its buffers";
  Started* taken_elsewhere = nullptr;
  std::thread other([&] {
    std::unique_ptr<Started> mine = process()->take_started();
    taken_elsewhere = mine.get();
    process()->recycle_started(std::move(mine));
  });
  other.join();
  EXPECT_NE(taken_elsewhere, node);  // still kept on this thread, so not freed meanwhile
  std::unique_ptr<Started> again = process()->take_started();
  EXPECT_EQ(again.get(), node);
  EXPECT_TRUE(again->requests.empty());
  EXPECT_TRUE(again->keep_alive.empty());
  EXPECT_GE(again->requests.capacity(), 8U);
  process()->recycle_started(std::move(again));
}

transport::OpInfo op_info(std::string_view name, std::int64_t seq) {
  transport::OpInfo info;
  info.name = name;
  info.seq = seq;
  return info;
}

TEST(MpiComm, ACoalescedBatchGrowsItsVectorsGeometrically) {
  // A batch's operations start into one Started; each reserves room for its request and status
  // before posting (Note [Issue without allocation]). Reserving exactly what each needed made
  // every operation reallocate the statuses (quadratic in the batch); growing them twofold at
  // least, a batch of kOps reallocates each vector about log2(kOps) times.
  constexpr int kOps = 256;
  const auto transport =
      std::make_shared<MpiTransport>(process(), std::chrono::seconds(20),
                                     /*check_collectives=*/false, MpiSchedule::Mpi);
  const std::shared_ptr<transport::Comm> comm = transport->create_comm("batch", {0});
  auto values = std::make_shared<std::vector<std::int32_t>>(kOps, 7);
  comm->begin_group();
  for (int i = 0; i < kOps; ++i) {
    transport::Buffer buffer;
    buffer.data = values->data() + i;
    buffer.count = 1;
    buffer.dtype = DType::Int32;
    buffer.keep_alive = values;
    EXPECT_EQ(comm->broadcast(buffer, buffer, 0, op_info("broadcast", i)), nullptr);
  }
  allocations_counted = 0;
  count_allocations = true;
  const std::shared_ptr<transport::Work> work =
      comm->end_group(op_info("broadcast_coalesced", kOps));
  count_allocations = false;
  // requests, statuses and keep_alive each about 9 times, the work once: 64 leaves room.
  EXPECT_LT(allocations_counted, std::size_t{64});
  work->wait(transport::Deadline::never());
  EXPECT_EQ(*values, std::vector<std::int32_t>(kOps, 7));
}

}  // namespace
}  // namespace chorus::mpi::detail
