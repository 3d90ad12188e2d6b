#pragma once

// Mixture-of-experts token routing with uneven all_to_all_single, and its single-rank reference
// (examples/moe_dispatch.cpp runs it, examples/examples_property.cpp checks it under generated
// schedules; docs/examples.md).
//
// Rank r holds tokens_of(r) tokens (between 0 and max_tokens: ranks differ, some hold none) of
// `features` values each, and experts [r E_r, (r + 1) E_r) of the E = E_r W experts (E_r =
// experts_per_rank); expert e is relu(x V_e). A router sends each token to k = top_k distinct
// experts (at most the experts it may route to) with power-of-two gates. With three or more ranks
// no rank routes to its successor's experts, so every world has zero splits as well as uneven ones.
// On every rank:
//   1. order the (token, choice) pairs by destination rank; input_split_sizes[j] = how many go to
//      rank j;
//   2. exchange the counts (all_to_all_single of one int64 per peer, equal splits) ->
//      output_split_sizes[j] = how many rank j sends here;
//   3. dispatch: all_to_all_single of the token rows and, with the same splits, of their expert
//      ids (uneven, with zeros);
//   4. run the local experts on the received rows, in the order received;
//   5. combine: the reverse all_to_all_single (the two split lists swapped) brings each result
//      back to the row it came from;
//   6. each token's output is the sum over its choices, in choice order, of gate * expert output.
// Data are small integers and the gates powers of two (Note [Exact example inputs]); the only
// sums are the rank-local ones of step 6, so no cross-rank sum needs proving.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "example_support.hpp"

namespace examples {

struct MoeCase {
  std::int64_t max_tokens = 6;
  std::int64_t features = 4;
  std::int64_t experts_per_rank = 2;
  std::int64_t top_k = 2;
  std::uint64_t data_seed = 1;
  // A planted bug for the program's failing ctest: the combined rows are taken in dispatch order
  // as if it were routing order (the inverse permutation forgotten), so outputs land on the wrong
  // tokens.
  bool bug_unpermuted_combine = false;
};

inline void showValue(const MoeCase& c, std::ostream& out) {
  out << "max tokens=" << c.max_tokens << " features=" << c.features
      << " experts/rank=" << c.experts_per_rank << " top k=" << c.top_k
      << " data seed=" << c.data_seed;
}

namespace moe_detail {

constexpr std::int64_t kValueBound = 2;       // token features and expert weights
constexpr std::int64_t kPickBound = 1 << 20;  // router draws, reduced modulo the candidates
// small_integer streams, far enough apart for sim::kMaxWorldSize ranks and their experts.
constexpr std::uint64_t kExpertStream = 1'000'000;
constexpr std::uint64_t kTokenStream = 2'000'000;
constexpr std::uint64_t kRouterStream = 3'000'000;
constexpr std::uint64_t kGateStream = 4'000'000;

using FloatMatrix = Matrix<float>;

inline std::int64_t tokens_of(const MoeCase& c, int rank) {
  return (small_integer(c.data_seed, 7, rank, c.max_tokens) + c.max_tokens) / 2;
}

inline FloatMatrix tokens(const MoeCase& c, int rank) {
  return FloatMatrix::generate(c.data_seed, kTokenStream + static_cast<std::uint64_t>(rank),
                               tokens_of(c, rank), c.features, kValueBound);
}

inline FloatMatrix expert_weights(const MoeCase& c, std::int64_t expert) {
  return FloatMatrix::generate(c.data_seed, kExpertStream + static_cast<std::uint64_t>(expert),
                               c.features, c.features, kValueBound);
}

// One routing choice of one token.
struct Choice {
  std::int64_t token = 0;
  std::int64_t expert = 0;
  float gate = 1.0f;
};

inline int owner(const MoeCase& c, std::int64_t expert) {
  return static_cast<int>(expert / c.experts_per_rank);
}

// Rank `rank`'s routing, token by token and choice by choice (the router: deterministic, from
// the data seed alone).
inline std::vector<Choice> route(const MoeCase& c, int rank, int world_size) {
  const std::int64_t experts = c.experts_per_rank * world_size;
  std::vector<std::int64_t> candidates;
  for (std::int64_t e = 0; e < experts; ++e) {
    if (world_size < 3 || owner(c, e) != (rank + 1) % world_size) {
      candidates.push_back(e);
    }
  }
  const auto k = std::min<std::int64_t>(c.top_k, static_cast<std::int64_t>(candidates.size()));
  std::vector<Choice> choices;
  for (std::int64_t token = 0; token < tokens_of(c, rank); ++token) {
    std::vector<std::int64_t> left = candidates;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t index = token * k + j;
      const auto pick = static_cast<std::size_t>(
          small_integer(c.data_seed, kRouterStream + static_cast<std::uint64_t>(rank), index,
                        kPickBound) +
          kPickBound);
      const std::int64_t halvings =  // 0, 1 or 2: the gate is 1, 1/2 or 1/4
          small_integer(c.data_seed, kGateStream + static_cast<std::uint64_t>(rank), index, 1) + 1;
      const float gate = std::ldexp(1.0f, -static_cast<int>(halvings));
      const std::size_t slot = pick % left.size();
      choices.push_back({token, left[slot], gate});
      left.erase(left.begin() + static_cast<std::ptrdiff_t>(slot));
    }
  }
  return choices;
}

// The dispatch order: indices into `choices`, stably sorted by destination rank.
inline std::vector<std::size_t> dispatch_order(const MoeCase& c,
                                               const std::vector<Choice>& choices) {
  std::vector<std::size_t> order(choices.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return owner(c, choices[a].expert) < owner(c, choices[b].expert);
  });
  return order;
}

