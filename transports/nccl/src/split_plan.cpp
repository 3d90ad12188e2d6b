// split_plan (Note [NCCL communicator set-up]): the ncclCommSplit arguments of a partition's
// part, without CUDA or NCCL, so the unit tests check them on any machine.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
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

// Every member that ends the round counts itself out; the last one removes the round's keys. A
// member that never arrives never counts out, so a round that timed out keeps its keys.
void count_out(store::Store& store, const std::string& round, const std::vector<std::string>& keys,
               store::Deadline deadline) {
  if (store.add(round + "done", 1, deadline) == static_cast<std::int64_t>(keys.size())) {
    for (const std::string& key : keys) {
      store.delete_key(key, deadline);
    }
    store.delete_key(round + "done", deadline);
  }
}

// "1, 3".
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (const int rank : ranks) {
    out += (out.empty() ? "" : ", ") + std::to_string(rank);
  }
  return out;
}

}  // namespace

std::vector<std::string> agree_through_store(store::Store& store, const StoreRound& round,
                                             const std::string& mine) {
  const std::vector<int>& members = round.members;
  CHORUS_CHECK_GE(round.me, 0);
  CHORUS_CHECK_LT(static_cast<std::size_t>(round.me), members.size());
  const int rank = members[static_cast<std::size_t>(round.me)];
  std::vector<std::string> keys;
  keys.reserve(members.size());
  for (const int member : members) {
    keys.push_back(round.prefix + std::to_string(member));
  }
  // The store calls that settle the round, after the wait: each gets the grace afresh (a member
  // may have waited much longer than the grace for the others, or past its deadline).
  const auto settle = [&round] { return store::Deadline(round.grace); };
  const auto timeout = [&](const std::string& detail) {
    return Timeout(round.context, "nccl: " + detail + ". " + round.contract);
  };

  // Publish, unless a member that stopped waiting has written its mark here already.
  const std::optional<std::string> published =
      store.compare_set(keys[static_cast<std::size_t>(round.me)], "", mine, round.deadline);
  if (published && gave_up(*published)) {
    count_out(store, round.prefix, keys, settle());
    throw timeout("reached " + round.what + " too late: " + published->substr(1) + "; " +
                  round.consequence);
  }
  std::vector<std::string> values;
  try {
    values = store.multi_get(keys, round.deadline);
  } catch (const Timeout&) {
    // Mark every key still absent (compare_set from absent with an empty expected value), so no
    // member arriving later goes ahead alone; a key another member marked is missing too.
    const std::string mark = std::string(1, kGaveUp) + "rank " + std::to_string(rank) +
                             " stopped waiting for it at its deadline";
    std::vector<int> missing;
    for (std::size_t i = 0; i < members.size(); ++i) {
      const std::optional<std::string> value = store.compare_set(keys[i], "", mark, settle());
      if (!value || gave_up(*value)) {
        missing.push_back(members[i]);
      }
    }
    if (!missing.empty()) {
      count_out(store, round.prefix, keys, settle());
      throw timeout(round.who + "s [" + rank_list(missing) + "] did not reach " + round.what +
                    " by the deadline; " + round.consequence);
    }
    values = store.multi_get(keys, settle());  // every member arrived just in time
  }
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (gave_up(values[i])) {
      count_out(store, round.prefix, keys, settle());
      throw timeout(round.what + " did not happen: " + round.who + " " +
                    std::to_string(members[i]) + " had not reached it when " + values[i].substr(1));
    }
  }
  count_out(store, round.prefix, keys, settle());
  return values;
}

