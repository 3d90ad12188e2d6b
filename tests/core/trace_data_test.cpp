// OpRecord as plain data: to_string, ==, the JSON round trip and its errors, compare_traces.
// No ranks, no transport: every input is crafted and every expectation exact.

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chorus/error.hpp"
#include "chorus/trace.hpp"

namespace chorus {
namespace {

// ---- Builders.

OpRecord make_record(std::string op, std::vector<int> ranks, std::vector<Shape> input_shapes,
                     std::optional<ReduceOp> reduce_op = std::nullopt) {
  OpRecord record;
  record.op = std::move(op);
  record.group_size = static_cast<int>(ranks.size());
  record.ranks = std::move(ranks);
  record.output_shapes = input_shapes;
  record.input_shapes = std::move(input_shapes);
  record.reduce_op = std::move(reduce_op);
  return record;
}

OpRecord all_reduce(std::vector<int> ranks, ReduceOp reduce_op = ReduceOp::Kind::Sum) {
  return make_record("all_reduce", std::move(ranks), {{4}}, reduce_op);
}

// The same record issued by every rank of `traces`, with rank and seq filled in as the collective
// would (the seq counts records per trace, which is right for one communicator).
void append_everywhere(std::vector<std::vector<OpRecord>>& traces, const OpRecord& record) {
  for (std::size_t r = 0; r < traces.size(); ++r) {
    OpRecord copy = record;
    copy.rank = static_cast<int>(r);
    copy.seq = static_cast<std::int64_t>(traces[r].size());
    traces[r].push_back(std::move(copy));
  }
}

// The detail of the InvalidArgument from_json throws for `json`, after checking its context.
std::string from_json_error(std::string_view json) {
  try {
    const std::vector<OpRecord> records = from_json(json);
    ADD_FAILURE() << "from_json accepted: " << json;
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.context().rank, -1);
    EXPECT_EQ(error.context().op, "from_json");
    EXPECT_EQ(error.context().seq, -1);
    EXPECT_EQ(error.context().group, "");
    EXPECT_EQ(std::string(error.what()), "chorus::InvalidArgument: from_json: " + error.detail());
    return error.detail();
  }
  return "";
}

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const std::size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  EXPECT_EQ(text.find(from, at + 1), std::string::npos) << from << " occurs twice";
  return text.replace(at, from.size(), to);
}

std::size_t offset_of(const std::string& text, const std::string& fragment) {
  const std::size_t at = text.find(fragment);
  EXPECT_NE(at, std::string::npos) << fragment;
  return at;
}

// A record whose JSON the error tests edit.
OpRecord sample_record() {
  OpRecord record = make_record("all_reduce", {0, 1}, {{2, 3}}, ReduceOp::Kind::Sum);
  record.tag = "tp";
  record.rank = 1;
  record.seq = 4;
  return record;
}

// The JSON of sample_record().
std::string sample_json() {
  return "[\n  {\"op\": \"all_reduce\", \"reduce_op\": \"sum\", \"tag\": \"tp\", \"ranks\": [0, "
         "1], "
         "\"group_size\": 2, \"input_shapes\": [[2, 3]], \"dtype\": \"Float32\", \"dims\": [], "
         "\"output_split_sizes\": null, \"input_split_sizes\": null, \"src\": -1, \"src_dst\": [], "
         "\"rank\": 1, \"seq\": 4, \"output_shapes\": [[2, 3]], \"meta\": false}\n]";
}

// ---- OpRecord::to_string.

TEST(OpRecordToString, MatchesTheHeaderExample) {
  OpRecord record = make_record("all_gather_tensor", {0, 1}, {{2, 3}});
  record.dims = {0};
  EXPECT_EQ(record.to_string(), "all_gather_tensor(Float32 [2, 3], gather_dim=0) on [0, 1]");
}

TEST(OpRecordToString, NamesReduceOpTagAndDtype) {
  OpRecord record = make_record("all_reduce", {0, 1, 2}, {{4}}, ReduceOp::Kind::Max);
  record.tag = "tp";
  record.dtype = DType::Int64;
  EXPECT_EQ(record.to_string(), "all_reduce(Int64 [4], max) on 'tp' [0, 1, 2]");
}

TEST(OpRecordToString, CoalescedScatterPrintsEveryInputAndScatterDims) {
  OpRecord record = make_record("reduce_scatter_tensor_coalesced", {0, 1}, {{4, 2}, {8}},
                                ReduceOp::premul_sum(0.1));
  record.dims = {1, 0};
  EXPECT_EQ(record.to_string(),
            "reduce_scatter_tensor_coalesced(Float32 [4, 2], Float32 [8], premul_sum(0.1), "
            "scatter_dims=[1, 0]) on [0, 1]");
}

TEST(OpRecordToString, MixedInputDtypesArePrintedPerInput) {
  OpRecord record = make_record("all_reduce_coalesced", {0, 1}, {{2}, {3}}, ReduceOp::Kind::Sum);
  record.dtype = DType::Int32;
  record.input_dtypes = {DType::Int32, DType::Float64};
  EXPECT_EQ(record.to_string(), "all_reduce_coalesced(Int32 [2], Float64 [3], sum) on [0, 1]");
  EXPECT_EQ(record.input_dtype(1), DType::Float64);
}

TEST(TraceJson, InputDtypesRoundTripAndAreWrittenOnlyWhenSet) {
  OpRecord record = make_record("all_reduce_coalesced", {0, 1}, {{2}, {3}}, ReduceOp::Kind::Sum);
  EXPECT_EQ(to_json({record}).find("input_dtypes"), std::string::npos);
  record.input_dtypes = {DType::Float32, DType::Complex128};
  const std::string json = to_json({record});
  EXPECT_NE(json.find("\"input_dtypes\": [\"Float32\", \"Complex128\"]"), std::string::npos)
      << json;
  const std::vector<OpRecord> back = from_json(json);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0], record);
  EXPECT_NE(back[0], make_record("all_reduce_coalesced", {0, 1}, {{2}, {3}}, ReduceOp::Kind::Sum));
}

// A single input dtype is still a list that was set: written, and read back as set.
TEST(TraceJson, ASingleInputDtypeIsWrittenAndReadBack) {
  OpRecord record = make_record("all_reduce", {0, 1}, {{2}}, ReduceOp::Kind::Sum);
  record.input_dtypes = {DType::Float64};
  const std::string json = to_json({record});
  EXPECT_TRUE(contains(json, "\"input_dtypes\": [\"Float64\"]")) << json;
  const std::vector<OpRecord> back = from_json(json);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0], record);
  EXPECT_EQ(back[0].input_dtypes, std::vector<DType>{DType::Float64});
}

TEST(OpRecordToString, SingleScatterDim) {
  OpRecord record = make_record("reduce_scatter_tensor", {0, 1}, {{4}}, ReduceOp::Kind::Avg);
  record.dims = {0};
  EXPECT_EQ(record.to_string(), "reduce_scatter_tensor(Float32 [4], avg, scatter_dim=0) on [0, 1]");
}

