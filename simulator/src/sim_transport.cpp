#include "sim_transport.hpp"

#include <memory>
#include <span>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "world.hpp"

namespace chorus::sim::detail {
namespace {

SimOp make_op(transport::OpKind kind, const transport::Buffer& send, const transport::Buffer& recv,
              const ReduceOp& reduce_op) {
  SimOp op;
  op.kind = kind;
  op.send = send;
  op.recv = recv;
  op.reduce_op = reduce_op;
  return op;
}

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
      group_rank_(group_->group_rank_of(rank)) {
  CHORUS_CHECK_GE(group_rank_, 0);
}

SimComm::~SimComm() = default;

std::uint64_t SimComm::id() const noexcept { return group_->id; }
const std::string& SimComm::tag() const noexcept { return group_->tag; }
const std::vector<int>& SimComm::ranks() const noexcept { return group_->ranks; }

std::shared_ptr<transport::Work> SimComm::all_reduce(const transport::Buffer& send,
                                                     const transport::Buffer& recv,
                                                     const ReduceOp& reduce_op,
                                                     const transport::OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(send.dtype == recv.dtype);
  return submit(make_op(transport::OpKind::AllReduce, send, recv, reduce_op), info);
}

std::shared_ptr<transport::Work> SimComm::all_gather(const transport::Buffer& send,
                                                     const transport::Buffer& recv,
                                                     const transport::OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(recv.count, send.count * ranks().size());
  CHORUS_CHECK(send.dtype == recv.dtype);
  return submit(make_op(transport::OpKind::AllGather, send, recv, ReduceOp::Kind::Sum), info);
}

std::shared_ptr<transport::Work> SimComm::reduce_scatter(const transport::Buffer& send,
                                                         const transport::Buffer& recv,
                                                         const ReduceOp& reduce_op,
                                                         const transport::OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(send.count, recv.count * ranks().size());
  CHORUS_CHECK(send.dtype == recv.dtype);
  return submit(make_op(transport::OpKind::ReduceScatter, send, recv, reduce_op), info);
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
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(send_counts.size(), ranks().size());
  CHORUS_CHECK_EQ(recv_counts.size(), ranks().size());
  CHORUS_CHECK_EQ(send.count, total(send_counts));
  CHORUS_CHECK_EQ(recv.count, total(recv_counts));
  CHORUS_CHECK(send.dtype == recv.dtype);
  SimOp op = make_op(transport::OpKind::AllToAll, send, recv, ReduceOp::Kind::Sum);
  op.send_counts = send_counts;
  op.recv_counts = recv_counts;
  return submit(std::move(op), info);
}

std::shared_ptr<transport::Work> SimComm::broadcast(const transport::Buffer& send,
                                                    const transport::Buffer& recv, int root,
                                                    const transport::OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(send.dtype == recv.dtype);
  CHORUS_CHECK(root >= 0 && root < size());
  SimOp op = make_op(transport::OpKind::Broadcast, send, recv, ReduceOp::Kind::Sum);
  op.root = root;
  return submit(std::move(op), info);
}

std::shared_ptr<transport::Work> SimComm::reduce(const transport::Buffer& send,
                                                 const transport::Buffer& recv,
                                                 const ReduceOp& reduce_op, int root,
                                                 const transport::OpInfo& info) {
  const auto abandon = batch_abandon();
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(send.dtype == recv.dtype);
  CHORUS_CHECK(root >= 0 && root < size());
  SimOp op = make_op(transport::OpKind::Reduce, send, recv, reduce_op);
  op.root = root;
  return submit(std::move(op), info);
}

std::optional<SimComm::BatchAbandon> SimComm::batch_abandon() noexcept {
  if (!batching_) {
    CHORUS_CHECK(batch_.empty());  // abandon_batch would do nothing
    return std::nullopt;
  }
  return std::optional<BatchAbandon>(std::in_place, *this);
}

void SimComm::abandon_batch() noexcept {
  // core will not call end_group: nothing of the batch started yet.
  batching_ = false;
  batch_.clear();
}

void SimComm::begin_group() {
  CHORUS_CHECK(!batching_);
  batching_ = true;
  batch_.clear();
}

std::shared_ptr<transport::Work> SimComm::end_group(const transport::OpInfo& info) {
  CHORUS_CHECK(batching_);
  CHORUS_CHECK(!batch_.empty());
  // Closed before the start, which may throw (then the batch started nothing and is gone). The
  // list keeps its room for the next batch.
  batching_ = false;
  std::shared_ptr<SimWork> work;
  try {
    work = world_->start(rank_, *group_, group_rank_, batch_, info);
  } catch (...) {
    batch_.clear();
    throw;
  }
  batch_.clear();
  return work;
}

std::shared_ptr<transport::Work> SimComm::submit(SimOp op, const transport::OpInfo& info) {
  // Under the caller's BatchAbandon: a push_back that throws drops the batch.
  if (batching_) {
    batch_.push_back(std::move(op));
    return nullptr;
  }
  // No list of one: start moves the op into its arrival, whose room a recycled slot keeps.
  return world_->start(rank_, *group_, group_rank_, std::span<SimOp>(&op, 1), info);
}

}  // namespace chorus::sim::detail
