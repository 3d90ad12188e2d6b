#include "battery/cases.hpp"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "chorus/check.hpp"

namespace chorus::props::families {
namespace {

std::uint64_t splitmix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<int> divisors(int n) {
  std::vector<int> result;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) {
      result.push_back(d);
    }
  }
  return result;
}

// Inclusive range of exact input values for an op and dtype (Note [Exact inputs]).
struct Range {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
};

Range value_range(DType dtype, ReduceOp::Kind op, int group_size) {
  if (dtype == DType::Bool) {
    return {0, 1};
  }
  const bool is_unsigned = dtype == DType::UInt8;
  switch (op) {
    case ReduceOp::Kind::Product:
      if (dtype == DType::Int8 || is_unsigned || group_size > 8) {
        return {is_unsigned ? 0 : -1, 1};
      }
      return {-2, 2};
    case ReduceOp::Kind::BAnd:
    case ReduceOp::Kind::BOr:
    case ReduceOp::Kind::BXor:
      return is_unsigned ? Range{0, 15} : Range{-8, 7};
    case ReduceOp::Kind::Min:
    case ReduceOp::Kind::Max:
      return is_unsigned ? Range{0, 8} : Range{-4, 4};
    default:
      return is_unsigned ? Range{0, 4} : Range{-4, 4};
  }
}

std::int64_t exact_value(std::uint64_t data_seed, int rank, std::int64_t index, int part,
                         Range range) {
  const std::uint64_t h =
      splitmix(splitmix(data_seed ^ (static_cast<std::uint64_t>(rank) << 40)) +
               static_cast<std::uint64_t>(index) * 2 + static_cast<std::uint64_t>(part));
  const auto width = static_cast<std::uint64_t>(range.hi - range.lo + 1);
  return range.lo + static_cast<std::int64_t>(h % width);
}

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (const std::int64_t size : shape) {
    n *= size;
  }
  return n;
}

// Two's-complement wrap of an int64 to the integer dtype (chorus's integer arithmetic).
std::int64_t wrap(std::int64_t value, DType dtype) {
  switch (dtype) {
    case DType::UInt8:
      return static_cast<std::uint8_t>(value);
    case DType::Int8:
      return static_cast<std::int8_t>(value);
    case DType::Int32:
      return static_cast<std::int32_t>(value);
    default:
      return value;
  }
}

Tensor from_integers(const std::vector<std::int64_t>& values, const Shape& shape, DType dtype) {
  if (dtype == DType::Bool) {
    std::vector<bool> bits;
    bits.reserve(values.size());
    for (const std::int64_t v : values) {
      bits.push_back(v != 0);
    }
    return Tensor::from_vector(bits, shape);
  }
  return Tensor::from_vector(values, shape).to(dtype);
}

template <class T, class Fold, class Finish>
std::vector<T> fold_members(const std::vector<std::vector<T>>& inputs, Fold&& fold,
                            Finish&& finish) {
  std::vector<T> result = inputs.front();
  for (std::size_t m = 1; m < inputs.size(); ++m) {
    for (std::size_t i = 0; i < result.size(); ++i) {
      result[i] = fold(result[i], inputs[m][i]);
    }
  }
  for (T& value : result) {
    value = finish(value);
  }
  return result;
}

}  // namespace

int index_of(const std::vector<int>& members, int rank) {
  const auto found = std::find(members.begin(), members.end(), rank);
  return found == members.end() ? -1 : static_cast<int>(found - members.begin());
}

// ---- Layouts

GroupSpec Layout::spec() const {
  switch (kind) {
    case Kind::World:
    case Kind::Subset:
      return GroupSpec(lists.front());
    case Kind::Lists:
      return GroupSpec(lists);
    case Kind::Mesh:
      return GroupSpec(MeshDim{DeviceMesh(mesh_shape, mesh_ranks), mesh_dim});
    case Kind::Tagged:
      return GroupSpec(new_group(lists.front(), std::string(kLayoutTag)));
    case Kind::Mesh1D:
      return GroupSpec(
          DeviceMesh({static_cast<std::int64_t>(lists.front().size())}, lists.front()));
  }
  return GroupSpec(lists.front());
}

