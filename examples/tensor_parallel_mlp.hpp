#pragma once

// A Megatron-style tensor-parallel MLP block, forward and backward, and its single-rank reference
// (examples/tensor_parallel_mlp.cpp runs it, examples/examples_property.cpp checks it under
// generated schedules; docs/examples.md).
//
// The block is y = relu(x W1) W2 with the loss 1/2 |y - target|^2, so dy = y - target. W1 [D, H]
// is split by columns and W2 [H, D] by rows: rank r holds hidden units [r h, (r + 1) h).
// - Tensor parallel: every rank holds all T tokens of x. Forward: z_r = relu(x W1_r) needs no
//   communication (column-parallel); y = all_reduce(z_r W2_r) (row-parallel). Backward:
//   dW2_r = z_r^T dy and dW1_r = x^T da_r are local; dx = all_reduce(da_r W1_r^T), issued before
//   dW1_r is computed so that it overlaps that compute.
// - Sequence parallel: rank r holds tokens [r t, (r + 1) t) of x (T = t W). all_gather(x_r)
//   replaces the forward's identity and reduce_scatter replaces both all_reduces, so y_r and dx_r
//   are rank r's tokens; dy_r is gathered for the backward.
// Data are small integers (Note [Exact example inputs]); the reference proves the two products
// whose hidden dimension the ranks split (z W2 and da W1^T) exact.

#include <cstdint>
#include <ostream>
#include <string>

#include "example_support.hpp"