void agree_on_split(store::Store& store, int rank, int world_size, std::int64_t split_index,
                    const std::string& description, const std::string& label,
                    store::Deadline deadline) {
  std::vector<int> world(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    world[static_cast<std::size_t>(r)] = r;
  }
  const StoreRound round{
      .prefix = "chorus/nccl/split/" + std::to_string(split_index) + "/",
      .members = std::move(world),
      .me = rank,
      .context = ErrorContext{rank, "create_comm", -1, label},
      .what = "split #" + std::to_string(split_index) + " (partition " + description + ")",
      .who = "world rank",
      .consequence = "no rank enters the split",
      .contract =
          "ncclCommSplit is collective over the world, so with split_partitions every "
          "rank must use the same partitions in the same order (docs/nccl.md)",
      .deadline = deadline,
  };
  const std::vector<std::string> descriptions = agree_through_store(store, round, description);
  for (int r = 0; r < world_size; ++r) {
    const std::string& theirs = descriptions[static_cast<std::size_t>(r)];
    if (theirs != description) {
      throw CollectiveMismatch(
          round.context, "nccl: ranks disagree on split #" + std::to_string(split_index) +
                             " of the world: rank " + std::to_string(rank) + " splits partition " +
                             description + ", rank " + std::to_string(r) + " splits partition " +
                             theirs + " (" + round.contract + ")");
    }
  }
}

std::string check_description(std::string_view name,
                              const std::vector<transport::OpSignature>& ops) {
  std::string out(name);
  out += ' ';
  for (std::size_t i = 0; i < ops.size(); ++i) {
    out += i > 0 ? ", " : "";
    // all_to_all counts differ between ranks by design (uneven splits): only the dtype.
    if (ops[i].kind == transport::OpKind::AllToAll) {
      out += std::string(transport::op_kind_name(ops[i].kind)) + "(";
      if (ops[i].lowered_from) {
        out += std::string(dtype_name(*ops[i].lowered_from)) + " as ";
      }
      out += std::string(dtype_name(ops[i].dtype)) + ")";
    } else {
      out += ops[i].to_string();
    }
    if (ops[i].layout != 0) {
      // Note [Layout digest] in core: ranks must agree on shapes and dims, not only counts (an
      // all_to_all's digest leaves out dim 0).
      out += " [shapes/dims " + ops[i].layout_text() + "]";
    }
    if (ops[i].reduce_op.kind() == ReduceOp::Kind::PremulSum) {
      // to_string prints the factor to 6 digits; ranks must agree on every bit of it.
      std::uint64_t bits = 0;
      const double factor = ops[i].reduce_op.premul_factor();
      std::memcpy(&bits, &factor, sizeof bits);
      char hex[48];
      std::snprintf(hex, sizeof hex, " [factor bits 0x%016llx]",
                    static_cast<unsigned long long>(bits));
      out += hex;
    }
  }
  return out;
}

namespace {

// The value a member publishes in a check round: its description, then one line per all_to_all
// ("send counts;recv counts", comma-separated). Descriptions hold no newline.
std::string check_value(const std::string& description, const std::vector<SplitSizes>& splits) {
  CHORUS_CHECK(description.find('\n') == std::string::npos);
  std::string value = description;
  const auto append = [&value](const std::vector<std::size_t>& counts) {
    for (std::size_t i = 0; i < counts.size(); ++i) {
      value += (i == 0 ? "" : ",") + std::to_string(counts[i]);
    }
  };
  for (const SplitSizes& split : splits) {
    value += '\n';
    append(split.send);
    value += ';';
    append(split.recv);
  }
  return value;
}

bool parse_counts(std::string_view text, std::vector<std::size_t>& counts) {
  counts.clear();
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view number = text.substr(0, comma);
    std::size_t count = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), count);
    if (error != std::errc() || end != number.data() + number.size() || number.empty()) {
      return false;
    }
    counts.push_back(count);
    if (comma == std::string_view::npos) {
      return true;
    }
    text.remove_prefix(comma + 1);
    if (text.empty()) {
      return false;  // a trailing comma
    }
  }
  return true;
}

