// OpRecord as plain data: formatting, equality, JSON, and the desync check (compare_traces).
// Nothing here touches a rank, a transport or the runtime: every function is pure.

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/group.hpp"
#include "chorus/trace.hpp"
#include "detail/format.hpp"

namespace chorus {
namespace {

// The op names a record may carry (the list in the OpRecord::op comment).
constexpr std::array<std::string_view, 13> kKnownOps = {
    "all_reduce",
    "all_gather_tensor",
    "reduce_scatter_tensor",
    "all_reduce_coalesced",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "permute_tensor",
    "all_reduce_inplace",
    "all_gather_tensor_inplace",
    "reduce_scatter_tensor_inplace",
};

constexpr std::string_view kAllToAllSingle = "all_to_all_single";

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) {
      out += separator;
    }
    out += parts[i];
  }
  return out;
}

// ---- Formatting.

// "[0, 1]", "'tag' [0, 1]", or for an MPMD list "[[0, 1], [2, 3]]". A group_size that does not
// split `ranks` into equal sub-lists (only a hand-written record has one) is spelled out, so two
// groups that differ only there still print differently.
std::string group_text(const std::string& tag, const std::vector<int>& ranks, int group_size) {
  std::string out;
  if (!tag.empty()) {
    out += "'" + tag + "' ";
  }
  const std::size_t count = ranks.size();
  const bool splits_evenly = group_size > 0 && count % static_cast<std::size_t>(group_size) == 0;
  if (splits_evenly && static_cast<std::size_t>(group_size) < count) {
    const auto size = static_cast<std::size_t>(group_size);
    std::vector<std::string> lists;
    for (std::size_t start = 0; start < count; start += size) {
      lists.push_back(detail::bracketed(
          std::vector<int>(ranks.begin() + static_cast<std::ptrdiff_t>(start),
                           ranks.begin() + static_cast<std::ptrdiff_t>(start + size))));
    }
    return out + "[" + join(lists, ", ") + "]";
  }
  out += detail::bracketed(ranks);
  if (!splits_evenly || static_cast<std::size_t>(group_size) != count) {
    out += " (group_size " + std::to_string(group_size) + ")";
  }
  return out;
}

std::string group_text(const OpRecord& record) {
  return group_text(record.tag, record.ranks, record.group_size);
}

// The canonical quiet NaN and its negation print as "nan" / "-nan"; any other NaN payload as
// "nan(0x<its 64 bits>)", because ReduceOp compares factors by bit pattern and JSON must
// round-trip them.
constexpr std::uint64_t kQuietNanBits = 0x7ff8000000000000ULL;
constexpr std::uint64_t kSignBit = 0x8000000000000000ULL;

// The shortest text that reads back to exactly `value` ("0.1", "-0", "1e+300", "inf", "nan").
std::string double_text(double value) {
  if (std::isnan(value)) {
    const auto bits = std::bit_cast<std::uint64_t>(value);
    if (bits == kQuietNanBits) {
      return "nan";
    }
    if (bits == (kQuietNanBits | kSignBit)) {
      return "-nan";
    }
    std::array<char, 16> hex{};
    const auto result = std::to_chars(hex.data(), hex.data() + hex.size(), bits, 16);
    CHORUS_CHECK(result.ec == std::errc());
    return "nan(0x" + std::string(hex.data(), result.ptr) + ")";
  }
  if (std::isinf(value)) {
    return value > 0 ? "inf" : "-inf";
  }
  std::array<char, 32> buffer{};
  const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  CHORUS_CHECK(result.ec == std::errc());
  return std::string(buffer.data(), result.ptr);
}

// "sum", "premul_sum(0.1)". As ReduceOp::to_string, the factor is exact, so two factors that
// compare unequal never print the same; unlike it, a NaN factor prints its payload.
std::string reduce_op_text(const ReduceOp& reduce_op) {
  if (reduce_op.kind() == ReduceOp::Kind::PremulSum) {
    return "premul_sum(" + double_text(reduce_op.premul_factor()) + ")";
  }
  return reduce_op.to_string();
}

std::string reduce_op_text(const std::optional<ReduceOp>& reduce_op) {
  return reduce_op.has_value() ? reduce_op_text(*reduce_op) : "none";
}

// The input shapes as compared: "[2, 3], [4]". For all_to_all_single dim 0 is not compared (each
// rank sends its own amount), so it prints as '*'.
std::string shapes_text(const std::vector<Shape>& shapes, bool ignore_dim0) {
  if (shapes.empty()) {
    return "no inputs";
  }
  std::vector<std::string> parts;
  for (const Shape& shape : shapes) {
    if (!ignore_dim0 || shape.empty()) {
      parts.push_back(detail::bracketed(shape));
      continue;
    }
    std::string text = "[*";
    for (std::size_t d = 1; d < shape.size(); ++d) {
      text += ", " + std::to_string(shape[d]);
    }
    parts.push_back(text + "]");
  }
  return join(parts, ", ");
}

// The name the dims are passed under: gather_dim(s) / scatter_dim(s) / dims.
std::string dims_text(const OpRecord& record) {
  std::string_view base = "dim";
  if (record.op.find("gather") != std::string::npos) {
    base = "gather_dim";
  } else if (record.op.find("scatter") != std::string::npos) {
    base = "scatter_dim";
  }
  if (base != "dim" && record.dims.size() == 1 && !ends_with(record.op, "_coalesced")) {
    return std::string(base) + "=" + std::to_string(record.dims[0]);
  }
  return std::string(base) + "s=" + detail::bracketed(record.dims);
}

// ---- compare_traces helpers.

