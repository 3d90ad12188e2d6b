#pragma once

// FSDP/ZeRO-style sharded training, several SGD steps, and its single-rank reference
// (examples/sharded_optimizer.cpp runs it, examples/examples_property.cpp checks it under
// generated schedules; docs/examples.md).
//
// The model is a linear layer, pred = x W + b (W [inputs, outputs], b [outputs]), trained with
// the L1 loss sum |pred - label|. Its parameters live in one flat buffer, W row-major then b,
// padded with zeros to a multiple of the world size (FSDP's FlatParameter); rank r owns shard r
// and the optimizer state of nothing else. Each step, on every rank:
//   1. all_gather the shards -> the full flat parameters (unflattened into W and b);
//   2. forward and backward on the rank's own batch -> the full flat gradient (padding: 0);
//   3. reduce_scatter(sum) the gradient -> the gradient of the rank's shard, summed over ranks;
//   4. SGD on the shard: shard -= kLearningRate * gradient shard.
// The L1 gradient x^T sign(pred - label) of integer data is an integer whatever the parameters
// are, so every cross-rank sum is exact in float32 (Note [Exact example inputs]; the reference
// proves it each step) and the parameters stay multiples of kLearningRate, a power of two.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "example_support.hpp"

namespace examples {

struct ShardedCase {
  std::int64_t inputs = 5;
  std::int64_t outputs = 3;
  std::int64_t batch_per_rank = 4;
  std::int64_t steps = 4;
  std::uint64_t data_seed = 1;
  // A planted bug for the program's failing ctest: each rank updates its shard with the
  // gradient it computed itself (its slice of its own full gradient) instead of the
  // reduce_scatter result.
  bool bug_local_gradient = false;
};

inline void showValue(const ShardedCase& c, std::ostream& out) {
  out << "inputs=" << c.inputs << " outputs=" << c.outputs << " batch/rank=" << c.batch_per_rank
      << " steps=" << c.steps << " data seed=" << c.data_seed;
}

namespace sharded_detail {

constexpr float kLearningRate = 0.125f;  // a power of two: updates are exact
constexpr std::int64_t kValueBound = 3;  // data, labels' model and initial parameters

using FloatMatrix = Matrix<float>;

inline std::int64_t flat_size(const ShardedCase& c) { return c.inputs * c.outputs + c.outputs; }
inline std::int64_t shard_size(const ShardedCase& c, int world_size) {
  return (flat_size(c) + world_size - 1) / world_size;  // the padded buffer has world_size shards
}

// The full flat parameters before the first step: small integers, then zero padding.
inline std::vector<float> initial_parameters(const ShardedCase& c, int world_size) {
  std::vector<float> flat(static_cast<std::size_t>(shard_size(c, world_size) * world_size), 0.0f);
  for (std::int64_t i = 0; i < flat_size(c); ++i) {
    flat[static_cast<std::size_t>(i)] =
        static_cast<float>(small_integer(c.data_seed, 10, i, kValueBound));
  }
  return flat;
}

// Rank `rank`'s batch at `step`: x [batch, inputs], labels from a fixed integer model.
struct Batch {
  FloatMatrix x;
  FloatMatrix labels;
};

inline Batch make_batch(const ShardedCase& c, int rank, std::int64_t step) {
  const std::uint64_t stream =
      1000 + static_cast<std::uint64_t>(step) * 4096 + static_cast<std::uint64_t>(rank);
  Batch batch{FloatMatrix::generate(c.data_seed, stream, c.batch_per_rank, c.inputs, kValueBound),
              {}};
  const FloatMatrix true_weights =
      FloatMatrix::generate(c.data_seed, 11, c.inputs, c.outputs, kValueBound);
  batch.labels = matmul(batch.x, true_weights);
  return batch;
}

// The full flat gradient (padded like `flat`) of the L1 loss on `batch` at parameters `flat`.
inline std::vector<float> flat_gradient(const ShardedCase& c, const std::vector<float>& flat,
                                        const Batch& batch) {
  FloatMatrix weights = FloatMatrix::zeros(c.inputs, c.outputs);
  std::copy(flat.begin(), flat.begin() + c.inputs * c.outputs, weights.values.begin());
  FloatMatrix residual_sign = matmul(batch.x, weights);
  for (std::int64_t i = 0; i < residual_sign.rows; ++i) {
    for (std::int64_t j = 0; j < c.outputs; ++j) {
      const float residual = residual_sign.at(i, j) +
                             flat[static_cast<std::size_t>(c.inputs * c.outputs + j)] -
                             batch.labels.at(i, j);
      residual_sign.at(i, j) = residual > 0.0f ? 1.0f : (residual < 0.0f ? -1.0f : 0.0f);
    }
  }
  const FloatMatrix weight_gradient = matmul(batch.x.transposed(), residual_sign);
  std::vector<float> gradient(flat.size(), 0.0f);
  std::copy(weight_gradient.values.begin(), weight_gradient.values.end(), gradient.begin());
  for (std::int64_t i = 0; i < residual_sign.rows; ++i) {
    for (std::int64_t j = 0; j < c.outputs; ++j) {
      gradient[static_cast<std::size_t>(c.inputs * c.outputs + j)] += residual_sign.at(i, j);
    }
  }
  return gradient;
}

inline void sgd(std::vector<float>& parameters, const std::vector<float>& gradient) {
  CHORUS_CHECK_EQ(parameters.size(), gradient.size());
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    parameters[i] -= kLearningRate * gradient[i];
  }
}

}  // namespace sharded_detail

