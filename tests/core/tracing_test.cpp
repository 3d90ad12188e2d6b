// Tracing mode (DESIGN 2.4, chorus/trace.hpp) and the shape rules (DESIGN 2.3, chorus/meta.hpp)
// on the simulator at world sizes 1, 2, 3, 4 and 8.
//
// - Meta: one program holding every collective form runs eagerly, traced, and traced on meta
//   tensors, and gives the shapes and dtypes chorus::meta computes; meta calls take no sequence
//   number; chorus::meta raises the collectives' own error text.
// - Tracing: a traced call has waited when it returns and records exactly its fields; scopes
//   nest; records survive JSON; compare_traces finds nothing in a consistent program and names
//   the rank of an inconsistent one.
// - Replay: a replayed trace equals, bitwise, a direct execution of its records on the inputs
//   trace.hpp documents; a meta trace replays as real collectives; replay under a TraceScope
//   records the trace again.
// - Adjoint: sum over ranks of <A* y, x> equals that of <y, A x>, exactly, for every linear
//   collective; the adjoint of the adjoint is the original; non-linear ops have no adjoint.
//
// Every value is an exact small integer (or an exact binary fraction), so every comparison is
// `==` on the bits; no tolerance appears anywhere.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "chorus/collectives.hpp"
#include "chorus/device.hpp"
#include "chorus/dtype.hpp"
#include "chorus/error.hpp"
#include "chorus/group.hpp"
#include "chorus/meta.hpp"
#include "chorus/reduce_op.hpp"
#include "chorus/sim/sim.hpp"
#include "chorus/tensor.hpp"
#include "chorus/trace.hpp"
#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

using testing::cyclic_shift;
using testing::element_count;
using testing::expect_error;
using testing::expect_invalid_argument;
using testing::first_ranks;
using testing::kWorldSizes;
using testing::list_text;
using testing::normalized_dim;
using testing::run_quietly;
using testing::sum_of;
using testing::to_index;
using testing::world_name;

// ---------------------------------------------------------------------------------------------
// Small helpers.

// The full content of a record (every field but `site`), for failure messages.
std::string record_text(const OpRecord& record) { return to_json({record}); }

// The detail text of the InvalidArgument `call` throws; a failure (and "") when it throws
// nothing or something else.
std::string invalid_detail(const std::function<void()>& call) {
  return expect_error<InvalidArgument>(call, {}).detail;
}

// A valid collective on the world, checked by value: the ranks still pair up.
void expect_world_pairs_up() {
  const std::int64_t w = world_size();
  const Tensor sum = all_reduce(Tensor::full({2}, rank() + 1, DType::Int64), "sum", world());
  EXPECT_EQ(sum.to_vector<std::int64_t>(), std::vector<std::int64_t>(2, w * (w + 1) / 2));
}

// Every field of `actual` equals that of `expected` (`site` aside), one by one so a failure
// names the field, and then operator== agrees.
void expect_record(const OpRecord& actual, const OpRecord& expected) {
  SCOPED_TRACE("expected " + record_text(expected));
  EXPECT_EQ(actual.op, expected.op);
  EXPECT_TRUE(actual.reduce_op == expected.reduce_op)
      << (actual.reduce_op ? actual.reduce_op->to_string() : "none") << " vs "
      << (expected.reduce_op ? expected.reduce_op->to_string() : "none");
  EXPECT_EQ(actual.tag, expected.tag);
  EXPECT_EQ(actual.ranks, expected.ranks);
  EXPECT_EQ(actual.group_size, expected.group_size);
  EXPECT_EQ(actual.input_shapes, expected.input_shapes);
  EXPECT_EQ(dtype_name(actual.dtype), dtype_name(expected.dtype));
  EXPECT_EQ(actual.dims, expected.dims);
  EXPECT_EQ(actual.output_split_sizes, expected.output_split_sizes);
  EXPECT_EQ(actual.input_split_sizes, expected.input_split_sizes);
  EXPECT_EQ(actual.src, expected.src);
  EXPECT_EQ(actual.src_dst, expected.src_dst);
  EXPECT_EQ(actual.rank, expected.rank);
  EXPECT_EQ(actual.seq, expected.seq);
  EXPECT_EQ(actual.output_shapes, expected.output_shapes);
  EXPECT_EQ(actual.meta, expected.meta);
  EXPECT_TRUE(actual == expected) << "operator== disagrees with the fields: "
                                  << record_text(actual);
}

// ---------------------------------------------------------------------------------------------
// One program holding every collective form.

// How a program's inputs are made.
enum class Mode {
  Eager,   // real tensors, no TraceScope
  Traced,  // real tensors inside a TraceScope
  Meta,    // meta tensors inside a TraceScope
};

// A real input holds rank + 1 everywhere (Bool: odd ranks true); a meta input only its shape.
Tensor program_tensor(Mode mode, const Shape& shape, DType dtype) {
  if (mode == Mode::Meta) {
    return Tensor::empty(shape, dtype, Device::meta());
  }
  const double value =
      dtype == DType::Bool ? static_cast<double>(rank() % 2) : static_cast<double>(rank() + 1);
  return Tensor::full(shape, value, dtype);
}

// The caller-provided output of an in-place form.
Tensor program_output(Mode mode, const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, mode == Mode::Meta ? Device::meta() : Device::cpu());
}

// One call of a program and the record a real traced run of it must leave. The output shapes
// in `expected` come from chorus::meta, and its seq counts per communicator.
struct Step {
  OpRecord expected;
  std::function<std::vector<Tensor>(Mode)> issue;
};

// rank r sends (r + 2j) % 3 rows to group rank j (zero included); receivers mirror it.
std::vector<std::int64_t> uneven_input_splits(int sender, int world) {
  std::vector<std::int64_t> splits;
  for (int j = 0; j < world; ++j) {
    splits.push_back((sender + 2 * j) % 3);
  }
  return splits;
}

std::vector<std::int64_t> uneven_output_splits(int receiver, int world) {
  std::vector<std::int64_t> splits;
  for (int i = 0; i < world; ++i) {
    splits.push_back(uneven_input_splits(i, world)[to_index(receiver)]);
  }
  return splits;
}

// Group rank 0 sends nowhere, m > 0 sends to m - 1; so group rank W - 1 receives nothing.
std::vector<int> partial_shift(int world) {
  std::vector<int> src_dst;
  for (int m = 0; m < world; ++m) {
    src_dst.push_back(m - 1);
  }
  return src_dst;
}