// The divergent fields in the order they are checked; at one (rank, index) the first one wins.
constexpr std::array<std::string_view, 10> kFieldOrder = {
    "op",  "reduce_op", "dtype", "input_shapes", "dims",
    "src", "src_dst",   "group", "splits",       "missing",
};

std::size_t field_rank(std::string_view field) {
  const auto* found = std::find(kFieldOrder.begin(), kFieldOrder.end(), field);
  CHORUS_CHECK(found != kFieldOrder.end());
  return static_cast<std::size_t>(found - kFieldOrder.begin());
}

struct FieldDifference {
  std::string field;
  std::string expected;
  std::string actual;
};

// "[Float32, Float64]": every input's dtype.
std::string dtypes_text(const OpRecord& record) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < record.input_shapes.size(); ++i) {
    names.emplace_back(dtype_name(record.input_dtype(i)));
  }
  return "[" + join(names, ", ") + "]";
}

bool same_input_shapes(const OpRecord& a, const OpRecord& b) {
  if (a.op != kAllToAllSingle) {
    return a.input_shapes == b.input_shapes;
  }
  if (a.input_shapes.size() != b.input_shapes.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.input_shapes.size(); ++i) {
    const Shape& x = a.input_shapes[i];
    const Shape& y = b.input_shapes[i];
    if (x.size() != y.size() ||
        !std::equal(x.begin() + (x.empty() ? 0 : 1), x.end(), y.begin() + (y.empty() ? 0 : 1))) {
      return false;
    }
  }
  return true;
}

// The first field (in kFieldOrder) where `actual` disagrees with `reference`, splits excepted
// (they relate pairs of ranks, not a rank and the reference).
std::optional<FieldDifference> first_difference(const OpRecord& reference, const OpRecord& actual) {
  if (reference.op != actual.op) {
    return FieldDifference{"op", reference.op, actual.op};
  }
  if (reference.reduce_op != actual.reduce_op) {
    return FieldDifference{"reduce_op", reduce_op_text(reference.reduce_op),
                           reduce_op_text(actual.reduce_op)};
  }
  if (reference.dtype != actual.dtype) {
    return FieldDifference{"dtype", std::string(dtype_name(reference.dtype)),
                           std::string(dtype_name(actual.dtype))};
  }
  if (reference.input_dtypes != actual.input_dtypes) {
    return FieldDifference{"dtype", dtypes_text(reference), dtypes_text(actual)};
  }
  if (!same_input_shapes(reference, actual)) {
    const bool ignore_dim0 = reference.op == kAllToAllSingle;
    return FieldDifference{"input_shapes", shapes_text(reference.input_shapes, ignore_dim0),
                           shapes_text(actual.input_shapes, ignore_dim0)};
  }
  if (reference.dims != actual.dims) {
    return FieldDifference{"dims", detail::bracketed(reference.dims),
                           detail::bracketed(actual.dims)};
  }
  if (reference.src != actual.src) {
    return FieldDifference{"src", std::to_string(reference.src), std::to_string(actual.src)};
  }
  if (reference.src_dst != actual.src_dst) {
    return FieldDifference{"src_dst", detail::bracketed(reference.src_dst),
                           detail::bracketed(actual.src_dst)};
  }
  if (reference.tag != actual.tag || reference.ranks != actual.ranks ||
      reference.group_size != actual.group_size) {
    return FieldDifference{"group", group_text(reference), group_text(actual)};
  }
  return std::nullopt;
}

// The split sizes all_to_all_single used: as passed, or the equal split of input dim 0.
std::vector<std::int64_t> effective_splits(const OpRecord& record,
                                           const std::optional<std::vector<std::int64_t>>& passed,
                                           std::size_t group_size) {
  if (passed.has_value()) {
    return *passed;
  }
  CHORUS_CHECK_GT(group_size, 0u);
  std::int64_t dim0 = 0;
  if (!record.input_shapes.empty() && !record.input_shapes[0].empty()) {
    dim0 = record.input_shapes[0][0];
  }
  return std::vector<std::int64_t>(group_size, dim0 / static_cast<std::int64_t>(group_size));
}

std::string split_text(std::string_view list, std::size_t index, std::int64_t value) {
  return std::string(list) + "[" + std::to_string(index) + "]=" + std::to_string(value);
}

// Collects divergences and keeps the one with the smallest (rank, index), then field order.
class Verdict {
 public:
  void consider(TraceDivergence candidate) {
    if (!best_.has_value() || key(candidate) < key(*best_)) {
      best_ = std::move(candidate);
    }
  }
  std::optional<TraceDivergence> take() { return std::move(best_); }

 private:
  static std::tuple<int, std::size_t, std::size_t> key(const TraceDivergence& divergence) {
    return {divergence.rank, divergence.index, field_rank(divergence.field)};
  }
  std::optional<TraceDivergence> best_;
};

// A communicator as compare_traces sees it: the tag and the issuing rank's sub-list.
// Meta records (shapes only) never communicated: they are matched among themselves, so a meta
// record on one rank never stands in for a peer's real one (that program would hang).
struct CommunicatorKey {
  bool meta = false;
  std::string tag;
  std::vector<int> members;
  friend auto operator<=>(const CommunicatorKey&, const CommunicatorKey&) = default;
};
// For each member rank, the indices (into its trace) of its records on that communicator.
using Sequences = std::map<int, std::vector<std::size_t>>;