// Trains on the calling rank (SPMD: every rank of world() calls it with the same case) and
// returns what it holds after the last step: its parameter shard, its last gradient shard and
// the full flat parameters all_gathered from every rank's shard (pending).
inline Results run_sharded_optimizer(const ShardedCase& c) {
  using namespace sharded_detail;
  const int world_size = chorus::world_size();
  const int rank = chorus::rank();
  const std::int64_t shard = shard_size(c, world_size);
  const std::vector<float> initial = initial_parameters(c, world_size);
  std::vector<float> mine(initial.begin() + rank * shard, initial.begin() + (rank + 1) * shard);
  chorus::Tensor gradient_shard = chorus::Tensor::zeros({shard});
  for (std::int64_t step = 0; step < c.steps; ++step) {
    const std::vector<float> full =
        host(chorus::all_gather_tensor(placed(chorus::Tensor::from_vector(mine)), 0,
                                       chorus::world()))
            .to_vector<float>();  // waits
    const std::vector<float> gradient = flat_gradient(c, full, make_batch(c, rank, step));
    if (c.bug_local_gradient) {
      gradient_shard = chorus::Tensor::from_vector(std::vector<float>(
          gradient.begin() + rank * shard, gradient.begin() + (rank + 1) * shard));
    } else {
      gradient_shard = chorus::reduce_scatter_tensor(placed(chorus::Tensor::from_vector(gradient)),
                                                     "sum", 0, chorus::world());
    }
    sgd(mine, host(gradient_shard).to_vector<float>());  // waits
  }
  const chorus::Tensor shard_tensor = chorus::Tensor::from_vector(mine);
  return {{"parameter shard", shard_tensor},
          {"gradient shard", gradient_shard},
          {"full parameters", chorus::all_gather_tensor(placed(shard_tensor), 0, chorus::world())}};
}

// The single-rank reference: the full parameters on one rank, each step's gradient the sum over
// every rank's batch in rank order (proved exact; InexactInputs otherwise), then the parts rank
// `rank` of `world_size` must hold.
inline Results reference_sharded_optimizer(const ShardedCase& c, int world_size, int rank) {
  using namespace sharded_detail;
  std::vector<float> parameters = initial_parameters(c, world_size);
  std::vector<float> gradient(parameters.size(), 0.0f);
  for (std::int64_t step = 0; step < c.steps; ++step) {
    std::vector<std::vector<float>> per_rank;
    for (int r = 0; r < world_size; ++r) {
      per_rank.push_back(flat_gradient(c, parameters, make_batch(c, r, step)));
    }
    require_exact_sum(per_rank, "sharded_optimizer: gradient of step " + std::to_string(step));
    gradient = per_rank.front();
    for (int r = 1; r < world_size; ++r) {
      for (std::size_t i = 0; i < gradient.size(); ++i) {
        gradient[i] += per_rank[static_cast<std::size_t>(r)][i];
      }
    }
    sgd(parameters, gradient);
  }
  const std::int64_t shard = shard_size(c, world_size);
  const auto slice = [&](const std::vector<float>& flat) {
    return chorus::Tensor::from_vector(
        std::vector<float>(flat.begin() + rank * shard, flat.begin() + (rank + 1) * shard));
  };
  return {{"parameter shard", slice(parameters)},
          {"gradient shard", slice(gradient)},
          {"full parameters", chorus::Tensor::from_vector(parameters)}};
}

}  // namespace examples
