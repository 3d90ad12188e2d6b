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

void agree_on_split(store::Store& store, int rank, int world_size, std::int64_t split_index,
                    const std::string& description, const std::string& label,
                    store::Deadline deadline) {
  const ErrorContext context{rank, "create_comm", -1, label};
  const std::string round = "chorus/nccl/split/" + std::to_string(split_index) + "/";
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    keys.push_back(round + std::to_string(r));
  }
  store.set(keys[static_cast<std::size_t>(rank)], description, deadline);
  std::vector<std::string> descriptions;
  try {
    descriptions = store.multi_get(keys, deadline);
  } catch (const Timeout&) {
    // Which ranks never published: a key that holds anything is not swapped by compare_set with
    // an expected value no description has, and an absent one stays absent.
    const std::string impossible(1, '\0');
    std::string missing;
    for (int r = 0; r < world_size; ++r) {
      if (!store.compare_set(keys[static_cast<std::size_t>(r)], impossible, "",
                             store::Deadline(std::chrono::seconds(5)))) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    throw Timeout(context,
                  "nccl: world ranks [" + missing + "] did not reach split #" +
                      std::to_string(split_index) + " (partition " + description +
                      ") by the deadline; ncclCommSplit is collective over the world, so with "
                      "split_partitions every rank must use the same partitions in the same "
                      "order (docs/nccl.md)");
  }
  for (int r = 0; r < world_size; ++r) {
    const std::string& theirs = descriptions[static_cast<std::size_t>(r)];
    if (theirs != description) {
      // Count out first, so the keys are removed even though this round fails.
      if (store.add(round + "done", 1, deadline) == world_size) {
        for (const std::string& key : keys) {
          store.delete_key(key, deadline);
        }
        store.delete_key(round + "done", deadline);
      }
      throw CollectiveMismatch(
          context, "nccl: ranks disagree on split #" + std::to_string(split_index) +
                       " of the world: rank " + std::to_string(rank) + " splits partition " +
                       description + ", rank " + std::to_string(r) + " splits partition " + theirs +
                       " (ncclCommSplit is collective over the world: every "
                       "rank must use the same partitions in the same order)");
    }
  }
  if (store.add(round + "done", 1, deadline) == world_size) {
    for (const std::string& key : keys) {
      store.delete_key(key, deadline);
    }
    store.delete_key(round + "done", deadline);
  }
}

}  // namespace chorus::nccl