// Checks one match position of an all_to_all_single on every member pair (i, j): i's input
// split j must equal j's output split i. Either side may be the wrong one, so a pair is reported
// on its higher group rank with the lower one as the reference (for i == j, a rank's own chunk,
// the rank is its own reference).
void check_splits(const std::vector<int>& members, const std::vector<const OpRecord*>& records,
                  const std::vector<std::size_t>& indices, Verdict& verdict) {
  const std::size_t size = members.size();
  CHORUS_CHECK_EQ(records.size(), size);
  CHORUS_CHECK_EQ(indices.size(), size);
  std::vector<std::vector<std::int64_t>> inputs;
  std::vector<std::vector<std::int64_t>> outputs;
  for (std::size_t m = 0; m < size; ++m) {
    inputs.push_back(effective_splits(*records[m], records[m]->input_split_sizes, size));
    outputs.push_back(effective_splits(*records[m], records[m]->output_split_sizes, size));
  }
  for (std::size_t m = 0; m < size; ++m) {
    // A list of the wrong length cannot be paired up: reported against the group's size, with
    // no peer to name.
    for (const auto* list : {&inputs[m], &outputs[m]}) {
      if (list->size() != size) {
        verdict.consider(TraceDivergence{members[m], indices[m], "splits",
                                         std::to_string(size) + " sizes (one per member)",
                                         detail::bracketed(*list), -1, 0});
      }
    }
  }
  for (std::size_t i = 0; i < size; ++i) {
    for (std::size_t j = 0; j < size; ++j) {
      if (inputs[i].size() != size || outputs[j].size() != size) {
        continue;
      }
      const std::int64_t sent = inputs[i][j];
      const std::int64_t received = outputs[j][i];
      if (sent == received) {
        continue;
      }
      const std::string sent_text = split_text("input_split_sizes", j, sent);
      const std::string received_text = split_text("output_split_sizes", i, received);
      const std::size_t low = std::min(i, j);
      const std::size_t high = std::max(i, j);
      // The reference (lower) side's value is the expected one; for i == j, the input split.
      const bool sender_is_reference = i <= j;
      verdict.consider(TraceDivergence{
          members[high], indices[high], "splits", sender_is_reference ? sent_text : received_text,
          sender_is_reference ? received_text : sent_text, members[low], indices[low]});
    }
  }
}

void check_communicator(const std::vector<std::vector<OpRecord>>& traces,
                        const std::vector<int>& members, const Sequences& sequences,
                        Verdict& verdict) {
  CHORUS_CHECK(!members.empty());
  const int reference = *std::min_element(members.begin(), members.end());
  const std::vector<std::size_t> no_records;
  const auto sequence_of = [&](int rank) -> const std::vector<std::size_t>& {
    const auto found = sequences.find(rank);
    return found == sequences.end() ? no_records : found->second;
  };
  const auto trace_length = [&](int rank) -> std::size_t {
    const bool known = rank >= 0 && static_cast<std::size_t>(rank) < traces.size();
    return known ? traces[static_cast<std::size_t>(rank)].size() : 0;
  };
  const auto record_at = [&](int rank, std::size_t index) -> const OpRecord& {
    CHORUS_CHECK_LT(index, trace_length(rank));
    return traces[static_cast<std::size_t>(rank)][index];
  };
  const std::vector<std::size_t>& reference_sequence = sequence_of(reference);

  std::size_t common = reference_sequence.size();
  for (const int member : members) {
    common = std::min(common, sequence_of(member).size());
    if (member == reference) {
      continue;
    }
    const std::vector<std::size_t>& sequence = sequence_of(member);
    const std::size_t shared = std::min(sequence.size(), reference_sequence.size());
    for (std::size_t k = 0; k < shared; ++k) {
      const OpRecord& expected = record_at(reference, reference_sequence[k]);
      const OpRecord& actual = record_at(member, sequence[k]);
      if (auto difference = first_difference(expected, actual)) {
        verdict.consider(TraceDivergence{
            member, sequence[k], std::move(difference->field), std::move(difference->expected),
            std::move(difference->actual), reference, reference_sequence[k]});
      }
    }
    // The shorter of the two lacks the record the longer one has at position `shared`.
    if (sequence.size() < reference_sequence.size()) {
      verdict.consider(TraceDivergence{member, trace_length(member), "missing",
                                       record_at(reference, reference_sequence[shared]).to_string(),
                                       "<none>", reference, reference_sequence[shared]});
    } else if (sequence.size() > reference_sequence.size()) {
      verdict.consider(TraceDivergence{reference, trace_length(reference), "missing",
                                       record_at(member, sequence[shared]).to_string(), "<none>",
                                       member, sequence[shared]});
    }
  }

  // Splits relate every pair of members, so they are checked where all members have a record
  // and all of them are all_to_all_single (a different op is already reported above).
  for (std::size_t k = 0; k < common; ++k) {
    std::vector<const OpRecord*> records;
    std::vector<std::size_t> indices;
    for (const int member : members) {
      const std::size_t index = sequence_of(member)[k];
      records.push_back(&record_at(member, index));
      indices.push_back(index);
    }
    const bool all_to_all = std::all_of(records.begin(), records.end(),
                                        [](const OpRecord* r) { return r->op == kAllToAllSingle; });
    if (all_to_all) {
      check_splits(members, records, indices, verdict);
    }
  }
}

// ---- JSON writing.

void write_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20) {
      constexpr std::string_view kHex = "0123456789abcdef";
      out += "\\u00";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      // Other bytes (UTF-8 included) are written as they are: a tag is a byte string.
      out += c;
    }
  }
  out += '"';
}

void write_double(std::string& out, double value) {
  // Numbers stay numbers; the values JSON has no number for become strings.
  const std::string text = double_text(value);
  out += std::isfinite(value) ? text : "\"" + text + "\"";
}

template <class T>
void write_list(std::string& out, const std::vector<T>& values) {
  out += '[';
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) {
      out += ", ";
    }
    out += std::to_string(values[i]);
  }
  out += ']';
}