TEST(OpRecordToString, MpmdListPrintsSubLists) {
  OpRecord record = make_record("all_reduce", {0, 1, 2, 3}, {{4}}, ReduceOp::Kind::Sum);
  record.group_size = 2;
  record.tag = "dp";
  EXPECT_EQ(record.to_string(), "all_reduce(Float32 [4], sum) on 'dp' [[0, 1], [2, 3]]");
}

TEST(OpRecordToString, GroupSizeThatDoesNotSplitTheRanksIsSpelledOut) {
  OpRecord record = make_record("all_reduce", {0, 1, 2}, {{4}}, ReduceOp::Kind::Sum);
  record.group_size = 2;
  EXPECT_EQ(record.to_string(), "all_reduce(Float32 [4], sum) on [0, 1, 2] (group_size 2)");
}

TEST(OpRecordToString, AllToAllSingleSplits) {
  OpRecord record = make_record("all_to_all_single", {0, 1}, {{3, 2}});
  record.dtype = DType::BFloat16;
  record.output_split_sizes = std::vector<std::int64_t>{1, 2};
  record.input_split_sizes = std::vector<std::int64_t>{2, 1};
  EXPECT_EQ(record.to_string(),
            "all_to_all_single(BFloat16 [3, 2], output_split_sizes=[1, 2], "
            "input_split_sizes=[2, 1]) on [0, 1]");
}

TEST(OpRecordToString, BroadcastReducePermuteAndMeta) {
  OpRecord broadcast = make_record("broadcast", {0, 1, 2}, {{2}});
  broadcast.src = 2;
  EXPECT_EQ(broadcast.to_string(), "broadcast(Float32 [2], src=2) on [0, 1, 2]");

  OpRecord reduce = make_record("reduce", {0, 1}, {{2}}, ReduceOp::Kind::Sum);
  reduce.src = 1;
  EXPECT_EQ(reduce.to_string(), "reduce(Float32 [2], sum, dst=1) on [0, 1]");

  OpRecord permute = make_record("permute_tensor", {0, 1, 2}, {{}});
  permute.src_dst = {1, 2, -1};
  permute.meta = true;
  EXPECT_EQ(permute.to_string(),
            "permute_tensor(Float32 [], src_dst=[1, 2, -1]) on [0, 1, 2] (meta)");
}

TEST(OpRecordToString, CoalescedGatherWithoutInputs) {
  OpRecord record = make_record("all_gather_into_tensor_coalesced", {0}, {});
  EXPECT_EQ(record.to_string(), "all_gather_into_tensor_coalesced() on [0]");
}

// ---- operator==.

TEST(OpRecordEquality, EveryFieldButSiteCounts) {
  const OpRecord base = sample_record();
  OpRecord other_site = base;
  other_site.site = CallSite("elsewhere.cpp", 12, "f");
  EXPECT_TRUE(base == other_site);

  const std::vector<std::pair<std::string, std::function<void(OpRecord&)>>> mutations = {
      {"op", [](OpRecord& r) { r.op = "all_reduce_inplace"; }},
      {"reduce_op", [](OpRecord& r) { r.reduce_op = ReduceOp::Kind::Avg; }},
      {"reduce_op absent", [](OpRecord& r) { r.reduce_op.reset(); }},
      {"tag", [](OpRecord& r) { r.tag = "pp"; }},
      {"ranks",
       [](OpRecord& r) {
         r.ranks = {1, 0};
       }},
      {"group_size", [](OpRecord& r) { r.group_size = 1; }},
      {"input_shapes",
       [](OpRecord& r) {
         r.input_shapes = {{3, 2}};
       }},
      {"dtype", [](OpRecord& r) { r.dtype = DType::Float64; }},
      {"dims", [](OpRecord& r) { r.dims = {0}; }},
      {"output_split_sizes",
       [](OpRecord& r) { r.output_split_sizes = std::vector<std::int64_t>{}; }},
      {"input_split_sizes",
       [](OpRecord& r) { r.input_split_sizes = std::vector<std::int64_t>{1}; }},
      {"src", [](OpRecord& r) { r.src = 0; }},
      {"src_dst",
       [](OpRecord& r) {
         r.src_dst = {-1, -1};
       }},
      {"rank", [](OpRecord& r) { r.rank = 0; }},
      {"seq", [](OpRecord& r) { r.seq = 5; }},
      {"output_shapes", [](OpRecord& r) { r.output_shapes = {}; }},
      {"meta", [](OpRecord& r) { r.meta = true; }},
  };
  for (const auto& [name, mutate] : mutations) {
    OpRecord changed = base;
    mutate(changed);
    EXPECT_FALSE(base == changed) << name;
    EXPECT_FALSE(changed == base) << name;
  }
}

TEST(OpRecordEquality, PremulFactorsCompareBitwise) {
  OpRecord a = sample_record();
  OpRecord b = sample_record();
  a.reduce_op = ReduceOp::premul_sum(0.0);
  b.reduce_op = ReduceOp::premul_sum(-0.0);
  EXPECT_FALSE(a == b);
  a.reduce_op = ReduceOp::premul_sum(std::numeric_limits<double>::quiet_NaN());
  b.reduce_op = ReduceOp::premul_sum(std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(a == b);
}

// ---- JSON: the exact text and round trips.

TEST(TraceJson, WritesOneRecordPerLineWithEveryField) {
  EXPECT_EQ(to_json({sample_record()}), sample_json());
  EXPECT_EQ(to_json({}), "[]");
}

TEST(TraceJson, PremulFactorFollowsReduceOp) {
  OpRecord record = sample_record();
  record.reduce_op = ReduceOp::premul_sum(0.1);
  const std::string json = to_json({record});
  EXPECT_TRUE(contains(json, "\"reduce_op\": \"premul_sum\", \"premul_factor\": 0.1, \"tag\""))
      << json;
  record.reduce_op = ReduceOp::premul_sum(-std::numeric_limits<double>::infinity());
  EXPECT_TRUE(contains(to_json({record}), "\"premul_factor\": \"-inf\"")) << to_json({record});
}

TEST(TraceJson, ReadsTheSampleBack) {
  const std::vector<OpRecord> records = from_json(sample_json());
  ASSERT_EQ(records.size(), 1u);
  EXPECT_TRUE(records[0] == sample_record()) << records[0].to_string();
  EXPECT_TRUE(from_json("[]").empty());
  EXPECT_TRUE(from_json(" \t\r\n[ \n ]\n ").empty());
}

void expect_round_trip(const std::vector<OpRecord>& records, const std::string& name) {
  const std::string json = to_json(records);
  const std::vector<OpRecord> back = from_json(json);
  ASSERT_EQ(back.size(), records.size()) << name;
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_TRUE(back[i] == records[i]) << name << " record " << i << ": " << json;
    if (records[i].reduce_op.has_value() && back[i].reduce_op.has_value()) {
      EXPECT_EQ(std::bit_cast<std::uint64_t>(back[i].reduce_op->premul_factor()),
                std::bit_cast<std::uint64_t>(records[i].reduce_op->premul_factor()))
          << name;
    }
  }
  // Writing what was read gives the same text: nothing is lost or reordered.
  EXPECT_EQ(to_json(back), json) << name;
}