const std::vector<int>* Layout::members_of(int rank) const {
  for (const std::vector<int>& list : lists) {
    if (std::find(list.begin(), list.end(), rank) != list.end()) {
      return &list;
    }
  }
  return nullptr;
}

void showValue(const Layout& layout, std::ostream& out) {
  const auto list_text = [&](const std::vector<int>& list) {
    out << "[";
    for (std::size_t i = 0; i < list.size(); ++i) {
      out << (i == 0 ? "" : ", ") << list[i];
    }
    out << "]";
  };
  switch (layout.kind) {
    case Layout::Kind::World:
      out << "world ";
      list_text(layout.lists.front());
      return;
    case Layout::Kind::Subset:
      out << "ranks ";
      list_text(layout.lists.front());
      return;
    case Layout::Kind::Lists:
      out << "2-D lists [";
      for (std::size_t i = 0; i < layout.lists.size(); ++i) {
        out << (i == 0 ? "" : ", ");
        list_text(layout.lists[i]);
      }
      out << "]";
      return;
    case Layout::Kind::Mesh:
      out << "mesh " << shape_text(layout.mesh_shape) << " ranks ";
      list_text(layout.mesh_ranks);
      out << " dim " << layout.mesh_dim;
      return;
    case Layout::Kind::Tagged:
      out << "new_group(";
      list_text(layout.lists.front());
      out << ", '" << kLayoutTag << "')";
      return;
    case Layout::Kind::Mesh1D:
      out << "1-D mesh ";
      list_text(layout.lists.front());
      return;
  }
}

rc::Gen<std::vector<int>> gen_permutation(int n) {
  return rc::gen::exec([n] {
    std::vector<int> permutation(static_cast<std::size_t>(n));
    std::iota(permutation.begin(), permutation.end(), 0);
    // Fisher-Yates with each swap offset generated: all-zero offsets are the identity.
    for (int i = n - 1; i > 0; --i) {
      const int offset = *gen_index(i + 1);
      std::swap(permutation[static_cast<std::size_t>(i)],
                permutation[static_cast<std::size_t>(i - offset)]);
    }
    return permutation;
  });
}

namespace {

// The generated kind numbers: Layout::Kind in order, but the 2-D mesh takes two, one per dim.
constexpr int kWorld = 0;
constexpr int kSubset = 1;
constexpr int kLists = 2;
constexpr int kMeshDim0 = 3;
constexpr int kMeshDim1 = 4;
constexpr int kTagged = 5;
constexpr int kMesh1D = 6;
static_assert(kMesh1D == Layout::kKinds, "a generated kind per layout kind, and a second for Mesh");

// `count`: the subset's size (Subset, Tagged, Mesh1D), or the number of lists or mesh rows.
Layout make_layout(int world_size, int kind, const std::vector<int>& permutation, int count) {
  Layout layout;
  std::vector<int> all(static_cast<std::size_t>(world_size));
  std::iota(all.begin(), all.end(), 0);
  switch (kind) {
    case kWorld:
      layout.kind = Layout::Kind::World;
      layout.lists = {all};
      break;
    case kSubset:
    case kTagged:
    case kMesh1D:
      layout.kind = kind == kSubset   ? Layout::Kind::Subset
                    : kind == kTagged ? Layout::Kind::Tagged
                                      : Layout::Kind::Mesh1D;
      layout.lists = {std::vector<int>(permutation.begin(), permutation.begin() + count)};
      break;
    case kLists: {
      // `count` sub-lists of the permuted ranks.
      layout.kind = Layout::Kind::Lists;
      const int length = world_size / count;
      for (int l = 0; l < count; ++l) {
        layout.lists.emplace_back(permutation.begin() + l * length,
                                  permutation.begin() + (l + 1) * length);
      }
      break;
    }
    default: {
      // A 2-D mesh of the permuted ranks, `count` rows; the slices along the chosen dim.
      CHORUS_CHECK(kind == kMeshDim0 || kind == kMeshDim1);
      layout.kind = Layout::Kind::Mesh;
      layout.mesh_shape = {count, world_size / count};
      layout.mesh_ranks = permutation;
      layout.mesh_dim = kind - kMeshDim0;
      const DeviceMesh mesh(layout.mesh_shape, layout.mesh_ranks);
      for (const int r : all) {
        std::vector<int> slice = mesh.dim_ranks(layout.mesh_dim, r);
        if (std::find(layout.lists.begin(), layout.lists.end(), slice) == layout.lists.end()) {
          layout.lists.push_back(std::move(slice));
        }
      }
      break;
    }
  }
  return layout;
}

// covering: Tagged and Mesh1D hold every rank (in a generated order).
rc::Gen<Layout> gen_layout_of_kinds(int world_size, std::vector<int> kinds, bool covering) {
  return rc::gen::exec([world_size, kinds, covering] {
    const int kind = *gen_element_of(kinds);
    const std::vector<int> permutation = *gen_permutation(world_size);
    int count = 1;
    if (kind == kSubset || ((kind == kTagged || kind == kMesh1D) && !covering)) {
      count = 1 + *gen_index(world_size);
    } else if (kind == kTagged || kind == kMesh1D) {
      count = world_size;
    } else if (kind != kWorld) {
      count = *gen_element_of(divisors(world_size));
    }
    return make_layout(world_size, kind, permutation, count);
  });
}

}  // namespace