void write_shapes(std::string& out, const std::vector<Shape>& shapes) {
  out += '[';
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    if (i > 0) {
      out += ", ";
    }
    write_list(out, shapes[i]);
  }
  out += ']';
}

void write_optional_list(std::string& out, const std::optional<std::vector<std::int64_t>>& values) {
  if (values.has_value()) {
    write_list(out, *values);
  } else {
    out += "null";
  }
}

void write_record(std::string& out, const OpRecord& record) {
  const auto key = [&](std::string_view name) {
    if (out.back() != '{') {
      out += ", ";
    }
    write_string(out, name);
    out += ": ";
  };
  out += '{';
  key("op");
  write_string(out, record.op);
  key("reduce_op");
  if (!record.reduce_op.has_value()) {
    out += "null";
  } else if (!record.reduce_op->is_valid()) {
    // Written as recorded; reading it back reports the unknown name.
    write_string(out, record.reduce_op->invalid_name());
  } else {
    write_string(out, reduce_kind_name(record.reduce_op->kind()));
    if (record.reduce_op->kind() == ReduceOp::Kind::PremulSum) {
      key("premul_factor");
      write_double(out, record.reduce_op->premul_factor());
    }
  }
  key("tag");
  write_string(out, record.tag);
  key("ranks");
  write_list(out, record.ranks);
  key("group_size");
  out += std::to_string(record.group_size);
  key("input_shapes");
  write_shapes(out, record.input_shapes);
  key("dtype");
  write_string(out, dtype_name(record.dtype));
  if (!record.input_dtypes.empty()) {
    key("input_dtypes");
    out += '[';
    for (std::size_t i = 0; i < record.input_dtypes.size(); ++i) {
      out += i > 0 ? ", " : "";
      write_string(out, dtype_name(record.input_dtypes[i]));
    }
    out += ']';
  }
  key("dims");
  write_list(out, record.dims);
  key("output_split_sizes");
  write_optional_list(out, record.output_split_sizes);
  key("input_split_sizes");
  write_optional_list(out, record.input_split_sizes);
  key("src");
  out += std::to_string(record.src);
  key("src_dst");
  write_list(out, record.src_dst);
  key("rank");
  out += std::to_string(record.rank);
  key("seq");
  out += std::to_string(record.seq);
  key("output_shapes");
  write_shapes(out, record.output_shapes);
  key("meta");
  out += record.meta ? "true" : "false";
  out += '}';
}

// ---- JSON parsing: a strict recursive-descent parser into a small tree (each value keeps its
// offset for error messages), then a schema pass that turns the tree into records.

// Deeper nesting than this is refused (records need 4 levels), so a hostile input cannot
// exhaust the stack.
constexpr int kMaxJsonDepth = 32;

[[noreturn]] void fail_at(std::size_t offset, const std::string& what) {
  throw InvalidArgument(ErrorContext{-1, "from_json", -1, ""},
                        "at offset " + std::to_string(offset) + ": " + what);
}

struct JsonMember;

struct JsonValue {
  enum class Kind : std::uint8_t { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  std::size_t offset = 0;
  bool boolean = false;
  std::string text;  // the string's value, or the number as written
  std::vector<JsonValue> items;
  std::vector<JsonMember> members;  // in the order written
};

struct JsonMember {
  std::string key;
  std::size_t key_offset = 0;
  JsonValue value;
};

std::string describe_kind(const JsonValue& value) {
  switch (value.kind) {
    case JsonValue::Kind::Null:
      return "null";
    case JsonValue::Kind::Bool:
      return value.boolean ? "true" : "false";
    case JsonValue::Kind::Number:
      return "the number " + value.text;
    case JsonValue::Kind::String:
      return "a string";
    case JsonValue::Kind::Array:
      return "an array";
    case JsonValue::Kind::Object:
      return "an object";
  }
  return "a value";
}

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : text_(text) {}

  JsonValue parse_document() {
    skip_whitespace();
    JsonValue value = parse_value(0);
    skip_whitespace();
    if (position_ != text_.size()) {
      fail("the end of input after the top-level value");
    }
    return value;
  }

 private:
  std::string found() const {
    if (position_ >= text_.size()) {
      return "the end of input";
    }
    const auto byte = static_cast<unsigned char>(text_[position_]);
    if (byte >= 0x20 && byte < 0x7f) {
      return "'" + std::string(1, text_[position_]) + "'";
    }
    constexpr std::string_view kHex = "0123456789abcdef";
    return std::string("byte 0x") + kHex[byte >> 4] + kHex[byte & 0xf];
  }

  [[noreturn]] void fail(std::string_view expected) const {
    fail_at(position_, "expected " + std::string(expected) + ", found " + found());
  }