// Every collective form on the world (all_gather and reduce_scatter at every dim, negative
// included, and a 0-d all_gather), then a tagged ProcessGroup, a call tag, and (W even) a 2-D
// rank list; the world's sequence numbers continue across them.
std::vector<Step> every_collective_program() {
  const int w = world_size();
  const int me = rank();
  const std::vector<int> everyone = first_ranks(w);
  std::map<std::string, std::int64_t> next_seq;  // per communicator: tag and members
  std::vector<Step> steps;
  const auto add = [&](OpRecord expected, const std::vector<int>& members,
                       std::function<std::vector<Tensor>(Mode)> issue) {
    expected.rank = me;
    expected.seq = next_seq[expected.tag + " " + list_text(members)]++;
    steps.push_back(Step{std::move(expected), std::move(issue)});
  };
  const auto on = [&](std::string op, DType dtype, std::vector<Shape> inputs,
                      std::vector<Shape> outputs, std::string tag = "") {
    OpRecord record;
    record.op = std::move(op);
    record.tag = std::move(tag);
    record.ranks = everyone;
    record.group_size = w;
    record.dtype = dtype;
    record.input_shapes = std::move(inputs);
    record.output_shapes = std::move(outputs);
    return record;
  };
  using Tensors = std::vector<Tensor>;

  // all_reduce over several dtypes and reductions.
  struct Reduction {
    DType dtype;
    ReduceOp reduce_op;
    Shape shape;
  };
  for (const Reduction& reduction :
       {Reduction{DType::Float32, "sum", {2, 3}}, Reduction{DType::Int32, "max", {4}},
        Reduction{DType::Float64, ReduceOp::premul_sum(0.1), {3}},
        Reduction{DType::Bool, "bor", {5}}, Reduction{DType::Int64, "avg", {2}}}) {
    OpRecord record = on("all_reduce", reduction.dtype, {reduction.shape},
                         {meta::all_reduce_shape(reduction.shape)});
    record.reduce_op = reduction.reduce_op;
    add(record, everyone, [reduction](Mode mode) {
      return Tensors{all_reduce(program_tensor(mode, reduction.shape, reduction.dtype),
                                reduction.reduce_op, world())};
    });
  }
  // all_gather_tensor at every dim, and on a 0-d input.
  const Shape gathered = {2, 1, 3};
  for (std::int64_t dim = -3; dim < 3; ++dim) {
    OpRecord record = on("all_gather_tensor", DType::Int64, {gathered},
                         {meta::all_gather_shape(gathered, dim, w)});
    record.dims = {normalized_dim(dim, gathered.size())};
    add(record, everyone, [gathered, dim](Mode mode) {
      return Tensors{all_gather_tensor(program_tensor(mode, gathered, DType::Int64), dim, world())};
    });
  }
  for (std::int64_t dim : {0, -1}) {
    OpRecord record =
        on("all_gather_tensor", DType::Float32, {Shape{}}, {meta::all_gather_shape({}, dim, w)});
    record.dims = {0};
    add(record, everyone, [dim](Mode mode) {
      return Tensors{all_gather_tensor(program_tensor(mode, {}, DType::Float32), dim, world())};
    });
  }
  // reduce_scatter_tensor at every dim.
  const Shape scattered = {w, 2 * w, 3 * w};
  for (std::int64_t dim = -3; dim < 3; ++dim) {
    OpRecord record = on("reduce_scatter_tensor", DType::Int64, {scattered},
                         {meta::reduce_scatter_shape(scattered, dim, w)});
    record.reduce_op = ReduceOp("sum");
    record.dims = {normalized_dim(dim, scattered.size())};
    add(record, everyone, [scattered, dim](Mode mode) {
      return Tensors{reduce_scatter_tensor(program_tensor(mode, scattered, DType::Int64), "sum",
                                           dim, world())};
    });
  }
  {
    const Shape input = {2 * w};
    OpRecord record = on("reduce_scatter_tensor", DType::Float32, {input},
                         {meta::reduce_scatter_shape(input, 0, w)});
    record.reduce_op = ReduceOp("avg");
    record.dims = {0};
    add(record, everyone, [input](Mode mode) {
      return Tensors{
          reduce_scatter_tensor(program_tensor(mode, input, DType::Float32), "avg", 0, world())};
    });
  }
  // The coalesced forms.
  {
    const std::vector<Shape> inputs = {{2}, {3, 2}};
    OpRecord record = on("all_reduce_coalesced", DType::Float32, inputs,
                         {meta::all_reduce_shape(inputs[0]), meta::all_reduce_shape(inputs[1])});
    record.reduce_op = ReduceOp("sum");
    add(record, everyone, [inputs](Mode mode) {
      return all_reduce_coalesced({program_tensor(mode, inputs[0], DType::Float32),
                                   program_tensor(mode, inputs[1], DType::Float32)},
                                  "sum", world());
    });
  }
  {
    const std::vector<Shape> inputs = {{2, 2}, {1}, {}};
    OpRecord record =
        on("all_gather_into_tensor_coalesced", DType::Int32, inputs,
           {meta::all_gather_shape(inputs[0], 0, w), meta::all_gather_shape(inputs[1], 0, w),
            meta::all_gather_shape(inputs[2], 0, w)});
    record.dims = {0, 0, 0};
    add(record, everyone, [inputs](Mode mode) {
      return all_gather_into_tensor_coalesced({program_tensor(mode, inputs[0], DType::Int32),
                                               program_tensor(mode, inputs[1], DType::Int32),
                                               program_tensor(mode, inputs[2], DType::Int32)},
                                              world());
    });
  }
  {
    const std::vector<Shape> inputs = {{2 * w, 3}, {3, w}};
    OpRecord record = on("reduce_scatter_tensor_coalesced", DType::Float64, inputs,
                         {meta::reduce_scatter_shape(inputs[0], 0, w),
                          meta::reduce_scatter_shape(inputs[1], -1, w)});
    record.reduce_op = ReduceOp("sum");
    record.dims = {0, 1};
    add(record, everyone, [inputs](Mode mode) {
      return reduce_scatter_tensor_coalesced({program_tensor(mode, inputs[0], DType::Float64),
                                              program_tensor(mode, inputs[1], DType::Float64)},
                                             "sum", {0, -1}, world());
    });
  }
  // all_to_all_single, equal and uneven.
  {
    const Shape input = {2 * w, 3};
    OpRecord record = on("all_to_all_single", DType::Int64, {input},
                         {meta::all_to_all_single_shape(input, std::nullopt, std::nullopt, w)});
    add(record, everyone, [input](Mode mode) {
      return Tensors{all_to_all_single(program_tensor(mode, input, DType::Int64), std::nullopt,
                                       std::nullopt, world())};
    });
  }
  {
    const std::vector<std::int64_t> input_splits = uneven_input_splits(me, w);
    const std::vector<std::int64_t> output_splits = uneven_output_splits(me, w);
    const Shape input = {sum_of(input_splits), 2};
    OpRecord record = on("all_to_all_single", DType::Float32, {input},
                         {meta::all_to_all_single_shape(input, output_splits, input_splits, w)});
    record.output_split_sizes = output_splits;
    record.input_split_sizes = input_splits;
    add(record, everyone, [input, input_splits, output_splits](Mode mode) {
      return Tensors{all_to_all_single(program_tensor(mode, input, DType::Float32), output_splits,
                                       input_splits, world())};
    });
  }
  // broadcast, reduce, permute_tensor.
  {
    const Shape input = {3};
    const int src = w - 1;
    OpRecord record =
        on("broadcast", DType::Int32, {input}, {meta::broadcast_shape(input, src, w)});
    record.src = src;
    add(record, everyone, [input, src](Mode mode) {
      return Tensors{broadcast(program_tensor(mode, input, DType::Int32), src, world())};
    });
  }
  {
    const Shape input = {2, 2};
    const int dst = w / 2;
    OpRecord record = on("reduce", DType::Int64, {input}, {meta::reduce_shape(input, dst, w)});
    record.reduce_op = ReduceOp("sum");
    record.src = dst;
    add(record, everyone, [input, dst](Mode mode) {
      return Tensors{reduce(program_tensor(mode, input, DType::Int64), "sum", dst, world())};
    });
  }
  for (const std::vector<int>& src_dst : {cyclic_shift(w), partial_shift(w)}) {
    const Shape input = {2};
    OpRecord record = on("permute_tensor", DType::Float32, {input},
                         {meta::permute_tensor_shape(input, src_dst, w)});
    record.src_dst = src_dst;
    add(record, everyone, [input, src_dst](Mode mode) {
      return Tensors{permute_tensor(program_tensor(mode, input, DType::Float32), src_dst, world())};
    });
  }
  // The in-place forms.
  {
    const Shape input = {3};
    OpRecord record =
        on("all_reduce_inplace", DType::Int32, {input}, {meta::all_reduce_shape(input)});
    record.reduce_op = ReduceOp("sum");
    add(record, everyone, [input](Mode mode) {
      Tensor tensor = program_tensor(mode, input, DType::Int32);
      all_reduce_inplace(tensor, "sum", world());
      return Tensors{tensor};
    });
  }
  {
    const Shape input = {2, 2};
    const Shape output = meta::all_gather_shape(input, 1, w);
    OpRecord record = on("all_gather_tensor_inplace", DType::Float32, {input}, {output});
    record.dims = {1};
    add(record, everyone, [input, output](Mode mode) {
      Tensor out = program_output(mode, output, DType::Float32);
      all_gather_tensor_inplace(out, program_tensor(mode, input, DType::Float32), world(), "", 1);
      return Tensors{out};
    });
  }
  {
    const Shape input = {4, w};
    const Shape output = meta::reduce_scatter_shape(input, -1, w);
    OpRecord record = on("reduce_scatter_tensor_inplace", DType::Int64, {input}, {output});
    record.reduce_op = ReduceOp("sum");
    record.dims = {1};
    add(record, everyone, [input, output](Mode mode) {
      Tensor out = program_output(mode, output, DType::Int64);
      reduce_scatter_tensor_inplace(out, program_tensor(mode, input, DType::Int64), "sum", world(),
                                    -1);
      return Tensors{out};
    });
  }
  // Other communicators: a tagged group, a call tag, and the world again.
  for (int i = 0; i < 2; ++i) {
    const Shape input = {2};
    OpRecord record = on("all_reduce", DType::Int32, {input}, {input}, "side");
    record.reduce_op = ReduceOp("sum");
    add(record, everyone, [input, everyone](Mode mode) {
      return Tensors{all_reduce(program_tensor(mode, input, DType::Int32), "sum",
                                new_group(everyone, "side"))};
    });
  }
  {
    const Shape input = {1};
    OpRecord record = on("all_gather_tensor", DType::Int32, {input},
                         {meta::all_gather_shape(input, 0, w)}, "call-tag");
    record.dims = {0};
    add(record, everyone, [input](Mode mode) {
      return Tensors{
          all_gather_tensor(program_tensor(mode, input, DType::Int32), 0, world(), "call-tag")};
    });
  }
  {
    const Shape input = {1};
    OpRecord record = on("all_reduce", DType::Float64, {input}, {input});
    record.reduce_op = ReduceOp("sum");
    add(record, everyone, [input](Mode mode) {
      return Tensors{all_reduce(program_tensor(mode, input, DType::Float64), "sum", world())};
    });
  }
  if (w % 2 == 0) {  // MPMD: the record holds the flattened list and the sub-list length
    const int half = w / 2;
    std::vector<std::vector<int>> lists(2);
    for (int r = 0; r < w; ++r) {
      lists[to_index(r < half ? 0 : 1)].push_back(r);
    }
    const Shape input = {2};
    OpRecord record = on("all_reduce", DType::Int64, {input}, {input});
    record.reduce_op = ReduceOp("sum");
    record.group_size = half;
    add(record, lists[to_index(me < half ? 0 : 1)], [input, lists](Mode mode) {
      return Tensors{all_reduce(program_tensor(mode, input, DType::Int64), "sum", lists)};
    });
  }
  return steps;
}