rc::Gen<Layout> gen_layout(int world_size) {
  return gen_layout_of_kinds(
      world_size, {kWorld, kSubset, kLists, kMeshDim0, kMeshDim1, kTagged, kMesh1D}, false);
}

rc::Gen<Layout> gen_covering_layout(int world_size) {
  return gen_layout_of_kinds(world_size, {kWorld, kLists, kMeshDim0, kMeshDim1, kTagged, kMesh1D},
                             true);
}

// ---- Shapes, dtypes, ops

rc::Gen<Shape> gen_shape(int dims_max) {
  return rc::gen::exec([dims_max] {
    const int dims = *rc::gen::inRange(0, dims_max + 1);
    Shape shape;
    for (int d = 0; d < dims; ++d) {
      // 1..4 mostly; 0 (an empty tensor) one time in eight.
      const int size =
          *rc::gen::weightedOneOf<int>({{7, rc::gen::inRange(1, 5)}, {1, rc::gen::just(0)}});
      shape.push_back(size);
    }
    return shape;
  });
}

rc::Gen<DType> gen_dtype() {
  return gen_element_of(std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes)));
}

void showValue(const OpDType& value, std::ostream& out) {
  out << value.op.to_string() << " on " << dtype_name(value.dtype);
}

namespace {

std::vector<ReduceOp> all_ops() {
  return {ReduceOp::Kind::Sum,       ReduceOp::Kind::Avg,        ReduceOp::Kind::Product,
          ReduceOp::Kind::Min,       ReduceOp::Kind::Max,        ReduceOp::Kind::BAnd,
          ReduceOp::Kind::BOr,       ReduceOp::Kind::BXor,       ReduceOp::premul_sum(0.5),
          ReduceOp::premul_sum(2.0), ReduceOp::premul_sum(-0.25)};
}

std::vector<OpDType> op_dtypes(bool allowed) {
  std::vector<OpDType> pairs;
  for (const ReduceOp& op : all_ops()) {
    for (const DType dtype : kAllDTypes) {
      if (op.check_dtype(dtype).empty() == allowed) {
        pairs.push_back({op, dtype});
      }
    }
  }
  return pairs;
}

}  // namespace

rc::Gen<OpDType> gen_op_dtype() { return gen_element_of(op_dtypes(true)); }
rc::Gen<OpDType> gen_disallowed_op_dtype() { return gen_element_of(op_dtypes(false)); }

// ---- Exact inputs and the reference model