  bool at_end() const { return position_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[position_]; }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) {
      ++position_;
    }
  }

  void expect_literal(std::string_view literal) {
    for (const char c : literal) {
      if (peek() != c || at_end()) {
        fail("'" + std::string(literal) + "'");
      }
      ++position_;
    }
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxJsonDepth) {
      fail_at(position_, "values nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    JsonValue value;
    value.offset = position_;
    switch (peek()) {
      case '[':
        value.kind = JsonValue::Kind::Array;
        parse_array(value, depth);
        return value;
      case '{':
        value.kind = JsonValue::Kind::Object;
        parse_object(value, depth);
        return value;
      case '"':
        value.kind = JsonValue::Kind::String;
        value.text = parse_string();
        return value;
      case 't':
        value.kind = JsonValue::Kind::Bool;
        value.boolean = true;
        expect_literal("true");
        return value;
      case 'f':
        value.kind = JsonValue::Kind::Bool;
        expect_literal("false");
        return value;
      case 'n':
        expect_literal("null");
        return value;
      default:
        if (!at_end() && (peek() == '-' || (peek() >= '0' && peek() <= '9'))) {
          value.kind = JsonValue::Kind::Number;
          value.text = parse_number();
          return value;
        }
        fail("a value");
    }
  }

  void parse_array(JsonValue& array, int depth) {
    ++position_;  // '['
    skip_whitespace();
    if (peek() == ']' && !at_end()) {
      ++position_;
      return;
    }
    while (true) {
      skip_whitespace();
      array.items.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (!at_end() && peek() == ',') {
        ++position_;
        continue;
      }
      if (!at_end() && peek() == ']') {
        ++position_;
        return;
      }
      fail("',' or ']' after an array element");
    }
  }

  void parse_object(JsonValue& object, int depth) {
    ++position_;  // '{'
    skip_whitespace();
    if (peek() == '}' && !at_end()) {
      ++position_;
      return;
    }
    while (true) {
      skip_whitespace();
      if (peek() != '"' || at_end()) {
        fail("a string key");
      }
      const std::size_t key_offset = position_;
      std::string key = parse_string();
      for (const JsonMember& member : object.members) {
        if (member.key == key) {
          fail_at(key_offset, "duplicate key \"" + key + "\"");
        }
      }
      skip_whitespace();
      if (peek() != ':' || at_end()) {
        fail("':' after an object key");
      }
      ++position_;
      skip_whitespace();
      object.members.push_back(JsonMember{std::move(key), key_offset, parse_value(depth + 1)});
      skip_whitespace();
      if (!at_end() && peek() == ',') {
        ++position_;
        continue;
      }
      if (!at_end() && peek() == '}') {
        ++position_;
        return;
      }
      fail("',' or '}' after an object member");
    }
  }

  unsigned parse_hex4() {
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = peek();
      const bool decimal = c >= '0' && c <= '9';
      const char lower = static_cast<char>(c | 0x20);  // 'A'-'F' -> 'a'-'f'
      if (at_end() || !(decimal || (lower >= 'a' && lower <= 'f'))) {
        fail("4 hex digits after \\u");
      }
      code = code * 16 + static_cast<unsigned>(decimal ? c - '0' : lower - 'a' + 10);
      ++position_;
    }
    return code;
  }

  static void append_utf8(std::string& out, std::uint32_t code) {
    CHORUS_CHECK_LE(code, 0x10ffffu);
    const auto byte = [](std::uint32_t bits) { return static_cast<char>(bits); };
    if (code < 0x80) {
      out += byte(code);
    } else if (code < 0x800) {
      out += byte(0xc0 | (code >> 6));
      out += byte(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      out += byte(0xe0 | (code >> 12));
      out += byte(0x80 | ((code >> 6) & 0x3f));
      out += byte(0x80 | (code & 0x3f));
    } else {
      out += byte(0xf0 | (code >> 18));
      out += byte(0x80 | ((code >> 12) & 0x3f));
      out += byte(0x80 | ((code >> 6) & 0x3f));
      out += byte(0x80 | (code & 0x3f));
    }
  }

  std::string parse_string() {
    CHORUS_CHECK_EQ(peek(), '"');
    ++position_;
    std::string out;
    while (true) {
      if (at_end()) {
        fail("'\"' to close the string");
      }
      const char c = text_[position_];
      if (c == '"') {
        ++position_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        fail("an escape (\\u00XX) for a control character in a string");
      }
      if (c != '\\') {
        out += c;
        ++position_;
        continue;
      }
      ++position_;
      const char escape = peek();
      if (at_end()) {
        fail("an escape character after '\\'");
      }
      ++position_;
      switch (escape) {
        case '"':
        case '\\':
        case '/':
          out += escape;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          append_utf8(out, parse_code_point());
          break;
        default:
          --position_;
          fail("one of \" \\ / b f n r t u after '\\'");
      }
    }
  }

  // After "\u": one code point, joining a UTF-16 surrogate pair.
  std::uint32_t parse_code_point() {
    const std::size_t start = position_ - 2;
    const unsigned high = parse_hex4();
    if (high >= 0xdc00 && high <= 0xdfff) {
      fail_at(start, "a low surrogate \\u" + hex4(high) + " without a high surrogate before it");
    }
    if (high < 0xd800 || high > 0xdbff) {
      return high;
    }
    if (peek() != '\\' || position_ + 1 >= text_.size() || text_[position_ + 1] != 'u') {
      fail("a low surrogate (\\uDC00-\\uDFFF) after the high surrogate \\u" + hex4(high));
    }
    position_ += 2;
    const std::size_t low_start = position_;
    const unsigned low = parse_hex4();
    if (low < 0xdc00 || low > 0xdfff) {
      position_ = low_start;
      fail("a low surrogate (\\uDC00-\\uDFFF) after the high surrogate \\u" + hex4(high));
    }
    return 0x10000u + ((high - 0xd800u) << 10) + (low - 0xdc00u);
  }

  static std::string hex4(unsigned code) {
    std::array<char, 8> digits{};
    const auto result = std::to_chars(digits.data(), digits.data() + digits.size(), code, 16);
    CHORUS_CHECK(result.ec == std::errc());
    std::string text(digits.data(), result.ptr);
    return std::string(4 - std::min<std::size_t>(4, text.size()), '0') + text;
  }

  bool digit_here() const { return !at_end() && peek() >= '0' && peek() <= '9'; }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? ; returned as written.
  std::string parse_number() {
    const std::size_t start = position_;
    if (peek() == '-') {
      ++position_;
    }
    if (!digit_here()) {
      fail("a digit after '-'");
    }
    if (peek() == '0') {
      ++position_;
      if (digit_here()) {
        fail("the end of the number after a leading 0");
      }
    } else {
      while (digit_here()) {
        ++position_;
      }
    }
    if (!at_end() && peek() == '.') {
      ++position_;
      if (!digit_here()) {
        fail("a digit after the decimal point");
      }
      while (digit_here()) {
        ++position_;
      }
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      ++position_;
      if (!at_end() && (peek() == '+' || peek() == '-')) {
        ++position_;
      }
      if (!digit_here()) {
        fail("a digit in the exponent");
      }
      while (digit_here()) {
        ++position_;
      }
    }
    return std::string(text_.substr(start, position_ - start));
  }

  std::string_view text_;
  std::size_t position_ = 0;
};

