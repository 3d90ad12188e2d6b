// The event log (Note [Event log]), its Perfetto trace JSON and SVG timeline (Note [Timeline
// layout]), the files SimOptions::timeline_path / trace_path write, and the run report.

#include <gtest/gtest.h>
#include <unistd.h>

#include <chorus/chorus.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/scoped_environment.hpp"
#include "support/sim_helpers.hpp"

namespace chorus {
namespace {

using sim::SimEvent;
using sim::SimOptions;
using sim::SimReport;
using Kind = SimEvent::Kind;

// ---- A tiny strict JSON reader: enough to check that the trace parses and to read it back.

struct Json {
  enum class Type { Null, Bool, Number, String, Array, Object } type = Type::Null;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  // A vector of a struct declared here, not of std::pair<std::string, Json>: libstdc++'s pair
  // wants Json complete, which clang 14 holds it to inside Json's own definition.
  struct Member;
  std::vector<Member> members;

  const Json* find(const std::string& key) const;
  const Json& at(const std::string& key) const {
    const Json* value = find(key);
    if (value == nullptr) {
      throw std::runtime_error("no member " + key);
    }
    return *value;
  }
};

struct Json::Member {
  std::string name;
  Json value;
};

const Json* Json::find(const std::string& key) const {
  for (const auto& [name, value] : members) {
    if (name == key) {
      return &value;
    }
  }
  return nullptr;
}

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : text_(text) {}

  Json read_document() {
    Json value = read_value();
    skip_space();
    expect(pos_ == text_.size(), "trailing characters");
    return value;
  }

 private:
  void expect(bool ok, const char* what) const {
    if (!ok) {
      throw std::runtime_error(std::string("bad JSON at ") + std::to_string(pos_) + ": " + what);
    }
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\t' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  char peek() {
    skip_space();
    expect(pos_ < text_.size(), "unexpected end");
    return text_[pos_];
  }
  void take(char c) {
    expect(peek() == c, "unexpected character");
    ++pos_;
  }
  bool take_word(const std::string& word) {
    if (text_.compare(pos_, word.size(), word) == 0) {
      pos_ += word.size();
      return true;
    }
    return false;
  }
  std::string read_string() {
    take('"');
    std::string out;
    while (true) {
      expect(pos_ < text_.size(), "unterminated string");
      const char c = text_[pos_++];
      expect(static_cast<unsigned char>(c) >= 0x20, "control character in a string");
      if (c == '"') {
        return out;
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      expect(pos_ < text_.size(), "unterminated escape");
      const char escaped = text_[pos_++];
      switch (escaped) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          expect(pos_ + 4 <= text_.size(), "short \\u escape");
          out += static_cast<char>(std::stoi(text_.substr(pos_, 4), nullptr, 16));
          pos_ += 4;
          break;
        default:
          expect(escaped == '"' || escaped == '\\' || escaped == '/', "unknown escape");
          out += escaped;
      }
    }
  }
  Json read_value() {
    Json value;
    const char c = peek();
    if (c == '{') {
      value.type = Json::Type::Object;
      take('{');
      if (peek() != '}') {
        do {
          std::string key = read_string();
          take(':');
          value.members.push_back(Json::Member{std::move(key), read_value()});
        } while (peek() == ',' && (take(','), true));
      }
      take('}');
    } else if (c == '[') {
      value.type = Json::Type::Array;
      take('[');
      if (peek() != ']') {
        do {
          value.items.push_back(read_value());
        } while (peek() == ',' && (take(','), true));
      }
      take(']');
    } else if (c == '"') {
      value.type = Json::Type::String;
      value.text = read_string();
    } else if (take_word("true") || take_word("false")) {
      value.type = Json::Type::Bool;
      value.boolean = text_[pos_ - 1] == 'e' && text_[pos_ - 2] == 'u';
    } else if (take_word("null")) {
      value.type = Json::Type::Null;
    } else {
      std::size_t used = 0;
      value.type = Json::Type::Number;
      value.number = std::stod(text_.substr(pos_), &used);
      expect(used > 0, "not a value");
      pos_ += used;
    }
    return value;
  }

  const std::string& text_;
  std::size_t pos_ = 0;
};

Json parse_json(const std::string& text) { return JsonReader(text).read_document(); }

// ---- Programs and helpers.

SimOptions recording(int world_size, std::uint64_t seed = 0) {
  SimOptions options = testing::quiet_options(world_size, seed);
  options.record_events = true;
  return options;
}

// Every choice 0 (Note [Decision stream]): the lowest runnable rank runs whenever one can, so a
// rank always blocks in its wait before the collective completes: the events are exact.
SimOptions lowest_rank_first(int world_size) {
  SimOptions options = recording(world_size);
  options.choices = std::vector<std::uint64_t>{};
  return options;
}

Tensor rank_tensor() { return Tensor::from_vector(std::vector<std::int32_t>{rank(), rank() + 1}); }

// One all_reduce waited, one dropped un-waited.
void waited_then_dropped() {
  Tensor waited = all_reduce(rank_tensor(), "sum", world());
  wait_tensor(waited);
  { Tensor dropped = all_reduce(rank_tensor(), "sum", world()); }
}

// Ops #0 agree; at #1 the last rank issues all_gather where the others issue all_reduce: a
// CollectiveMismatch on every rank.
void mismatch_at_second_op() {
  wait_tensor(all_reduce(rank_tensor(), "sum", world()));
  if (rank() == world_size() - 1) {
    wait_tensor(all_gather_tensor(rank_tensor(), 0, world()));
  } else {
    wait_tensor(all_reduce(rank_tensor(), "sum", world()));
  }
}

std::map<Kind, int> count_kinds(const SimReport& report) {
  std::map<Kind, int> counts;
  for (const SimEvent& event : report.events) {
    counts[event.kind] += 1;
  }
  return counts;
}

std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t count = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) {
    ++count;
  }
  return count;
}

// A file name in the test's temporary directory, of this process only: the per-test ctest entries
// and the whole binary's run (simulator_test.threads) may run at the same time.
std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + std::to_string(::getpid()) + "_" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

