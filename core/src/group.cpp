#include "chorus/group.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/runtime.hpp"
#include "chorus/stream.hpp"
#include "chorus/transport/group_label.hpp"
#include "chorus/transport/transport.hpp"
#include "detail/errors.hpp"
#include "detail/format.hpp"
#include "detail/group_internal.hpp"
#include "detail/rank_state.hpp"
#include "detail/tensor_access.hpp"

namespace chorus {
namespace detail {
namespace {

RankContext& require_rank(std::string_view op) {
  RankContext* context = RankContext::current();
  if (context == nullptr) {
    throw_invalid(op,
                  "called outside a rank: call it from the rank function given to "
                  "chorus::run or chorus::sim::run");
  }
  return *context;
}

std::string describe(const GroupSpec& group);

// Throws InvalidArgument naming the group as the caller spelled it (`spec`, formatted only here,
// on the error path; null when there is no spec to name).
[[noreturn]] void throw_group_error(std::string_view op, const GroupSpec* spec,
                                    std::string detail) {
  throw InvalidArgument(make_context(op, -1, spec != nullptr ? describe(*spec) : std::string()),
                        std::move(detail));
}

// Index of a repeated rank in `ranks`, or -1: the first position whose rank appeared before it.
// Linear and allocation-free for the group sizes collectives see on every call (one bit per rank
// below kBitsetRanks, on the stack: a 64-rank world was 2,016 pairwise comparisons per collective);
// sorts a copy for lists that name larger ranks.
int find_duplicate(const std::vector<int>& ranks) {
  constexpr std::size_t kPairwiseMax = 8;
  if (ranks.size() <= kPairwiseMax) {
    for (std::size_t i = 1; i < ranks.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if (ranks[i] == ranks[j]) {
          return static_cast<int>(i);
        }
      }
    }
    return -1;
  }
  constexpr std::size_t kBitsetRanks = 8192;
  const auto [smallest, largest] = std::minmax_element(ranks.begin(), ranks.end());
  if (*smallest >= 0 && static_cast<std::size_t>(*largest) < kBitsetRanks) {
    std::uint64_t seen[kBitsetRanks / 64] = {};
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      const auto r = static_cast<std::size_t>(ranks[i]);
      const std::uint64_t bit = std::uint64_t{1} << (r % 64);
      if ((seen[r / 64] & bit) != 0) {
        return static_cast<int>(i);
      }
      seen[r / 64] |= bit;
    }
    return -1;
  }
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  auto repeated = std::adjacent_find(sorted.begin(), sorted.end());
  if (repeated == sorted.end()) {
    return -1;
  }
  // The second occurrence, as the other paths report.
  const auto first = std::find(ranks.begin(), ranks.end(), *repeated);
  return static_cast<int>(std::find(first + 1, ranks.end(), *repeated) - ranks.begin());
}

// Checks a flat list of ranks: non-empty, no duplicates, no negative ranks, and below the world
// size when called inside a rank. `what` names the list in messages; `spec` is the group as the
// caller spelled it, for the error's context.
void check_rank_list(const std::vector<int>& ranks, std::string_view op, const char* what,
                     const GroupSpec* spec = nullptr) {
  if (ranks.empty()) {
    throw_group_error(op, spec, std::string(what) + " is empty: a group needs at least one rank");
  }
  const RankContext* context = RankContext::current();
  for (int r : ranks) {
    if (r < 0 || (context != nullptr && r >= context->world_size())) {
      std::string range = context != nullptr ? "[0, " + std::to_string(context->world_size()) + ")"
                                             : "non-negative";
      throw_group_error(op, spec,
                        std::string(what) + " " + ranks_to_string(ranks) + " holds rank " +
                            std::to_string(r) + ", out of range " + range);
    }
  }
  if (const int repeated = find_duplicate(ranks); repeated >= 0) {
    throw_group_error(op, spec,
                      std::string(what) + " " + ranks_to_string(ranks) + " holds rank " +
                          std::to_string(ranks[static_cast<std::size_t>(repeated)]) +
                          " more than once");
  }
}

// The group as the caller spelled it, for errors raised before it could be expanded.
std::string describe(const GroupSpec& group) {
  const GroupSpec::Value& value = group.value();
  if (const auto* ranks = std::get_if<std::vector<int>>(&value)) {
    return ranks_to_string(*ranks);
  }
  if (const auto* lists = std::get_if<std::vector<std::vector<int>>>(&value)) {
    std::string out = "[";
    for (std::size_t i = 0; i < lists->size(); ++i) {
      out += (i > 0 ? ", " : "") + ranks_to_string((*lists)[i]);
    }
    return out + "]";
  }
  if (const auto* process_group = std::get_if<ProcessGroup>(&value)) {
    return transport::group_label(process_group->tag(), process_group->ranks());
  }
  if (const auto* mesh = std::get_if<DeviceMesh>(&value)) {
    return "mesh " + shape_to_string(mesh->shape()) + " of " + ranks_to_string(mesh->ranks());
  }
  const auto& mesh_dim = std::get<MeshDim>(value);
  return "dim " + std::to_string(mesh_dim.dim) + " of mesh " +
         shape_to_string(mesh_dim.mesh.shape()) + " of " + ranks_to_string(mesh_dim.mesh.ranks());
}

std::string_view pick_tag(std::string_view call_tag, const std::string& own_tag) {
  return call_tag.empty() ? std::string_view(own_tag) : call_tag;
}

// A call's scratch group (RankState::push_expanded_group) usually holds the same group as the
// rank's call before, and an assignment costs more than finding that nothing changed (an
// std::string assign is ~50 instructions even of an empty string to an empty one): these set
// only what differs.
void set_tag(ExpandedGroup& out, std::string_view tag) {
  if (out.tag != tag) {
    out.tag.assign(tag);
  }
}
void set_ranks(ExpandedGroup& out, std::span<const int> ranks) {
  if (!std::equal(out.ranks.begin(), out.ranks.end(), ranks.begin(), ranks.end())) {
    out.ranks.assign(ranks.begin(), ranks.end());
  }
}

}  // namespace