// ---- Schema: JSON tree -> records.

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DType dtype : kAllDTypes) {
    if (dtype_name(dtype) == name) {
      return dtype;
    }
  }
  return std::nullopt;
}

std::string known_names_text() {
  std::string out;
  for (const std::string_view name : kKnownOps) {
    out += out.empty() ? "" : ", ";
    out += name;
  }
  return out;
}

std::string dtype_names_text() {
  std::string out;
  for (const DType dtype : kAllDTypes) {
    out += out.empty() ? "" : ", ";
    out += dtype_name(dtype);
  }
  return out;
}

// One record's object, read field by field.
class RecordReader {
 public:
  RecordReader(const JsonValue& object, std::size_t record_index)
      : object_(object), record_index_(record_index) {
    CHORUS_CHECK(object.kind == JsonValue::Kind::Object);
  }

  // The member `name`, or null when absent (and then, when required, an error).
  const JsonValue* find(std::string_view name, bool required) const {
    for (const JsonMember& member : object_.members) {
      if (member.key == name) {
        return &member.value;
      }
    }
    if (required) {
      fail_at(object_.offset, "record " + std::to_string(record_index_) +
                                  " lacks the required field \"" + std::string(name) + "\"");
    }
    return nullptr;
  }

  const JsonValue& require(std::string_view name) const { return *find(name, true); }

  [[noreturn]] static void wrong_type(const JsonValue& value, std::string_view expected,
                                      std::string_view field) {
    fail_at(value.offset, "expected " + std::string(expected) + " for \"" + std::string(field) +
                              "\", found " + describe_kind(value));
  }

  static std::string as_string(const JsonValue& value, std::string_view field) {
    if (value.kind != JsonValue::Kind::String) {
      wrong_type(value, "a string", field);
    }
    return value.text;
  }

  template <class Int>
  static Int as_integer(const JsonValue& value, std::string_view field) {
    if (value.kind != JsonValue::Kind::Number) {
      wrong_type(value, "an integer", field);
    }
    const std::string& text = value.text;
    if (text.find_first_of(".eE") != std::string::npos) {
      wrong_type(value, "an integer", field);
    }
    Int out = 0;
    const auto result = std::from_chars(text.data(), text.data() + text.size(), out);
    if (result.ec == std::errc::result_out_of_range) {
      fail_at(value.offset, "expected an integer in [" +
                                std::to_string(std::numeric_limits<Int>::min()) + ", " +
                                std::to_string(std::numeric_limits<Int>::max()) + "] for \"" +
                                std::string(field) + "\", found " + text);
    }
    CHORUS_CHECK(result.ec == std::errc());
    CHORUS_CHECK(result.ptr == text.data() + text.size());
    return out;
  }

  template <class Int>
  static std::vector<Int> as_integer_list(const JsonValue& value, std::string_view field) {
    if (value.kind != JsonValue::Kind::Array) {
      wrong_type(value, "an array of integers", field);
    }
    std::vector<Int> out;
    out.reserve(value.items.size());
    for (const JsonValue& item : value.items) {
      out.push_back(as_integer<Int>(item, field));
    }
    return out;
  }

  static std::vector<Shape> as_shape_list(const JsonValue& value, std::string_view field) {
    if (value.kind != JsonValue::Kind::Array) {
      wrong_type(value, "an array of shapes", field);
    }
    std::vector<Shape> out;
    out.reserve(value.items.size());
    for (const JsonValue& item : value.items) {
      out.push_back(as_integer_list<std::int64_t>(item, field));
    }
    return out;
  }

  static double as_double(const JsonValue& value, std::string_view field) {
    if (value.kind == JsonValue::Kind::String) {
      return special_double(value, field);
    }
    if (value.kind != JsonValue::Kind::Number) {
      wrong_type(value, "a number or \"inf\", \"-inf\", \"nan\"", field);
    }
    const std::string& text = value.text;
    double out = 0;
    const auto result = std::from_chars(text.data(), text.data() + text.size(), out);
    if (result.ec == std::errc::result_out_of_range) {
      fail_at(value.offset, "expected a number in the range of a double for \"" +
                                std::string(field) + "\", found " + text);
    }
    CHORUS_CHECK(result.ec == std::errc());
    CHORUS_CHECK(result.ptr == text.data() + text.size());
    return out;
  }