TEST(TraceJson, PremulFactorsRoundTripBitForBit) {
  const std::vector<double> factors = {
      0.1,
      -0.0,
      0.0,
      1.0 / 3.0,
      std::numeric_limits<double>::infinity(),
      -std::numeric_limits<double>::infinity(),
      std::numeric_limits<double>::quiet_NaN(),
      -std::numeric_limits<double>::quiet_NaN(),
      std::bit_cast<double>(std::uint64_t{0x7ff8000000000123}),  // a NaN with a payload
      std::bit_cast<double>(std::uint64_t{0xfff0000000000001}),  // negative, signalling bits
      std::numeric_limits<double>::max(),
      std::numeric_limits<double>::lowest(),
      std::numeric_limits<double>::denorm_min(),
      std::numeric_limits<double>::min(),
      1e300,
      -2.5e-300,
  };
  for (const double factor : factors) {
    OpRecord record = sample_record();
    record.reduce_op = ReduceOp::premul_sum(factor);
    expect_round_trip({record},
                      "premul_sum bits " + std::to_string(std::bit_cast<std::uint64_t>(factor)));
  }
}

TEST(TraceJson, NonFiniteFactorsAreWrittenAsStrings) {
  const std::vector<std::pair<double, std::string>> cases = {
      {std::numeric_limits<double>::infinity(), "\"inf\""},
      {-std::numeric_limits<double>::infinity(), "\"-inf\""},
      {std::bit_cast<double>(std::uint64_t{0x7ff8000000000000}), "\"nan\""},
      {std::bit_cast<double>(std::uint64_t{0xfff8000000000000}), "\"-nan\""},
      {std::bit_cast<double>(std::uint64_t{0x7ff8000000000123}), "\"nan(0x7ff8000000000123)\""},
      {-0.0, "-0"},
  };
  for (const auto& [factor, text] : cases) {
    OpRecord record = sample_record();
    record.reduce_op = ReduceOp::premul_sum(factor);
    EXPECT_TRUE(contains(to_json({record}), "\"premul_factor\": " + text + ", ")) << text;
  }
}

TEST(TraceJson, EveryReduceOpDtypeAndOpRoundTrips) {
  std::vector<OpRecord> records;
  for (const ReduceOp::Kind kind :
       {ReduceOp::Kind::Sum, ReduceOp::Kind::Avg, ReduceOp::Kind::Product, ReduceOp::Kind::Min,
        ReduceOp::Kind::Max, ReduceOp::Kind::BAnd, ReduceOp::Kind::BOr, ReduceOp::Kind::BXor}) {
    OpRecord record = sample_record();
    record.reduce_op = kind;
    records.push_back(record);
  }
  for (const DType dtype : kAllDTypes) {
    OpRecord record = sample_record();
    record.dtype = dtype;
    records.push_back(record);
  }
  for (const char* op :
       {"all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_reduce_coalesced",
        "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced", "all_to_all_single",
        "broadcast", "reduce", "permute_tensor", "all_reduce_inplace", "all_gather_tensor_inplace",
        "reduce_scatter_tensor_inplace"}) {
    OpRecord record = sample_record();
    record.op = op;
    records.push_back(record);
  }
  expect_round_trip(records, "ops, reduce ops and dtypes");
}

TEST(TraceJson, TagsWithSpecialCharactersRoundTrip) {
  const std::vector<std::string> tags = {
      "",
      "with \"quotes\"",
      "back\\slash\\",
      "new\nline\r\ttab",
      std::string("nul\0byte", 8),
      "\x01\x1f\x7f",
      "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80",  // UTF-8: é, 日本, 😀
      "\xff\xfe not UTF-8",
      "/slash/",
  };
  for (const std::string& tag : tags) {
    OpRecord record = sample_record();
    record.tag = tag;
    expect_round_trip({record}, "tag " + tag);
  }
}

TEST(TraceJson, StringsAreEscapedAsDocumented) {
  OpRecord record = sample_record();
  record.tag = "a\"b\\c\nd\x01";
  EXPECT_TRUE(contains(to_json({record}), R"("tag": "a\"b\\c\u000ad\u0001")")) << to_json({record});
}

TEST(TraceJson, ReadsEveryJsonEscape) {
  std::string json = replace_once(sample_json(), R"("tag": "tp")",
                                  R"("tag": "\"\\\/\b\f\n\r\t\u00e9\u00E9\ud83d\ude00\u0000")");
  const std::vector<OpRecord> records = from_json(json);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].tag, std::string("\"\\/\b\f\n\r\t\xc3\xa9\xc3\xa9\xf0\x9f\x98\x80\0", 17));
}

// \u escapes become UTF-8 of 1 to 4 bytes, each length at both of its ends.
TEST(TraceJson, UnicodeEscapesAtEveryUtf8LengthBoundaryDecodeExactly) {
  std::string json = replace_once(sample_json(), R"("tag": "tp")",
                                  R"("tag": "\u007f\u0080\u07ff\u0800\uffff\ud800\udc00")");
  const std::vector<OpRecord> records = from_json(json);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].tag, "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\xf0\x90\x80\x80");
}

TEST(TraceJson, EmptyListsAndPresentEmptySplitsRoundTrip) {
  OpRecord record = make_record("all_to_all_single", {}, {});
  record.group_size = 0;
  record.output_split_sizes = std::vector<std::int64_t>{};
  record.input_split_sizes = std::vector<std::int64_t>{};
  record.output_shapes = {{}, {0}};
  expect_round_trip({record}, "empty lists");
  EXPECT_TRUE(contains(to_json({record}), "\"output_split_sizes\": [], \"input_split_sizes\": []"));
}

TEST(TraceJson, FieldsOfEveryKindRoundTrip) {
  OpRecord all_to_all = make_record("all_to_all_single", {3, 1, 2}, {{6, 2}});
  all_to_all.output_split_sizes = std::vector<std::int64_t>{1, 2, 3};
  all_to_all.input_split_sizes = std::vector<std::int64_t>{3, 2, 1};
  all_to_all.output_shapes = {{6, 2}};

  OpRecord broadcast = make_record("broadcast", {0, 1}, {{2}});
  broadcast.src = 1;

  OpRecord permute = make_record("permute_tensor", {0, 1, 2}, {{5}});
  permute.src_dst = {2, -1, 0};

  OpRecord coalesced = make_record("reduce_scatter_tensor_coalesced", {0, 1, 2, 3}, {{4, 8}, {8}},
                                   ReduceOp::Kind::Min);
  coalesced.group_size = 2;
  coalesced.dims = {1, 0};
  coalesced.output_shapes = {{4, 4}, {4}};

  OpRecord meta = make_record("all_gather_tensor", {0, 1}, {{2, 3}});
  meta.dims = {1};
  meta.meta = true;
  meta.seq = -1;
  meta.output_shapes = {{2, 6}};

  OpRecord extremes = sample_record();
  extremes.ranks = {std::numeric_limits<int>::max(), std::numeric_limits<int>::min()};
  extremes.group_size = std::numeric_limits<int>::max();
  extremes.seq = std::numeric_limits<std::int64_t>::max();
  extremes.input_shapes = {{std::numeric_limits<std::int64_t>::min(), 0}};
  extremes.src = std::numeric_limits<int>::min();
  extremes.rank = -7;

  expect_round_trip({all_to_all, broadcast, permute, coalesced, meta, extremes}, "every kind");
}