Tensor exact_input(std::uint64_t data_seed, int rank, const Shape& shape, DType dtype,
                   const ReduceOp& op, int group_size) {
  const Range range = value_range(dtype, op.kind(), group_size);
  const std::int64_t n = numel_of(shape);
  if (is_complex(dtype)) {
    std::vector<std::complex<double>> values;
    for (std::int64_t i = 0; i < n; ++i) {
      values.emplace_back(static_cast<double>(exact_value(data_seed, rank, i, 0, range)),
                          static_cast<double>(exact_value(data_seed, rank, i, 1, range)));
    }
    return Tensor::from_vector(values, shape).to(dtype);
  }
  std::vector<std::int64_t> values;
  for (std::int64_t i = 0; i < n; ++i) {
    values.push_back(exact_value(data_seed, rank, i, 0, range));
  }
  if (is_floating(dtype)) {
    std::vector<double> doubles(values.begin(), values.end());
    return Tensor::from_vector(doubles, shape).to(dtype);
  }
  return from_integers(values, shape, dtype);
}

Tensor reference_reduce(std::uint64_t data_seed, const std::vector<int>& members,
                        const Shape& shape, DType dtype, const ReduceOp& op) {
  CHORUS_CHECK(!members.empty());
  const int group_size = static_cast<int>(members.size());
  const Range range = value_range(dtype, op.kind(), group_size);
  const std::int64_t n = numel_of(shape);
  const auto count = static_cast<double>(group_size);
  const double factor = op.premul_factor();
  using Kind = ReduceOp::Kind;
  if (is_complex(dtype)) {
    using C = std::complex<double>;
    std::vector<std::vector<C>> inputs;
    for (const int r : members) {
      std::vector<C> values;
      for (std::int64_t i = 0; i < n; ++i) {
        const C value(static_cast<double>(exact_value(data_seed, r, i, 0, range)),
                      static_cast<double>(exact_value(data_seed, r, i, 1, range)));
        values.push_back(op.kind() == Kind::PremulSum ? factor * value : value);
      }
      inputs.push_back(std::move(values));
    }
    const std::vector<C> result = fold_members(
        inputs, [](C a, C b) { return a + b; },
        [&](C v) { return op.kind() == Kind::Avg ? C(v.real() / count, v.imag() / count) : v; });
    return Tensor::from_vector(result, shape).to(dtype);
  }
  if (is_floating(dtype)) {
    std::vector<std::vector<double>> inputs;
    for (const int r : members) {
      std::vector<double> values;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto value = static_cast<double>(exact_value(data_seed, r, i, 0, range));
        values.push_back(op.kind() == Kind::PremulSum ? factor * value : value);
      }
      inputs.push_back(std::move(values));
    }
    const auto fold = [&](double a, double b) {
      switch (op.kind()) {
        case Kind::Product:
          return a * b;
        case Kind::Min:
          return std::min(a, b);
        case Kind::Max:
          return std::max(a, b);
        default:
          return a + b;
      }
    };
    const std::vector<double> result = fold_members(
        inputs, fold, [&](double v) { return op.kind() == Kind::Avg ? v / count : v; });
    return Tensor::from_vector(result, shape).to(dtype);
  }
  std::vector<std::vector<std::int64_t>> inputs;
  for (const int r : members) {
    std::vector<std::int64_t> values;
    for (std::int64_t i = 0; i < n; ++i) {
      values.push_back(exact_value(data_seed, r, i, 0, range));
    }
    inputs.push_back(std::move(values));
  }
  const auto fold = [&](std::int64_t a, std::int64_t b) -> std::int64_t {
    switch (op.kind()) {
      case Kind::Product:
        return wrap(a * b, dtype);
      case Kind::Min:
        return std::min(a, b);
      case Kind::Max:
        return std::max(a, b);
      case Kind::BAnd:
        return a & b;
      case Kind::BOr:
        return a | b;
      case Kind::BXor:
        return a ^ b;
      default:
        return wrap(a + b, dtype);
    }
  };
  const std::vector<std::int64_t> result =
      fold_members(inputs, fold, [&](std::int64_t v) -> std::int64_t {
        if (op.kind() == Kind::Avg) {
          return wrap(v, dtype) / static_cast<std::int64_t>(group_size);
        }
        return wrap(v, dtype);
      });
  return from_integers(result, shape, dtype);
}