  // "inf", "-inf", "nan", "-nan", "nan(0x<64-bit pattern>)": the forms write_double produces.
  static double special_double(const JsonValue& value, std::string_view field) {
    const std::string& text = value.text;
    if (text == "inf") {
      return std::numeric_limits<double>::infinity();
    }
    if (text == "-inf") {
      return -std::numeric_limits<double>::infinity();
    }
    if (text == "nan") {
      return std::bit_cast<double>(kQuietNanBits);
    }
    if (text == "-nan") {
      return std::bit_cast<double>(kQuietNanBits | kSignBit);
    }
    constexpr std::string_view kPrefix = "nan(0x";
    if (text.size() > kPrefix.size() + 1 && text.compare(0, kPrefix.size(), kPrefix) == 0 &&
        text.back() == ')') {
      std::uint64_t bits = 0;
      const char* first = text.data() + kPrefix.size();
      const char* last = text.data() + text.size() - 1;
      const auto result = std::from_chars(first, last, bits, 16);
      if (result.ec == std::errc() && result.ptr == last &&
          std::isnan(std::bit_cast<double>(bits))) {
        return std::bit_cast<double>(bits);
      }
    }
    fail_at(value.offset, "expected a number or \"inf\", \"-inf\", \"nan\" for \"" +
                              std::string(field) + "\", found \"" + text + "\"");
  }

 private:
  const JsonValue& object_;
  std::size_t record_index_;
};

// The keys a record object may hold. "site" is not serialised, and not accepted either: an
// unknown key is an error, so a misspelt optional key cannot pass as absent.
constexpr std::array<std::string_view, 18> kRecordFields = {
    "op",
    "reduce_op",
    "premul_factor",
    "tag",
    "ranks",
    "group_size",
    "input_shapes",
    "dtype",
    "input_dtypes",
    "dims",
    "output_split_sizes",
    "input_split_sizes",
    "src",
    "src_dst",
    "rank",
    "seq",
    "output_shapes",
    "meta",
};

OpRecord read_record(const JsonValue& value, std::size_t index) {
  if (value.kind != JsonValue::Kind::Object) {
    fail_at(value.offset, "expected an object for record " + std::to_string(index) + ", found " +
                              describe_kind(value));
  }
  for (const JsonMember& member : value.members) {
    if (std::find(kRecordFields.begin(), kRecordFields.end(), member.key) == kRecordFields.end()) {
      fail_at(member.key_offset,
              "unknown field \"" + member.key + "\" in record " + std::to_string(index));
    }
  }
  const RecordReader reader(value, index);
  OpRecord record;

  const JsonValue& op = reader.require("op");
  record.op = RecordReader::as_string(op, "op");
  if (std::find(kKnownOps.begin(), kKnownOps.end(), record.op) == kKnownOps.end()) {
    fail_at(op.offset,
            "unknown op \"" + record.op + "\" (expected one of " + known_names_text() + ")");
  }

  const JsonValue* reduce_op = reader.find("reduce_op", false);
  const JsonValue* premul_factor = reader.find("premul_factor", false);
  const bool has_reduce_op = reduce_op != nullptr && reduce_op->kind != JsonValue::Kind::Null;
  const bool has_factor = premul_factor != nullptr && premul_factor->kind != JsonValue::Kind::Null;
  if (has_reduce_op) {
    const std::string name = RecordReader::as_string(*reduce_op, "reduce_op");
    if (name == reduce_kind_name(ReduceOp::Kind::PremulSum)) {
      if (!has_factor) {
        fail_at(reduce_op->offset, "reduce_op \"premul_sum\" needs a \"premul_factor\"");
      }
      record.reduce_op =
          ReduceOp::premul_sum(RecordReader::as_double(*premul_factor, "premul_factor"));
    } else {
      ReduceOp parsed(name);
      if (!parsed.is_valid()) {
        fail_at(reduce_op->offset, "unknown reduce_op \"" + name +
                                       "\" (expected one of sum, avg, product, min, max, band, "
                                       "bor, bxor, premul_sum)");
      }
      record.reduce_op = parsed;
    }
  }
  if (has_factor &&
      !(record.reduce_op.has_value() && record.reduce_op->kind() == ReduceOp::Kind::PremulSum)) {
    fail_at(premul_factor->offset,
            "\"premul_factor\" is only allowed with reduce_op \"premul_sum\"");
  }

  record.tag = RecordReader::as_string(reader.require("tag"), "tag");
  record.ranks = RecordReader::as_integer_list<int>(reader.require("ranks"), "ranks");
  record.group_size = RecordReader::as_integer<int>(reader.require("group_size"), "group_size");
  record.input_shapes = RecordReader::as_shape_list(reader.require("input_shapes"), "input_shapes");

  const auto read_dtype = [](const JsonValue& dtype, std::string_view field) {
    const std::string dtype_text = RecordReader::as_string(dtype, field);
    const std::optional<DType> parsed_dtype = dtype_from_name(dtype_text);
    if (!parsed_dtype.has_value()) {
      fail_at(dtype.offset,
              "unknown dtype \"" + dtype_text + "\" (expected one of " + dtype_names_text() + ")");
    }
    return *parsed_dtype;
  };
  record.dtype = read_dtype(reader.require("dtype"), "dtype");
  if (const JsonValue* dtypes = reader.find("input_dtypes", false);
      dtypes != nullptr && dtypes->kind != JsonValue::Kind::Null) {
    if (dtypes->kind != JsonValue::Kind::Array) {
      RecordReader::wrong_type(*dtypes, "an array of dtype names", "input_dtypes");
    }
    for (const JsonValue& item : dtypes->items) {
      record.input_dtypes.push_back(read_dtype(item, "input_dtypes"));
    }
  }

  record.dims = RecordReader::as_integer_list<std::int64_t>(reader.require("dims"), "dims");
  const auto read_splits = [&](std::string_view name) {
    std::optional<std::vector<std::int64_t>> out;
    const JsonValue* splits = reader.find(name, false);
    if (splits != nullptr && splits->kind != JsonValue::Kind::Null) {
      out = RecordReader::as_integer_list<std::int64_t>(*splits, name);
    }
    return out;
  };
  record.output_split_sizes = read_splits("output_split_sizes");
  record.input_split_sizes = read_splits("input_split_sizes");
  record.src = RecordReader::as_integer<int>(reader.require("src"), "src");
  record.src_dst = RecordReader::as_integer_list<int>(reader.require("src_dst"), "src_dst");
  record.rank = RecordReader::as_integer<int>(reader.require("rank"), "rank");
  record.seq = RecordReader::as_integer<std::int64_t>(reader.require("seq"), "seq");
  record.output_shapes =
      RecordReader::as_shape_list(reader.require("output_shapes"), "output_shapes");
  const JsonValue& meta = reader.require("meta");
  if (meta.kind != JsonValue::Kind::Bool) {
    RecordReader::wrong_type(meta, "true or false", "meta");
  }
  record.meta = meta.boolean;
  return record;
}

}  // namespace