TEST(TraceJson, MissingOptionalKeysReadAsAbsent) {
  std::string json = replace_once(sample_json(), "\"reduce_op\": \"sum\", ", "");
  json = replace_once(json, "\"output_split_sizes\": null, ", "");
  json = replace_once(json, "\"input_split_sizes\": null, ", "");
  const std::vector<OpRecord> records = from_json(json);
  ASSERT_EQ(records.size(), 1u);
  OpRecord expected = sample_record();
  expected.reduce_op.reset();
  EXPECT_TRUE(records[0] == expected);
  EXPECT_FALSE(records[0].output_split_sizes.has_value());
  EXPECT_FALSE(records[0].input_split_sizes.has_value());
}

// An optional key written as null is absent: input_dtypes and premul_factor too.
TEST(TraceJson, NullOptionalKeysReadAsAbsent) {
  std::string json = replace_once(sample_json(), R"("reduce_op": "sum", )",
                                  R"("reduce_op": "sum", "premul_factor": null, )");
  json = replace_once(json, R"("dtype": "Float32", )",
                      R"("dtype": "Float32", "input_dtypes": null, )");
  const std::vector<OpRecord> records = from_json(json);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0], sample_record());
  EXPECT_TRUE(records[0].input_dtypes.empty());
  // premul_sum with a null factor lacks one.
  const std::string null_factor =
      replace_once(sample_json(), R"("reduce_op": "sum", )",
                   R"("reduce_op": "premul_sum", "premul_factor": null, )");
  EXPECT_EQ(from_json_error(null_factor),
            "at offset " + std::to_string(offset_of(null_factor, "\"premul_sum\"")) +
                ": reduce_op \"premul_sum\" needs a \"premul_factor\"");
}

TEST(TraceJson, KeyOrderAndSpacingDoNotMatter) {
  const std::string json =
      R"([{"meta":false,"output_shapes":[[2,3]],"seq":4,"rank":1,"src_dst":[],"src":-1,)"
      R"("dims":[],"dtype":"Float32","input_shapes":[[2,3]],"group_size":2,"ranks":[0,1],)"
      R"("tag":"tp","premul_factor":1E-1,"reduce_op":"premul_sum","op":"all_reduce"}])";
  const std::vector<OpRecord> records = from_json(json);
  ASSERT_EQ(records.size(), 1u);
  OpRecord expected = sample_record();
  expected.reduce_op = ReduceOp::premul_sum(0.1);
  EXPECT_TRUE(records[0] == expected) << records[0].to_string();
}

// ---- JSON: malformed input.

TEST(TraceJsonErrors, EveryTruncationIsRejected) {
  OpRecord record = sample_record();
  record.reduce_op = ReduceOp::premul_sum(-0.25);
  record.tag = "t\"\n";
  const std::string json = to_json({record, sample_record()});
  for (std::size_t length = 0; length < json.size(); ++length) {
    EXPECT_THROW(from_json(std::string_view(json).substr(0, length)), InvalidArgument) << length;
  }
}

TEST(TraceJsonErrors, SyntaxErrorsNameTheOffsetAndWhatWasExpected) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "at offset 0: expected a value, found the end of input"},
      {"[", "at offset 1: expected a value, found the end of input"},
      {R"([{"op": "all_re)",
       "at offset 15: expected '\"' to close the string, found the end of input"},
      {"[{} x]", "at offset 4: expected ',' or ']' after an array element, found 'x'"},
      {"[] x", "at offset 3: expected the end of input after the top-level value, found 'x'"},
      {"[]]", "at offset 2: expected the end of input after the top-level value, found ']'"},
      {"[{},]", "at offset 4: expected a value, found ']'"},
      {R"([{"op" 1}])", "at offset 7: expected ':' after an object key, found '1'"},
      {"[{op: 1}]", "at offset 2: expected a string key, found 'o'"},
      {R"([{"a": 1 "b": 2}])",
       "at offset 9: expected ',' or '}' after an object member, found '\"'"},
      {"[tru]", "at offset 4: expected 'true', found ']'"},
      {"[nul", "at offset 4: expected 'null', found the end of input"},
      {"[01]", "at offset 2: expected the end of the number after a leading 0, found '1'"},
      {"[-]", "at offset 2: expected a digit after '-', found ']'"},
      {"[+1]", "at offset 1: expected a value, found '+'"},
      {"[1.]", "at offset 3: expected a digit after the decimal point, found ']'"},
      {"[1e+]", "at offset 4: expected a digit in the exponent, found ']'"},
      {"[\"a\nb\"]",
       "at offset 3: expected an escape (\\u00XX) for a control character in a string, found byte "
       "0x0a"},
      {"[\"\x1f\"]",
       "at offset 2: expected an escape (\\u00XX) for a control character in a string, found byte "
       "0x1f"},
      {"[\x7f]", "at offset 1: expected a value, found byte 0x7f"},
      {R"(["\x"])", "at offset 3: expected one of \" \\ / b f n r t u after '\\', found 'x'"},
      {R"(["\u12"])", "at offset 6: expected 4 hex digits after \\u, found '\"'"},
      {R"(["\udc00"])", "at offset 2: a low surrogate \\udc00 without a high surrogate before it"},
      {R"(["\ud800x"])",
       "at offset 8: expected a low surrogate (\\uDC00-\\uDFFF) after the high surrogate \\ud800, "
       "found 'x'"},
      {R"(["\ud800\u0041"])",
       "at offset 10: expected a low surrogate (\\uDC00-\\uDFFF) after the high surrogate "
       "\\ud800, found '0'"},
      {"{}", "at offset 0: expected an array of records, found an object"},
      {"[1]", "at offset 1: expected an object for record 0, found the number 1"},
      {std::string(40, '['), "at offset 33: values nested deeper than 32 levels"},
  };
  for (const auto& [json, detail] : cases) {
    EXPECT_EQ(from_json_error(json), detail) << json;
  }
}