// A hand-made two-rank log with exact times (ns), for the layout (Note [Timeline layout]):
//   rank 0: all_reduce #0 0-2000, its wait 1000-3000 (overlaps without nesting: row 2), then
//           all_reduce #1 3000-4000, arrived and dropped at 3000, finalized at 4000;
//   rank 1: all_reduce #0 0-2000, its wait 1000-2000 (ends with it: nested), then
//           all_reduce #1 2000-2050 (begins as #0 ends: the same row).
SimReport hand_made_report() {
  SimReport report;
  report.world_size = 2;
  report.virtual_time = std::chrono::nanoseconds(4000);
  report.rank_errors.resize(2);
  const auto add = [&](Kind kind, int rank, std::int64_t seq, std::int64_t ns) {
    SimEvent event;
    event.kind = kind;
    event.step = static_cast<std::uint64_t>(ns / 1000);
    event.time = std::chrono::nanoseconds(ns);
    event.rank = rank;
    event.op = "all_reduce";
    event.comm_id = 1;
    event.group = "[0, 1]";
    event.seq = seq;
    event.owner = rank;
    event.detail = kind == Kind::Finalize ? "after a drop" : "";
    report.events.push_back(event);
  };
  add(Kind::Issue, 0, 0, 0);
  add(Kind::Issue, 1, 0, 0);
  add(Kind::WaitBegin, 0, 0, 1000);
  add(Kind::WaitBegin, 1, 0, 1000);
  add(Kind::Complete, 0, 0, 2000);
  add(Kind::Complete, 1, 0, 2000);
  add(Kind::WaitEnd, 1, 0, 2000);
  add(Kind::Issue, 1, 1, 2000);
  add(Kind::Complete, 1, 1, 2050);
  add(Kind::WaitEnd, 0, 0, 3000);
  add(Kind::Issue, 0, 1, 3000);
  add(Kind::Arrive, 0, 1, 3000);
  add(Kind::Drop, 0, 1, 3000);
  add(Kind::Complete, 0, 1, 4000);
  add(Kind::Finalize, 0, 1, 4000);
  return report;
}

// ---- The event log

TEST(EventLog, IsOffByDefaultButOperationsAreCounted) {
  const SimReport report = sim::run(testing::quiet_options(3), waited_then_dropped);
  EXPECT_TRUE(report.events.empty());
  EXPECT_EQ(report.mark_count("timeline.events"), 0u);
  EXPECT_EQ(report.ops_issued, (std::vector<std::uint64_t>{2, 2, 2}));
}

TEST(EventLog, RecordsEachRanksIssueArriveWaitCompleteDropFinalizeAndEnd) {
  const SimReport report = sim::run(lowest_rank_first(2), waited_then_dropped);
  const std::map<Kind, int> expected = {
      {Kind::Issue, 4},   {Kind::Arrive, 4}, {Kind::Complete, 4}, {Kind::WaitBegin, 4},
      {Kind::WaitEnd, 4}, {Kind::Drop, 2},   {Kind::Finalize, 2}, {Kind::End, 2}};
  EXPECT_EQ(count_kinds(report), expected);
  EXPECT_EQ(report.mark_count("timeline.events"), 26u);
  EXPECT_EQ(report.mark_count("timeline.drop"), 2u);
  EXPECT_EQ(report.mark_count("timeline.finalize"), 2u);
  // Rank 0's story, in order.
  std::vector<std::pair<Kind, std::int64_t>> rank0;
  for (const SimEvent& event : report.events) {
    if (event.rank == 0) {
      rank0.emplace_back(event.kind, event.seq);
    }
  }
  const std::vector<std::pair<Kind, std::int64_t>> story = {
      {Kind::Issue, 0},     {Kind::Arrive, 0},   {Kind::WaitBegin, 0}, {Kind::Complete, 0},
      {Kind::WaitEnd, 0},   {Kind::Issue, 1},    {Kind::Arrive, 1},    {Kind::Drop, 1},
      {Kind::WaitBegin, 1}, {Kind::Complete, 1}, {Kind::WaitEnd, 1},   {Kind::Finalize, 1},
      {Kind::End, -1}};
  EXPECT_EQ(rank0, story);
  for (const SimEvent& event : report.events) {
    if (event.kind == Kind::End) {  // no operation: how the rank's function ended
      EXPECT_EQ(event.detail, "returned");
      EXPECT_EQ(event.op, "");
      EXPECT_EQ(event.owner, event.rank);
      EXPECT_EQ(event.to_string(), "step " + std::to_string(event.step) +
                                       " t=" + std::to_string(event.step) + "us rank " +
                                       std::to_string(event.rank) + " end: returned");
      continue;
    }
    EXPECT_EQ(event.op, "all_reduce");
    EXPECT_EQ(event.group, "[0, 1]");
    EXPECT_EQ(event.owner, event.rank);
    EXPECT_EQ(event.time, sim::kStepDuration * static_cast<std::int64_t>(event.step));
    EXPECT_NE(std::string(event.site.file_name()).find("timeline_test.cpp"), std::string::npos);
    if (event.kind == Kind::Finalize) {
      EXPECT_EQ(event.detail, "after a drop");
    }
  }
}

TEST(EventLog, TimesNeverGoBackwards) {
  const SimReport report = sim::run(recording(4, 7), waited_then_dropped);
  ASSERT_FALSE(report.events.empty());
  for (std::size_t i = 1; i < report.events.size(); ++i) {
    EXPECT_LE(report.events[i - 1].step, report.events[i].step);
  }
}

TEST(EventLog, DoesNotChangeTheSchedule) {
  for (std::uint64_t seed : {0u, 1u, 2u, 3u}) {
    const SimReport plain = sim::run(testing::quiet_options(3, seed), waited_then_dropped);
    const SimReport logged = sim::run(recording(3, seed), waited_then_dropped);
    EXPECT_EQ(plain.schedule_hash, logged.schedule_hash) << "seed " << seed;
    EXPECT_EQ(plain.choices, logged.choices) << "seed " << seed;
  }
}

TEST(EventLog, FailuresAreLoggedWithTheirError) {
  const SimReport report = sim::simulate(lowest_rank_first(3), mismatch_at_second_op);
  ASSERT_FALSE(report.ok());
  int fails = 0;
  for (const SimEvent& event : report.events) {
    if (event.kind == Kind::Fail) {
      ++fails;
      EXPECT_EQ(event.seq, 1);
      EXPECT_EQ(event.detail.rfind("CollectiveMismatch: ranks disagree on operation #1", 0), 0u)
          << event.detail;
    }
  }
  EXPECT_EQ(fails, 3);
}