// ---- OpRecord.

std::string OpRecord::to_string() const {
  std::vector<std::string> arguments;
  for (const Shape& shape : input_shapes) {
    arguments.push_back(std::string(dtype_name(input_dtype(arguments.size()))) + " " +
                        detail::bracketed(shape));
  }
  if (reduce_op.has_value()) {
    arguments.push_back(reduce_op_text(*reduce_op));
  }
  if (!dims.empty()) {
    arguments.push_back(dims_text(*this));
  }
  if (output_split_sizes.has_value()) {
    arguments.push_back("output_split_sizes=" + detail::bracketed(*output_split_sizes));
  }
  if (input_split_sizes.has_value()) {
    arguments.push_back("input_split_sizes=" + detail::bracketed(*input_split_sizes));
  }
  if (src >= 0) {
    // The reduce API calls it the destination.
    arguments.push_back((op == "reduce" ? "dst=" : "src=") + std::to_string(src));
  }
  if (!src_dst.empty()) {
    arguments.push_back("src_dst=" + detail::bracketed(src_dst));
  }
  std::string out = op + "(" + join(arguments, ", ") + ") on " + group_text(*this);
  if (meta) {
    out += " (meta)";
  }
  return out;
}

bool operator==(const OpRecord& a, const OpRecord& b) {
  // `site` is left out on purpose: a run and its replay issue from different lines.
  return a.op == b.op && a.reduce_op == b.reduce_op && a.tag == b.tag && a.ranks == b.ranks &&
         a.group_size == b.group_size && a.input_shapes == b.input_shapes && a.dtype == b.dtype &&
         a.input_dtypes == b.input_dtypes && a.dims == b.dims &&
         a.output_split_sizes == b.output_split_sizes &&
         a.input_split_sizes == b.input_split_sizes && a.src == b.src && a.src_dst == b.src_dst &&
         a.rank == b.rank && a.seq == b.seq && a.output_shapes == b.output_shapes &&
         a.meta == b.meta;
}

// ---- JSON.

std::string to_json(const std::vector<OpRecord>& records) {
  if (records.empty()) {
    return "[]";
  }
  // One record per line, so traces diff line by line.
  std::string out = "[\n";
  for (std::size_t i = 0; i < records.size(); ++i) {
    out += "  ";
    write_record(out, records[i]);
    out += i + 1 < records.size() ? ",\n" : "\n";
  }
  out += "]";
  return out;
}

std::vector<OpRecord> from_json(std::string_view json) {
  const JsonValue document = JsonParser(json).parse_document();
  if (document.kind != JsonValue::Kind::Array) {
    fail_at(document.offset, "expected an array of records, found " + describe_kind(document));
  }
  std::vector<OpRecord> records;
  records.reserve(document.items.size());
  for (std::size_t i = 0; i < document.items.size(); ++i) {
    records.push_back(read_record(document.items[i], i));
  }
  return records;
}

// ---- Desync check.

std::string TraceDivergence::to_string() const {
  std::string out = "rank " + std::to_string(rank) + ", record " + std::to_string(index) + ": ";
  if (field == "missing") {
    out += "no record where rank " + std::to_string(reference_rank) + " record " +
           std::to_string(reference_index) + " has '" + expected + "'";
    return out;
  }
  out += field + " is '" + actual + "', ";
  if (reference_rank >= 0) {
    out += "rank " + std::to_string(reference_rank) + " record " + std::to_string(reference_index) +
           " has '" + expected + "'";
  } else {
    out += "expected '" + expected + "'";
  }
  return out;
}

std::optional<TraceDivergence> compare_traces(const std::vector<std::vector<OpRecord>>& traces) {
  std::map<CommunicatorKey, Sequences> communicators;
  Verdict verdict;
  for (std::size_t position = 0; position < traces.size(); ++position) {
    // The position in `traces` is the issuing rank; the record's own `rank` field is ignored.
    const int issuer = static_cast<int>(position);
    for (std::size_t index = 0; index < traces[position].size(); ++index) {
      const OpRecord& record = traces[position][index];
      if (ends_with(record.op, "_coalesced") && record.input_shapes.empty()) {
        continue;  // a coalesced call of no tensors starts nothing, on any rank
      }
      ExpandedGroup group{record.tag, record.ranks, record.group_size};
      std::vector<int> members = group.members_of(issuer);
      if (members.empty()) {
        // Only a hand-written trace gets here: a collective refuses a group without the caller.
        verdict.consider(TraceDivergence{issuer, index, "group",
                                         "a group containing rank " + std::to_string(issuer),
                                         group_text(record), -1, 0});
        continue;
      }
      communicators[CommunicatorKey{record.meta, record.tag, std::move(members)}][issuer].push_back(
          index);
    }
  }
  for (const auto& [key, sequences] : communicators) {
    check_communicator(traces, key.members, sequences, verdict);
  }
  return verdict.take();
}

}  // namespace chorus