TEST(TraceJsonErrors, WrongTypeForAField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("ranks": [0, 1])", R"("ranks": "0, 1")"},
      {R"("group_size": 2)", R"("group_size": 2.5)"},
      {R"("meta": false)", R"("meta": 0)"},
      {R"("tag": "tp")", R"("tag": 7)"},
      {R"("input_shapes": [[2, 3]])", R"("input_shapes": [2, 3])"},
      {R"("dims": [])", R"("dims": null)"},
      {R"("output_split_sizes": null)", R"("output_split_sizes": [1, true])"},
      {R"("seq": 4)", R"("seq": 4e0)"},
      {R"("group_size": 2)", R"("group_size": 2E0)"},
      {R"("tag": "tp")", R"("tag": false)"},
  };
  const std::vector<std::string> details = {
      "expected an array of integers for \"ranks\", found a string",
      "expected an integer for \"group_size\", found the number 2.5",
      "expected true or false for \"meta\", found the number 0",
      "expected a string for \"tag\", found the number 7",
      "expected an array of integers for \"input_shapes\", found the number 2",
      "expected an array of integers for \"dims\", found null",
      "expected an integer for \"output_split_sizes\", found true",
      "expected an integer for \"seq\", found the number 4e0",
      "expected an integer for \"group_size\", found the number 2E0",
      "expected a string for \"tag\", found false",
  };
  ASSERT_EQ(cases.size(), details.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string json = replace_once(sample_json(), cases[i].first, cases[i].second);
    // The offset is where the offending value starts.
    std::size_t offset = offset_of(json, cases[i].second) + cases[i].second.find(':') + 2;
    if (i == 4) {
      offset += 1;  // the first element of the outer array
    } else if (i == 6) {
      offset += 4;  // `true`
    }
    EXPECT_EQ(from_json_error(json), "at offset " + std::to_string(offset) + ": " + details[i])
        << json;
  }
}

TEST(TraceJsonErrors, IntegersOutOfRange) {
  const std::string group_size =
      replace_once(sample_json(), R"("group_size": 2)", R"("group_size": 2147483648)");
  EXPECT_EQ(from_json_error(group_size),
            "at offset " + std::to_string(offset_of(group_size, "2147483648")) +
                ": expected an integer in [-2147483648, 2147483647] for \"group_size\", found "
                "2147483648");
  const std::string seq =
      replace_once(sample_json(), R"("seq": 4)", R"("seq": -9223372036854775809)");
  EXPECT_TRUE(contains(from_json_error(seq),
                       "expected an integer in [-9223372036854775808, 9223372036854775807] for "
                       "\"seq\", found -9223372036854775809"));
}

TEST(TraceJsonErrors, UnknownNames) {
  const std::string op =
      replace_once(sample_json(), R"("op": "all_reduce")", R"("op": "allreduce")");
  const std::string op_error = from_json_error(op);
  EXPECT_TRUE(contains(op_error, "at offset " + std::to_string(offset_of(op, "\"allreduce\"")) +
                                     ": unknown op \"allreduce\" (expected one of all_reduce, "
                                     "all_gather_tensor,"))
      << op_error;

  const std::string dtype =
      replace_once(sample_json(), R"("dtype": "Float32")", R"("dtype": "float32")");
  EXPECT_EQ(from_json_error(dtype),
            "at offset " + std::to_string(offset_of(dtype, "\"float32\"")) +
                ": unknown dtype \"float32\" (expected one of Bool, UInt8, Int8, Int32, Int64, "
                "Float16, BFloat16, Float32, Float64, Complex64, Complex128)");

  const std::string reduce_op =
      replace_once(sample_json(), R"("reduce_op": "sum")", R"("reduce_op": "mean")");
  EXPECT_TRUE(contains(from_json_error(reduce_op),
                       "at offset " + std::to_string(offset_of(reduce_op, "\"mean\"")) +
                           ": unknown reduce_op \"mean\""));

  const std::string field = replace_once(sample_json(), R"("meta": false)", R"("colour": 1)");
  EXPECT_EQ(from_json_error(field), "at offset " + std::to_string(offset_of(field, "\"colour\"")) +
                                        ": unknown field \"colour\" in record 0");
}

TEST(TraceJsonErrors, MissingRequiredFieldIsNamed) {
  for (const std::string field : {"op", "tag", "ranks", "group_size", "input_shapes", "dtype",
                                  "dims", "src", "src_dst", "rank", "seq", "output_shapes"}) {
    // Drop `"field": value, ` from the sample.
    const std::size_t start = offset_of(sample_json(), "\"" + field + "\": ");
    const std::size_t end = sample_json().find(", \"", start);
    ASSERT_NE(end, std::string::npos);
    std::string json = sample_json();
    json.erase(start, end + 2 - start);
    EXPECT_EQ(from_json_error(json), "at offset " + std::to_string(offset_of(json, "{")) +
                                         ": record 0 lacks the required field \"" + field + "\"");
  }
  // The record index and offset point at the record that lacks it, here the second.
  const std::string complete = sample_json().substr(1, sample_json().size() - 2);
  const std::string no_meta = replace_once(complete, R"(, "meta": false)", "");
  const std::string json = "[" + complete + "," + no_meta + "]";
  EXPECT_EQ(from_json_error(json), "at offset " + std::to_string(complete.size() + 2 + 3) +
                                       ": record 1 lacks the required field \"meta\"");
}

TEST(TraceJsonErrors, PremulFactorRules) {
  const std::string no_factor =
      replace_once(sample_json(), R"("reduce_op": "sum")", R"("reduce_op": "premul_sum")");
  EXPECT_EQ(from_json_error(no_factor), "at offset " +
                                            std::to_string(offset_of(no_factor, "\"premul_sum\"")) +
                                            ": reduce_op \"premul_sum\" needs a \"premul_factor\"");

  const std::string stray = replace_once(sample_json(), R"("reduce_op": "sum")",
                                         R"("reduce_op": "sum", "premul_factor": 2)");
  EXPECT_EQ(from_json_error(stray), "at offset " + std::to_string(offset_of(stray, "2, \"tag")) +
                                        ": \"premul_factor\" is only allowed with reduce_op "
                                        "\"premul_sum\"");

  const std::string bad_text =
      replace_once(sample_json(), R"("reduce_op": "sum")",
                   R"("reduce_op": "premul_sum", "premul_factor": "Infinity")");
  EXPECT_EQ(from_json_error(bad_text),
            "at offset " + std::to_string(offset_of(bad_text, "\"Infinity\"")) +
                ": expected a number or \"inf\", \"-inf\", \"nan\" for \"premul_factor\", found "
                "\"Infinity\"");

  const std::string not_nan =
      replace_once(sample_json(), R"("reduce_op": "sum")",
                   R"json("reduce_op": "premul_sum", "premul_factor": "nan(0x1)")json");
  EXPECT_TRUE(contains(from_json_error(not_nan), "found \"nan(0x1)\""));

  const std::string too_big = replace_once(sample_json(), R"("reduce_op": "sum")",
                                           R"("reduce_op": "premul_sum", "premul_factor": 1e400)");
  EXPECT_TRUE(contains(from_json_error(too_big),
                       "expected a number in the range of a double for \"premul_factor\", found "
                       "1e400"));

  const std::string wrong_type = replace_once(sample_json(), R"("reduce_op": "sum")",
                                              R"("reduce_op": "premul_sum", "premul_factor": [])");
  EXPECT_TRUE(contains(from_json_error(wrong_type),
                       "expected a number or \"inf\", \"-inf\", \"nan\" for \"premul_factor\", "
                       "found an array"));
}

