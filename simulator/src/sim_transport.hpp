#pragma once

// The simulator behind the transport seam: one SimTransport per rank, one SimComm per rank and
// group, both thin adaptors over the shared SimWorld. The world owns every rank's context and
// with it these objects, so they point at it without owning it.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/transport/batch_abandon.hpp"
#include "chorus/transport/transport.hpp"

namespace chorus::sim::detail {

class SimWorld;
struct SimGroup;
struct SimOp;

class SimTransport final : public transport::Transport {
 public:
  SimTransport(SimWorld& world, int rank);

  std::string_view name() const noexcept override { return "sim"; }
  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override;
  // cuda:rank with SimOptions::cuda_devices, the host otherwise.
  Device device() const noexcept override;
  std::shared_ptr<transport::Comm> create_comm(const std::string& tag,
                                               const std::vector<int>& ranks) override;
  transport::Duration now() override;
  std::string supports(transport::OpKind kind, DType dtype, const ReduceOp& reduce_op,
                       Device device) const override;

 private:
  SimWorld* world_;
  int rank_;
};

class SimComm final : public transport::Comm {
 public:
  SimComm(SimWorld& world, std::shared_ptr<SimGroup> group, int rank);
  ~SimComm() override;

  std::uint64_t id() const noexcept override;
  const std::string& tag() const noexcept override;
  const std::vector<int>& ranks() const noexcept override;
  int group_rank() const noexcept override { return group_rank_; }

  std::shared_ptr<transport::Work> all_reduce(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const ReduceOp& reduce_op,
                                              const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> all_gather(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> reduce_scatter(const transport::Buffer& send,
                                                  const transport::Buffer& recv,
                                                  const ReduceOp& reduce_op,
                                                  const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> all_to_all(const transport::Buffer& send,
                                              const std::vector<std::size_t>& send_counts,
                                              const transport::Buffer& recv,
                                              const std::vector<std::size_t>& recv_counts,
                                              const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> broadcast(const transport::Buffer& send,
                                             const transport::Buffer& recv, int root,
                                             const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> reduce(const transport::Buffer& send,
                                          const transport::Buffer& recv, const ReduceOp& reduce_op,
                                          int root, const transport::OpInfo& info) override;
  void begin_group() override;
  std::shared_ptr<transport::Work> end_group(const transport::OpInfo& info) override;

 private:
  using BatchAbandon = transport::BatchAbandon<SimComm>;
  friend BatchAbandon;

  // Builds an op at the end of ops_, in place (Note [Ops built in place] in sim_transport.cpp),
  // for its method to complete (an all_to_all's counts, a root) in its stage_op. Throws
  // std::bad_alloc, and then stages nothing.
  SimOp& stage(transport::OpKind kind, const transport::Buffer& send, const transport::Buffer& recv,
               const ReduceOp& reduce_op);
  // Runs an operation method's `stage_op` (its checks, then stage()) and leaves the op in the open
  // batch, or starts it alone (SimWorld::start). Inside a batch `stage_op` runs under a
  // BatchAbandon: one that throws (std::bad_alloc copying its counts or staging the op) drops the
  // open batch, since core calls no end_group then (Note [Transport contract]). Outside one there
  // is nothing to drop, so no guard (Note [No guard outside a batch] in sim_transport.cpp).
  template <class StageOp>
  std::shared_ptr<transport::Work> stage_and_submit(const transport::OpInfo& info,
                                                    StageOp&& stage_op) {
    if (batching_) {
      const BatchAbandon abandon(*this);
      stage_op();
      return nullptr;
    }
    CHORUS_CHECK(ops_.empty());  // the list holds this op alone
    stage_op();
    return start_staged(info);
  }
  // Starts ops_ (SimWorld::start) and empties it, whether the start returns or throws.
  std::shared_ptr<transport::Work> start_staged(const transport::OpInfo& info);
  // Drops the open batch (nothing of it started); a no-op outside a batch. For BatchAbandon.
  void abandon_batch() noexcept;

  SimWorld* world_;
  std::shared_ptr<SimGroup> group_;
  int rank_;
  int group_rank_;
  bool batching_ = false;
  // The open batch's ops, or the one op an operation method starts alone; empty between
  // operations outside a batch. Its room comes and goes with the arrivals' (Note [Ops built in
  // place]).
  std::vector<SimOp> ops_;
};

}  // namespace chorus::sim::detail
