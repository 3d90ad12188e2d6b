#pragma once

// Groups of ranks, and their desugaring into the canonical (tag, ranks, group_size) form that
// every collective takes, following PyTorch's _expand_group.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "chorus/tensor.hpp"

namespace chorus {

class ProcessGroup;

// Every rank, with the empty tag: world() is the same group as the list {0, ..., W-1}.
// Throws InvalidArgument outside a rank.
ProcessGroup world();

// A group of `ranks` (in that order). Local: a non-member gets a group whose use in a collective
// throws InvalidArgument. Empty, duplicate or out-of-range ranks throw InvalidArgument here.
// Different tags make different groups (different communicators).
ProcessGroup new_group(std::vector<int> ranks, std::string tag = "");

// A named, ordered set of ranks. A value type; creating one is local, not collective: any rank
// may create any group (DESIGN 2.7). Its communicator is created lazily, by the members, at first
// use. Two groups with the same tag and ranks are the same group.
class ProcessGroup {
 public:
  const std::string& tag() const noexcept { return tag_; }
  // A moved-from group has no ranks.
  const std::vector<int>& ranks() const noexcept {
    return ranks_ != nullptr ? *ranks_ : no_ranks();
  }
  int size() const noexcept { return static_cast<int>(ranks().size()); }
  bool contains(int rank) const noexcept;
  // Index of `rank` in ranks(), or -1.
  int group_rank(int rank) const noexcept;

  friend bool operator==(const ProcessGroup& a, const ProcessGroup& b) {
    return a.tag_ == b.tag_ && (a.ranks_ == b.ranks_ || a.ranks() == b.ranks());
  }

 private:
  friend ProcessGroup world();
  friend ProcessGroup new_group(std::vector<int> ranks, std::string tag);
  ProcessGroup(std::shared_ptr<const std::vector<int>> ranks, std::string tag);
  // With the empty tag (world(), at every collective that names it): no tag string is made from
  // "" and moved in, two out-of-line std::string calls.
  explicit ProcessGroup(const std::shared_ptr<const std::vector<int>>& ranks) noexcept
      : ranks_(ranks) {}
  static const std::vector<int>& no_ranks() noexcept;

  // Immutable and shared by copies: a group is copied into every GroupSpec that names it, and
  // world() hands out the rank's one list instead of building it at every collective.
  std::shared_ptr<const std::vector<int>> ranks_;
  std::string tag_;
};

// An N-D arrangement of ranks, as torch's DeviceMesh: ranks laid out row-major in mesh_shape.
class DeviceMesh {
 public:
  // Throws InvalidArgument when the product of mesh_shape differs from ranks.size(), or a size
  // is not positive, or ranks hold duplicates or negative values.
  DeviceMesh(Shape mesh_shape, std::vector<int> ranks);

  const Shape& shape() const noexcept { return shape_; }
  const std::vector<int>& ranks() const noexcept { return ranks_; }
  std::int64_t ndim() const noexcept { return static_cast<std::int64_t>(shape_.size()); }
  std::int64_t size(std::int64_t dim) const;
  bool contains(int rank) const noexcept;
  // The ranks of the 1-D slice through `rank` along `dim` (its "dim group"). Throws
  // InvalidArgument if `rank` is not in the mesh or `dim` is out of range.
  std::vector<int> dim_ranks(std::int64_t dim, int rank) const;

  friend bool operator==(const DeviceMesh&, const DeviceMesh&) = default;

 private:
  Shape shape_;
  std::vector<int> ranks_;
};

// One dimension of a mesh: the collective runs within the caller's slice along `dim`.
struct MeshDim {
  DeviceMesh mesh;
  std::int64_t dim = 0;
};

// Any of the ways to name a group. Implicitly constructible so collectives accept
// `{0, 1, 2}`, `{{0, 1}, {2, 3}}`, a ProcessGroup, a DeviceMesh or a MeshDim. One-rank
// sub-lists need the type spelled out (`{{0}, {1}}` is ambiguous between a rank list and a list
// of lists): `std::vector<std::vector<int>>{{0}, {1}}`.
class GroupSpec {
 public:
  GroupSpec(std::vector<int> ranks);                    // NOLINT: implicit by design
  GroupSpec(std::initializer_list<int> ranks);          // NOLINT
  GroupSpec(std::vector<std::vector<int>> rank_lists);  // NOLINT
  GroupSpec(std::initializer_list<std::initializer_list<int>> rank_lists);  // NOLINT
  GroupSpec(ProcessGroup group);                                            // NOLINT
  GroupSpec(DeviceMesh mesh);                                               // NOLINT
  GroupSpec(MeshDim mesh_dim);                                              // NOLINT

  using Value = std::variant<std::vector<int>, std::vector<std::vector<int>>, ProcessGroup,
                             DeviceMesh, MeshDim>;
  const Value& value() const noexcept { return value_; }

 private:
  Value value_;
};

// The canonical form of a group (the seed's `(tag, rankset, group_size)`). For a 2-D rank list,
// `ranks` is the flattened list and `group_size` the length of each sub-list: the collective runs
// within the caller's sub-list (MPMD). For the other forms, `ranks` is the caller's group.
struct ExpandedGroup {
  std::string tag;
  std::vector<int> ranks;
  int group_size = 0;

  // The sub-list of `ranks` (of length group_size) that contains `rank`; empty if none.
  std::vector<int> members_of(int rank) const;
  // "[0, 1, 2, 3]" or "'tag' [0, 1]".
  std::string to_string() const;

  friend bool operator==(const ExpandedGroup&, const ExpandedGroup&) = default;
};

// Desugars `group`. The tag is `tag` when non-empty, else the group's own tag. Throws
// InvalidArgument (DESIGN 2.2) for: an empty group or sub-list, duplicate ranks, negative ranks
// or (inside a rank) ranks >= world_size(), sub-lists of unequal length ("group sizes must be
// identical ..."), an N-D mesh with N > 1 passed alone ("Only 1D mesh ..."), and a MeshDim whose
// mesh does not hold the calling rank (a MeshDim names the calling rank's slice, which only a
// member has). For the other forms the calling rank's membership is checked by the collective,
// not here, as PyTorch's _expand_group does not check it either.
ExpandedGroup expand_group(const GroupSpec& group, std::string_view tag = "");

// The calling rank and the number of ranks (thread- or fiber-local in the simulator).
// Throw InvalidArgument outside a rank.
int rank();
int world_size();
// Where the calling rank computes: Device::cuda(i) on the NCCL transport (the rank's GPU,
// LOCAL_RANK % device count), Device::cpu() on the simulator and MPI. Code that places its
// tensors with it (Tensor::zeros(shape, dtype, local_device()), t.to(local_device())) runs
// unchanged on every transport. Throws InvalidArgument outside a rank.
Device local_device();
// Bytes of Device::cuda storage the calling rank allocated through its device memory
// (RankOptions::device_memory) that chorus has not given back yet: tensors still alive, and the
// buffers of collectives waited on the device stream whose operation has not finished (core
// holds them until the transport reports it done, Note [Stream-waited works]). PyTorch's
// torch.cuda.memory_allocated, per rank. Memory wrapped with from_blob is not counted. Throws
// InvalidArgument outside a rank.
std::size_t device_memory_allocated();

std::ostream& operator<<(std::ostream& out, const ExpandedGroup& group);

}  // namespace chorus