// The rank that causes a failure shows it: its lane ends with how its function ended (a
// throw, an injected crash), drawn red in the SVG and "terrible" in the trace.
TEST(EventLog, EachRanksEndSaysHowItsFunctionEnded) {
  SimOptions options = lowest_rank_first(3);
  options.faults = {sim::Fault::crash(2, 1)};
  const SimReport report = sim::simulate(options, [] {
    (void)all_reduce(rank_tensor(), "sum", world()).to_vector<std::int32_t>();
    if (rank() == 1) {
      throw std::runtime_error("CUDA OOM on rank 1");
    }
    (void)all_reduce(rank_tensor(), "sum", world()).to_vector<std::int32_t>();
  });
  std::map<int, std::string> ends;
  for (const SimEvent& event : report.events) {
    if (event.kind == Kind::End) {
      EXPECT_TRUE(ends.emplace(event.rank, event.detail).second) << "one End per rank";
    }
  }
  ASSERT_EQ(ends.size(), 3u);
  EXPECT_EQ(ends[0].rfind("threw chorus::RankFailure: [rank 0] all_reduce #1", 0), 0u) << ends[0];
  EXPECT_EQ(ends[1], "threw CUDA OOM on rank 1");
  EXPECT_EQ(
      ends[2].rfind(
          "rank 2 crashed (injected fault: crash at rank 2's operation 1, starting all_reduce #1",
          0),
      0u)
      << ends[2];
  const std::string svg = sim::to_svg_timeline(report);
  EXPECT_EQ(count_of(svg, "<rect class=\"end abnormal\""), 4u) << "3 ranks and the legend";
  EXPECT_NE(svg.find("<title>end at "), std::string::npos);
  EXPECT_NE(svg.find("us: threw CUDA OOM on rank 1</title>"), std::string::npos);
}

// The title quotes the error the run raised first (the cause), not the lowest rank's (here a
// RankFailure that only follows from it).
TEST(SvgTimeline, TheFailureLineQuotesTheFirstErrorRaised) {
  const SimReport report = sim::simulate(lowest_rank_first(3), [] {
    (void)all_reduce(rank_tensor(), "sum", world()).to_vector<std::int32_t>();
    if (rank() == 2) {
      throw std::runtime_error("CUDA OOM on rank 2");
    }
    (void)all_reduce(rank_tensor(), "sum", world()).to_vector<std::int32_t>();
  });
  ASSERT_EQ(report.first_error_rank, 2);
  EXPECT_NE(report.rank_errors[0].find("RankFailure"), std::string::npos) << report.rank_errors[0];
  const std::string svg = sim::to_svg_timeline(report);
  EXPECT_NE(svg.find("<text class=\"failure\" x=\"8\" y=\"32\">failed: rank 2: CUDA OOM on rank 2"),
            std::string::npos)
      << svg.substr(0, 2000);
  EXPECT_NE(sim::to_perfetto_json(report).find("(failed: rank 2: CUDA OOM on rank 2)"),
            std::string::npos);
}

TEST(EventLog, FinalizationAtRankExitIsLogged) {
  Tensor kept[2];
  const SimReport report = sim::run(lowest_rank_first(2), [&] {
    kept[rank()] = all_reduce(rank_tensor(), "sum", world());  // never waited, never dropped
  });
  EXPECT_EQ(report.mark_count("timeline.finalize.at_rank_exit"), 2u);
  EXPECT_EQ(report.mark_count("timeline.drop"), 0u);
  EXPECT_EQ(count_kinds(report)[Kind::Finalize], 2);
  for (const SimEvent& event : report.events) {
    if (event.kind == Kind::Finalize) {
      EXPECT_EQ(event.detail, "at rank exit");
    }
  }
}

TEST(EventLog, StopsAtItsCapAndCountsTheRest) {
  SimOptions options = lowest_rank_first(2);
  options.events_record_max = 5;
  const SimReport report = sim::run(options, waited_then_dropped);
  EXPECT_EQ(report.events.size(), 5u);
  EXPECT_EQ(report.events_not_recorded, 21u);  // the two End events included
  EXPECT_EQ(report.mark_count("timeline.events_not_recorded"), 21u);
}

// ---- Perfetto JSON

TEST(PerfettoJson, ParsesBackWithOneSpanPerOperationAndWaitAndOneInstantPerMarker) {
  const SimReport report = sim::run(lowest_rank_first(2), waited_then_dropped);
  const Json trace = parse_json(sim::to_perfetto_json(report));
  const Json& events = trace.at("traceEvents");
  ASSERT_EQ(events.type, Json::Type::Array);
  std::map<std::string, int> by_phase;
  std::map<std::string, int> by_category;
  std::vector<std::string> rank_threads;
  for (const Json& event : events.items) {
    const std::string phase = event.at("ph").text;
    by_phase[phase] += 1;
    EXPECT_EQ(event.at("pid").number, 0);
    if (phase == "M" && event.at("name").text == "thread_name") {
      const std::string name = event.at("args").at("name").text;
      if (name.find("row") == std::string::npos) {
        rank_threads.push_back(name + " tid " + std::to_string(int(event.at("tid").number)));
      }
    }
    if (phase != "M") {
      by_category[event.at("cat").text] += 1;
      EXPECT_GE(event.at("ts").number, 1);
    }
    if (phase != "M" && event.at("cat").text == "end") {  // no operation
      EXPECT_EQ(event.at("name").text, "end");
      EXPECT_EQ(event.at("args").at("detail").text, "returned");
      EXPECT_EQ(event.find("cname"), nullptr) << "a rank that returned is no failure";
    } else if (phase != "M") {
      EXPECT_EQ(event.at("args").at("group").text, "[0, 1]");
      EXPECT_NE(event.at("args").at("site").text.find("timeline_test.cpp"), std::string::npos);
    }
    if (phase == "X") {
      EXPECT_GE(event.at("dur").number, 1);
    }
  }
  EXPECT_EQ(by_phase["X"], 8);   // 4 operations (2 per rank), 4 waits
  EXPECT_EQ(by_phase["i"], 10);  // 4 arrivals, 2 drops, 2 finalizations, 2 ends
  const std::map<std::string, int> categories = {{"op", 4},   {"wait", 4},     {"arrive", 4},
                                                 {"drop", 2}, {"finalize", 2}, {"end", 2}};
  EXPECT_EQ(by_category, categories);
  EXPECT_EQ(rank_threads, (std::vector<std::string>{"rank 0 tid 0", "rank 1 tid 1"}));
}

TEST(PerfettoJson, SlicesOfEachThreadNest) {
  // Operations overlap their waits without nesting: the layout moves them to rows (threads).
  for (std::uint64_t seed : {0u, 5u, 9u}) {
    const SimReport report = sim::run(recording(3, seed), [] {
      Tensor a = all_reduce(rank_tensor(), "sum", world());
      Tensor b = all_gather_tensor(rank_tensor(), 0, world());
      wait_tensor(b);
      wait_tensor(a);
    });
    const Json trace = parse_json(sim::to_perfetto_json(report));
    std::map<int, std::vector<std::pair<double, double>>> slices;  // tid -> (begin, end)
    for (const Json& event : trace.at("traceEvents").items) {
      if (event.at("ph").text == "X") {
        const double ts = event.at("ts").number;
        slices[int(event.at("tid").number)].emplace_back(ts, ts + event.at("dur").number);
      }
    }
    ASSERT_FALSE(slices.empty());
    for (const auto& [tid, spans] : slices) {
      for (std::size_t i = 0; i < spans.size(); ++i) {
        for (std::size_t j = i + 1; j < spans.size(); ++j) {
          const auto [a0, a1] = spans[i];
          const auto [b0, b1] = spans[j];
          const bool disjoint = a1 <= b0 || b1 <= a0;
          const bool nested = (a0 <= b0 && b1 <= a1) || (b0 <= a0 && a1 <= b1);
          EXPECT_TRUE(disjoint || nested) << "seed " << seed << " tid " << tid;
        }
      }
    }
  }
}

