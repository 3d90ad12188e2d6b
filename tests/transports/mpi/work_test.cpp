// MpiWork's end (Note [Recycled Started]): a work that failed after MPI completed its requests
// is recycled, not parked until the process ends; one MPI may still write into is parked, even
// with no memory left (Note [Issue without allocation]). And a failed request's error names the
// rank it exchanged with; the user ops (Note [MPI mapping]) step as the kernels do.
// Runs under mpirun -np 1 (mpi.work_test): one MpiProcess, MPI_COMM_SELF messages to itself.

#include <gtest/gtest.h>

#include <array>
#include <bit>
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
#include "mpi_errors.hpp"
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

// Note [MPI mapping]: a user op is one step of the kernels' reduction, inout = in (op) inout,
// `in` holding the lower ranks' side (MPI's operand order), on the dtype's own elements.
template <typename T>
T reduce_local(MPI_Op op, MPI_Datatype datatype, T in, T inout) {
  EXPECT_EQ(MPI_Reduce_local(&in, &inout, 1, datatype, op), MPI_SUCCESS);
  return inout;
}

TEST(MpiUserOps, ReduceAsTheKernelsWithTheLowerRanksOnTheLeft) {
  UserOps& ops = process()->user_ops();
  const std::lock_guard lock(process()->mutex());
  // A tie keeps the left operand, `in`: max(-0, +0) is -0, min(+0, -0) is +0.
  const MPI_Op f32_max = ops.get(DType::Float32, ReduceOp::Kind::Max);
  const MPI_Op f32_min = ops.get(DType::Float32, ReduceOp::Kind::Min);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(reduce_local(f32_max, MPI_FLOAT, -0.0f, 0.0f)),
            0x8000'0000u);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(reduce_local(f32_min, MPI_FLOAT, 0.0f, -0.0f)),
            0x0000'0000u);
  // Each 16-bit dtype compares as itself: 0x7C01 is BFloat16's 2^121 * (1 + 2^-7), finite and
  // above 1.0 (0x3F80); read as Float16 it would be a NaN, which min and max propagate.
  const MPI_Op bf16_min = ops.get(DType::BFloat16, ReduceOp::Kind::Min);
  const MPI_Op bf16_max = ops.get(DType::BFloat16, ReduceOp::Kind::Max);
  EXPECT_EQ(reduce_local<std::uint16_t>(bf16_min, MPI_UINT16_T, 0x3F80, 0x7C01), 0x3F80);
  EXPECT_EQ(reduce_local<std::uint16_t>(bf16_max, MPI_UINT16_T, 0x3F80, 0x7C01), 0x7C01);
  // 8-bit sums and products wrap (Open MPI's own saturate: ompi#8045).
  const MPI_Op i8_sum = ops.get(DType::Int8, ReduceOp::Kind::Sum);
  const MPI_Op u8_product = ops.get(DType::UInt8, ReduceOp::Kind::Product);
  EXPECT_EQ(reduce_local<std::int8_t>(i8_sum, MPI_UINT8_T, 100, 100), -56);
  EXPECT_EQ(reduce_local<std::uint8_t>(u8_product, MPI_UINT8_T, 16, 17), 16);  // 272 mod 256
}

// Only sums and products tell MPI they commute: on min and max it must keep rank order, or which
// of two tied operands survives would depend on its algorithm.
TEST(MpiUserOps, OnlySumsAndProductsCommute) {
  UserOps& ops = process()->user_ops();
  const std::lock_guard lock(process()->mutex());
  const auto commutes = [&](DType dtype, ReduceOp::Kind kind) {
    int commute = -1;
    EXPECT_EQ(MPI_Op_commutative(ops.get(dtype, kind), &commute), MPI_SUCCESS);
    return commute;
  };
  EXPECT_EQ(commutes(DType::Int8, ReduceOp::Kind::Sum), 1);
  EXPECT_EQ(commutes(DType::UInt8, ReduceOp::Kind::Product), 1);
  for (const DType dtype : {DType::Float16, DType::BFloat16, DType::Float32, DType::Float64}) {
    EXPECT_EQ(commutes(dtype, ReduceOp::Kind::Min), 0) << dtype_name(dtype);
    EXPECT_EQ(commutes(dtype, ReduceOp::Kind::Max), 0) << dtype_name(dtype);
  }
}

