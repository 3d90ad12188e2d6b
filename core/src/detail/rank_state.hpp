#pragma once

// Everything chorus keeps for one rank (behind RankContext's public face).

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chorus/runtime.hpp"
#include "chorus/transport/transport.hpp"
#include "detail/host_pool.hpp"
#include "detail/work_registry.hpp"

namespace chorus {
class TraceScope;
}

namespace chorus::detail {

// A communicator as core tracks it: created lazily at the first collective that passes
// validation (creation is collective on real transports, so a rank must not create one for an
// op it then rejects), and the sequence counter of Note [Transport contract].
struct CommSlot {
  std::shared_ptr<transport::Comm> comm;
  std::int64_t next_seq = 0;
  std::string label;  // "[0, 1]" or "'tag' [0, 1]", for error messages and reports
};

class RankState {
 public:
  RankState(std::shared_ptr<transport::Transport> transport, RankOptions options);

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  transport::Transport& transport() noexcept { return *transport_; }
  const std::shared_ptr<transport::Transport>& transport_ptr() const noexcept { return transport_; }
  const RankOptions& options() const noexcept { return options_; }
  const std::shared_ptr<WorkRegistry>& registry() const noexcept { return registry_; }
  const std::shared_ptr<HostPool>& host_pool() const noexcept { return host_pool_; }

  // The slot of the group (tag, members); `members` holds this rank. Slots live as long as the
  // rank state.
  CommSlot& comm_slot(const std::string& tag, std::span<const int> members);
  // Creates the slot's communicator if it does not exist yet.
  transport::Comm& ensure_comm(CommSlot& slot, const std::string& tag,
                               std::span<const int> members);

  // Throws the first error recorded while completing a dropped work, once (Note [Work
  // lifecycle], step 3).
  void raise_deferred_error();
  // At every collective and explicit wait: completes drops deferred during unwinding (unless an
  // exception is in flight now), then raises a deferred error.
  void settle_unwaited();

  bool finished = false;
  TraceScope* trace = nullptr;  // the innermost TraceScope, or null when not tracing

 private:
  int rank_;
  int world_size_;
  std::shared_ptr<transport::Transport> transport_;
  RankOptions options_;
  std::shared_ptr<WorkRegistry> registry_;
  std::shared_ptr<HostPool> host_pool_;
  using CommKey = std::pair<std::string, std::vector<int>>;
  std::map<CommKey, CommSlot> comms_;
  // The slot comm_slot returned last, and its key (both in comms_, whose nodes never move):
  // consecutive collectives mostly use one group, and comparing is cheaper than building a key.
  const CommKey* last_key_ = nullptr;
  CommSlot* last_slot_ = nullptr;
};

}  // namespace chorus::detail