TEST(PerfettoJson, EscapesStringsAndMarksFailures) {
  const SimReport report = sim::simulate(lowest_rank_first(3), mismatch_at_second_op);
  const std::string json = sim::to_perfetto_json(report);
  const Json trace = parse_json(json);  // the mismatch's detail has quotes and newlines
  int failed_spans = 0;
  int fail_instants = 0;
  int abnormal_ends = 0;  // each rank's function ended by the mismatch it raised
  for (const Json& event : trace.at("traceEvents").items) {
    if (event.find("cname") != nullptr) {
      EXPECT_EQ(event.at("cname").text, "terrible");
      (event.at("ph").text == "X"                   ? failed_spans
       : event.at("cat").text == std::string("end") ? abnormal_ends
                                                    : fail_instants) += 1;
      EXPECT_NE(event.at("args").at("detail").text.find("CollectiveMismatch"), std::string::npos);
    }
  }
  EXPECT_EQ(failed_spans, 3);
  EXPECT_EQ(fail_instants, 3);
  EXPECT_EQ(abnormal_ends, 3);
  EXPECT_NE(trace.at("traceEvents").items[0].at("args").at("name").text.find("failed: rank"),
            std::string::npos);
}

// Each span goes to the first row whose open spans all enclose it: one that ends as the next
// begins is closed, one that ends with it encloses it. Row k > 0 is thread k * world_size + r,
// named "rank r (row k+1)" and sorted right under row 0.
TEST(PerfettoJson, ASpanTakesTheFirstRowWhoseOpenSpansEncloseIt) {
  const Json trace = parse_json(sim::to_perfetto_json(hand_made_report()));
  std::vector<std::string> threads;  // "name tid sort_index"
  std::map<int, std::string> names;
  std::vector<std::tuple<std::string, int, double, double>> slices;  // name, tid, ts, dur
  for (const Json& event : trace.at("traceEvents").items) {
    const std::string phase = event.at("ph").text;
    const int tid = int(event.at("tid").number);
    if (phase == "M" && event.at("name").text == "thread_name") {
      names[tid] = event.at("args").at("name").text;
    } else if (phase == "M" && event.at("name").text == "thread_sort_index") {
      threads.push_back(names[tid] + " " + std::to_string(tid) + " " +
                        std::to_string(int(event.at("args").at("sort_index").number)));
    } else if (phase == "X") {
      slices.emplace_back(event.at("name").text, tid, event.at("ts").number,
                          event.at("dur").number);
    }
  }
  EXPECT_EQ(threads,
            (std::vector<std::string>{"rank 0 0 0", "rank 0 (row 2) 2 1", "rank 1 1 1024"}));
  const std::vector<std::tuple<std::string, int, double, double>> expected = {
      {"all_reduce #0", 0, 0, 2},      {"all_reduce #0", 1, 0, 2},
      {"wait all_reduce #0", 2, 1, 2}, {"wait all_reduce #0", 1, 1, 1},
      {"all_reduce #1", 1, 2, 0.05},   {"all_reduce #1", 0, 3, 1}};
  EXPECT_EQ(slices, expected);
}

// Times are microseconds with the nanoseconds as three decimals: 50 ns is 0.050, not 0.50.
TEST(PerfettoJson, TimesKeepTheirNanosecondsAsThreeDecimals) {
  const std::string json = sim::to_perfetto_json(hand_made_report());
  EXPECT_NE(json.find("\"ph\":\"X\",\"ts\":2,\"dur\":0.050,"), std::string::npos) << json;
}

// JSON strings escape every control character; ESC has no short form: \u001b. The process is
// named after the first line of the first error only, as the SVG's title.
TEST(PerfettoJson, EscapesControlCharactersAsUnicodeEscapes) {
  SimReport report;
  report.world_size = 2;
  report.rank_errors = {"", "\x1b[31mloss is NaN\x1b[0m\x01\nat step 3"};
  const std::string json = sim::to_perfetto_json(report);
  EXPECT_NE(json.find("(failed: rank 1: \\u001b[31mloss is NaN\\u001b[0m\\u0001)\""),
            std::string::npos)
      << json;
  EXPECT_EQ(sim::to_svg_timeline(report).find("at step 3"), std::string::npos);
  for (const char c : json) {
    EXPECT_TRUE(static_cast<unsigned char>(c) >= 0x20 || c == '\n')
        << "control character " << int(c) << " in the JSON";
  }
}

TEST(PerfettoJson, IsEmptyWithoutEvents) {
  const SimReport report = sim::run(testing::quiet_options(2), waited_then_dropped);
  const Json trace = parse_json(sim::to_perfetto_json(report));
  for (const Json& event : trace.at("traceEvents").items) {
    EXPECT_EQ(event.at("ph").text, "M");
  }
}

// ---- SVG

TEST(SvgTimeline, DrawsOneLanePerRankAndOneBoxPerOperationWithTheFailingOnesRed) {
  const SimReport report = sim::simulate(lowest_rank_first(4), mismatch_at_second_op);
  const std::string svg = sim::to_svg_timeline(report);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count_of(svg, "<g class=\"lane\""), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(count_of(svg, "<g class=\"lane\" data-rank=\"" + std::to_string(r) + "\">"), 1u);
  }
  EXPECT_EQ(count_of(svg, "<rect class=\"op\" data-rank="), 4u);         // ops #0
  EXPECT_EQ(count_of(svg, "<rect class=\"op failed\" data-rank="), 4u);  // ops #1, the mismatch
  EXPECT_EQ(count_of(svg,
                     "<rect class=\"op failed\" data-rank=\"3\" data-op=\"all_gather_tensor\" "
                     "data-seq=\"1\""),
            1u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(count_of(svg, "<rect class=\"op failed\" data-rank=\"" + std::to_string(r) +
                                "\" data-op=\"all_reduce\" data-seq=\"1\""),
              1u);
  }
  EXPECT_EQ(count_of(svg, "<g class=\"fail\""), 4u);
  EXPECT_NE(svg.find(".op.failed { fill: #d62728;"), std::string::npos) << "failures are red";
  EXPECT_NE(svg.find("class=\"failure\""), std::string::npos) << "the error is in the title";
  EXPECT_NE(svg.find("<g class=\"legend\">"), std::string::npos);
  EXPECT_EQ(svg.find("<g class=\"drop\""), std::string::npos);
}