inline FloatMatrix expert(const MoeCase& c, std::int64_t e, const FloatMatrix& row) {
  FloatMatrix out = matmul(row, expert_weights(c, e));
  for (float& v : out.values) {
    v = v > 0.0f ? v : 0.0f;
  }
  return out;
}

// Each token's output: the sum over its choices, in choice order, of gate * expert output.
// `outputs[i]` is the expert output (a 1 x features row) of choices[i].
inline FloatMatrix combine(const MoeCase& c, std::int64_t token_count,
                           const std::vector<Choice>& choices,
                           const std::vector<FloatMatrix>& outputs) {
  FloatMatrix combined = FloatMatrix::zeros(token_count, c.features);
  for (std::size_t i = 0; i < choices.size(); ++i) {
    for (std::int64_t f = 0; f < c.features; ++f) {
      combined.at(choices[i].token, f) += choices[i].gate * outputs[i].at(0, f);
    }
  }
  return combined;
}

// On the rank's device (Note [Example devices]).
inline chorus::Tensor int64_tensor(const std::vector<std::int64_t>& values) {
  return placed(chorus::Tensor::from_vector(values));
}

}  // namespace moe_detail

// counts[source][destination]: how many token rows rank `source` dispatches to rank
// `destination` (its input_split_sizes), for printing.
inline std::vector<std::vector<std::int64_t>> routing_counts(const MoeCase& c, int world_size) {
  using namespace moe_detail;
  std::vector<std::vector<std::int64_t>> counts(
      static_cast<std::size_t>(world_size),
      std::vector<std::int64_t>(static_cast<std::size_t>(world_size), 0));
  for (int source = 0; source < world_size; ++source) {
    for (const Choice& choice : route(c, source, world_size)) {
      ++counts[static_cast<std::size_t>(source)][static_cast<std::size_t>(owner(c, choice.expert))];
    }
  }
  return counts;
}