std::string ranks_to_string(const std::vector<int>& ranks) { return bracketed(ranks); }

ExpandedGroup expand_group_for(const GroupSpec& group, std::string_view tag, std::string_view op) {
  ExpandedGroup out;
  expand_group_into(group, tag, op, out);
  return out;
}

void expand_group_into(const GroupSpec& group, std::string_view tag, std::string_view op,
                       ExpandedGroup& out) {
  const GroupSpec::Value& value = group.value();
  const auto fail = [&](std::string detail) { throw_group_error(op, &group, std::move(detail)); };
  if (const auto* ranks = std::get_if<std::vector<int>>(&value)) {
    check_rank_list(*ranks, op, "group", &group);
    set_tag(out, tag);
    set_ranks(out, *ranks);
    out.group_size = static_cast<int>(ranks->size());
  } else if (const auto* lists = std::get_if<std::vector<std::vector<int>>>(&value)) {
    if (lists->empty()) {
      fail("group is an empty list of rank lists");
    }
    int group_size = -1;
    out.ranks.clear();
    for (const std::vector<int>& list : *lists) {
      if (group_size != -1 && group_size != static_cast<int>(list.size())) {
        fail("group sizes must be identical found " + std::to_string(group_size) + " and " +
             std::to_string(list.size()));
      }
      group_size = static_cast<int>(list.size());
      out.ranks.insert(out.ranks.end(), list.begin(), list.end());
    }
    check_rank_list(out.ranks, op, "group (flattened)", &group);
    set_tag(out, tag);
    out.group_size = group_size;
  } else if (const auto* process_group = std::get_if<ProcessGroup>(&value)) {
    // world() on this rank hands out the process's list of 0..W-1 for its world size
    // (RankState::world_ranks), valid by construction, so it skips the checks every other list
    // gets. No other list can take its address: the lists, one per size, are never freed
    // (Note [Shared world lists] in runtime.cpp). A group that world() made in a run of another
    // size holds that size's list, not the one this rank's state points at: it is checked.
    RankContext* context = RankContext::current();
    if (context == nullptr || &process_group->ranks() != context->state().built_world_ranks()) {
      check_rank_list(process_group->ranks(), op, "process group", &group);
    }
    set_tag(out, pick_tag(tag, process_group->tag()));
    set_ranks(out, process_group->ranks());
    out.group_size = process_group->size();
  } else if (const auto* mesh = std::get_if<DeviceMesh>(&value)) {
    if (mesh->ndim() != 1) {
      fail(
          "Only 1D mesh is supported, pass in MeshDim{mesh, dim} together if mesh > 1D (mesh "
          "shape " +
          shape_to_string(mesh->shape()) + ")");
    }
    check_rank_list(mesh->ranks(), op, "mesh", &group);
    set_tag(out, tag);
    set_ranks(out, mesh->ranks());
    out.group_size = static_cast<int>(mesh->ranks().size());
  } else {
    const auto& mesh_dim = std::get<MeshDim>(value);
    check_rank_list(mesh_dim.mesh.ranks(), op, "mesh", &group);
    const int caller = require_rank(op).rank();
    if (!mesh_dim.mesh.contains(caller)) {
      fail("rank " + std::to_string(caller) + " is not in the mesh " +
           ranks_to_string(mesh_dim.mesh.ranks()));
    }
    const std::int64_t ndim = mesh_dim.mesh.ndim();
    if (mesh_dim.dim < -ndim || mesh_dim.dim >= ndim) {
      fail("MeshDim dim " + std::to_string(mesh_dim.dim) + " is out of range for a " +
           std::to_string(ndim) + "-d mesh (expected [" + std::to_string(-ndim) + ", " +
           std::to_string(ndim - 1) + "])");
    }
    set_tag(out, tag);
    out.ranks = mesh_dim.mesh.dim_ranks(mesh_dim.dim, caller);
    out.group_size = static_cast<int>(out.ranks.size());
  }
}

