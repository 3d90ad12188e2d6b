#include "sim_transport.hpp"

#include <utility>

#include "chorus/check.hpp"
#include "world.hpp"

namespace chorus::sim::detail {

SimTransport::SimTransport(SimWorld& world, int rank) : world_(&world), rank_(rank) {}

int SimTransport::world_size() const noexcept { return world_->world_size(); }

std::shared_ptr<transport::Comm> SimTransport::create_comm(const std::string& tag,
                                                           const std::vector<int>& ranks) {
  return std::make_shared<SimComm>(*world_, world_->group_for(tag, ranks), rank_);
}

transport::Duration SimTransport::now() { return world_->now(); }

std::string SimTransport::supports(transport::OpKind /*kind*/, DType /*dtype*/,
                                   const ReduceOp& /*reduce_op*/, Device device) const {
  // Every op, dtype and reduction runs natively (core's kernels); only host memory moves.
  if (!device.is_cpu()) {
    return "the simulator moves host memory only";
  }
  return {};
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
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(send.dtype == recv.dtype);
  return submit(SimOp{transport::OpKind::AllReduce, send, recv, reduce_op}, info);
}

std::shared_ptr<transport::Work> SimComm::all_gather(const transport::Buffer& send,
                                                     const transport::Buffer& recv,
                                                     const transport::OpInfo& info) {
  CHORUS_CHECK_EQ(recv.count, send.count * ranks().size());
  CHORUS_CHECK(send.dtype == recv.dtype);
  return submit(SimOp{transport::OpKind::AllGather, send, recv, ReduceOp::Kind::Sum}, info);
}

std::shared_ptr<transport::Work> SimComm::reduce_scatter(const transport::Buffer& send,
                                                         const transport::Buffer& recv,
                                                         const ReduceOp& reduce_op,
                                                         const transport::OpInfo& info) {
  CHORUS_CHECK_EQ(send.count, recv.count * ranks().size());
  CHORUS_CHECK(send.dtype == recv.dtype);
  return submit(SimOp{transport::OpKind::ReduceScatter, send, recv, reduce_op}, info);
}

void SimComm::begin_group() {
  CHORUS_CHECK(!batching_);
  batching_ = true;
  batch_.clear();
}

std::shared_ptr<transport::Work> SimComm::end_group(const transport::OpInfo& info) {
  CHORUS_CHECK(batching_);
  CHORUS_CHECK(!batch_.empty());
  batching_ = false;
  return world_->start(rank_, *group_, std::move(batch_), info);
}

std::shared_ptr<transport::Work> SimComm::submit(SimOp op, const transport::OpInfo& info) {
  if (batching_) {
    batch_.push_back(std::move(op));
    return nullptr;
  }
  std::vector<SimOp> ops;
  ops.push_back(std::move(op));
  return world_->start(rank_, *group_, std::move(ops), info);
}

}  // namespace chorus::sim::detail