// Operations that move elements without arithmetic (all_gather, broadcast, all_to_all, the direct
// exchanges) send each dtype as an MPI type of its own size: Complex128, 16 bytes, has no
// unsigned integer of its width. (Behind chorus's API complex and Bool buffers arrive lowered,
// Note [Lowering] in core; the transport's own entry points take every dtype.)
TEST(MpiMapping, EveryDTypeMovesAsAnMpiTypeOfItsSize) {
  const std::lock_guard lock(process()->mutex());
  for (const DType dtype : kAllDTypes) {
    int bytes = 0;
    ASSERT_EQ(MPI_Type_size(mpi_datatype(movement_element(dtype)), &bytes), MPI_SUCCESS);
    EXPECT_EQ(static_cast<std::size_t>(bytes), element_size(dtype)) << dtype_name(dtype);
  }
}

// A group's id (Note [Communicator rendezvous]) tells its set-up messages from another group's,
// and gives its MPI_Comm_create_group tag: every byte of the tag and of each rank counts.
TEST(MpiTransport, GroupIdsTellTagsAndRanksApart) {
  EXPECT_EQ(comm_id_of("a", {0, 1}), comm_id_of("a", {0, 1}));
  EXPECT_NE(comm_id_of("a", {0, 1}), comm_id_of("b", {0, 1}));
  EXPECT_NE(comm_id_of("", {0, 1}), comm_id_of("", {0, 257}));  // 257 = 0x101
  EXPECT_NE(comm_id_of("", {0, 1}), comm_id_of("", {1, 0}));
}

MPI_Status status_of(int error, int source = MPI_UNDEFINED) {
  MPI_Status status{};
  status.MPI_SOURCE = source;
  status.MPI_ERROR = error;
  return status;
}

// A failed wait's text names the first request whose status holds an error (MPI_ERR_PENDING:
// one that neither failed nor completed), counted from 1, and the rank it exchanged with.
TEST(MpiRequestsFailure, NamesTheFirstFailedRequestAndItsPeer) {
  const std::lock_guard lock(process()->mutex());
  const std::array<MPI_Status, 3> statuses = {status_of(MPI_SUCCESS), status_of(MPI_ERR_PENDING),
                                              status_of(MPI_ERR_TRUNCATE)};
  const std::array<int, 3> peers = {4, 5, 6};
  EXPECT_EQ(
      mpi_requests_failure("MPI_Waitall", MPI_ERR_IN_STATUS, statuses, peers),
      "MPI_Waitall failed: " + mpi_error_text(MPI_ERR_TRUNCATE) + " (request 3 of 3, with rank 6)");
  // Without a peer for the failed request: none named, whatever the status's source says. A
  // collective's request has no peer, and MPI leaves its MPI_SOURCE undefined: Open MPI's
  // libnbc writes 0 (an MPI_Iallgather on 2 ranks, Open MPI 4.1), a rank of every
  // communicator, which the collective check's failure (MpiComm::await_requests) named as the
  // failed request's peer, the group's first member whoever failed.
  const std::array<MPI_Status, 1> from_self = {status_of(MPI_ERR_TRUNCATE, 0)};
  EXPECT_EQ(mpi_requests_failure("MPI_Testall", MPI_ERR_IN_STATUS, from_self),
            "MPI_Testall failed: " + mpi_error_text(MPI_ERR_TRUNCATE) + " (request 1 of 1)");
  const std::array<int, 1> unknown = {-1};
  EXPECT_EQ(mpi_requests_failure("MPI_Testall", MPI_ERR_IN_STATUS, from_self, unknown),
            "MPI_Testall failed: " + mpi_error_text(MPI_ERR_TRUNCATE) + " (request 1 of 1)");
}

