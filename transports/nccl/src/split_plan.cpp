// split_plan (Note [NCCL communicator set-up]): the ncclCommSplit arguments of a partition's
// part, without CUDA or NCCL, so the unit tests check them on any machine.

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/nccl/nccl.hpp"

namespace chorus::nccl {

SplitPlan split_plan(const transport::Partition& partition, int world_size, int rank,
                     bool has_existing) {
  if (std::string problem = partition.problem(world_size, rank); !problem.empty()) {
    throw InvalidArgument(ErrorContext{rank, "create_comm", -1, ""},
                          "nccl: not a partition of the world of " + std::to_string(world_size) +
                              " ranks: " + problem);
  }
  const std::vector<int>& part = partition.own();
  const auto position = std::find(part.begin(), part.end(), rank) - part.begin();
  CHORUS_CHECK_GE(position, 0);
  CHORUS_CHECK_LT(static_cast<std::size_t>(position), part.size());
  if (has_existing) {
    return SplitPlan{kNoColor, static_cast<int>(position)};
  }
  // The part's smallest rank: the same on every member, however each listed the parts.
  return SplitPlan{*std::min_element(part.begin(), part.end()), static_cast<int>(position)};
}

std::string split_description(const std::string& tag, const transport::Partition& partition) {
  std::vector<const std::vector<int>*> parts;
  parts.reserve(partition.parts.size());
  for (const std::vector<int>& part : partition.parts) {
    parts.push_back(&part);
  }
  const auto smallest = [](const std::vector<int>* part) {
    return part->empty() ? -1 : *std::min_element(part->begin(), part->end());
  };
  std::sort(parts.begin(), parts.end(), [&](const std::vector<int>* a, const std::vector<int>* b) {
    return smallest(a) < smallest(b);
  });
  std::string text = "'" + tag + "' [";
  for (std::size_t i = 0; i < parts.size(); ++i) {
    text += i == 0 ? "[" : ", [";
    for (std::size_t j = 0; j < parts[i]->size(); ++j) {
      text += (j == 0 ? "" : ", ") + std::to_string((*parts[i])[j]);
    }
    text += "]";
  }
  return text + "]";
}

namespace {

// A rank that stops waiting writes this into every key still absent, so that a rank arriving
// later cannot enter the split alone (Note [Split agreement]). No description starts with it.
constexpr char kGaveUp = '\x01';

bool gave_up(const std::string& value) { return !value.empty() && value.front() == kGaveUp; }

// Every rank that ends the round counts itself out; the last one removes the round's keys. A
// rank that never arrives never counts out, so a round that timed out keeps its keys.
void count_out(store::Store& store, const std::string& round, const std::vector<std::string>& keys,
               int world_size, store::Deadline deadline) {
  if (store.add(round + "done", 1, deadline) == world_size) {
    for (const std::string& key : keys) {
      store.delete_key(key, deadline);
    }
    store.delete_key(round + "done", deadline);
  }
}

}  // namespace

void agree_on_split(store::Store& store, int rank, int world_size, std::int64_t split_index,
                    const std::string& description, const std::string& label,
                    store::Deadline deadline) {
  const ErrorContext context{rank, "create_comm", -1, label};
  const std::string round = "chorus/nccl/split/" + std::to_string(split_index) + "/";
  const std::string split =
      "split #" + std::to_string(split_index) + " (partition " + description + ")";
  const std::string contract =
      "ncclCommSplit is collective over the world, so with split_partitions every rank must use "
      "the same partitions in the same order (docs/nccl.md)";
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    keys.push_back(round + std::to_string(r));
  }
  // After the deadline: a few seconds for the store calls that settle the round.
  const store::Deadline settle(std::chrono::seconds(5));

  // Publish, unless a rank that stopped waiting has written its mark here already.
  const std::optional<std::string> published =
      store.compare_set(keys[static_cast<std::size_t>(rank)], "", description, deadline);
  if (published && gave_up(*published)) {
    count_out(store, round, keys, world_size, settle);
    throw Timeout(context, "nccl: reached " + split + " too late: " + published->substr(1) +
                               "; no rank enters the split. " + contract);
  }
  std::vector<std::string> descriptions;
  try {
    descriptions = store.multi_get(keys, deadline);
  } catch (const Timeout&) {
    // Mark every key still absent (compare_set from absent with an empty expected value), so no
    // rank arriving later enters the split alone; a key another rank marked is missing too.
    const std::string mark = std::string(1, kGaveUp) + "rank " + std::to_string(rank) +
                             " stopped waiting for it at its deadline";
    std::string missing;
    for (int r = 0; r < world_size; ++r) {
      const std::optional<std::string> value =
          store.compare_set(keys[static_cast<std::size_t>(r)], "", mark, settle);
      if (!value || gave_up(*value)) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    if (!missing.empty()) {
      count_out(store, round, keys, world_size, settle);
      throw Timeout(context, "nccl: world ranks [" + missing + "] did not reach " + split +
                                 " by the deadline; no rank enters the split. " + contract);
    }
    descriptions = store.multi_get(keys, settle);  // every rank arrived just in time
  }
  for (int r = 0; r < world_size; ++r) {
    const std::string& theirs = descriptions[static_cast<std::size_t>(r)];
    if (gave_up(theirs)) {
      count_out(store, round, keys, world_size, settle);
      throw Timeout(context, "nccl: " + split + " did not happen: world rank " + std::to_string(r) +
                                 " had not reached it when " + theirs.substr(1) + ". " + contract);
    }
  }
  for (int r = 0; r < world_size; ++r) {
    const std::string& theirs = descriptions[static_cast<std::size_t>(r)];
    if (theirs != description) {
      count_out(store, round, keys, world_size, settle);
      throw CollectiveMismatch(context, "nccl: ranks disagree on split #" +
                                            std::to_string(split_index) + " of the world: rank " +
                                            std::to_string(rank) + " splits partition " +
                                            description + ", rank " + std::to_string(r) +
                                            " splits partition " + theirs + " (" + contract + ")");
    }
  }
  count_out(store, round, keys, world_size, settle);
}

}  // namespace chorus::nccl