// A lane is as tall as its rows, and the next lane starts below them; a span sits on its row. An
// arrival is a tick that takes no marker's place: the drop at the same moment stays at its time.
TEST(SvgTimeline, LanesAreAsTallAsTheirRowsAndArrivalsLeaveMarkersInPlace) {
  // 4 us of virtual time at 28 px per us, right of the 90 px labels; lanes from y = 48, 22 px per
  // row, 8 px apart.
  const std::string svg = sim::to_svg_timeline(hand_made_report());
  EXPECT_NE(svg.find(R"(<g class="lane" data-rank="0"><rect class="lane-bg" x="90.0" y="48.0" )"
                     R"(width="112.0" height="44.0"/>)"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find(R"(<g class="lane" data-rank="1"><rect class="lane-bg" x="90.0" y="100.0" )"
                     R"(width="112.0" height="22.0"/>)"),
            std::string::npos)
      << svg;
  // Rank 0's wait on its second row, rank 1's on its first.
  EXPECT_NE(svg.find(R"(<rect class="wait" data-rank="0" data-op="all_reduce" data-seq="0" )"
                     R"(x="118.0" y="76.0" width="56.0" height="10.0">)"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find(R"(<rect class="wait" data-rank="1" data-op="all_reduce" data-seq="0" )"
                     R"(x="118.0" y="106.0" width="28.0" height="10.0">)"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find(R"(<path class="drop" d="M 169.0 60.0 L 179.0 60.0 L 174.0 68.0 Z"/>)"),
            std::string::npos)
      << svg;
}

// Markup characters are escaped; overlong sequences after E0 and F0 (second byte below A0 and 90)
// are ill-formed: one U+FFFD per byte. U+0800, the first three-byte character, passes.
TEST(SvgTimeline, EscapesMarkupAndReplacesOverlongSequencesInAMessage) {
  SimReport report;
  report.world_size = 2;
  report.rank_errors = {"", "loss < 0 & grad > 1: \xE0\x80\x80 \xF0\x80\x80\x80 \xE0\xA0\x80"};
  const std::string r = "\xEF\xBF\xBD";  // U+FFFD
  const std::string shown =
      "rank 1: loss &lt; 0 &amp; grad &gt; 1: " + r + r + r + " " + r + r + r + r + " \xE0\xA0\x80";
  const std::string svg = sim::to_svg_timeline(report);
  EXPECT_NE(svg.find("<text class=\"failure\" x=\"8\" y=\"32\">failed: " + shown + "<title>" +
                     shown + "</title></text>"),
            std::string::npos)
      << svg;
  EXPECT_NE(sim::to_perfetto_json(report).find(": " + r + r + r + " " + r + r + r + r + " "),
            std::string::npos);
}

TEST(SvgTimeline, MarksDropsAndFinalizations) {
  const SimReport report = sim::run(lowest_rank_first(2), waited_then_dropped);
  const std::string svg = sim::to_svg_timeline(report);
  EXPECT_EQ(count_of(svg, "<g class=\"drop\""), 2u);
  EXPECT_EQ(count_of(svg, "<g class=\"finalize\""), 2u);
  EXPECT_EQ(count_of(svg, "<g class=\"arrive\""), 4u);
  EXPECT_EQ(count_of(svg, "<rect class=\"wait\" data-rank="), 4u);
  EXPECT_EQ(count_of(svg, "<rect class=\"op\" data-rank="), 4u);
}

TEST(SvgTimeline, ControlCharactersInAMessageBecomeReplacementCharacters) {
  // An error message with an ANSI colour code (ESC, 0x1b) and a 0x01: no XML 1.0 document may
  // hold either, so the SVG carries U+FFFD in their place; tab and newline pass through.
  const SimReport report = sim::simulate(lowest_rank_first(2), [] {
    (void)wait_tensor(all_reduce(Tensor::ones({1}), "sum", world()));
    if (rank() == 1) {
      throw std::runtime_error("\x1b[31mloss is NaN\x1b[0m\x01\tat step 3");
    }
  });
  const std::string svg = sim::to_svg_timeline(report);
  for (const char c : svg) {
    const auto byte = static_cast<unsigned char>(c);
    EXPECT_TRUE(byte >= 0x20 || c == '\t' || c == '\n' || c == '\r')
        << "control character " << static_cast<int>(byte) << " in the SVG";
  }
  EXPECT_NE(svg.find("\xEF\xBF\xBD[31mloss is NaN\xEF\xBF\xBD[0m\xEF\xBF\xBD\tat step 3"),
            std::string::npos);
}

TEST(SvgTimeline, InvalidUtf8InAMessageBecomesReplacementCharacters) {
  // A message is a byte string; the SVG and the Perfetto JSON must be UTF-8. Each ill-formed
  // subsequence becomes one U+FFFD per maximal subpart; well-formed characters pass through.
  const SimReport report = sim::simulate(lowest_rank_first(2), [] {
    (void)wait_tensor(all_reduce(Tensor::ones({1}), "sum", world()));
    if (rank() == 1) {
      throw std::runtime_error(
          "a\xff|b\xe2\x82|c\xc0\xaf|d\xed\xa0\x80|e\xf4\x90\x80\x80|f\xe2\x82\xac|"
          "g\xf0\x9d\x84\x9e|h\xe2");
    }
  });
  const std::string r = "\xEF\xBF\xBD";  // U+FFFD
  const std::string expected = "a" + r + "|b" + r + "|c" + r + r + "|d" + r + r + r + "|e" + r + r +
                               r + r + "|f\xe2\x82\xac|g\xf0\x9d\x84\x9e|h" + r;
  const std::string svg = sim::to_svg_timeline(report);
  EXPECT_NE(svg.find(expected), std::string::npos) << svg;
  const std::string json = sim::to_perfetto_json(report);
  EXPECT_NE(json.find(expected), std::string::npos) << json;
}

TEST(SvgTimeline, NoncharactersFFFEAndFFFFBecomeReplacementCharacters) {
  // U+FFFE and U+FFFF are well-formed UTF-8 but not XML 1.0 characters: an XML parser refuses
  // the file. The JSON keeps them (JSON allows every code point).
  const SimReport report = sim::simulate(lowest_rank_first(2), [] {
    (void)wait_tensor(all_reduce(Tensor::ones({1}), "sum", world()));
    if (rank() == 1) {
      throw std::runtime_error("x\xEF\xBF\xBEy\xEF\xBF\xBFz");
    }
  });
  const std::string svg = sim::to_svg_timeline(report);
  EXPECT_EQ(svg.find("\xEF\xBF\xBE"), std::string::npos);
  EXPECT_EQ(svg.find("\xEF\xBF\xBF"), std::string::npos);
  EXPECT_NE(svg.find("x\xEF\xBF\xBDy\xEF\xBF\xBDz"), std::string::npos);
  EXPECT_NE(sim::to_perfetto_json(report).find("x\xEF\xBF\xBEy\xEF\xBF\xBFz"), std::string::npos);
}

TEST(TextTimeline, TimesPrintInPlainMicrosecondsAfterMinutesOfVirtualTime) {
  // A double streamed with the default precision printed "t=6e+08us" after the 10-minute
  // watchdog, and events microseconds apart printed alike.
  SimOptions options = recording(2, 0);
  options.faults = {sim::Fault::hang(1, 0)};
  const SimReport report = sim::simulate(options, [] {
    try {
      (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
    } catch (const Timeout&) {
    }
  });
  ASSERT_GE(report.virtual_time, std::chrono::minutes(10));
  const std::string text = sim::timeline_text(report) + report.to_string();
  EXPECT_EQ(text.find("e+"), std::string::npos) << text;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(report.virtual_time);
  const auto rest = (report.virtual_time - us).count();
  std::string expected = "virtual time " + std::to_string(us.count());
  if (rest != 0) {
    std::string digits = std::to_string(rest);
    digits.insert(0, 3 - digits.size(), '0');
    while (digits.back() == '0') {
      digits.pop_back();
    }
    expected += "." + digits;
  }
  EXPECT_NE(text.find(expected + " us"), std::string::npos) << text;
}

TEST(SvgTimeline, SameRunGivesTheSameBytes) {
  const SimReport first = sim::simulate(recording(4, 3), mismatch_at_second_op);
  const SimReport second = sim::simulate(recording(4, 3), mismatch_at_second_op);
  EXPECT_EQ(sim::to_svg_timeline(first), sim::to_svg_timeline(second));
  EXPECT_EQ(sim::to_perfetto_json(first), sim::to_perfetto_json(second));
}

// The first value of `attribute` (' x="') after the first `prefix` in `svg`.
double x_of_first(const std::string& svg, const std::string& prefix, const std::string& attribute) {
  const std::size_t element = svg.find(prefix);
  if (element == std::string::npos) {
    throw std::runtime_error("no " + prefix);
  }
  const std::size_t at = svg.find(attribute, element) + attribute.size();
  return std::stod(svg.substr(at, svg.find('"', at) - at));
}

TEST(SvgTimeline, AWatchdogTimeoutsMinutesOfVirtualTimeAreABreakNotAScale) {
  SimOptions options = recording(2, 0);
  options.faults = {sim::Fault::hang(1, 0)};  // the default 10-minute timeout fires
  const SimReport report = sim::simulate(options, [] {
    try {
      (void)all_reduce(Tensor::ones({1}), "sum", world()).item<float>();
    } catch (const Timeout&) {
    }
  });
  ASSERT_GE(report.virtual_time, std::chrono::minutes(10));
  const std::string svg = sim::to_svg_timeline(report);
  const std::size_t at = svg.find("width=\"") + 7;
  const double width = std::stod(svg.substr(at, svg.find('"', at) - at));
  EXPECT_LE(width, 2000.0) << "one pixel per microsecond would be 600 million";
  // The ten minutes are one break; the microseconds before it keep their scale (28 px each, at
  // most): rank 1's arrival (after its issue) stands clear of rank 0's, not in the same pixel.
  EXPECT_EQ(count_of(svg, "<g class=\"skip\">"), 1u) << svg;
  EXPECT_NE(svg.find(">+10 min</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<title>+10 min of virtual time skipped: no event from "), std::string::npos);
  const double arrive0 = x_of_first(svg, "<g class=\"arrive\" data-rank=\"0\">", " x1=\"");
  const double arrive1 = x_of_first(svg, "<g class=\"arrive\" data-rank=\"1\">", " x1=\"");
  const double skip = x_of_first(svg, "<rect class=\"skip\"", " x=\"");
  EXPECT_GE(std::abs(arrive1 - arrive0), 20.0) << svg;
  EXPECT_LT(std::max(arrive0, arrive1), skip);
  // Each side of the break has its ticks, labelled in the run's own microseconds.
  EXPECT_NE(svg.find(">0us</text>"), std::string::npos);
  EXPECT_NE(svg.find(">600000003us</text>"), std::string::npos) << svg;
}

// A break's label is in plain digits whatever the stretch: a day is "+24 h", not "+1.44e+03 min".
TEST(SvgTimeline, ABreakOfADayOrMoreIsLabelledInHours) {
  for (const auto& [skip_ns, label] :
       {std::pair<std::int64_t, std::string>{std::int64_t{86'400} * 1'000'000'000, ">+24 h</text>"},
        {std::int64_t{7'200'000} * 1'000'000'000, ">+2000 h</text>"},
        {std::int64_t{5'000'000}, ">+5 ms</text>"},
        // %.3g would write these as "+1e+03 ms" and "+1e+03 h".
        {std::int64_t{999'600'000}, ">+1000 ms</text>"},
        {std::int64_t{3'599'000} * 1'000'000'000, ">+1000 h</text>"}}) {
    SimReport report;  // hand-made: one operation that lasts `skip_ns`
    report.world_size = 1;
    SimEvent issue;
    issue.kind = Kind::Issue;
    issue.rank = 0;
    issue.owner = 0;
    issue.op = "all_reduce";
    issue.group = "[0]";
    issue.comm_id = 1;
    issue.seq = 0;
    issue.time = std::chrono::nanoseconds(1000);
    SimEvent complete = issue;
    complete.kind = Kind::Complete;
    complete.time = issue.time + std::chrono::nanoseconds(skip_ns);
    report.events = {issue, complete};
    report.virtual_time = complete.time + std::chrono::nanoseconds(1000);
    const std::string svg = sim::to_svg_timeline(report);
    EXPECT_EQ(count_of(svg, "<g class=\"skip\">"), 1u) << svg;
    EXPECT_NE(svg.find(label), std::string::npos) << svg;
    EXPECT_EQ(svg.find("e+0"), std::string::npos) << svg;
  }
}

TEST(SvgTimeline, ARunWithoutALongQuietStretchHasNoBreak) {
  const SimReport report = sim::simulate(recording(4, 3), mismatch_at_second_op);
  EXPECT_EQ(sim::to_svg_timeline(report).find("class=\"skip\""), std::string::npos);
}

// TimeAxis::right: the axis ends one microsecond past its last stretch's start at least, so a
// stretch of no length still gets a lane (until 2026-12-07 a run of no virtual time drew lanes 0
// px wide, and a run ending where a break ends drew nothing right of the break).
TEST(SvgTimeline, AStretchOfNoVirtualTimeStillGetsAMicrosecondOfLane) {
  const auto one_op_report = [](std::int64_t complete_ns, std::int64_t end_ns) {
    SimReport report;
    report.world_size = 1;
    report.virtual_time = std::chrono::nanoseconds(end_ns);
    report.rank_errors.resize(1);
    for (const auto& [kind, ns] :
         {std::pair{Kind::Issue, std::int64_t{0}}, std::pair{Kind::Complete, complete_ns},
          std::pair{Kind::End, end_ns}}) {
      SimEvent event;
      event.kind = kind;
      event.time = std::chrono::nanoseconds(ns);
      event.rank = 0;
      event.op = kind == Kind::End ? "" : "all_reduce";
      event.group = "[0]";
      event.seq = kind == Kind::End ? -1 : 0;
      event.owner = 0;
      event.detail = kind == Kind::End ? "returned" : "";
      report.events.push_back(event);
    }
    return report;
  };
  // Everything at time 0: one microsecond at 28 px, right of the 90 px labels.
  const std::string instant = sim::to_svg_timeline(one_op_report(0, 0));
  EXPECT_NE(instant.find(R"(<rect class="lane-bg" x="90.0" y="48.0" width="28.0" )"),
            std::string::npos)
      << instant;
  // 1 us drawn to scale (28 px), a break (28 px, the ten minutes' quiet) and a last stretch that
  // begins and ends at the run's end: one more microsecond (28 px) after the break.
  const std::int64_t ten_minutes_ns = std::int64_t{600} * 1'000'000'000;
  const std::string broken = sim::to_svg_timeline(one_op_report(1000, ten_minutes_ns));
  EXPECT_EQ(count_of(broken, "<g class=\"skip\">"), 1u) << broken;
  EXPECT_NE(broken.find(R"(<rect class="lane-bg" x="90.0" y="48.0" width="84.0" )"),
            std::string::npos)
      << broken;
}

// ---- Files and the run report

TEST(TimelineFiles, WrittenAtTheEndOfAFailingRun) {
  const std::string svg_path = temp_path("chorus_timeline_test.svg");
  const std::string json_path = temp_path("chorus_timeline_test.json");
  SimOptions options = testing::quiet_options(3);
  options.timeline_path = svg_path;
  options.trace_path = json_path;
  const SimReport report = sim::simulate(options, mismatch_at_second_op);
  EXPECT_FALSE(report.ok());
  EXPECT_FALSE(report.events.empty()) << "a path turns the log on";
  EXPECT_EQ(report.mark_count("timeline.svg_written"), 1u);
  EXPECT_EQ(report.mark_count("timeline.trace_written"), 1u);
  EXPECT_EQ(read_file(svg_path), sim::to_svg_timeline(report));
  EXPECT_EQ(read_file(json_path), sim::to_perfetto_json(report));
  std::remove(svg_path.c_str());
  std::remove(json_path.c_str());
}

TEST(TimelineFiles, TheEnvironmentSetsThePaths) {
  const std::string svg_path = temp_path("chorus_timeline_env_test.svg");
  SimOptions options = testing::quiet_options(2);
  options.seed_from_environment = true;
  const testing::ScopedEnvironment environment({{"CHORUS_SIM_TIMELINE", svg_path}});
  const SimReport report = sim::simulate(options, waited_then_dropped);
  EXPECT_EQ(report.mark_count("timeline.svg_written"), 1u);
  EXPECT_EQ(read_file(svg_path), sim::to_svg_timeline(report));
  std::remove(svg_path.c_str());
}

// Refused before the run, with the operating system's reason: found at the end, the error came
// after a failing run's report (and in place of `chorus replay`'s verdict).
TEST(TimelineFiles, AnUnwritablePathIsInvalidArgumentBeforeTheRun) {
  bool ran = false;
  const auto program = [&ran] { ran = true; };
  SimOptions options = testing::quiet_options(2);
  options.trace_path = "/nonexistent-directory/trace.json";
  testing::expect_error<InvalidArgument>(
      [&] { sim::simulate(options, program); },
      {"cannot write the trace JSON to '/nonexistent-directory/trace.json': No such file or "
       "directory"});
  options.trace_path.clear();
  options.timeline_path = "/nonexistent-directory/timeline.svg";
  testing::expect_error<InvalidArgument>(
      [&] { sim::simulate(options, program); },
      {"cannot write the SVG timeline to '/nonexistent-directory/timeline.svg': No such file or "
       "directory"});
  options.timeline_path = "/";
  testing::expect_error<InvalidArgument>([&] { sim::simulate(options, program); },
                                         {"cannot write the SVG timeline to '/': Is a directory"});
  // The check creates nothing: a writable timeline path beside an unwritable trace path is left
  // as it was.
  const std::string svg_path = temp_path("chorus_timeline_unwritable_trace_test.svg");
  std::remove(svg_path.c_str());
  options.timeline_path = svg_path;
  options.trace_path = "/nonexistent-directory/trace.json";
  EXPECT_THROW(sim::simulate(options, program), InvalidArgument);
  EXPECT_FALSE(std::ifstream(svg_path).good()) << svg_path << " was created";
  EXPECT_FALSE(ran);
}

TEST(TimelineFiles, ShrinkWritesTheMinimalRunOnly) {
  const std::string svg_path = temp_path("chorus_timeline_shrink_test.svg");
  SimOptions options = testing::quiet_options(3, 11);
  const SimReport failing = sim::simulate(options, mismatch_at_second_op);
  ASSERT_FALSE(failing.ok());
  options.timeline_path = svg_path;
  const sim::ShrinkResult shrunk = sim::shrink(options, mismatch_at_second_op, failing);
  EXPECT_EQ(shrunk.minimal.mark_count("timeline.svg_written"), 1u);
  EXPECT_EQ(read_file(svg_path), sim::to_svg_timeline(shrunk.minimal));
  std::remove(svg_path.c_str());
}

// CHORUS_SIM_TIMELINE and CHORUS_SIM_TRACE name shrink's files too (its attempts stop reading
// the environment; the minimal run still writes where it says).
TEST(TimelineFiles, ShrinkTakesThePathsFromTheEnvironment) {
  const std::string svg_path = temp_path("chorus_timeline_shrink_env_test.svg");
  const std::string json_path = temp_path("chorus_timeline_shrink_env_test.json");
  std::remove(svg_path.c_str());
  std::remove(json_path.c_str());
  SimOptions options = testing::quiet_options(3, 11);
  const SimReport failing = sim::simulate(options, mismatch_at_second_op);
  ASSERT_FALSE(failing.ok());
  options.seed_from_environment = true;
  const testing::ScopedEnvironment environment(
      {{"CHORUS_SIM_TIMELINE", svg_path}, {"CHORUS_SIM_TRACE", json_path}});
  const sim::ShrinkResult shrunk = sim::shrink(options, mismatch_at_second_op, failing);
  EXPECT_EQ(shrunk.minimal.mark_count("timeline.svg_written"), 1u);
  EXPECT_EQ(shrunk.minimal.mark_count("timeline.trace_written"), 1u);
  EXPECT_EQ(read_file(svg_path), sim::to_svg_timeline(shrunk.minimal));
  EXPECT_EQ(read_file(json_path), sim::to_perfetto_json(shrunk.minimal));
  std::remove(svg_path.c_str());
  std::remove(json_path.c_str());
}

TEST(TextTimeline, TellsEachRanksStoryOfTheMinimalFailingRun) {
  const SimOptions options = testing::quiet_options(3, 11);
  const SimReport failing = sim::simulate(options, mismatch_at_second_op);
  ASSERT_FALSE(failing.ok());
  const sim::ShrinkResult shrunk = sim::shrink(options, mismatch_at_second_op, failing);
  const std::string& text = shrunk.timeline;
  for (const char* line : {"rank 0:\n", "rank 1:\n", "rank 2:\n"}) {
    EXPECT_EQ(count_of(text, line), 1u) << text;
  }
  EXPECT_NE(text.find("rank 2 issue all_gather_tensor #1 on [0, 1, 2]"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2 fail all_gather_tensor #1 on [0, 1, 2]"), std::string::npos) << text;
  EXPECT_NE(text.find(": CollectiveMismatch: ranks disagree on operation #1"), std::string::npos)
      << text;
}

TEST(RunReport, NamesRanksOperationsDecisionsAndUnwaitedWorksWithCallSites) {
  const SimReport report = sim::run(lowest_rank_first(2), waited_then_dropped);
  const std::string text = report.to_string();
  EXPECT_NE(text.find("chorus sim: 2 ranks"), std::string::npos) << text;
  EXPECT_NE(text.find(std::to_string(report.steps) + " scheduling decisions"), std::string::npos);
  EXPECT_NE(text.find("operations issued per rank: 0: 2, 1: 2"), std::string::npos) << text;
  EXPECT_NE(text.find("26 events recorded"), std::string::npos) << text;
  EXPECT_NE(text.find("2 collective(s) never waited"), std::string::npos) << text;
  EXPECT_EQ(count_of(text, "timeline_test.cpp"), 2u) << "each unwaited work's call site";
}

// A hand-built event: another rank's work is named with its owner; a rank's own work is not.
TEST(RunReport, AnEventNamesTheOwnerOfAnotherRanksWorkOnly) {
  SimEvent event;
  event.kind = Kind::WaitBegin;
  event.step = 3;
  event.time = std::chrono::nanoseconds(2000);
  event.rank = 1;
  event.owner = 0;
  event.op = "all_reduce";
  event.seq = 2;
  event.group = "[0, 1]";
  EXPECT_EQ(event.to_string(),
            "step 3 t=2us rank 1 wait_begin rank 0's all_reduce #2 on [0, 1] (<unknown>)");
  event.owner = 1;
  EXPECT_EQ(event.to_string(),
            "step 3 t=2us rank 1 wait_begin all_reduce #2 on [0, 1] (<unknown>)");
}

// A report whose schedule holds every decision has no "not recorded" line.
TEST(RunReport, TimelineTextOfAnEmptyCompleteScheduleIsItsHeaderOnly) {
  SimReport report;
  report.world_size = 1;
  EXPECT_EQ(sim::timeline_text(report), "step  rank 0    completes\n");
  report.steps = 2;
  EXPECT_EQ(sim::timeline_text(report),
            "step  rank 0    completes\n... 2 more decisions not recorded\n");
}

// An empty CHORUS_SIM_TIMELINE / CHORUS_SIM_TRACE is unset: the options' own paths stay.
TEST(TimelineFiles, AnEmptyEnvironmentPathKeepsTheOptionsPath) {
  const std::string svg_path = temp_path("chorus_timeline_empty_env_test.svg");
  const testing::ScopedEnvironment environment({{"CHORUS_SIM_TIMELINE", std::string()},
                                                {"CHORUS_SIM_TRACE", std::string()},
                                                {"CHORUS_SIM_SEED", std::nullopt},
                                                {"CHORUS_SIM_REPLAY", std::nullopt}});
  SimOptions options = testing::quiet_options(1);
  options.seed_from_environment = true;
  options.timeline_path = svg_path;
  const SimReport report = sim::simulate(options, [] {});
  EXPECT_EQ(report.mark_count("timeline.svg_written"), 1u);
  EXPECT_EQ(report.mark_count("timeline.trace_written"), 0u);
  EXPECT_EQ(read_file(svg_path), sim::to_svg_timeline(report));
  std::remove(svg_path.c_str());
}

// SimReport::to_string of a hand-built report: microseconds without trailing zeros, and the first
// 16 unwaited works listed, the rest counted.
TEST(RunReport, PrintsExactMicrosecondsAndListsTheFirstSixteenUnwaitedWorks) {
  SimReport report;
  report.world_size = 1;
  report.seed = 5;
  report.virtual_time = std::chrono::nanoseconds(1500);
  for (std::int64_t seq = 0; seq < 17; ++seq) {
    UnwaitedWork work;
    work.rank = 0;
    work.op = "all_reduce";
    work.seq = seq;
    work.group = "[0]";
    report.unwaited.push_back(work);
  }
  const std::string text = report.to_string();
  EXPECT_EQ(text.substr(0, text.find('\n')),
            "chorus sim: 1 ranks, seed 5, 0 scheduling decisions, 0 collectives completed, "
            "virtual time 1.5 us, schedule hash 0000000000000000")
      << text;
  EXPECT_EQ(count_of(text, "all_reduce #"), 16u) << text;
  EXPECT_NE(text.find("all_reduce #15 "), std::string::npos) << text;
  EXPECT_EQ(text.find("all_reduce #16 "), std::string::npos) << text;
  EXPECT_NE(text.find("  17 collective(s) never waited:\n"), std::string::npos) << text;
  EXPECT_NE(text.find("    ... and 1 more\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace chorus
