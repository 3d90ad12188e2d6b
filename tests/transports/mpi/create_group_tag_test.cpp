// Communicator creation beside a leftover control message (mpi.create_group_tag_test, two ranks
// under mpirun; Note [Communicator rendezvous], "Creation"). Open MPI 4.1 agrees on a new
// communicator's id with point-to-point messages on MPI_Comm_create_group's parent, tagged with
// create_group's tag. When chorus created communicators from its control communicator, a group
// whose tag came out as kBusyTag had Open MPI take an unread busy reply waiting there as its own
// message (MPI_ERR_TRUNCATE, or a wrong id). Here each rank in turn holds such an unread reply
// from the other while the two create a group with that tag: creation must succeed. On the
// control communicator it did not: one rank took Open MPI's 4-byte message as a busy reply and
// the other waited in MPI_Comm_create_group forever (a watchdog ends such a hang).

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "mpi_transport.hpp"

namespace chorus::mpi::detail {
namespace {

// A tag, distinct from `other`, whose group {0, 1} gets create_group tag `wanted`.
std::string tag_with_create_group_tag(int wanted, const std::string& other) {
  const std::vector<int> ranks{0, 1};
  for (int i = 0;; ++i) {
    std::string tag = "t" + std::to_string(i);
    if (tag != other && create_group_tag(comm_id_of(tag, ranks)) == wanted) {
      return tag;
    }
  }
}

TEST(MpiCreateGroupTag, LeftoverBusyReplyDoesNotMeetCommunicatorCreation) {
  // A rank stuck in MPI_Comm_create_group never returns: fail the job well inside ctest's limit.
  std::jthread watchdog([](const std::stop_token& stop) {
    std::mutex mutex;
    std::condition_variable_any never;
    std::unique_lock lock(mutex);
    if (!never.wait_for(lock, stop, std::chrono::seconds(60), [] { return false; }) &&
        !stop.stop_requested()) {
      std::fputs("mpi.create_group_tag_test: communicator creation hung for 60 s\n", stderr);
      std::_Exit(1);
    }
  });
  auto process = std::make_shared<MpiProcess>();
  ASSERT_EQ(process->world_size(), 2) << "run under mpirun -np 2";
  auto transport = std::make_shared<MpiTransport>(process, std::chrono::seconds(20),
                                                  /*check_collectives=*/false, MpiSchedule::Mpi);
  const std::string first = tag_with_create_group_tag(kBusyTag, "");
  const std::string second = tag_with_create_group_tag(kBusyTag, first);
  std::vector<std::shared_ptr<transport::Comm>> comms;
  for (const int late : {0, 1}) {
    // The early rank leaves an unread busy reply at the late one, which then reaches the set-up
    // with its peer's set-up message already there, so its rendezvous takes no busy reply.
    const int rank = process->rank();
    if (rank != late) {
      const BusyReply reply{};  // answers no set-up: chorus drops it whenever it takes it
      const std::lock_guard lock(process->mutex());
      ASSERT_EQ(MPI_Send(&reply, sizeof(reply), MPI_BYTE, late, kBusyTag, process->control()),
                MPI_SUCCESS);
    }
    ASSERT_EQ(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
    if (rank == late) {
      // Until the early rank's set-up message is here (a probe leaves it queued): the rendezvous
      // then finds its peer at once and never takes the busy reply.
      const std::lock_guard lock(process->mutex());
      ASSERT_EQ(MPI_Probe(1 - late, kRendezvousTag, process->control(), MPI_STATUS_IGNORE),
                MPI_SUCCESS);
    }
    const std::string& tag = late == 0 ? first : second;
    ASSERT_EQ(create_group_tag(comm_id_of(tag, {0, 1})), kBusyTag);
    EXPECT_NO_THROW(comms.push_back(transport->create_comm(tag, {0, 1}))) << "late rank " << late;
  }
  // The leftovers do not disturb a later set-up either (whoever takes them drops them).
  EXPECT_NO_THROW(comms.push_back(transport->create_comm("after", {0, 1})));
  comms.clear();
  transport.reset();
  process.reset();
}

}  // namespace
}  // namespace chorus::mpi::detail