bool world_partition(const GroupSpec& group, const ExpandedGroup& expanded, int world_size,
                     std::span<const int>& parts, int& part_size, std::vector<int>& storage) {
  const GroupSpec::Value& value = group.value();
  const auto world = static_cast<std::size_t>(world_size);
  if (std::holds_alternative<std::vector<std::vector<int>>>(value)) {
    if (expanded.ranks.size() != world) {
      return false;  // some rank is in no sub-list: not every rank reaches this operation
    }
    CHORUS_CHECK_GT(expanded.group_size, 0);
    CHORUS_CHECK_EQ(world % static_cast<std::size_t>(expanded.group_size), 0u);
    parts = expanded.ranks;
    part_size = expanded.group_size;
    return true;
  }
  const auto* mesh_dim = std::get_if<MeshDim>(&value);
  if (mesh_dim == nullptr || mesh_dim->mesh.ranks().size() != world) {
    return false;
  }
  const DeviceMesh& mesh = mesh_dim->mesh;
  const auto d = static_cast<std::size_t>(normalize_dim(mesh_dim->dim, mesh.ndim(), "MeshDim"));
  // Row-major, as DeviceMesh::dim_ranks: a slice starts at each position whose coordinate along
  // d is 0, and steps by the stride of d.
  std::int64_t stride = 1;
  for (std::size_t i = d + 1; i < mesh.shape().size(); ++i) {
    stride *= mesh.shape()[i];
  }
  const std::int64_t size = mesh.shape()[d];
  storage.clear();
  storage.reserve(world);
  for (std::int64_t position = 0; position < static_cast<std::int64_t>(world); ++position) {
    if ((position / stride) % size != 0) {
      continue;
    }
    for (std::int64_t i = 0; i < size; ++i) {
      storage.push_back(mesh.ranks()[static_cast<std::size_t>(position + i * stride)]);
    }
  }
  CHORUS_CHECK_EQ(storage.size(), world);
  CHORUS_CHECK_EQ(static_cast<std::int64_t>(expanded.ranks.size()), size);
  parts = storage;
  part_size = static_cast<int>(size);
  return true;
}

}  // namespace detail