// Any other code than MPI_ERR_IN_STATUS is the failure itself: the statuses are not read.
TEST(MpiRequestsFailure, ReportsTheCallsOwnCodeUnlessInStatus) {
  const std::lock_guard lock(process()->mutex());
  const std::array<MPI_Status, 1> statuses = {status_of(MPI_ERR_TRUNCATE)};
  const std::array<int, 1> peers = {3};
  EXPECT_EQ(mpi_requests_failure("MPI_Testall", MPI_ERR_OTHER, statuses, peers),
            "MPI_Testall failed: " + mpi_error_text(MPI_ERR_OTHER));
  const std::array<MPI_Status, 1> clean = {status_of(MPI_SUCCESS)};
  EXPECT_EQ(mpi_requests_failure("MPI_Testall", MPI_ERR_IN_STATUS, clean, peers),
            "MPI_Testall failed: " + mpi_error_text(MPI_ERR_IN_STATUS) +
                " (no request's status names an error)");
}

// Only a truncation in the request's own status, under MPI_ERR_IN_STATUS, is a longer message.
TEST(MpiRequestsFailure, TruncatedReadsTheRequestsOwnStatus) {
  const std::lock_guard lock(process()->mutex());
  const std::array<MPI_Status, 2> statuses = {status_of(MPI_SUCCESS), status_of(MPI_ERR_TRUNCATE)};
  EXPECT_FALSE(truncated(MPI_ERR_IN_STATUS, statuses, 0));
  EXPECT_TRUE(truncated(MPI_ERR_IN_STATUS, statuses, 1));
  EXPECT_FALSE(truncated(MPI_ERR_OTHER, statuses, 1));      // the statuses are not read
  EXPECT_FALSE(truncated(MPI_ERR_IN_STATUS, statuses, 2));  // past the last request
  const std::array<MPI_Status, 1> other = {status_of(MPI_ERR_OTHER)};
  EXPECT_FALSE(truncated(MPI_ERR_IN_STATUS, other, 0));
}

// A message of another size: the sender, both sizes in the receive's unit (one without its s),
// and where.
TEST(MpiRequestsFailure, MessageSizeMismatchNamesTheSenderAndBothSizes) {
  const std::string tail =
      ": the ranks issued different operations or sizes at this point (--check-collectives "
      "compares them before anything is sent)";
  EXPECT_EQ(message_size_mismatch(3, 0, 1, "elements", ""),
            "rank 3 sent 0 elements where this rank expected 1" + tail);
  EXPECT_EQ(message_size_mismatch(2, 1, 4, "elements", ""),
            "rank 2 sent 1 element where this rank expected 4" + tail);
  EXPECT_EQ(message_size_mismatch(1, kLongerMessage, 1, "elements", ""),
            "rank 1 sent more than the 1 element this rank expected" + tail);
  EXPECT_EQ(
      message_size_mismatch(0, kLongerMessage, 8192, "bytes", " in the ring all_reduce"),
      "rank 0 sent more than the 8192 bytes this rank expected in the ring all_reduce" + tail);
  EXPECT_EQ(message_size_mismatch(5, MPI_UNDEFINED, 2, "elements", ""),
            "rank 5 sent a message that is not a whole number of elements where this rank "
            "expected 2 elements" +
                tail);
}

TEST(MpiRequestsFailure, WorldRankOfIsMinusOneOutsideTheCommunicator) {
  const std::lock_guard lock(process()->mutex());
  EXPECT_EQ(world_rank_of(MPI_COMM_SELF, 0), 0);
  EXPECT_EQ(world_rank_of(MPI_COMM_SELF, 1), -1);  // size 1: rank 1 is past its last
  EXPECT_EQ(world_rank_of(MPI_COMM_SELF, -1), -1);
  EXPECT_EQ(world_rank_of(MPI_COMM_NULL, 0), -1);
}

}  // namespace
}  // namespace chorus::mpi::detail