// The records every rank of a `world`-rank simulation leaves running `program` inside a
// TraceScope, indexed by rank.
std::vector<std::vector<OpRecord>> traces_of(int world, const std::function<void()>& program) {
  std::vector<std::vector<OpRecord>> traces(to_index(world));
  run_quietly(world, [&] {
    TraceScope scope;
    program();
    traces[to_index(rank())] = scope.records();
  });
  return traces;
}

// The records every rank leaves tracing every_collective_program() in `mode` (Traced or
// Meta), indexed by rank.
std::vector<std::vector<OpRecord>> trace_program(int world, Mode mode) {
  return traces_of(world, [mode] {
    // Building the steps issues nothing; only their `issue` calls record.
    for (const Step& step : every_collective_program()) {
      (void)step.issue(mode);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Meta: shapes.

class MetaShapes : public ::testing::TestWithParam<int> {};

TEST_P(MetaShapes, ShapeFunctionsFollowTheDocumentedRules) {
  const int w = GetParam();
  EXPECT_EQ(meta::all_reduce_shape({2, 3}), (Shape{2, 3}));
  EXPECT_EQ(meta::all_gather_shape({2, 3}, 0, w), (Shape{2 * w, 3}));
  EXPECT_EQ(meta::all_gather_shape({2, 3}, -1, w), (Shape{2, 3 * w}));
  EXPECT_EQ(meta::all_gather_shape({}, 0, w), (Shape{w}));
  EXPECT_EQ(meta::all_gather_shape({}, -1, w), (Shape{w}));
  EXPECT_EQ(meta::reduce_scatter_shape({2 * w, 3}, 0, w), (Shape{2, 3}));
  EXPECT_EQ(meta::reduce_scatter_shape({3, w, 2}, -2, w), (Shape{3, 1, 2}));
  EXPECT_EQ(meta::all_to_all_single_shape({2 * w, 5}, std::nullopt, std::nullopt, w),
            (Shape{2 * w, 5}));
  const std::vector<std::int64_t> input_splits = uneven_input_splits(0, w);
  const std::vector<std::int64_t> output_splits = uneven_output_splits(0, w);
  EXPECT_EQ(
      meta::all_to_all_single_shape({sum_of(input_splits), 4}, output_splits, input_splits, w),
      (Shape{sum_of(output_splits), 4}));
  EXPECT_EQ(meta::broadcast_shape({4, 1}, w - 1, w), (Shape{4, 1}));
  EXPECT_EQ(meta::reduce_shape({4, 1}, 0, w), (Shape{4, 1}));
  EXPECT_EQ(meta::permute_tensor_shape({3}, partial_shift(w), w), (Shape{3}));
  for (int bad : {0, -1}) {
    SCOPED_TRACE("group_size " + std::to_string(bad));
    expect_invalid_argument([&] { (void)meta::all_gather_shape({2}, 0, bad); }, {"group_size"});
    expect_invalid_argument([&] { (void)meta::reduce_scatter_shape({2}, 0, bad); }, {"group_size"});
    expect_invalid_argument(
        [&] { (void)meta::all_to_all_single_shape({2}, std::nullopt, std::nullopt, bad); },
        {"group_size"});
    expect_invalid_argument([&] { (void)meta::broadcast_shape({2}, 0, bad); }, {"group_size"});
    expect_invalid_argument([&] { (void)meta::reduce_shape({2}, 0, bad); }, {"group_size"});
    expect_invalid_argument([&] { (void)meta::permute_tensor_shape({2}, {}, bad); },
                            {"group_size"});
  }
}

// The same program eagerly, traced, and traced on meta tensors: every output has the shape
// chorus::meta computes and the input's dtype, and lives on the meta device exactly in the meta
// run.
TEST_P(MetaShapes, EveryOpGivesTheShapesOfChorusMetaEagerTracedAndOnMetaTensors) {
  run_quietly(GetParam(), [] {
    const std::vector<Step> steps = every_collective_program();
    std::vector<std::vector<std::string>> seen;  // per mode: "dtype [shape]" of every output
    for (Mode mode : {Mode::Eager, Mode::Traced, Mode::Meta}) {
      SCOPED_TRACE(mode == Mode::Eager ? "eager" : mode == Mode::Traced ? "traced" : "meta");
      std::optional<TraceScope> scope;
      if (mode != Mode::Eager) {
        scope.emplace();
      }
      std::vector<std::string> signatures;
      std::vector<Tensor> eager_outputs;
      for (const Step& step : steps) {
        SCOPED_TRACE(record_text(step.expected));
        const std::vector<Tensor> outputs = step.issue(mode);
        ASSERT_EQ(outputs.size(), step.expected.output_shapes.size());
        for (std::size_t k = 0; k < outputs.size(); ++k) {
          EXPECT_EQ(outputs[k].sizes(), step.expected.output_shapes[k]) << "output " << k;
          EXPECT_EQ(dtype_name(outputs[k].dtype()), dtype_name(step.expected.dtype));
          EXPECT_EQ(outputs[k].device().is_meta(), mode == Mode::Meta) << "output " << k;
          signatures.push_back(std::string(dtype_name(outputs[k].dtype())) + " " +
                               list_text(outputs[k].sizes()));
          eager_outputs.push_back(outputs[k]);
        }
      }
      if (mode == Mode::Eager) {
        wait_tensors(eager_outputs);
      }
      seen.push_back(std::move(signatures));
    }
    EXPECT_EQ(seen[1], seen[0]) << "traced vs eager";
    EXPECT_EQ(seen[2], seen[0]) << "meta vs eager";
  });
}

INSTANTIATE_TEST_SUITE_P(Meta, MetaShapes, ::testing::ValuesIn(kWorldSizes), world_name);

// ---------------------------------------------------------------------------------------------
// Meta: sequence numbers and misuse.

class MetaCalls : public ::testing::TestWithParam<int> {};

// Odd ranks trace three meta calls the even ranks never make; the real collectives after them
// still pair up, and take sequence numbers 0 and 1.
TEST_P(MetaCalls, ConsumeNoSequenceNumber) {
  const int w = GetParam();
  run_quietly(w, [w] {
    TraceScope scope;
    const bool odd = rank() % 2 == 1;
    if (odd) {
      const Tensor meta = Tensor::empty({w, 2}, DType::Float32, Device::meta());
      (void)all_reduce(meta, "sum", world());
      (void)all_gather_tensor(meta, 1, world());
      (void)all_to_all_single(meta, std::nullopt, std::nullopt, world());
    }
    expect_world_pairs_up();
    expect_world_pairs_up();
    const std::vector<OpRecord>& records = scope.records();
    ASSERT_EQ(records.size(), odd ? 5u : 2u);
    const std::size_t first_real = odd ? 3 : 0;
    for (std::size_t i = 0; i < first_real; ++i) {
      EXPECT_EQ(records[i].seq, -1) << record_text(records[i]);
      EXPECT_TRUE(records[i].meta) << record_text(records[i]);
    }
    EXPECT_EQ(records[first_real].seq, 0);
    EXPECT_FALSE(records[first_real].meta);
    EXPECT_EQ(records[first_real + 1].seq, 1);
    EXPECT_FALSE(records[first_real + 1].meta);
  });
}

TEST_P(MetaCalls, MetaInputOutsideATraceScopeIsInvalidArgument) {
  const int w = GetParam();
  run_quietly(w, [w] {
    ASSERT_EQ(current_trace(), nullptr);
    const auto meta = [](Shape shape) {
      return Tensor::empty(std::move(shape), DType::Float32, Device::meta());
    };
    const Tensor input = meta({w, 2});
    const std::vector<std::function<void()>> calls = {
        [&] { (void)all_reduce(input, "sum", world()); },
        [&] { (void)all_gather_tensor(input, 0, world()); },
        [&] { (void)reduce_scatter_tensor(input, "sum", 0, world()); },
        [&] {
          (void)all_reduce_coalesced({input, input}, "sum", world());
        },
        [&] { (void)all_gather_into_tensor_coalesced({input}, world()); },
        [&] { (void)reduce_scatter_tensor_coalesced({input}, "sum", {0}, world()); },
        [&] { (void)all_to_all_single(input, std::nullopt, std::nullopt, world()); },
        [&] { (void)broadcast(input, 0, world()); },
        [&] { (void)reduce(input, "sum", 0, world()); },
        [&] { (void)permute_tensor(input, cyclic_shift(w), world()); },
        [&] {
          Tensor tensor = meta({w, 2});
          all_reduce_inplace(tensor, "sum", world());
        },
        [&] {
          Tensor out = meta({w * w, 2});
          all_gather_tensor_inplace(out, input, world());
        },
        [&] {
          Tensor out = meta({1, 2});
          reduce_scatter_tensor_inplace(out, input, "sum", world());
        },
    };
    for (std::size_t i = 0; i < calls.size(); ++i) {
      SCOPED_TRACE("call " + std::to_string(i));
      expect_invalid_argument(calls[i], {"meta"});
    }
    expect_world_pairs_up();
  });
}

TEST_P(MetaCalls, MixingMetaAndRealInputsInOneCallIsInvalidArgument) {
  const int w = GetParam();
  run_quietly(w, [w] {
    TraceScope scope;
    const Tensor meta = Tensor::empty({w, 2}, DType::Float32, Device::meta());
    const Tensor real = Tensor::ones({w, 2}, DType::Float32);
    for (const std::vector<Tensor>& inputs :
         {std::vector<Tensor>{meta, real}, std::vector<Tensor>{real, meta}}) {
      expect_invalid_argument([&] { (void)all_reduce_coalesced(inputs, "sum", world()); },
                              {"all_reduce_coalesced", "meta"});
      expect_invalid_argument([&] { (void)all_gather_into_tensor_coalesced(inputs, world()); },
                              {"all_gather_into_tensor_coalesced", "meta"});
      expect_invalid_argument(
          [&] {
            (void)reduce_scatter_tensor_coalesced(inputs, "sum", {0, 0}, world());
          },
          {"reduce_scatter_tensor_coalesced", "meta"});
    }
    // An in-place form's output must be meta exactly when its input is.
    Tensor real_gathered = Tensor::empty({w * w, 2}, DType::Float32);
    Tensor meta_gathered = Tensor::empty({w * w, 2}, DType::Float32, Device::meta());
    expect_invalid_argument([&] { all_gather_tensor_inplace(real_gathered, meta, world()); },
                            {"all_gather_tensor_inplace", "meta"});
    expect_invalid_argument([&] { all_gather_tensor_inplace(meta_gathered, real, world()); },
                            {"all_gather_tensor_inplace", "meta"});
    Tensor real_scattered = Tensor::empty({1, 2}, DType::Float32);
    Tensor meta_scattered = Tensor::empty({1, 2}, DType::Float32, Device::meta());
    expect_invalid_argument(
        [&] { reduce_scatter_tensor_inplace(real_scattered, meta, "sum", world()); },
        {"reduce_scatter_tensor_inplace", "meta"});
    expect_invalid_argument(
        [&] { reduce_scatter_tensor_inplace(meta_scattered, real, "sum", world()); },
        {"reduce_scatter_tensor_inplace", "meta"});
    EXPECT_TRUE(scope.records().empty()) << "a refused call leaves no record";
    expect_world_pairs_up();
    ASSERT_EQ(scope.records().size(), 1u);
    EXPECT_EQ(scope.records()[0].seq, 0) << "the refused calls took no sequence number";
  });
}

// For the same bad arguments, chorus::meta throws InvalidArgument with the collective's detail
// text (Note [One rule, three paths]).
TEST_P(MetaCalls, ShapeFunctionsThrowTheCollectivesDetailText) {
  const int w = GetParam();
  run_quietly(w, [w] {
    struct BadCase {
      std::string name;
      std::function<void()> collective;
      std::function<void()> shape_function;
    };
    const Tensor matrix = Tensor::ones({2, 3}, DType::Float32);
    const Tensor scalar = Tensor::ones({}, DType::Float32);
    const Tensor rows = Tensor::ones({w + 1, 2}, DType::Float32);
    const Tensor column = Tensor::ones({w}, DType::Float32);
    const std::vector<std::int64_t> ones(to_index(w), 1);
    const std::vector<std::int64_t> too_long(to_index(w + 1), 1);
    std::vector<std::int64_t> negative = ones;
    negative[0] = -1;
    const std::vector<std::int64_t> short_sum(to_index(w), 0);
    std::vector<BadCase> cases;
    const auto add = [&](std::string name, std::function<void()> collective,
                         std::function<void()> shape_function) {
      cases.push_back(BadCase{std::move(name), std::move(collective), std::move(shape_function)});
    };
    for (std::int64_t dim : {2, -3, 5}) {
      add(
          "all_gather dim " + std::to_string(dim),
          [&, dim] { (void)all_gather_tensor(matrix, dim, world()); },
          [&, dim] {
            (void)meta::all_gather_shape({2, 3}, dim, w);
          });
    }
    for (std::int64_t dim : {1, -2}) {
      add(
          "all_gather 0-d dim " + std::to_string(dim),
          [&, dim] { (void)all_gather_tensor(scalar, dim, world()); },
          [&, dim] { (void)meta::all_gather_shape({}, dim, w); });
    }
    add(
        "reduce_scatter 0-d", [&] { (void)reduce_scatter_tensor(scalar, "sum", 0, world()); },
        [&] { (void)meta::reduce_scatter_shape({}, 0, w); });
    for (std::int64_t dim : {2, -3}) {
      add(
          "reduce_scatter dim " + std::to_string(dim),
          [&, dim] { (void)reduce_scatter_tensor(matrix, "sum", dim, world()); },
          [&, dim] {
            (void)meta::reduce_scatter_shape({2, 3}, dim, w);
          });
    }
    if (w > 1) {
      add(
          "reduce_scatter not divisible",
          [&] { (void)reduce_scatter_tensor(rows, "sum", -2, world()); },
          [&] {
            (void)meta::reduce_scatter_shape({w + 1, 2}, -2, w);
          });
      add(
          "all_to_all equal split not divisible",
          [&] { (void)all_to_all_single(rows, std::nullopt, std::nullopt, world()); },
          [&] {
            (void)meta::all_to_all_single_shape({w + 1, 2}, std::nullopt, std::nullopt, w);
          });
    }
    // all_to_all_single: the input's shape is what the shape function gets.
    using Splits = std::optional<std::vector<std::int64_t>>;
    struct AllToAllCase {
      std::string name;
      Tensor input;
      Splits output_splits;
      Splits input_splits;
    };
    const std::vector<AllToAllCase> all_to_all_cases = {
        {"negative input split", column, ones, negative},
        {"0-d", scalar, ones, ones},
        {"output splits only", column, ones, std::nullopt},
        {"input splits only", column, std::nullopt, ones},
        {"output splits too long", column, too_long, ones},
        {"input splits too long", column, ones, too_long},
        {"negative output split", column, negative, ones},
        {"input splits do not sum to dim 0", column, ones, short_sum},
    };
    for (const AllToAllCase& c : all_to_all_cases) {
      add(
          "all_to_all " + c.name,
          [c] { (void)all_to_all_single(c.input, c.output_splits, c.input_splits, world()); },
          [c, w] {
            (void)meta::all_to_all_single_shape(c.input.sizes(), c.output_splits, c.input_splits,
                                                w);
          });
    }
    for (int root : {-1, w}) {
      add(
          "broadcast src " + std::to_string(root),
          [&, root] { (void)broadcast(matrix, root, world()); },
          [&, root] {
            (void)meta::broadcast_shape({2, 3}, root, w);
          });
      add(
          "reduce dst " + std::to_string(root),
          [&, root] { (void)reduce(matrix, "sum", root, world()); },
          [&, root] {
            (void)meta::reduce_shape({2, 3}, root, w);
          });
    }
    std::vector<std::vector<int>> bad_permutations = {std::vector<int>(to_index(w + 1), -1)};
    std::vector<int> out_of_range = cyclic_shift(w);
    out_of_range.back() = w;
    bad_permutations.push_back(out_of_range);
    std::vector<int> below = cyclic_shift(w);
    below.front() = -2;
    bad_permutations.push_back(below);
    if (w > 1) {
      bad_permutations.emplace_back(to_index(w), 0);  // everyone sends to 0
    }
    for (const std::vector<int>& src_dst : bad_permutations) {
      add(
          "permute_tensor " + list_text(src_dst),
          [&, src_dst] { (void)permute_tensor(matrix, src_dst, world()); },
          [&, src_dst] {
            (void)meta::permute_tensor_shape({2, 3}, src_dst, w);
          });
    }
    for (const BadCase& bad : cases) {
      SCOPED_TRACE(bad.name);
      const std::string from_collective = invalid_detail(bad.collective);
      const std::string from_shape_function = invalid_detail(bad.shape_function);
      EXPECT_FALSE(from_collective.empty());
      EXPECT_EQ(from_shape_function, from_collective);
    }
    expect_world_pairs_up();
  });
}

INSTANTIATE_TEST_SUITE_P(Meta, MetaCalls, ::testing::ValuesIn(kWorldSizes), world_name);

// ---------------------------------------------------------------------------------------------
// Tracing: records.

class TracingRecords : public ::testing::TestWithParam<int> {};

// "Traced programs contain no pending tensors": every traced call returns its outputs waited,
// with nothing left in the registry, and appends exactly the record it describes. The meta run
// records the same apart from seq (-1) and meta (true).
TEST_P(TracingRecords, EveryTracedCallReturnsWaitedAndRecordsExactlyItsFields) {
  run_quietly(GetParam(), [] {
    {
      // The contrast: outside a scope a call returns pending. (On its own communicator, so the
      // program's sequence numbers are the ones it expects.)
      const Tensor eager = all_reduce(Tensor::ones({2}, DType::Int32), "sum", world(), "contrast");
      EXPECT_TRUE(eager.is_pending());
      EXPECT_EQ(work_registry_size(), 1u);
      wait_tensor(eager);
    }
    const std::vector<Step> steps = every_collective_program();
    for (Mode mode : {Mode::Traced, Mode::Meta}) {
      SCOPED_TRACE(mode == Mode::Traced ? "traced" : "meta");
      TraceScope scope;
      EXPECT_EQ(current_trace(), &scope);
      for (std::size_t i = 0; i < steps.size(); ++i) {
        OpRecord expected = steps[i].expected;
        if (mode == Mode::Meta) {
          expected.seq = -1;
          expected.meta = true;
        }
        SCOPED_TRACE(record_text(expected));
        const std::vector<Tensor> outputs = steps[i].issue(mode);
        for (const Tensor& output : outputs) {
          EXPECT_FALSE(output.is_pending());
        }
        EXPECT_EQ(work_registry_size(), 0u);
        ASSERT_EQ(scope.records().size(), i + 1);
        expect_record(scope.records().back(), expected);
      }
    }
    EXPECT_EQ(current_trace(), nullptr);
  });
}

// Scopes nest: the innermost records, the outer one resumes when it ends.
TEST_P(TracingRecords, NestedScopesRecordIntoTheInnermostOnly) {
  run_quietly(GetParam(), [] {
    const Tensor x = Tensor::ones({2}, DType::Int64);
    TraceScope outer;
    (void)all_reduce(x, "sum", world());
    {
      TraceScope inner;
      EXPECT_EQ(current_trace(), &inner);
      (void)all_gather_tensor(x, 0, world());
      (void)broadcast(x, 0, world());
      ASSERT_EQ(inner.records().size(), 2u);
      EXPECT_EQ(inner.records()[0].op, "all_gather_tensor");
      EXPECT_EQ(inner.records()[0].seq, 1);
      EXPECT_EQ(inner.records()[1].op, "broadcast");
      EXPECT_EQ(inner.records()[1].seq, 2);
    }
    EXPECT_EQ(current_trace(), &outer);
    (void)reduce(x, "sum", 0, world());
    ASSERT_EQ(outer.records().size(), 2u);
    EXPECT_EQ(outer.records()[0].op, "all_reduce");
    EXPECT_EQ(outer.records()[0].seq, 0);
    EXPECT_EQ(outer.records()[1].op, "reduce");
    EXPECT_EQ(outer.records()[1].seq, 3);
  });
}

TEST(Tracing, ScopeOutsideARankIsInvalidArgument) {
  EXPECT_EQ(current_trace(), nullptr);
  expect_invalid_argument([] { TraceScope scope; }, {"TraceScope", "outside a rank"});
}

TEST_P(TracingRecords, RecordsOfARealProgramSurviveAJsonRoundTrip) {
  const int w = GetParam();
  for (Mode mode : {Mode::Traced, Mode::Meta}) {
    const std::vector<std::vector<OpRecord>> traces = trace_program(w, mode);
    for (int r = 0; r < w; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const std::vector<OpRecord>& records = traces[to_index(r)];
      ASSERT_FALSE(records.empty());
      const std::vector<OpRecord> back = from_json(to_json(records));
      ASSERT_EQ(back.size(), records.size());
      for (std::size_t i = 0; i < records.size(); ++i) {
        expect_record(back[i], records[i]);
      }
    }
  }
}

// The meta trace of a program equals its real trace apart from seq and meta.
TEST_P(TracingRecords, MetaTraceEqualsRealTraceApartFromSeqAndMeta) {
  const int w = GetParam();
  const std::vector<std::vector<OpRecord>> real = trace_program(w, Mode::Traced);
  const std::vector<std::vector<OpRecord>> meta = trace_program(w, Mode::Meta);
  for (int r = 0; r < w; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(meta[to_index(r)].size(), real[to_index(r)].size());
    for (std::size_t i = 0; i < real[to_index(r)].size(); ++i) {
      OpRecord expected = real[to_index(r)][i];
      expected.seq = -1;
      expected.meta = true;
      expect_record(meta[to_index(r)][i], expected);
    }
  }
}

TEST_P(TracingRecords, CompareTracesOfAConsistentProgramFindsNothing) {
  const int w = GetParam();
  for (Mode mode : {Mode::Traced, Mode::Meta}) {
    const std::optional<TraceDivergence> divergence = compare_traces(trace_program(w, mode));
    EXPECT_FALSE(divergence.has_value()) << divergence->to_string();
  }
}

// A coalesced call may mix dtypes (the collectives accept it); its record must still describe
// the call well enough to execute it again on the same inputs (OpRecord::input_dtypes).
TEST_P(TracingRecords, CoalescedCallWithMixedDTypesExecutesAgainFromItsRecord) {
  run_quietly(GetParam(), [] {
    const std::vector<Tensor> inputs = {Tensor::full({2}, rank() + 1, DType::Int32),
                                        Tensor::full({3}, rank() + 1, DType::Float64)};
    OpRecord record;
    std::vector<Tensor> traced;
    {
      TraceScope scope;
      traced = all_reduce_coalesced(inputs, "sum", world());
      ASSERT_EQ(scope.records().size(), 1u);
      record = scope.records()[0];
    }
    EXPECT_EQ(record.input_dtypes, (std::vector<DType>{DType::Int32, DType::Float64}));
    EXPECT_EQ(from_json(to_json({record})).front(), record);
    const std::vector<Tensor> again = wait_tensors(execute(record, inputs));
    ASSERT_EQ(again.size(), traced.size());
    for (std::size_t k = 0; k < again.size(); ++k) {
      EXPECT_TRUE(again[k].bitwise_equal(traced[k])) << "output " << k;
    }
  });
}

// Rank 1 passes a Float32 second input where every other rank passes Float64, on meta tensors:
// the desync check must see the dtype difference (a real run would mismatch).
TEST(Tracing, CompareTracesSeesADTypeDifferenceInALaterCoalescedInput) {
  for (int w : {2, 3, 4, 8}) {
    SCOPED_TRACE("world size " + std::to_string(w));
    const std::optional<TraceDivergence> divergence = compare_traces(traces_of(w, [] {
      const DType second = rank() == 1 ? DType::Float32 : DType::Float64;
      (void)all_reduce_coalesced({Tensor::empty({2}, DType::Float64, Device::meta()),
                                  Tensor::empty({3}, second, Device::meta())},
                                 "sum", world());
    }));
    ASSERT_TRUE(divergence.has_value());
    EXPECT_EQ(divergence->rank, 1);
    EXPECT_EQ(divergence->index, 0u);
    EXPECT_EQ(divergence->field, "dtype");
  }
}

INSTANTIATE_TEST_SUITE_P(Tracing, TracingRecords, ::testing::ValuesIn(kWorldSizes), world_name);

// Rank 1 reduces with max where every other rank uses sum, at its third collective. Traced on
// meta tensors, so no communication can notice; compare_traces does: the reference is the
// group's lowest member (rank 0) and rank 1 is the smallest diverging (rank, index).
TEST(Tracing, CompareTracesNamesTheRankThatReducesDifferently) {
  for (int w : {2, 3, 4, 8}) {
    SCOPED_TRACE("world size " + std::to_string(w));
    const std::optional<TraceDivergence> divergence = compare_traces(traces_of(w, [w] {
      const Tensor meta = Tensor::empty({w, 3}, DType::Float32, Device::meta());
      (void)all_reduce(meta, "sum", world());
      (void)all_gather_tensor(meta, 1, world());
      (void)all_reduce(meta, rank() == 1 ? "max" : "sum", world());
      (void)reduce_scatter_tensor(meta, "sum", 0, world());
    }));
    ASSERT_TRUE(divergence.has_value());
    EXPECT_EQ(divergence->rank, 1);
    EXPECT_EQ(divergence->index, 2u);
    EXPECT_EQ(divergence->field, "reduce_op");
    EXPECT_EQ(divergence->expected, "sum");
    EXPECT_EQ(divergence->actual, "max");
    EXPECT_EQ(divergence->reference_rank, 0);
    EXPECT_EQ(divergence->reference_index, 2u);
  }
}

// ---------------------------------------------------------------------------------------------
// Replay.

template <class T>
Tensor counting_from(std::int64_t base, const Shape& shape) {
  std::vector<T> values;
  for (std::int64_t i = 0; i < element_count(shape); ++i) {
    values.push_back(static_cast<T>(base + i));
  }
  return Tensor::from_vector(values, shape);
}

// The input replay documents: element i of input k of record n on rank r holds
// (r + 1) * 1000 + n * 10 + k + i (Bool: i % 2), built here in the dtype's own element type.
Tensor documented_replay_input(const OpRecord& record, std::size_t n, std::size_t k, int r) {
  const Shape& shape = record.input_shapes[k];
  const std::int64_t base = (r + 1) * 1000 + static_cast<std::int64_t>(n * 10 + k);
  switch (record.dtype) {
    case DType::Bool: {
      std::vector<bool> values;
      for (std::int64_t i = 0; i < element_count(shape); ++i) {
        values.push_back(i % 2 == 1);
      }
      return Tensor::from_vector(values, shape);
    }
    case DType::Int32:
      return counting_from<std::int32_t>(base, shape);
    case DType::Int64:
      return counting_from<std::int64_t>(base, shape);
    case DType::Float32:
      return counting_from<float>(base, shape);
    case DType::Float64:
      return counting_from<double>(base, shape);
    default:
      ADD_FAILURE() << "the program uses no " << dtype_name(record.dtype);
      return Tensor();
  }
}

class ReplayRuns : public ::testing::TestWithParam<int> {};

TEST_P(ReplayRuns, ReplayedOutputsEqualADirectExecutionOnTheDocumentedInputsBitwise) {
  const int w = GetParam();
  const std::vector<std::vector<OpRecord>> traces = trace_program(w, Mode::Traced);
  run_quietly(w, [&] {
    const int me = rank();
    const std::vector<OpRecord>& mine = traces[to_index(me)];
    const std::vector<std::vector<Tensor>> replayed = replay(mine);
    ASSERT_EQ(replayed.size(), mine.size());
    // The first record is all_reduce sum of Float32 [2, 3]: element i is
    // sum_r ((r + 1) * 1000 + i) = 1000 * W (W + 1) / 2 + W * i, exact in float.
    ASSERT_EQ(mine[0].op, "all_reduce");
    std::vector<float> first;
    for (int i = 0; i < 6; ++i) {
      first.push_back(static_cast<float>(1000 * w * (w + 1) / 2 + w * i));
    }
    EXPECT_TRUE(replayed[0][0].bitwise_equal(Tensor::from_vector(first, {2, 3}))) << replayed[0][0];
    for (std::size_t n = 0; n < mine.size(); ++n) {
      SCOPED_TRACE(record_text(mine[n]));
      std::vector<Tensor> inputs;
      for (std::size_t k = 0; k < mine[n].input_shapes.size(); ++k) {
        inputs.push_back(documented_replay_input(mine[n], n, k, me));
      }
      const std::vector<Tensor> direct = wait_tensors(execute(mine[n], inputs));
      ASSERT_EQ(replayed[n].size(), direct.size());
      ASSERT_EQ(replayed[n].size(), mine[n].output_shapes.size());
      for (std::size_t k = 0; k < direct.size(); ++k) {
        EXPECT_FALSE(replayed[n][k].is_pending()) << "replay waits every output";
        EXPECT_EQ(replayed[n][k].sizes(), mine[n].output_shapes[k]);
        EXPECT_TRUE(replayed[n][k].bitwise_equal(direct[k]))
            << "output " << k << ": replayed " << replayed[n][k] << ", direct " << direct[k];
      }
    }
  });
}

// A trace recorded on meta tensors replays as real collectives with outputs of the recorded
// shapes, bitwise equal to the replay of the same program's real trace.
TEST_P(ReplayRuns, MetaTraceReplaysAsRealCollectivesOfTheRecordedShapes) {
  const int w = GetParam();
  const std::vector<std::vector<OpRecord>> meta_traces = trace_program(w, Mode::Meta);
  const std::vector<std::vector<OpRecord>> real_traces = trace_program(w, Mode::Traced);
  run_quietly(w, [&] {
    const std::vector<OpRecord>& meta_records = meta_traces[to_index(rank())];
    const std::vector<std::vector<Tensor>> from_meta = replay(meta_records);
    const std::vector<std::vector<Tensor>> from_real = replay(real_traces[to_index(rank())]);
    ASSERT_EQ(from_meta.size(), meta_records.size());
    ASSERT_EQ(from_real.size(), meta_records.size());
    for (std::size_t n = 0; n < meta_records.size(); ++n) {
      SCOPED_TRACE(record_text(meta_records[n]));
      ASSERT_TRUE(meta_records[n].meta);
      ASSERT_EQ(from_meta[n].size(), meta_records[n].output_shapes.size());
      ASSERT_EQ(from_real[n].size(), from_meta[n].size());
      for (std::size_t k = 0; k < from_meta[n].size(); ++k) {
        EXPECT_FALSE(from_meta[n][k].device().is_meta());
        EXPECT_EQ(from_meta[n][k].sizes(), meta_records[n].output_shapes[k]);
        EXPECT_TRUE(from_meta[n][k].bitwise_equal(from_real[n][k])) << "output " << k;
      }
    }
  });
}

// Replaying under a TraceScope records the trace again: a real trace exactly (a fresh run
// numbers each communicator from 0 again), a meta trace with seq counted and meta false — the
// two fields that say whether communication happened. `site` is not compared (operator==).
TEST_P(ReplayRuns, ReplayUnderATraceScopeRecordsTheOriginalRecords) {
  const int w = GetParam();
  const std::vector<std::vector<OpRecord>> real_traces = trace_program(w, Mode::Traced);
  const std::vector<std::vector<OpRecord>> meta_traces = trace_program(w, Mode::Meta);
  run_quietly(w, [&] {
    const std::vector<OpRecord>& original = real_traces[to_index(rank())];
    TraceScope scope;
    (void)replay(original);
    ASSERT_EQ(scope.records().size(), original.size());
    for (std::size_t n = 0; n < original.size(); ++n) {
      expect_record(scope.records()[n], original[n]);
    }
  });
  run_quietly(w, [&] {
    const std::vector<OpRecord>& original = meta_traces[to_index(rank())];
    TraceScope scope;
    (void)replay(original);
    ASSERT_EQ(scope.records().size(), original.size());
    for (std::size_t n = 0; n < original.size(); ++n) {
      OpRecord expected = original[n];
      expected.seq = real_traces[to_index(rank())][n].seq;
      expected.meta = false;
      EXPECT_GE(expected.seq, 0);
      expect_record(scope.records()[n], expected);
    }
  });
}

// `fill` supplies every input, once per (record, input), and those are what the collectives get.
TEST_P(ReplayRuns, FillSuppliesEveryInput) {
  const int w = GetParam();
  const std::vector<std::vector<OpRecord>> traces = trace_program(w, Mode::Meta);
  run_quietly(w, [&] {
    const std::vector<OpRecord>& mine = traces[to_index(rank())];
    std::vector<std::string> calls;
    const auto fill = [&](const OpRecord& record, std::size_t k) {
      calls.push_back(record.op + " input " + std::to_string(k));
      return Tensor::full(record.input_shapes[k], 1.0, record.dtype);
    };
    const std::vector<std::vector<Tensor>> replayed = replay(mine, fill);
    std::vector<std::string> expected_calls;
    for (const OpRecord& record : mine) {
      for (std::size_t k = 0; k < record.input_shapes.size(); ++k) {
        expected_calls.push_back(record.op + " input " + std::to_string(k));
      }
    }
    EXPECT_EQ(calls, expected_calls);
    ASSERT_EQ(replayed.size(), mine.size());
    for (std::size_t n = 0; n < mine.size(); ++n) {
      SCOPED_TRACE(record_text(mine[n]));
      std::vector<Tensor> inputs;
      for (const Shape& shape : mine[n].input_shapes) {
        inputs.push_back(Tensor::full(shape, 1.0, mine[n].dtype));
      }
      const std::vector<Tensor> direct = wait_tensors(execute(mine[n], inputs));
      ASSERT_EQ(replayed[n].size(), direct.size());
      for (std::size_t k = 0; k < direct.size(); ++k) {
        EXPECT_TRUE(replayed[n][k].bitwise_equal(direct[k])) << "output " << k;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Replay, ReplayRuns, ::testing::ValuesIn(kWorldSizes), world_name);

// ---------------------------------------------------------------------------------------------
// Adjoints.

// A linear collective A on the world, applied to inputs of `input_shapes`.
struct LinearCase {
  std::string name;
  DType dtype = DType::Int64;  // Int64, or Float64 where the op needs a floating dtype
  // Every value is a multiple of this. avg divides the sum by W and truncates integers, so it is
  // linear on exact inputs only: with every value a multiple of W, every sum is one too.
  std::int64_t multiple = 1;
  std::vector<Shape> input_shapes;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> apply;
  bool may_vanish = false;  // nothing is sent anywhere, so both sides are 0
  bool functional = true;   // not an in-place form (whose adjoint's adjoint is the functional form)
};

// Rank-dependent small integers in [1, 11] (times `multiple`), exact in Int64 and Float64.
// Positive, so <y, A x> cannot cancel to 0 unless A x is empty or all zeros (see may_vanish).
Tensor exact_integers(const Shape& shape, DType dtype, int salt, std::int64_t multiple) {
  std::vector<std::int64_t> values;
  for (std::int64_t i = 0; i < element_count(shape); ++i) {
    values.push_back(((i * 7 + rank() * 5 + salt * 3) % 11 + 1) * multiple);
  }
  if (dtype == DType::Float64) {
    std::vector<double> floating;
    for (std::int64_t value : values) {
      floating.push_back(static_cast<double>(value));
    }
    return Tensor::from_vector(floating, shape);
  }
  EXPECT_EQ(dtype, DType::Int64);
  return Tensor::from_vector(values, shape);
}

std::vector<LinearCase> linear_cases() {
  const int w = world_size();
  const int me = rank();
  using Tensors = std::vector<Tensor>;
  std::vector<LinearCase> cases;
  const auto add = [&](std::string name, std::vector<Shape> shapes,
                       std::function<Tensors(const Tensors&)> apply) -> LinearCase& {
    LinearCase linear;
    linear.name = std::move(name);
    linear.input_shapes = std::move(shapes);
    linear.apply = std::move(apply);
    cases.push_back(std::move(linear));
    return cases.back();
  };
  add("all_reduce sum", {{3, 2}},
      [](const Tensors& x) { return Tensors{all_reduce(x[0], "sum", world())}; });
  add("all_reduce avg", {{4}}, [](const Tensors& x) {
    return Tensors{all_reduce(x[0], "avg", world())};
  }).multiple = w;
  // premul_sum takes floating dtypes only: Float64 holding small integers, and factors 3 and
  // 0.5, keeps every product and sum exact.
  add("all_reduce premul_sum(3)", {{5}}, [](const Tensors& x) {
    return Tensors{all_reduce(x[0], ReduceOp::premul_sum(3.0), world())};
  }).dtype = DType::Float64;
  add("all_reduce_inplace sum", {{3}}, [](const Tensors& x) {
    Tensor tensor = x[0].clone();
    all_reduce_inplace(tensor, "sum", world());
    return Tensors{tensor};
  }).functional = false;
  add("all_reduce_coalesced sum", {{2}, {2, 2}},
      [](const Tensors& x) { return all_reduce_coalesced(x, "sum", world()); });
  add("all_reduce_coalesced avg", {{2}, {3}}, [](const Tensors& x) {
    return all_reduce_coalesced(x, "avg", world());
  }).multiple = w;
  add("all_reduce_coalesced premul_sum(0.5)", {{2}, {1, 3}}, [](const Tensors& x) {
    return all_reduce_coalesced(x, ReduceOp::premul_sum(0.5), world());
  }).dtype = DType::Float64;
  for (std::int64_t dim = -2; dim < 2; ++dim) {
    add("all_gather_tensor dim " + std::to_string(dim), {{2, 3}},
        [dim](const Tensors& x) { return Tensors{all_gather_tensor(x[0], dim, world())}; });
  }
  add("all_gather_tensor_inplace dim 1", {{2, 3}}, [w](const Tensors& x) {
    Tensor out = Tensor::empty({2, 3 * w}, DType::Int64);
    all_gather_tensor_inplace(out, x[0], world(), "", 1);
    return Tensors{out};
  }).functional = false;
  add("all_gather_into_tensor_coalesced", {{2}, {1, 3}},
      [](const Tensors& x) { return all_gather_into_tensor_coalesced(x, world()); });
  for (std::int64_t dim = -2; dim < 2; ++dim) {
    add("reduce_scatter_tensor sum dim " + std::to_string(dim), {{2 * w, w}},
        [dim](const Tensors& x) {
          return Tensors{reduce_scatter_tensor(x[0], "sum", dim, world())};
        });
  }
  add("reduce_scatter_tensor_inplace sum dim 1", {{3, 2 * w}}, [](const Tensors& x) {
    Tensor out = Tensor::empty({3, 2}, DType::Int64);
    reduce_scatter_tensor_inplace(out, x[0], "sum", world(), 1);
    return Tensors{out};
  }).functional = false;
  add("reduce_scatter_tensor_coalesced sum", {{w}, {2 * w, 2}}, [](const Tensors& x) {
    return reduce_scatter_tensor_coalesced(x, "sum", {0, 0}, world());
  });
  add("all_to_all_single equal", {{2 * w, 2}}, [](const Tensors& x) {
    return Tensors{all_to_all_single(x[0], std::nullopt, std::nullopt, world())};
  });
  {
    const std::vector<std::int64_t> input_splits = uneven_input_splits(me, w);
    const std::vector<std::int64_t> output_splits = uneven_output_splits(me, w);
    add("all_to_all_single uneven", {{sum_of(input_splits), 3}},
        [input_splits, output_splits](const Tensors& x) {
          return Tensors{all_to_all_single(x[0], output_splits, input_splits, world())};
        })
        .may_vanish = w == 1;  // rank 0 sends itself (0 + 0) % 3 = 0 rows
  }
  add("permute_tensor cyclic", {{2, 2}},
      [w](const Tensors& x) { return Tensors{permute_tensor(x[0], cyclic_shift(w), world())}; });
  add("permute_tensor partial", {{3}}, [w](const Tensors& x) {
    return Tensors{permute_tensor(x[0], partial_shift(w), world())};
  }).may_vanish = w == 1;  // [-1]: nobody sends
  for (int root = 0; root < w; ++root) {
    add("broadcast src " + std::to_string(root), {{2, 3}},
        [root](const Tensors& x) { return Tensors{broadcast(x[0], root, world())}; });
    add("reduce sum dst " + std::to_string(root), {{3}},
        [root](const Tensors& x) { return Tensors{reduce(x[0], "sum", root, world())}; });
  }
  return cases;
}

// A's record, traced once on `inputs`, and A's outputs.
struct Traced {
  OpRecord record;
  std::vector<Tensor> outputs;
};

Traced trace_once(const LinearCase& linear, const std::vector<Tensor>& inputs) {
  TraceScope scope;
  Traced traced;
  traced.outputs = linear.apply(inputs);
  EXPECT_EQ(scope.records().size(), 1u);
  if (!scope.records().empty()) {
    traced.record = scope.records().front();
  }
  return traced;
}

template <class T>
T dot(const Tensor& a, const Tensor& b) {
  const std::vector<T> u = a.to_vector<T>();
  const std::vector<T> v = b.to_vector<T>();
  EXPECT_EQ(u.size(), v.size());
  T sum = 0;
  for (std::size_t i = 0; i < u.size() && i < v.size(); ++i) {
    sum += u[i] * v[i];
  }
  return sum;
}

// sum over ranks of <A* y, x> and of <y, A x>, in T.
template <class T>
std::vector<T> global_dots(const std::vector<Tensor>& adjoint_y, const std::vector<Tensor>& x,
                           const std::vector<Tensor>& y, const std::vector<Tensor>& a_x) {
  T left = 0;
  T right = 0;
  for (std::size_t k = 0; k < x.size() && k < adjoint_y.size(); ++k) {
    left += dot<T>(adjoint_y[k], x[k]);
  }
  for (std::size_t k = 0; k < y.size() && k < a_x.size(); ++k) {
    right += dot<T>(y[k], a_x[k]);
  }
  return all_reduce(Tensor::from_vector(std::vector<T>{left, right}), "sum", world())
      .template to_vector<T>();
}

// The dot-product test of one case on the calling rank (every rank runs the same cases).
void expect_adjoint_identity(const LinearCase& linear) {
  SCOPED_TRACE(linear.name);
  std::vector<Tensor> x;
  for (std::size_t k = 0; k < linear.input_shapes.size(); ++k) {
    x.push_back(
        exact_integers(linear.input_shapes[k], linear.dtype, static_cast<int>(k), linear.multiple));
  }
  const Traced forward = trace_once(linear, x);
  const OpRecord backward = adjoint(forward.record);
  EXPECT_EQ(backward.input_shapes, forward.record.output_shapes);
  std::vector<Tensor> y;
  for (std::size_t k = 0; k < forward.record.output_shapes.size(); ++k) {
    y.push_back(exact_integers(forward.record.output_shapes[k], linear.dtype,
                               10 + static_cast<int>(k), linear.multiple));
  }
  const std::vector<Tensor> adjoint_y = wait_tensors(execute(backward, y));
  EXPECT_EQ(adjoint_y.size(), x.size());
  for (std::size_t k = 0; k < x.size() && k < adjoint_y.size(); ++k) {
    EXPECT_EQ(adjoint_y[k].sizes(), x[k].sizes()) << "A* maps back onto input " << k;
  }
  if (linear.dtype == DType::Float64) {
    const std::vector<double> sums = global_dots<double>(adjoint_y, x, y, forward.outputs);
    EXPECT_EQ(sums[0], sums[1]) << "<A* y, x> vs <y, A x>";
    if (!linear.may_vanish) {
      EXPECT_NE(sums[1], 0.0) << "a test that cannot fail";
    }
  } else {
    const std::vector<std::int64_t> sums =
        global_dots<std::int64_t>(adjoint_y, x, y, forward.outputs);
    EXPECT_EQ(sums[0], sums[1]) << "<A* y, x> vs <y, A x>";
    if (!linear.may_vanish) {
      EXPECT_NE(sums[1], 0) << "a test that cannot fail";
    }
  }
}

class AdjointLaws : public ::testing::TestWithParam<int> {};

TEST_P(AdjointLaws, DotProductTestHoldsExactlyForEveryLinearOp) {
  run_quietly(GetParam(), [] {
    for (const LinearCase& linear : linear_cases()) {
      expect_adjoint_identity(linear);
    }
  });
}

// adjoint(adjoint(A)) == A, every field (A traced on meta tensors: seq -1 and meta true on both
// sides). The in-place forms are left out: their adjoint's adjoint is their functional form.
TEST_P(AdjointLaws, AdjointOfAdjointIsTheOriginal) {
  run_quietly(GetParam(), [] {
    for (const LinearCase& linear : linear_cases()) {
      if (!linear.functional) {
        continue;
      }
      SCOPED_TRACE(linear.name);
      std::vector<Tensor> inputs;
      for (const Shape& shape : linear.input_shapes) {
        inputs.push_back(Tensor::empty(shape, linear.dtype, Device::meta()));
      }
      const OpRecord forward = trace_once(linear, inputs).record;
      ASSERT_TRUE(forward.meta);
      const OpRecord backward = adjoint(forward);
      EXPECT_EQ(backward.input_shapes, forward.output_shapes);
      EXPECT_EQ(backward.output_shapes, forward.input_shapes);
      expect_record(adjoint(backward), forward);
    }
  });
}

// The in-place forms take the adjoint of their functional form.
TEST_P(AdjointLaws, InPlaceFormsTakeTheAdjointOfTheirFunctionalForm) {
  const int w = GetParam();
  run_quietly(w, [w] {
    TraceScope scope;
    Tensor tensor = Tensor::empty({3}, DType::Int64, Device::meta());
    all_reduce_inplace(tensor, "sum", world());
    Tensor gathered = Tensor::empty({2, 3 * w}, DType::Int64, Device::meta());
    all_gather_tensor_inplace(gathered, Tensor::empty({2, 3}, DType::Int64, Device::meta()),
                              world(), "", -1);
    Tensor scattered = Tensor::empty({3, 2}, DType::Int64, Device::meta());
    reduce_scatter_tensor_inplace(
        scattered, Tensor::empty({3, 2 * w}, DType::Int64, Device::meta()), "sum", world(), 1);
    ASSERT_EQ(scope.records().size(), 3u);
    const OpRecord all_reduced = adjoint(scope.records()[0]);
    EXPECT_EQ(all_reduced.op, "all_reduce");
    EXPECT_TRUE(all_reduced.reduce_op == ReduceOp("sum"));
    const OpRecord from_gather = adjoint(scope.records()[1]);
    EXPECT_EQ(from_gather.op, "reduce_scatter_tensor");
    EXPECT_TRUE(from_gather.reduce_op == ReduceOp("sum"));
    EXPECT_EQ(from_gather.dims, (std::vector<std::int64_t>{1}));
    EXPECT_EQ(from_gather.input_shapes, (std::vector<Shape>{{2, 3 * w}}));
    const OpRecord from_scatter = adjoint(scope.records()[2]);
    EXPECT_EQ(from_scatter.op, "all_gather_tensor");
    EXPECT_FALSE(from_scatter.reduce_op.has_value());
    EXPECT_EQ(from_scatter.dims, (std::vector<std::int64_t>{1}));
    EXPECT_EQ(from_scatter.input_shapes, (std::vector<Shape>{{3, 2}}));
  });
}

// Ops with no single linear adjoint collective: the error names the op and the reduction.
TEST_P(AdjointLaws, OpsWithoutALinearAdjointAreInvalidArgument) {
  const int w = GetParam();
  run_quietly(w, [w] {
    TraceScope scope;
    const Tensor integers = Tensor::empty({w, 2}, DType::Int64, Device::meta());
    const Tensor floating = Tensor::empty({w, 2}, DType::Float64, Device::meta());
    std::vector<std::string> reductions;
    for (const char* name : {"max", "min", "product", "band", "bor", "bxor"}) {
      (void)all_reduce(integers, name, world());
      reductions.emplace_back(name);
    }
    Tensor in_place = integers.clone();
    all_reduce_inplace(in_place, "product", world());
    reductions.emplace_back("product");
    (void)all_reduce_coalesced({integers, integers}, "min", world());
    reductions.emplace_back("min");
    (void)reduce_scatter_tensor(integers, "avg", 0, world());
    reductions.emplace_back("avg");
    (void)reduce_scatter_tensor(floating, ReduceOp::premul_sum(2.0), 0, world());
    reductions.emplace_back("premul_sum");
    (void)reduce_scatter_tensor_coalesced({integers}, "avg", {0}, world());
    reductions.emplace_back("avg");
    (void)reduce(integers, "max", 0, world());
    reductions.emplace_back("max");
    const std::vector<OpRecord>& records = scope.records();
    ASSERT_EQ(records.size(), reductions.size());
    for (std::size_t i = 0; i < records.size(); ++i) {
      SCOPED_TRACE(record_text(records[i]));
      expect_invalid_argument([&] { (void)adjoint(records[i]); }, {records[i].op, reductions[i]});
    }
    OpRecord unknown = records.front();
    unknown.op = "all_reduce_sideways";
    expect_invalid_argument([&] { (void)adjoint(unknown); }, {"all_reduce_sideways"});
  });
}

// all_gather of a 0-d input gives [W]; its adjoint is reduce_scatter_tensor(dim 0) of [W], which
// gives [1] (one element, as the 0-d input has): documented in adjoint(), and the adjoint
// record's output_shapes say so.
TEST_P(AdjointLaws, ZeroDimAllGatherAdjointGivesOneElement) {
  run_quietly(GetParam(), [] {
    for (std::int64_t dim : {0, -1}) {
      LinearCase linear;
      linear.name = "all_gather_tensor 0-d dim " + std::to_string(dim);
      linear.input_shapes = {Shape{}};
      linear.apply = [dim](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{all_gather_tensor(x[0], dim, world())};
      };
      std::vector<Tensor> inputs = {Tensor::empty({}, DType::Int64, Device::meta())};
      const OpRecord forward = trace_once(linear, inputs).record;
      const OpRecord backward = adjoint(forward);
      EXPECT_EQ(backward.op, "reduce_scatter_tensor");
      EXPECT_EQ(backward.input_shapes, (std::vector<Shape>{Shape{world_size()}}));
      EXPECT_EQ(backward.output_shapes, (std::vector<Shape>{Shape{1}}));
      const Tensor y = Tensor::ones({world_size()}, DType::Int64);
      EXPECT_EQ(execute(backward, {y})[0].sizes(), (Shape{1}));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Adjoint, AdjointLaws, ::testing::ValuesIn(kWorldSizes), world_name);

// The adjoint is issued where the forward was: it keeps the forward's call site (which operator==
// leaves out, so the laws above cannot see it).
TEST(Tracing, AdjointKeepsTheCallSiteOfTheForward) {
  OpRecord forward;
  forward.op = "all_reduce";
  forward.reduce_op = ReduceOp(ReduceOp::Kind::Sum);
  forward.ranks = {0, 1};
  forward.group_size = 2;
  forward.input_shapes = {{2}};
  forward.dtype = DType::Float32;
  forward.output_shapes = {{2}};
  forward.site = CallSite("model.cpp", 42, "backward_pass");
  const OpRecord backward = adjoint(forward);
  EXPECT_STREQ(backward.site.file_name(), "model.cpp");
  EXPECT_EQ(backward.site.line(), 42);
  EXPECT_STREQ(backward.site.function_name(), "backward_pass");
}

}  // namespace
}  // namespace chorus