namespace examples {

struct MlpCase {
  std::int64_t tokens_per_rank = 2;  // t: the batch has T = t W tokens
  std::int64_t model = 8;            // D
  std::int64_t hidden_per_rank = 4;  // h: the hidden layer has H = h W units
  std::uint64_t data_seed = 1;
  // A planted bug for the program's failing ctest: the backward skips dx's all_reduce (or
  // reduce_scatter), so each rank keeps its own partial input gradient.
  bool bug_local_dx = false;
};

inline void showValue(const MlpCase& c, std::ostream& out) {
  out << "tokens/rank=" << c.tokens_per_rank << " model=" << c.model
      << " hidden/rank=" << c.hidden_per_rank << " data seed=" << c.data_seed;
}

enum class MlpVariant { TensorParallel, SequenceParallel };

inline const char* name(MlpVariant variant) {
  return variant == MlpVariant::TensorParallel ? "tensor parallel" : "sequence parallel";
}

namespace mlp_detail {

// Entries in [-kValueBound, kValueBound]: the cross-rank products stay exact in float32 (the
// reference proves it per run; the default shape passes at 256 ranks).
constexpr std::int64_t kValueBound = 2;

using FloatMatrix = Matrix<float>;

struct Data {
  FloatMatrix x;       // [T, D]
  FloatMatrix w1;      // [D, H]
  FloatMatrix w2;      // [H, D]
  FloatMatrix target;  // [T, D]
};

inline Data make_data(const MlpCase& c, int world_size) {
  const std::int64_t tokens = c.tokens_per_rank * world_size;
  const std::int64_t hidden = c.hidden_per_rank * world_size;
  return Data{FloatMatrix::generate(c.data_seed, 0, tokens, c.model, kValueBound),
              FloatMatrix::generate(c.data_seed, 1, c.model, hidden, kValueBound),
              FloatMatrix::generate(c.data_seed, 2, hidden, c.model, kValueBound),
              FloatMatrix::generate(c.data_seed, 3, tokens, c.model, kValueBound)};
}

inline FloatMatrix relu(FloatMatrix m) {
  for (float& v : m.values) {
    v = v > 0.0f ? v : 0.0f;
  }
  return m;
}

// gradient where pre_activation > 0, else 0: the backward of relu.
inline FloatMatrix relu_backward(FloatMatrix gradient, const FloatMatrix& pre_activation) {
  CHORUS_CHECK_EQ(gradient.values.size(), pre_activation.values.size());
  for (std::size_t i = 0; i < gradient.values.size(); ++i) {
    if (!(pre_activation.values[i] > 0.0f)) {
      gradient.values[i] = 0.0f;
    }
  }
  return gradient;
}

inline FloatMatrix minus(FloatMatrix a, const FloatMatrix& b) {
  CHORUS_CHECK_EQ(a.values.size(), b.values.size());
  for (std::size_t i = 0; i < a.values.size(); ++i) {
    a.values[i] -= b.values[i];
  }
  return a;
}

}  // namespace mlp_detail

// Runs the block on the calling rank (SPMD: every rank of world() calls it with the same case)
// and returns what the rank holds: y, dx (both of all tokens for TensorParallel, of the rank's
// tokens for SequenceParallel) and the rank's shards dW1_r [D, h], dW2_r [h, D]. dx is returned
// still pending.
inline Results run_mlp(const MlpCase& c, MlpVariant variant) {
  using namespace mlp_detail;
  const int world_size = chorus::world_size();
  const int rank = chorus::rank();
  const Data data = make_data(c, world_size);
  const std::int64_t t = c.tokens_per_rank;
  const std::int64_t h = c.hidden_per_rank;
  const FloatMatrix w1 = data.w1.column_block(rank * h, h);  // column-parallel shard
  const FloatMatrix w2 = data.w2.row_block(rank * h, h);     // row-parallel shard
  const bool sequence = variant == MlpVariant::SequenceParallel;

  // Forward.
  const FloatMatrix x =
      sequence ? FloatMatrix::from(chorus::all_gather_tensor(
                     placed(data.x.row_block(rank * t, t).tensor()), 0, chorus::world()))
               : data.x;
  const FloatMatrix pre_activation = matmul(x, w1);
  const FloatMatrix activation = relu(pre_activation);
  const chorus::Tensor partial_y = placed(matmul(activation, w2).tensor());
  const chorus::Tensor y = sequence
                               ? chorus::reduce_scatter_tensor(partial_y, "sum", 0, chorus::world())
                               : chorus::all_reduce(partial_y, "sum", chorus::world());

  // Backward. dy is of the tokens this rank's y holds; the hidden shard needs all of them.
  const FloatMatrix target = sequence ? data.target.row_block(rank * t, t) : data.target;
  const FloatMatrix dy_mine = minus(FloatMatrix::from(y), target);  // waits for y
  const FloatMatrix dy = sequence ? FloatMatrix::from(chorus::all_gather_tensor(
                                        placed(dy_mine.tensor()), 0, chorus::world()))
                                  : dy_mine;
  const FloatMatrix dw2 = matmul(activation.transposed(), dy);
  const FloatMatrix da = relu_backward(matmul(dy, w2.transposed()), pre_activation);
  const chorus::Tensor partial_dx = placed(matmul(da, w1.transposed()).tensor());
  chorus::Tensor dx;
  if (c.bug_local_dx) {
    dx = sequence ? partial_dx.narrow(0, rank * t, t).clone() : partial_dx;
  } else {
    dx = sequence ? chorus::reduce_scatter_tensor(partial_dx, "sum", 0, chorus::world())
                  : chorus::all_reduce(partial_dx, "sum", chorus::world());
  }
  // Overlaps dx's collective.
  const FloatMatrix dw1 = matmul(x.transposed(), da);
  return {{"y", y}, {"dx", dx}, {"dW1 shard", dw1.tensor()}, {"dW2 shard", dw2.tensor()}};
}

// The single-rank reference: the whole block on one rank, then the part rank `rank` of
// `world_size` must hold. Throws InexactInputs if a cross-rank product could round.
inline Results reference_mlp(const MlpCase& c, MlpVariant variant, int world_size, int rank) {
  using namespace mlp_detail;
  const Data data = make_data(c, world_size);
  const FloatMatrix pre_activation = matmul(data.x, data.w1);
  const FloatMatrix activation = relu(pre_activation);
  require_exact_product(activation, data.w2, "tensor_parallel_mlp: y = relu(x W1) W2");
  const FloatMatrix y = matmul(activation, data.w2);
  const FloatMatrix dy = minus(y, data.target);
  const FloatMatrix da = relu_backward(matmul(dy, data.w2.transposed()), pre_activation);
  const FloatMatrix w1_transposed = data.w1.transposed();
  require_exact_product(da, w1_transposed, "tensor_parallel_mlp: dx = da W1^T");
  const FloatMatrix dx = matmul(da, w1_transposed);
  const FloatMatrix dw1 = matmul(data.x.transposed(), da);
  const FloatMatrix dw2 = matmul(activation.transposed(), dy);
  const std::int64_t t = c.tokens_per_rank;
  const std::int64_t h = c.hidden_per_rank;
  const bool sequence = variant == MlpVariant::SequenceParallel;
  return {{"y", sequence ? y.row_block(rank * t, t).tensor() : y.tensor()},
          {"dx", sequence ? dx.row_block(rank * t, t).tensor() : dx.tensor()},
          {"dW1 shard", dw1.column_block(rank * h, h).tensor()},
          {"dW2 shard", dw2.row_block(rank * h, h).tensor()}};
}

}  // namespace examples