// check_value's inverse: false when `value` is not one.
bool parse_check_value(std::string_view value, std::string& description,
                       std::vector<SplitSizes>& splits) {
  const std::size_t first = value.find('\n');
  description = std::string(value.substr(0, first));
  splits.clear();
  if (first == std::string_view::npos) {
    return true;
  }
  value.remove_prefix(first + 1);
  for (;;) {
    const std::size_t end = value.find('\n');
    const std::string_view line = value.substr(0, end);
    const std::size_t semicolon = line.find(';');
    SplitSizes split;
    if (semicolon == std::string_view::npos ||
        !parse_counts(line.substr(0, semicolon), split.send) ||
        !parse_counts(line.substr(semicolon + 1), split.recv)) {
      return false;
    }
    splits.push_back(std::move(split));
    if (end == std::string_view::npos) {
      return true;
    }
    value.remove_prefix(end + 1);
  }
}

}  // namespace

void check_collective(store::Store& store, const std::string& comm_key,
                      const std::vector<int>& members, int group_rank, std::int64_t seq,
                      std::int64_t round_index, const std::string& description,
                      const std::vector<SplitSizes>& splits, const ErrorContext& context,
                      store::Deadline deadline, std::chrono::milliseconds grace) {
  const std::size_t n = members.size();
  for (const SplitSizes& split : splits) {
    CHORUS_CHECK_EQ(split.send.size(), n);
    CHORUS_CHECK_EQ(split.recv.size(), n);
  }
  if (n == 1) {
    return;  // nobody to disagree with (the transport refuses a member's unpaired own sizes)
  }
  const StoreRound round{
      .prefix = "chorus/nccl/check/" + comm_key + "/" + std::to_string(round_index) + "/",
      .members = members,
      .me = group_rank,
      .context = context,
      .what = "operation #" + std::to_string(seq) + " (" + description + ")",
      .who = "rank",
      .consequence = "no member starts it",
      .contract =
          "With --check-collectives every member of a group compares each operation with "
          "the others before NCCL runs it (docs/nccl.md)",
      .deadline = deadline,
      .grace = grace,
  };
  const std::vector<std::string> values =
      agree_through_store(store, round, check_value(description, splits));
  const int rank = members[static_cast<std::size_t>(group_rank)];
  const std::string operation = "operation #" + std::to_string(seq) + " of group " + context.group;
  std::vector<std::vector<SplitSizes>> theirs(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::string their_description;
    if (!parse_check_value(values[i], their_description, theirs[i])) {
      throw CollectiveMismatch(context, "nccl: rank " + std::to_string(members[i]) +
                                            " published an unreadable check value for " +
                                            operation + " (--check-collectives)");
    }
    if (their_description != description) {
      throw CollectiveMismatch(context, "nccl: ranks disagree on " + operation + ": rank " +
                                            std::to_string(rank) + " issued " + description +
                                            "; rank " + std::to_string(members[i]) + " issued " +
                                            their_description + " (--check-collectives)");
    }
    if (theirs[i].size() != splits.size() ||
        std::any_of(theirs[i].begin(), theirs[i].end(), [n](const SplitSizes& split) {
          return split.send.size() != n || split.recv.size() != n;
        })) {
      throw CollectiveMismatch(context, "nccl: rank " + std::to_string(members[i]) +
                                            " published split sizes of another shape for " +
                                            operation + " (--check-collectives)");
    }
  }
  // Every member has every member's sizes: all check every pair, in the same order, and name
  // the same first mismatch.
  for (std::size_t k = 0; k < splits.size(); ++k) {
    for (std::size_t from = 0; from < n; ++from) {
      for (std::size_t to = 0; to < n; ++to) {
        const std::size_t sent = theirs[from][k].send[to];
        const std::size_t expected = theirs[to][k].recv[from];
        if (sent == expected) {
          continue;
        }
        const std::string which = splits.size() > 1 ? ", all_to_all " + std::to_string(k + 1) +
                                                          " of " + std::to_string(splits.size())
                                                    : "";
        throw CollectiveMismatch(
            context, "nccl: ranks disagree on the split sizes of " + operation + " (" +
                         description + ")" + which + ": rank " + std::to_string(members[from]) +
                         " sends " + std::to_string(sent) + " elements to rank " +
                         std::to_string(members[to]) + ", which expects " +
                         std::to_string(expected) + " from it (--check-collectives)");
      }
    }
  }
}

}  // namespace chorus::nccl