// Routes, dispatches, runs the local experts and combines on the calling rank (SPMD: every rank
// of world() calls it with the same case). Returns what the rank holds: the token rows and
// expert ids it received (in source-rank order), and its tokens' combined outputs.
inline Results run_moe_dispatch(const MoeCase& c) {
  using namespace moe_detail;
  const int world_size = chorus::world_size();
  const int rank = chorus::rank();
  const std::string where = "rank " + std::to_string(rank) + ": ";
  const FloatMatrix x = tokens(c, rank);
  const std::vector<Choice> routed = route(c, rank, world_size);
  const std::vector<std::size_t> order = dispatch_order(c, routed);

  // 1. Rows to send, in dispatch order, and the split sizes.
  std::vector<std::int64_t> send_splits(static_cast<std::size_t>(world_size), 0);
  FloatMatrix send = FloatMatrix::zeros(static_cast<std::int64_t>(order.size()), c.features);
  std::vector<std::int64_t> send_experts;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const Choice& choice = routed[order[i]];
    ++send_splits[static_cast<std::size_t>(owner(c, choice.expert))];
    for (std::int64_t f = 0; f < c.features; ++f) {
      send.at(static_cast<std::int64_t>(i), f) = x.at(choice.token, f);
    }
    send_experts.push_back(choice.expert);
  }
  // 2. Counts: one int64 to each peer.
  const std::vector<std::int64_t> receive_splits =
      host(chorus::all_to_all_single(int64_tensor(send_splits), std::nullopt, std::nullopt,
                                     chorus::world()))
          .to_vector<std::int64_t>();
  // 3. Dispatch: rows and expert ids, uneven splits.
  const chorus::Tensor received = chorus::all_to_all_single(placed(send.tensor()), receive_splits,
                                                            send_splits, chorus::world());
  const chorus::Tensor received_experts = chorus::all_to_all_single(
      int64_tensor(send_experts), receive_splits, send_splits, chorus::world());
  // 4. The local experts, row by row in the order received.
  const FloatMatrix rows = FloatMatrix::from(received);
  const std::vector<std::int64_t> ids = host(received_experts).to_vector<std::int64_t>();
  FloatMatrix expert_outputs = FloatMatrix::zeros(rows.rows, c.features);
  for (std::int64_t i = 0; i < rows.rows; ++i) {
    const std::int64_t e = ids[static_cast<std::size_t>(i)];
    if (e < 0 || owner(c, e) != rank) {
      throw WrongResult(where + "received a token for expert " + std::to_string(e) +
                        ", which this rank does not hold");
    }
    const FloatMatrix out = expert(c, e, rows.row_block(i, 1));
    for (std::int64_t f = 0; f < c.features; ++f) {
      expert_outputs.at(i, f) = out.at(0, f);
    }
  }
  // 5. Combine: the reverse exchange.
  const chorus::Tensor returned = chorus::all_to_all_single(
      placed(expert_outputs.tensor()), send_splits, receive_splits, chorus::world());
  // 6. Row i of `returned` is the output of routed[order[i]].
  const FloatMatrix back = FloatMatrix::from(returned);
  if (back.rows != static_cast<std::int64_t>(order.size())) {
    throw WrongResult(where + "combine returned " + std::to_string(back.rows) + " rows for " +
                      std::to_string(order.size()) + " dispatched");
  }
  std::vector<FloatMatrix> outputs(routed.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    outputs[c.bug_unpermuted_combine ? i : order[i]] =
        back.row_block(static_cast<std::int64_t>(i), 1);
  }
  return {{"received tokens", received},
          {"received expert ids", received_experts},
          {"combined output", combine(c, x.rows, routed, outputs).tensor()}};
}

// The single-rank reference: every rank's tokens and routing on one rank; what rank `rank` of
// `world_size` must receive, and its tokens' outputs computed directly.
inline Results reference_moe_dispatch(const MoeCase& c, int world_size, int rank) {
  using namespace moe_detail;
  std::vector<float> received;
  std::vector<std::int64_t> received_experts;
  for (int source = 0; source < world_size; ++source) {
    const FloatMatrix x = tokens(c, source);
    const std::vector<Choice> choices = route(c, source, world_size);
    for (const std::size_t i : dispatch_order(c, choices)) {
      const Choice& choice = choices[i];
      if (owner(c, choice.expert) == rank) {
        const FloatMatrix row = x.row_block(choice.token, 1);
        received.insert(received.end(), row.values.begin(), row.values.end());
        received_experts.push_back(choice.expert);
      }
    }
  }
  const FloatMatrix x = tokens(c, rank);
  const std::vector<Choice> choices = route(c, rank, world_size);
  std::vector<FloatMatrix> outputs;
  for (const Choice& choice : choices) {
    outputs.push_back(expert(c, choice.expert, x.row_block(choice.token, 1)));
  }
  const auto received_rows = static_cast<std::int64_t>(received_experts.size());
  return {{"received tokens", FloatMatrix{received_rows, c.features, std::move(received)}.tensor()},
          {"received expert ids", int64_tensor(received_experts)},
          {"combined output", combine(c, x.rows, choices, outputs).tensor()}};
}

}  // namespace examples