// ---- Input forms (Note [Input forms])

const char* input_form_name(InputForm form) noexcept {
  switch (form) {
    case InputForm::Fresh:
      return "fresh";
    case InputForm::Offset:
      return "offset view";
    case InputForm::Strided:
      return "strided view";
  }
  return "?";
}

rc::Gen<InputForm> gen_input_form() {
  // At the nominal size: rc::gen::inRange scales its range with the size, and the runner draws
  // case i at size i * 100 / cases, so below it the last form would never be drawn.
  return rc::gen::map(rc::gen::resize(rc::kNominalSize, rc::gen::inRange(0, kInputFormCount)),
                      [](int form) { return static_cast<InputForm>(form); });
}

Tensor in_form(const Tensor& input, InputForm form) {
  CHORUS_CHECK(!input.is_pending());
  if (form == InputForm::Fresh) {
    return input;
  }
  const Shape shape = input.sizes();
  const auto dims = static_cast<std::int64_t>(shape.size());
  Tensor view;
  if (form == InputForm::Offset) {
    // Junk on either side of a contiguous run of numel elements.
    constexpr std::int64_t kJunk = 3;
    const std::int64_t n = input.numel();
    view = Tensor::full({n + 2 * kJunk}, kJunkValue, input.dtype()).narrow(0, kJunk, n).view(shape);
    CHORUS_CHECK(view.is_contiguous());
    CHORUS_CHECK_EQ(view.storage_offset(), kJunk);
  } else {
    // Element i of the view is element 2 i + 1 of its buffer (junk between), and with two dims
    // or more dims 0 and 1 are swapped in memory.
    Shape buffer_shape = shape;
    if (dims >= 2) {
      std::swap(buffer_shape[0], buffer_shape[1]);
    }
    buffer_shape.push_back(2);
    view = Tensor::full(buffer_shape, kJunkValue, input.dtype()).select(dims, 1);
    if (dims >= 2) {
      view = view.transpose(0, 1);
    }
    CHORUS_CHECK_EQ(view.storage_offset(), 1);
    if (input.numel() > 1) {
      CHORUS_CHECK(!view.is_contiguous());
    }
  }
  CHORUS_CHECK(view.sizes() == shape);
  view.copy_(input);
  return view;
}

// ---- The common case

void showValue(const ReduceCase& c, std::ostream& out) {
  out << "group ";
  showValue(c.layout, out);
  out << ", ";
  showValue(c.op, out);
  out << ", shape " << shape_text(c.shape) << ", dim/root " << c.dim << ", data seed "
      << c.data_seed << ", input " << input_form_name(c.form);
}

rc::Gen<ReduceCase> gen_reduce_case(const World& world, bool any_dtype) {
  return rc::gen::exec([world, any_dtype] {
    ReduceCase c;
    c.layout = *gen_layout(world.size);
    c.op = *gen_op_dtype();
    if (any_dtype) {
      c.op.dtype = *gen_dtype();
    }
    c.shape = *gen_shape();
    c.dim = *gen_index(c.layout.group_size());
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    c.form = *gen_input_form();
    return c;
  });
}

rc::Gen<ReduceCase> gen_scatter_case(const World& world) {
  return rc::gen::exec([world] {
    ReduceCase c;
    c.layout = *gen_layout(world.size);
    c.op = *gen_op_dtype();
    c.shape = *gen_shape(3);
    if (c.shape.empty()) {
      c.shape.push_back(1);
    }
    const auto dims = static_cast<std::int64_t>(c.shape.size());
    const std::int64_t dim = *rc::gen::inRange<std::int64_t>(0, dims);
    c.shape[static_cast<std::size_t>(dim)] = *gen_multiple<std::int64_t>(c.layout.group_size());
    c.dim = !*gen_flag() ? dim - dims : dim;
    c.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    c.form = *gen_input_form();
    return c;
  });
}

std::int64_t normalized_dim(std::int64_t dim, const Shape& shape) {
  return dim < 0 ? dim + static_cast<std::int64_t>(shape.size()) : dim;
}

}  // namespace chorus::props::families
