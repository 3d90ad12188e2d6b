#include "sim_transport.hpp"

#include <memory>
#include <utility>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "world.hpp"

namespace chorus::sim::detail {
namespace {

// Note [Ops built in place]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A SimOp is some 220 bytes: two Buffers (each with its keep_alive), a ReduceOp, the counts'
// vectors. Each operation built one on the stack (zeroed, then written member by member), moved
// it into its arrival's list (SimWorld::start, a SimOp move constructor call) and destroyed the
// moved-from one: about 150 instructions an operation spent on copies. Now the comm builds each
// op once, by a constructor, at the end of its own list (SimComm::ops_, which also holds an open
// batch), and start swaps that whole list with the arrival's empty one: three pointers each way,
// whatever the batch's size. The comm gets the arrival's room for its next operation, and the
// arrival keeps the ops until recycle_slot clears them, as before. Rooms circulate: a comm's
// list goes back to a per-thread stack as the comm dies (transport::RecycledRooms, Note
// [Recycled rooms]) and the next run's comms take it from there, so a steady schedule allocates
// no list, as when start reserved room in the arrival. A start that throws, or an operation that
// fails at once, leaves the ops in the comm's list, which the comm empties (start_staged).
struct OpListTag {};
using RecycledOpLists = transport::RecycledRooms<std::vector<SimOp>, OpListTag>;

}  // namespace

SimTransport::SimTransport(SimWorld& world, int rank) : world_(&world), rank_(rank) {}

int SimTransport::world_size() const noexcept { return world_->world_size(); }

std::shared_ptr<transport::Comm> SimTransport::create_comm(const std::string& tag,
                                                           const std::vector<int>& ranks) {
  // Each run makes one per rank and group: recycled (Note [Recycled blocks]).
  return std::allocate_shared<SimComm>(transport::RecyclingAllocator<SimComm>{}, *world_,
                                       world_->group_for(tag, ranks), rank_);
}

transport::Duration SimTransport::now() { return world_->now(); }

Device SimTransport::device() const noexcept {
  return world_->cuda_devices() ? Device::cuda(rank_) : Device::cpu();
}

std::string SimTransport::supports(transport::OpKind /*kind*/, DType /*dtype*/,
                                   const ReduceOp& /*reduce_op*/, Device device) const {
  // Every op, dtype and reduction runs natively (core's kernels); only host memory moves, some
  // of it posing as the rank's CUDA device (SimOptions::cuda_devices).
  if (device.is_cpu() || device == this->device()) {
    return {};
  }
  if (world_->cuda_devices()) {
    return "simulated rank " + std::to_string(rank_) + " owns cuda:" + std::to_string(rank_) +
           ", not " + device.to_string();
  }
  return "the simulator moves host memory only (SimOptions::cuda_devices, --sim-cuda, lets "
         "ranks pose as CUDA device owners)";
}

SimComm::SimComm(SimWorld& world, std::shared_ptr<SimGroup> group, int rank)
    : world_(&world),
      group_(std::move(group)),
      rank_(rank),
      group_rank_(group_->group_rank_of(rank)),
      ops_(RecycledOpLists::take()) {
  CHORUS_CHECK_GE(group_rank_, 0);
}

SimComm::~SimComm() { RecycledOpLists::give(ops_); }  // Note [Ops built in place]

std::uint64_t SimComm::id() const noexcept { return group_->id; }
const std::string& SimComm::tag() const noexcept { return group_->tag; }
const std::vector<int>& SimComm::ranks() const noexcept { return group_->ranks; }

// Note [No guard outside a batch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each operation method held a std::optional<BatchAbandon>, engaged only inside a batch, across
// the start: its flag was set up before the checks and tested again after start_staged returned.
// The guard now exists only on the batch's path (stage_and_submit), so outside a batch the start
// is the last thing a method does and nothing is tested after it. The method's checks and staging
// are a lambda, always inlined (GCC left it a call otherwise); the same checks run in the same
// order, with the same texts, then the same op is staged. bench_sim: ~4.5 instructions an
// operation in all_reduce (docs/performance.md, 2026-12-08 00:07).

std::shared_ptr<transport::Work> SimComm::all_reduce(const transport::Buffer& send,
                                                     const transport::Buffer& recv,
                                                     const ReduceOp& reduce_op,
                                                     const transport::OpInfo& info) {
  return stage_and_submit(
      info, [&]() __attribute__((always_inline)) {
        CHORUS_CHECK_EQ(send.count, recv.count);
        CHORUS_CHECK(send.dtype == recv.dtype);
        stage(transport::OpKind::AllReduce, send, recv, reduce_op);
      });
}

std::shared_ptr<transport::Work> SimComm::all_gather(const transport::Buffer& send,
                                                     const transport::Buffer& recv,
                                                     const transport::OpInfo& info) {
  return stage_and_submit(
      info, [&]() __attribute__((always_inline)) {
        CHORUS_CHECK_EQ(recv.count, send.count * ranks().size());
        CHORUS_CHECK(send.dtype == recv.dtype);
        stage(transport::OpKind::AllGather, send, recv, ReduceOp::Kind::Sum);
      });
}

std::shared_ptr<transport::Work> SimComm::reduce_scatter(const transport::Buffer& send,
                                                         const transport::Buffer& recv,
                                                         const ReduceOp& reduce_op,
                                                         const transport::OpInfo& info) {
  return stage_and_submit(
      info, [&]() __attribute__((always_inline)) {
        CHORUS_CHECK_EQ(send.count, recv.count * ranks().size());
        CHORUS_CHECK(send.dtype == recv.dtype);
        stage(transport::OpKind::ReduceScatter, send, recv, reduce_op);
      });
}

namespace {

std::size_t total(const std::vector<std::size_t>& counts) {
  std::size_t sum = 0;
  for (std::size_t count : counts) {
    sum += count;
  }
  return sum;
}
}  // namespace

std::shared_ptr<transport::Work> SimComm::all_to_all(const transport::Buffer& send,
                                                     const std::vector<std::size_t>& send_counts,
                                                     const transport::Buffer& recv,
                                                     const std::vector<std::size_t>& recv_counts,
                                                     const transport::OpInfo& info) {
  return stage_and_submit(
      info, [&]() __attribute__((always_inline)) {
        CHORUS_CHECK_EQ(send_counts.size(), ranks().size());
        CHORUS_CHECK_EQ(recv_counts.size(), ranks().size());
        CHORUS_CHECK_EQ(send.count, total(send_counts));
        CHORUS_CHECK_EQ(recv.count, total(recv_counts));
        CHORUS_CHECK(send.dtype == recv.dtype);
        // Copied before the op is staged: a copy that throws leaves nothing staged.
        std::vector<std::size_t> sends = send_counts;
        std::vector<std::size_t> receives = recv_counts;
        SimOp& op = stage(transport::OpKind::AllToAll, send, recv, ReduceOp::Kind::Sum);
        op.send_counts = std::move(sends);
        op.recv_counts = std::move(receives);
      });
}

std::shared_ptr<transport::Work> SimComm::broadcast(const transport::Buffer& send,
                                                    const transport::Buffer& recv, int root,
                                                    const transport::OpInfo& info) {
  return stage_and_submit(
      info, [&]() __attribute__((always_inline)) {
        CHORUS_CHECK_EQ(send.count, recv.count);
        CHORUS_CHECK(send.dtype == recv.dtype);
        CHORUS_CHECK(root >= 0 && root < size());
        stage(transport::OpKind::Broadcast, send, recv, ReduceOp::Kind::Sum).root = root;
      });
}

std::shared_ptr<transport::Work> SimComm::reduce(const transport::Buffer& send,
                                                 const transport::Buffer& recv,
                                                 const ReduceOp& reduce_op, int root,
                                                 const transport::OpInfo& info) {
  return stage_and_submit(
      info, [&]() __attribute__((always_inline)) {
        CHORUS_CHECK_EQ(send.count, recv.count);
        CHORUS_CHECK(send.dtype == recv.dtype);
        CHORUS_CHECK(root >= 0 && root < size());
        stage(transport::OpKind::Reduce, send, recv, reduce_op).root = root;
      });
}

void SimComm::abandon_batch() noexcept {
  // core will not call end_group: nothing of the batch started yet.
  batching_ = false;
  ops_.clear();
}

void SimComm::begin_group() {
  CHORUS_CHECK(!batching_);
  batching_ = true;
  ops_.clear();
}

std::shared_ptr<transport::Work> SimComm::end_group(const transport::OpInfo& info) {
  CHORUS_CHECK(batching_);
  CHORUS_CHECK(!ops_.empty());
  // Closed before the start, which may throw (then the batch started nothing and is gone).
  batching_ = false;
  return start_staged(info);
}

SimOp& SimComm::stage(transport::OpKind kind, const transport::Buffer& send,
                      const transport::Buffer& recv, const ReduceOp& reduce_op) {
  // Outside a batch the list is empty here (stage_and_submit checked): it holds this op alone.
  return ops_.emplace_back(kind, send, recv, reduce_op);
}

std::shared_ptr<transport::Work> SimComm::start_staged(const transport::OpInfo& info) {
  std::shared_ptr<SimWork> work;
  try {
    work = world_->start(rank_, *group_, group_rank_, ops_, info);
  } catch (...) {
    ops_.clear();
    throw;
  }
  // Usually the arrival's empty list now (Note [Ops built in place]); an operation that failed
  // at once left its ops here.
  ops_.clear();
  return work;
}

}  // namespace chorus::sim::detail