TEST(TraceJsonErrors, DuplicateKey) {
  const std::string json =
      replace_once(sample_json(), R"("tag": "tp")", R"("tag": "tp", "tag": "x")");
  EXPECT_EQ(
      from_json_error(json),
      "at offset " + std::to_string(offset_of(json, "\"tag\": \"x\"")) + ": duplicate key \"tag\"");
}

// ---- TraceDivergence::to_string.

TEST(TraceDivergenceToString, FieldMissingAndNoPeer) {
  EXPECT_EQ((TraceDivergence{2, 5, "reduce_op", "sum", "max", 0, 5}).to_string(),
            "rank 2, record 5: reduce_op is 'max', rank 0 record 5 has 'sum'");
  EXPECT_EQ(
      (TraceDivergence{1, 1, "missing", "all_reduce(Float32 [4], sum) on [0, 1]", "<none>", 0, 1})
          .to_string(),
      "rank 1, record 1: no record where rank 0 record 1 has "
      "'all_reduce(Float32 [4], sum) on [0, 1]'");
  EXPECT_EQ(
      (TraceDivergence{2, 0, "group", "a group containing rank 2", "[0, 1]", -1, 0}).to_string(),
      "rank 2, record 0: group is '[0, 1]', expected 'a group containing rank 2'");
}

// ---- compare_traces.

void expect_divergence(const std::optional<TraceDivergence>& found, const TraceDivergence& want) {
  ASSERT_TRUE(found.has_value()) << "expected " << want.to_string();
  EXPECT_EQ(found->rank, want.rank) << found->to_string();
  EXPECT_EQ(found->index, want.index) << found->to_string();
  EXPECT_EQ(found->field, want.field) << found->to_string();
  EXPECT_EQ(found->expected, want.expected) << found->to_string();
  EXPECT_EQ(found->actual, want.actual) << found->to_string();
  EXPECT_EQ(found->reference_rank, want.reference_rank) << found->to_string();
  EXPECT_EQ(found->reference_index, want.reference_index) << found->to_string();
}

TEST(CompareTraces, AgreeingTracesGiveNothing) {
  EXPECT_FALSE(compare_traces({}).has_value());
  EXPECT_FALSE(compare_traces({{}, {}, {}}).has_value());

  std::vector<std::vector<OpRecord>> traces(3);
  append_everywhere(traces, all_reduce({0, 1, 2}));
  OpRecord gather = make_record("all_gather_tensor", {0, 1, 2}, {{2, 2}});
  gather.dims = {1};
  append_everywhere(traces, gather);
  OpRecord broadcast = make_record("broadcast", {0, 1, 2}, {{3}});
  broadcast.src = 2;
  append_everywhere(traces, broadcast);
  append_everywhere(traces, all_reduce({0, 1, 2}, ReduceOp::premul_sum(0.5)));
  EXPECT_FALSE(compare_traces(traces).has_value());
}

struct FieldCase {
  std::string name;
  OpRecord reference;                     // what rank 0 issues
  std::function<void(OpRecord&)> mutate;  // turns it into what rank 1 issues
  std::string field;
  std::string expected;
  std::string actual;
};

OpRecord with(OpRecord record, const std::function<void(OpRecord&)>& change) {
  change(record);
  return record;
}

std::vector<FieldCase> field_cases() {
  OpRecord all_to_all = make_record("all_to_all_single", {0, 1}, {{4, 3}});
  OpRecord meta = all_reduce({0, 1});
  meta.meta = true;
  meta.seq = -1;
  return {
      {"op", all_reduce({0, 1}), [](OpRecord& r) { r.op = "all_reduce_coalesced"; }, "op",
       "all_reduce", "all_reduce_coalesced"},
      {"reduce_op", all_reduce({0, 1}), [](OpRecord& r) { r.reduce_op = ReduceOp::Kind::Max; },
       "reduce_op", "sum", "max"},
      {"reduce_op_absent", all_reduce({0, 1}), [](OpRecord& r) { r.reduce_op.reset(); },
       "reduce_op", "sum", "none"},
      {"premul_factor", all_reduce({0, 1}, ReduceOp::premul_sum(0.1)),
       [](OpRecord& r) { r.reduce_op = ReduceOp::premul_sum(0.10000000000000002); }, "reduce_op",
       "premul_sum(0.1)", "premul_sum(0.10000000000000002)"},
      {"dtype", all_reduce({0, 1}), [](OpRecord& r) { r.dtype = DType::BFloat16; }, "dtype",
       "Float32", "BFloat16"},
      {"input_dtypes", make_record("all_reduce_coalesced", {0, 1}, {{2}, {3}}, ReduceOp::Kind::Sum),
       [](OpRecord& r) {
         r.input_dtypes = {DType::Float32, DType::Float64};
       },
       "dtype", "[Float32, Float32]", "[Float32, Float64]"},
      {"input_shapes", all_reduce({0, 1}),
       [](OpRecord& r) {
         r.input_shapes = {{2, 3}};
       },
       "input_shapes", "[4]", "[2, 3]"},
      {"input_count", make_record("all_reduce_coalesced", {0, 1}, {{4}, {2}}, ReduceOp::Kind::Sum),
       [](OpRecord& r) { r.input_shapes = {{4}}; }, "input_shapes", "[4], [2]", "[4]"},
      {"all_to_all_trailing_dim", all_to_all,
       [](OpRecord& r) {
         r.input_shapes = {{4, 2}};
       },
       "input_shapes", "[*, 3]", "[*, 2]"},
      {"all_to_all_ndim", all_to_all,
       [](OpRecord& r) {
         r.input_shapes = {{4, 3, 1}};
       },
       "input_shapes", "[*, 3]", "[*, 3, 1]"},
      {"dims",
       with(make_record("all_gather_tensor", {0, 1}, {{2, 2}}), [](OpRecord& r) { r.dims = {0}; }),
       [](OpRecord& r) { r.dims = {1}; }, "dims", "[0]", "[1]"},
      {"src", with(make_record("broadcast", {0, 1}, {{2}}), [](OpRecord& r) { r.src = 0; }),
       [](OpRecord& r) { r.src = 1; }, "src", "0", "1"},
      {"src_dst",
       with(make_record("permute_tensor", {0, 1}, {{2}}),
            [](OpRecord& r) {
              r.src_dst = {1, 0};
            }),
       [](OpRecord& r) {
         r.src_dst = {1, -1};
       },
       "src_dst", "[1, 0]", "[1, -1]"},
      {"group", all_reduce({0, 1}),
       [](OpRecord& r) {
         r.ranks = {0, 1, 2, 3};
         r.group_size = 2;
       },
       "group", "[0, 1]", "[[0, 1], [2, 3]]"},
      {"meta_records", meta, [](OpRecord& r) { r.dtype = DType::Int32; }, "dtype", "Float32",
       "Int32"},
  };
}