// ---- ProcessGroup

ProcessGroup::ProcessGroup(std::shared_ptr<const std::vector<int>> ranks, std::string tag)
    : ranks_(std::move(ranks)), tag_(std::move(tag)) {}

const std::vector<int>& ProcessGroup::no_ranks() noexcept {
  static const std::vector<int> none;
  return none;
}

bool ProcessGroup::contains(int rank) const noexcept { return group_rank(rank) >= 0; }

int ProcessGroup::group_rank(int rank) const noexcept {
  const std::vector<int>& members = ranks();
  auto it = std::find(members.begin(), members.end(), rank);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

ProcessGroup world() { return ProcessGroup(detail::require_rank("world").state().world_ranks()); }

ProcessGroup new_group(std::vector<int> ranks, std::string tag) {
  detail::require_rank("new_group");
  detail::check_rank_list(ranks, "new_group", "ranks");
  return ProcessGroup(std::make_shared<const std::vector<int>>(std::move(ranks)), std::move(tag));
}

// ---- DeviceMesh

DeviceMesh::DeviceMesh(Shape mesh_shape, std::vector<int> ranks)
    : shape_(std::move(mesh_shape)), ranks_(std::move(ranks)) {
  if (shape_.empty()) {
    detail::throw_invalid("DeviceMesh", "mesh shape is empty: a mesh needs at least one dim");
  }
  std::int64_t count = 1;
  for (std::int64_t size : shape_) {
    if (size <= 0) {
      detail::throw_invalid("DeviceMesh", "mesh shape " + detail::shape_to_string(shape_) +
                                              " has a non-positive size");
    }
    // Checked: a wrapped product could equal the rank count (and dim_ranks would then index
    // past the ranks).
    if (__builtin_mul_overflow(count, size, &count)) {
      detail::throw_invalid("DeviceMesh", "mesh shape " + detail::shape_to_string(shape_) +
                                              " holds more ranks than an int64 counts, but " +
                                              std::to_string(ranks_.size()) + " were given");
    }
  }
  if (count != static_cast<std::int64_t>(ranks_.size())) {
    detail::throw_invalid("DeviceMesh", "mesh shape " + detail::shape_to_string(shape_) +
                                            " holds " + std::to_string(count) + " ranks but " +
                                            std::to_string(ranks_.size()) + " were given");
  }
  const auto negative = std::find_if(ranks_.begin(), ranks_.end(), [](int r) { return r < 0; });
  const int repeated = detail::find_duplicate(ranks_);
  if (negative != ranks_.end() || repeated >= 0) {
    const int r = negative != ranks_.end() ? *negative : ranks_[static_cast<std::size_t>(repeated)];
    detail::throw_invalid("DeviceMesh", "mesh ranks " + detail::ranks_to_string(ranks_) +
                                            " hold a negative or repeated rank " +
                                            std::to_string(r));
  }
}

std::int64_t DeviceMesh::size(std::int64_t dim) const {
  return shape_[static_cast<std::size_t>(detail::normalize_dim(dim, ndim(), "DeviceMesh::size"))];
}

bool DeviceMesh::contains(int rank) const noexcept {
  return std::find(ranks_.begin(), ranks_.end(), rank) != ranks_.end();
}

std::vector<int> DeviceMesh::dim_ranks(std::int64_t dim, int rank) const {
  const auto d = static_cast<std::size_t>(detail::normalize_dim(dim, ndim(), "MeshDim"));
  auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  if (it == ranks_.end()) {
    detail::throw_invalid("MeshDim", "rank " + std::to_string(rank) + " is not in the mesh " +
                                         detail::ranks_to_string(ranks_));
  }
  // Row-major: the stride of dim d is the product of the sizes after it.
  std::int64_t stride = 1;
  for (std::size_t i = d + 1; i < shape_.size(); ++i) {
    stride *= shape_[i];
  }
  const std::int64_t position = it - ranks_.begin();
  const std::int64_t coordinate = (position / stride) % shape_[d];
  const std::int64_t base = position - coordinate * stride;
  std::vector<int> slice;
  slice.reserve(static_cast<std::size_t>(shape_[d]));
  for (std::int64_t i = 0; i < shape_[d]; ++i) {
    slice.push_back(ranks_[static_cast<std::size_t>(base + i * stride)]);
  }
  return slice;
}

// ---- GroupSpec

GroupSpec::GroupSpec(std::vector<int> ranks) : value_(std::move(ranks)) {}
GroupSpec::GroupSpec(std::initializer_list<int> ranks) : value_(std::vector<int>(ranks)) {}
GroupSpec::GroupSpec(std::vector<std::vector<int>> rank_lists) : value_(std::move(rank_lists)) {}
GroupSpec::GroupSpec(std::initializer_list<std::initializer_list<int>> rank_lists)
    : value_(std::vector<std::vector<int>>(rank_lists.begin(), rank_lists.end())) {}
GroupSpec::GroupSpec(ProcessGroup group) : value_(std::move(group)) {}
GroupSpec::GroupSpec(DeviceMesh mesh) : value_(std::move(mesh)) {}
GroupSpec::GroupSpec(MeshDim mesh_dim) : value_(std::move(mesh_dim)) {}

// ---- ExpandedGroup

std::vector<int> ExpandedGroup::members_of(int rank) const {
  if (group_size <= 0) {
    return {};
  }
  const auto size = static_cast<std::size_t>(group_size);
  for (std::size_t start = 0; start + size <= ranks.size(); start += size) {
    auto first = ranks.begin() + static_cast<std::ptrdiff_t>(start);
    auto last = first + static_cast<std::ptrdiff_t>(size);
    if (std::find(first, last, rank) != last) {
      return std::vector<int>(first, last);
    }
  }
  return {};
}

std::string ExpandedGroup::to_string() const {
  std::string out = transport::group_label(tag, ranks);
  if (group_size != static_cast<int>(ranks.size())) {
    out += " in sub-groups of " + std::to_string(group_size);
  }
  return out;
}

std::ostream& operator<<(std::ostream& out, const ExpandedGroup& group) {
  return out << group.to_string();
}

ExpandedGroup expand_group(const GroupSpec& group, std::string_view tag) {
  return detail::expand_group_for(group, tag, "expand_group");
}

int rank() { return detail::require_rank("rank").rank(); }
int world_size() { return detail::require_rank("world_size").world_size(); }
Device local_device() { return detail::require_rank("local_device").transport().device(); }

namespace {

// The calling rank's streams, for `device`; InvalidArgument naming `op` otherwise.
const std::shared_ptr<detail::CurrentStreams>& streams_for(Device device, std::string_view op) {
  detail::RankState& state = detail::require_rank(op).state();
  if (!device.is_cuda()) {
    detail::throw_invalid(op, "streams order device work, and " + device.to_string() +
                                  " has none: pass Device::cuda(i)");
  }
  if (device.index() < 0 || device.index() >= detail::CurrentStreams::kMaxDevices) {
    detail::throw_invalid(op, "no such device " + device.to_string() +
                                  ": a CUDA device index is 0 to " +
                                  std::to_string(detail::CurrentStreams::kMaxDevices - 1));
  }
  return state.streams();
}

}  // namespace

void* current_stream(Device device) {
  return streams_for(device, "current_stream")->get(device.index());
}

void set_current_stream(Device device, void* stream) {
  streams_for(device, "set_current_stream")->set(device.index(), stream);
}

StreamGuard::StreamGuard(Device device, void* stream)
    : streams_(streams_for(device, "StreamGuard")),
      device_(device),
      previous_(streams_->get(device.index())) {
  streams_->set(device.index(), stream);
}

StreamGuard::~StreamGuard() { streams_->set(device_.index(), previous_); }

std::size_t device_memory_allocated() {
  return detail::require_rank("device_memory_allocated")
      .state()
      .device_bytes()
      ->load(std::memory_order_relaxed);
}

}  // namespace chorus