class CompareTracesField : public ::testing::TestWithParam<FieldCase> {};

// Two ranks agree on record 0 and disagree on record 1 in one field.
TEST_P(CompareTracesField, NamesTheFieldRankAndBothValues) {
  const FieldCase& c = GetParam();
  std::vector<std::vector<OpRecord>> traces(2);
  append_everywhere(traces, all_reduce({0, 1}));
  append_everywhere(traces, c.reference);
  c.mutate(traces[1][1]);
  expect_divergence(compare_traces(traces),
                    TraceDivergence{1, 1, c.field, c.expected, c.actual, 0, 1});
}

INSTANTIATE_TEST_SUITE_P(EveryField, CompareTracesField, ::testing::ValuesIn(field_cases()),
                         [](const ::testing::TestParamInfo<FieldCase>& param_info) {
                           return param_info.param.name;
                         });

TEST(CompareTraces, TheLowestMemberIsTheReference) {
  std::vector<std::vector<OpRecord>> traces(3);
  append_everywhere(traces, all_reduce({2, 0, 1}));
  traces[0][0].reduce_op = ReduceOp::Kind::Min;
  // Ranks 1 and 2 both disagree with rank 0 (the lowest member, though not group rank 0).
  expect_divergence(compare_traces(traces), TraceDivergence{1, 0, "reduce_op", "min", "sum", 0, 0});
}

TEST(CompareTraces, OnlyTheFirstDifferingFieldIsReported) {
  std::vector<std::vector<OpRecord>> traces(2);
  append_everywhere(traces, all_reduce({0, 1}));
  traces[1][0].dtype = DType::Float64;
  traces[1][0].src = 0;
  traces[1][0].reduce_op = ReduceOp::Kind::Avg;
  expect_divergence(compare_traces(traces), TraceDivergence{1, 0, "reduce_op", "sum", "avg", 0, 0});
}

TEST(CompareTraces, UncomparedFieldsMayDiffer) {
  std::vector<std::vector<OpRecord>> traces(2);
  append_everywhere(traces, all_reduce({0, 1}));
  traces[1][0].seq = 9;
  traces[1][0].output_shapes = {{8}};
  traces[1][0].site = CallSite("x.cpp", 3, "g");
  EXPECT_FALSE(compare_traces(traces).has_value());
}

// A meta record (shapes only) never stands in for a peer's real call: meta records are matched
// among themselves. A coalesced call of no tensors starts nothing and is left out.
TEST(CompareTraces, MetaRecordsPairOnlyWithMetaRecords) {
  OpRecord meta = all_reduce({0, 1});
  meta.meta = true;
  std::vector<std::vector<OpRecord>> lonely(2);
  lonely[0].push_back(meta);
  lonely[1].push_back(all_reduce({0, 1}));
  const std::optional<TraceDivergence> divergence = compare_traces(lonely);
  ASSERT_TRUE(divergence.has_value());
  EXPECT_EQ(divergence->field, "missing");
  EXPECT_EQ(divergence->rank, 0);

  std::vector<std::vector<OpRecord>> traces(2);
  append_everywhere(traces, all_reduce({0, 1}));
  append_everywhere(traces, meta);
  std::swap(traces[1][0], traces[1][1]);  // the real and the meta call interleave differently
  traces[0].insert(traces[0].begin(), make_record("all_reduce_coalesced", {0, 1}, {}));
  EXPECT_FALSE(compare_traces(traces).has_value());
}

TEST(CompareTraces, RankFieldIsIgnoredInFavourOfThePosition) {
  std::vector<std::vector<OpRecord>> traces(2);
  append_everywhere(traces, all_reduce({0, 1}));
  traces[0][0].rank = -1;
  traces[1][0].rank = 0;
  EXPECT_FALSE(compare_traces(traces).has_value());
}

TEST(CompareTraces, MissingRecordOnAPeer) {
  std::vector<std::vector<OpRecord>> traces(2);
  append_everywhere(traces, all_reduce({0, 1}));
  const OpRecord second = all_reduce({0, 1}, ReduceOp::Kind::Max);
  traces[0].push_back(second);
  expect_divergence(
      compare_traces(traces),
      TraceDivergence{1, 1, "missing", "all_reduce(Float32 [4], max) on [0, 1]", "<none>", 0, 1});
  EXPECT_EQ(compare_traces(traces)->to_string(),
            "rank 1, record 1: no record where rank 0 record 1 has "
            "'all_reduce(Float32 [4], max) on [0, 1]'");
}

TEST(CompareTraces, MissingRecordOnTheReference) {
  std::vector<std::vector<OpRecord>> traces(3);
  append_everywhere(traces, all_reduce({0, 1, 2}));
  OpRecord extra = all_reduce({0, 1, 2});
  extra.tag = "late";
  traces[1].push_back(extra);
  traces[2].push_back(extra);
  // Rank 0 lacks it: reported at one past its last record, against the first peer that has it.
  expect_divergence(
      compare_traces(traces),
      TraceDivergence{0, 1, "missing", "all_reduce(Float32 [4], sum) on 'late' [0, 1, 2]", "<none>",
                      1, 1});
}

TEST(CompareTraces, DifferentTagsAreDifferentCommunicators) {
  std::vector<std::vector<OpRecord>> traces(2);
  append_everywhere(traces, all_reduce({0, 1}));
  traces[0][0].tag = "a";
  traces[1][0].tag = "b";
  // Communicator 'a' lacks rank 1's record and 'b' lacks rank 0's; rank 0 comes first.
  expect_divergence(compare_traces(traces),
                    TraceDivergence{0, 1, "missing", "all_reduce(Float32 [4], sum) on 'b' [0, 1]",
                                    "<none>", 1, 0});
}

TEST(CompareTraces, CommunicatorsMayInterleaveDifferently) {
  const OpRecord tensor_parallel = with(all_reduce({0, 1}), [](OpRecord& r) { r.tag = "tp"; });
  OpRecord data_parallel = make_record("all_gather_tensor", {0, 1}, {{2}});
  data_parallel.dims = {0};
  data_parallel.tag = "dp";
  std::vector<std::vector<OpRecord>> traces = {
      {tensor_parallel, data_parallel, tensor_parallel},
      {data_parallel, tensor_parallel, tensor_parallel},
  };
  EXPECT_FALSE(compare_traces(traces).has_value());

  // A divergence is reported at the record's own index, against the matching peer record.
  traces[1][0].dims = {1};
  expect_divergence(compare_traces(traces), TraceDivergence{1, 0, "dims", "[0]", "[1]", 0, 1});
}

TEST(CompareTraces, MpmdGroupsCompareWithinTheirSubList) {
  OpRecord sum = all_reduce({0, 1, 2, 3});
  sum.group_size = 2;
  OpRecord max = with(sum, [](OpRecord& r) { r.reduce_op = ReduceOp::Kind::Max; });
  std::vector<std::vector<OpRecord>> traces = {{sum}, {sum}, {max}, {max}};
  EXPECT_FALSE(compare_traces(traces).has_value());

  traces[3][0].reduce_op = ReduceOp::Kind::Min;
  expect_divergence(compare_traces(traces), TraceDivergence{3, 0, "reduce_op", "max", "min", 2, 0});
}

TEST(CompareTraces, MemberWithoutATraceMissesEveryRecord) {
  std::vector<std::vector<OpRecord>> traces(2);
  append_everywhere(traces, all_reduce({0, 1, 2}));
  expect_divergence(compare_traces(traces),
                    TraceDivergence{2, 0, "missing", "all_reduce(Float32 [4], sum) on [0, 1, 2]",
                                    "<none>", 0, 0});
}

TEST(CompareTraces, IssuerOutsideItsGroup) {
  std::vector<std::vector<OpRecord>> traces = {
      {all_reduce({0, 1})}, {all_reduce({0, 1})}, {all_reduce({0, 1})}};
  expect_divergence(compare_traces(traces),
                    TraceDivergence{2, 0, "group", "a group containing rank 2", "[0, 1]", -1, 0});
}

// Rank i sends kSplits[i][j] rows to rank j.
constexpr std::int64_t kSplits[3][3] = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}};

std::vector<std::vector<OpRecord>> uneven_all_to_all() {
  std::vector<std::vector<OpRecord>> traces(3);
  for (std::size_t i = 0; i < 3; ++i) {
    std::vector<std::int64_t> input(3);
    std::vector<std::int64_t> output(3);
    for (std::size_t j = 0; j < 3; ++j) {
      input[j] = kSplits[i][j];
      output[j] = kSplits[j][i];
    }
    OpRecord record =
        make_record("all_to_all_single", {0, 1, 2}, {{input[0] + input[1] + input[2], 2}});
    record.input_split_sizes = input;
    record.output_split_sizes = output;
    record.output_shapes = {{output[0] + output[1] + output[2], 2}};
    record.rank = static_cast<int>(i);
    traces[i].push_back(record);
  }
  return traces;
}

// uneven_all_to_all() with entry `index` of rank `r`'s `splits` (OpRecord::input_split_sizes or
// OpRecord::output_split_sizes) set to `value`.
std::vector<std::vector<OpRecord>> uneven_all_to_all_with(
    std::size_t r, std::optional<std::vector<std::int64_t>> OpRecord::*splits, std::size_t index,
    std::int64_t value) {
  std::vector<std::vector<OpRecord>> traces = uneven_all_to_all();
  (*(traces[r][0].*splits))[index] = value;
  return traces;
}

TEST(CompareTraces, UnevenAllToAllSplitsThatPairUpAgree) {
  EXPECT_FALSE(compare_traces(uneven_all_to_all()).has_value());
}

TEST(CompareTraces, InconsistentOutputSplitIsReported) {
  // Rank 1 sends 6.
  expect_divergence(
      compare_traces(uneven_all_to_all_with(2, &OpRecord::output_split_sizes, 1, 7)),
      TraceDivergence{2, 0, "splits", "input_split_sizes[2]=6", "output_split_sizes[1]=7", 1, 0});
}

TEST(CompareTraces, InconsistentInputSplitIsReportedOnTheHigherRankOfThePair) {
  // Rank 0 expects 4.
  expect_divergence(
      compare_traces(uneven_all_to_all_with(1, &OpRecord::input_split_sizes, 0, 3)),
      TraceDivergence{1, 0, "splits", "output_split_sizes[1]=4", "input_split_sizes[0]=3", 0, 0});
}

TEST(CompareTraces, AbsentSplitsMeanEqualSplitsOfInputDim0) {
  OpRecord equal = make_record("all_to_all_single", {0, 1}, {{4, 3}});
  OpRecord explicit_equal = equal;
  explicit_equal.input_split_sizes = std::vector<std::int64_t>{2, 2};
  explicit_equal.output_split_sizes = std::vector<std::int64_t>{2, 2};
  std::vector<std::vector<OpRecord>> traces = {{equal}, {explicit_equal}};
  EXPECT_FALSE(compare_traces(traces).has_value());

  traces[1][0].input_split_sizes = std::vector<std::int64_t>{1, 3};
  traces[1][0].output_split_sizes = std::vector<std::int64_t>{2, 3};
  expect_divergence(
      compare_traces(traces),
      TraceDivergence{1, 0, "splits", "output_split_sizes[1]=2", "input_split_sizes[0]=1", 0, 0});
}

TEST(CompareTraces, InconsistentSplitWithItselfIsReported) {
  // Rank 0 keeps 1 row of its own.
  expect_divergence(
      compare_traces(uneven_all_to_all_with(0, &OpRecord::output_split_sizes, 0, 5)),
      TraceDivergence{0, 0, "splits", "input_split_sizes[0]=1", "output_split_sizes[0]=5", 0, 0});
}

TEST(CompareTraces, SplitListOfTheWrongLength) {
  std::vector<std::vector<OpRecord>> traces = uneven_all_to_all();
  traces[1][0].output_split_sizes = std::vector<std::int64_t>{2, 5};
  expect_divergence(compare_traces(traces),
                    TraceDivergence{1, 0, "splits", "3 sizes (one per member)", "[2, 5]", -1, 0});
}

TEST(CompareTraces, FieldBeatsSplitsAtTheSameRecord) {
  std::vector<std::vector<OpRecord>> traces =
      uneven_all_to_all_with(2, &OpRecord::output_split_sizes, 1, 7);
  traces[2][0].dtype = DType::Int8;
  expect_divergence(compare_traces(traces),
                    TraceDivergence{2, 0, "dtype", "Float32", "Int8", 0, 0});
}

TEST(CompareTraces, SmallestRankThenIndexWins) {
  std::vector<std::vector<OpRecord>> traces(3);
  for (int i = 0; i < 5; ++i) {
    append_everywhere(traces, all_reduce({0, 1, 2}));
  }
  traces[2][0].dtype = DType::Int32;                 // rank 2, record 0
  traces[1][4].dims = {0};                           // rank 1, record 4
  traces[1][3].reduce_op = ReduceOp::Kind::Product;  // rank 1, record 3: the winner
  traces[2].pop_back();                              // rank 2 also misses record 4
  expect_divergence(compare_traces(traces),
                    TraceDivergence{1, 3, "reduce_op", "sum", "product", 0, 3});
}

}  // namespace
}  // namespace chorus
