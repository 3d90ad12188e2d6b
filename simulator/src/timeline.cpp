// The event log drawn two ways: Chrome trace event JSON (Perfetto) and a standalone SVG.
//
// Note [Timeline layout]
// Both drawings show the same spans (SimReport::events, Note [Event log] in world.hpp): per rank,
// an operation from its issue to its completion or failure, and a wait from the moment the rank
// blocked to the moment it woke. Within a rank these overlap without nesting (an operation
// completes while the rank's wait on it lasts until the rank is resumed; asynchronous operations
// overlap each other), but the slices of one trace thread must nest. So a rank's lane is split
// into rows: each span, in the order they begin, goes to the first row whose open spans all
// enclose it. Row 0 is the trace thread "rank r"; row k > 0 is "rank r (row k+1)", sorted right
// under it. Instants (arrive, drop, finalize, fail, and the end of the rank's function) sit on
// row 0.
//
// Note [Skipped time]
// Virtual time can jump: a hung operation's timeout skips minutes while every rank waits. Drawn to
// one scale, everything before the jump would shrink into a pixel of the SVG. So the SVG's time
// axis draws to scale only the stretches in which something happens, and cuts each quiet stretch
// (no event begins or ends in it) that is at least kSkipMinNs and kSkipRatio times longer than the
// rest of the run to a break of kBreakWidth pixels, labelled with the time it skipped. The trace
// keeps every nanosecond: Perfetto zooms.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/sim/sim.hpp"

namespace chorus::sim {
namespace {

using Kind = SimEvent::Kind;

struct Span {
  bool wait = false;                // a wait, else an operation
  const SimEvent* begin = nullptr;  // Issue or WaitBegin
  const SimEvent* end = nullptr;    // Complete, Fail or WaitEnd; null: open when the run ended
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;
  int row = 0;

  bool failed() const { return end != nullptr && end->kind == Kind::Fail; }
};

struct Layout {
  std::vector<Span> spans;                // in the order they begin
  std::vector<const SimEvent*> instants;  // arrive, drop, finalize, fail, end
  std::vector<int> rows;                  // per rank: rows of its lane (>= 1)
  std::int64_t end_ns = 0;                // the run's virtual end
};

bool is_instant(Kind kind) {
  return kind == Kind::Arrive || kind == Kind::Drop || kind == Kind::Finalize ||
         kind == Kind::Fail || kind == Kind::End;
}

// Note [Timeline layout]: pairs the events into spans and gives each span its row.
Layout lay_out(const SimReport& report) {
  const auto size = static_cast<std::size_t>(std::max(report.world_size, 0));
  Layout layout;
  layout.rows.assign(size, 1);
  layout.end_ns = report.virtual_time.count();
  std::map<std::tuple<int, std::uint64_t, std::int64_t>, std::size_t> open_ops;
  std::vector<std::size_t> open_wait(size, SIZE_MAX);
  const auto close = [&](std::size_t index, const SimEvent& event) {
    layout.spans[index].end = &event;
    layout.spans[index].end_ns = event.time.count();
  };
  for (const SimEvent& event : report.events) {
    CHORUS_CHECK(event.rank >= 0 && static_cast<std::size_t>(event.rank) < size);
    layout.end_ns = std::max(layout.end_ns, event.time.count());
    const auto rank = static_cast<std::size_t>(event.rank);
    const auto key = std::make_tuple(event.rank, event.comm_id, event.seq);
    switch (event.kind) {
      case Kind::Issue:
        CHORUS_CHECK(open_ops.count(key) == 0);
        open_ops.emplace(key, layout.spans.size());
        layout.spans.push_back(Span{false, &event, nullptr, event.time.count(), -1, 0});
        break;
      case Kind::WaitBegin:
        CHORUS_CHECK_EQ(open_wait[rank], SIZE_MAX);  // a blocked rank cannot start another wait
        open_wait[rank] = layout.spans.size();
        layout.spans.push_back(Span{true, &event, nullptr, event.time.count(), -1, 0});
        break;
      case Kind::WaitEnd:
        CHORUS_CHECK_NE(open_wait[rank], SIZE_MAX);
        close(open_wait[rank], event);
        open_wait[rank] = SIZE_MAX;
        break;
      case Kind::Complete:
      case Kind::Fail:
        if (auto it = open_ops.find(key); it != open_ops.end()) {
          close(it->second, event);
          open_ops.erase(it);
        }
        break;
      case Kind::Arrive:
      case Kind::Drop:
      case Kind::Finalize:
      case Kind::End:
        break;
    }
    if (is_instant(event.kind)) {
      layout.instants.push_back(&event);
    }
  }
  // Rows: per rank, a stack of open spans per row.
  std::vector<std::vector<std::vector<const Span*>>> stacks(size);
  for (Span& span : layout.spans) {
    if (span.end == nullptr) {
      span.end_ns = layout.end_ns;
    }
    CHORUS_CHECK_LE(span.begin_ns, span.end_ns);
    auto& rows = stacks[static_cast<std::size_t>(span.begin->rank)];
    std::size_t row = 0;
    for (; row < rows.size(); ++row) {
      std::vector<const Span*>& stack = rows[row];
      while (!stack.empty() && stack.back()->end_ns <= span.begin_ns) {
        stack.pop_back();
      }
      if (stack.empty() || stack.back()->end_ns >= span.end_ns) {
        break;
      }
    }
    if (row == rows.size()) {
      rows.emplace_back();
    }
    rows[row].push_back(&span);
    span.row = static_cast<int>(row);
    int& lane_rows = layout.rows[static_cast<std::size_t>(span.begin->rank)];
    lane_rows = std::max(lane_rows, span.row + 1);
  }
  return layout;
}

// "all_reduce #3", with "rank 2's " first when `event` happened on another rank than the owner's.
std::string op_label(const SimEvent& event) {
  std::string label = event.op + " #" + std::to_string(event.seq);
  return event.owner != event.rank ? "rank " + std::to_string(event.owner) + "'s " + label : label;
}

// An instant's name: "drop all_reduce #3", or "end" (the rank's function ended: no operation).
std::string instant_name(const SimEvent& event) {
  return event.kind == Kind::End ? "end"
                                 : std::string(event_kind_name(event.kind)) + " " + op_label(event);
}

// Whether an End event says the rank's function did not return normally (it threw or crashed).
bool ended_abnormally(const SimEvent& event) {
  return event.kind == Kind::End && event.detail != "returned";
}

// The run's first failure, in one line: "rank 1: CollectiveMismatch: ranks disagree ...": the
// rank that raised SimReport::first_error (the cause, where the others' errors follow from it),
// else the lowest-numbered rank that failed (a hand-made report).
std::string first_failure(const SimReport& report) {
  const std::vector<std::string>& errors = report.rank_errors;
  const auto failed = [&](std::size_t r) { return r < errors.size() && !errors[r].empty(); };
  std::size_t rank = report.first_error_rank >= 0
                         ? static_cast<std::size_t>(report.first_error_rank)
                         : errors.size();
  if (!failed(rank)) {
    rank = 0;
    while (rank < errors.size() && !failed(rank)) {
      ++rank;
    }
    if (rank == errors.size()) {
      return {};
    }
  }
  const std::string text = "rank " + std::to_string(rank) + ": " + errors[rank];
  return text.substr(0, text.find('\n'));
}

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// `text` with each ill-formed UTF-8 subsequence (a stray byte, a truncated or overlong sequence,
// a surrogate, a code point past U+10FFFF) replaced by U+FFFD, one per maximal subpart as Unicode
// recommends. Messages and tags are byte strings; JSON and SVG files must be UTF-8.
std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      out += text[i++];
      continue;
    }
    // Continuation bytes the sequence needs, and the range of the first (Table 3-7 of the
    // Unicode standard: no overlong forms, no surrogates, nothing past U+10FFFF).
    std::size_t needed = 0;
    unsigned char low = 0x80;
    unsigned char high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      needed = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      needed = 2;
      low = lead == 0xE0 ? 0xA0 : 0x80;
      high = lead == 0xED ? 0x9F : 0xBF;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      needed = 3;
      low = lead == 0xF0 ? 0x90 : 0x80;
      high = lead == 0xF4 ? 0x8F : 0xBF;
    }
    std::size_t length = 1;
    bool whole = needed > 0;
    for (std::size_t k = 0; k < needed; ++k, low = 0x80, high = 0xBF) {
      if (i + length == text.size()) {
        whole = false;
        break;
      }
      const auto next = static_cast<unsigned char>(text[i + length]);
      if (next < low || next > high) {
        whole = false;
        break;
      }
      ++length;
    }
    if (whole) {
      out.append(text.substr(i, length));
    } else {
      out += kReplacementCharacter;
    }
    i += length;
  }
  return out;
}

// ---- JSON

std::string json_string(std::string_view raw) {
  const std::string text = valid_utf8(raw);
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Microseconds of virtual time, exactly: "12" or "12.345".
std::string microseconds(std::int64_t ns) {
  std::string text = std::to_string(ns / 1000);
  if (const std::int64_t rest = ns % 1000; rest != 0) {
    char fraction[8];
    std::snprintf(fraction, sizeof fraction, ".%03lld", static_cast<long long>(rest));
    text += fraction;
  }
  return text;
}

// The trace thread of row `row` of `rank`'s lane (Note [Timeline layout]).
int thread_of(int world_size, int rank, int row) { return row * world_size + rank; }

std::string json_args(const SimEvent& event) {
  std::string args =
      "{\"seq\":" + std::to_string(event.seq) + ",\"group\":" + json_string(event.group) +
      ",\"comm\":" + std::to_string(event.comm_id) + ",\"owner\":" + std::to_string(event.owner) +
      ",\"site\":" + json_string(event.site.to_string()) +
      ",\"step\":" + std::to_string(event.step);
  if (!event.detail.empty()) {
    args += ",\"detail\":" + json_string(event.detail);
  }
  return args + "}";
}

}  // namespace

std::string to_perfetto_json(const SimReport& report) {
  const Layout layout = lay_out(report);
  std::ostringstream out;
  bool first = true;
  const auto begin_event = [&]() -> std::ostringstream& {
    out << (first ? "\n" : ",\n");
    first = false;
    return out;
  };
  out << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  std::string process =
      "chorus sim: " + std::to_string(report.world_size) + " ranks, " + report.choice_source_text();
  if (const std::string failure = first_failure(report); !failure.empty()) {
    process += " (failed: " + failure + ")";
  }
  begin_event() << R"({"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":)"
                << json_string(process) << "}}";
  for (int rank = 0; rank < report.world_size; ++rank) {
    const int rows = layout.rows[static_cast<std::size_t>(rank)];
    for (int row = 0; row < rows; ++row) {
      const int thread = thread_of(report.world_size, rank, row);
      std::string name = "rank " + std::to_string(rank);
      if (row > 0) {
        name += " (row " + std::to_string(row + 1) + ")";
      }
      begin_event() << R"({"name":"thread_name","ph":"M","pid":0,"tid":)" << thread
                    << R"(,"args":{"name":)" << json_string(name) << "}}";
      begin_event() << R"({"name":"thread_sort_index","ph":"M","pid":0,"tid":)" << thread
                    << R"(,"args":{"sort_index":)" << rank * 1024 + row << "}}";
    }
  }
  for (const Span& span : layout.spans) {
    const SimEvent& begin = *span.begin;
    begin_event() << "{\"name\":" << json_string((span.wait ? "wait " : "") + op_label(begin))
                  << ",\"cat\":\"" << (span.wait ? "wait" : "op")
                  << "\",\"ph\":\"X\",\"ts\":" << microseconds(span.begin_ns)
                  << ",\"dur\":" << microseconds(span.end_ns - span.begin_ns)
                  << ",\"pid\":0,\"tid\":" << thread_of(report.world_size, begin.rank, span.row)
                  << (span.failed() ? R"(,"cname":"terrible")" : "")
                  << ",\"args\":" << json_args(span.end != nullptr ? *span.end : begin) << "}";
  }
  for (const SimEvent* event : layout.instants) {
    begin_event() << "{\"name\":" << json_string(instant_name(*event)) << ",\"cat\":\""
                  << event_kind_name(event->kind)
                  << "\",\"ph\":\"i\",\"s\":\"t\",\"ts\":" << microseconds(event->time.count())
                  << ",\"pid\":0,\"tid\":" << thread_of(report.world_size, event->rank, 0)
                  << (event->kind == Kind::Fail || ended_abnormally(*event)
                          ? R"(,"cname":"terrible")"
                          : "")
                  << ",\"args\":" << json_args(*event) << "}";
  }
  out << "\n]}\n";
  return out.str();
}

// ---- SVG

namespace {

constexpr double kLabelWidth = 90;  // px left of the time axis, for "rank r"
constexpr double kRowHeight = 22;   // px per row of a lane
constexpr double kLaneGap = 8;      // px between lanes
constexpr double kTop = 48;         // px above the first lane (title, axis)
constexpr double kRight = 24;       // px right of the last microsecond
constexpr double kPlotWidthMax = 1400;
constexpr double kMicrosecondWidthMax = 28;  // px per microsecond of virtual time, at most
constexpr double kLegendWidth = 1110;        // px: the image is at least as wide as the legend
constexpr double kBoxWidthMin = 8;           // px: the narrowest operation box
constexpr double kMarkerSpacing = 10;        // px between markers of one rank at the same moment
constexpr double kCharWidth = 6.7;           // px per character of 11px monospace, about
constexpr double kTickCharWidth = 6.2;       // px per character of a tick's 10px label
constexpr double kBreakWidth = 28;           // px: a stretch of skipped time (Note [Skipped time])
constexpr std::int64_t kSkipMinNs = 1'000'000;  // shorter quiet stretches stay to scale
constexpr std::int64_t kSkipRatio = 4;          // ... and those not this much longer than the rest

std::string xml_escape(std::string_view raw) {
  std::string text = valid_utf8(raw);
  // U+FFFE and U+FFFF are well-formed UTF-8 but not XML 1.0 characters: U+FFFD instead. (In
  // valid UTF-8 their bytes cannot be part of another character.)
  for (const std::string_view nonchar :
       {std::string_view("\xEF\xBF\xBE"), std::string_view("\xEF\xBF\xBF")}) {
    for (std::size_t at = text.find(nonchar); at != std::string::npos;
         at = text.find(nonchar, at + 1)) {
      text.replace(at, nonchar.size(), kReplacementCharacter);
    }
  }
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        // XML 1.0 has no control characters but tab, newline and carriage return (not even as
        // character references): a message's ANSI colour code becomes U+FFFD.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          out += kReplacementCharacter;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// Pixels with one decimal, the same on every machine.
std::string px(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

// A tick spacing of 1, 2 or 5 times a power of ten microseconds giving at most ~12 ticks.
std::int64_t tick_spacing_us(std::int64_t total_us) {
  std::int64_t spacing = 1;
  while (true) {
    for (const std::int64_t factor : {1, 2, 5}) {
      if (total_us / (spacing * factor) <= 12) {
        return spacing * factor;
      }
    }
    spacing *= 10;
  }
}

// "+10 min", "+2.5 s", "+300 ms", "+24 h": a skipped stretch's length, to its largest unit, never
// in exponent notation (%.3g writes 1440 minutes as 1.44e+03).
std::string skipped_text(std::int64_t ns) {
  struct Unit {
    std::int64_t ns;
    const char* name;
  };
  for (const Unit unit : {Unit{3'600'000'000'000, "h"}, Unit{60'000'000'000, "min"},
                          Unit{1'000'000'000, "s"}, Unit{1'000'000, "ms"}, Unit{1'000, "us"}}) {
    if (ns >= unit.ns) {
      const double value = static_cast<double>(ns) / static_cast<double>(unit.ns);
      char text[48];
      // %.3g rounds 999.5 and up to 1e+03: those are written whole too ("+1000 ms").
      std::snprintf(text, sizeof text, value < 999.5 ? "+%.3g %s" : "+%.0f %s", value, unit.name);
      return text;
    }
  }
  return "+" + std::to_string(ns) + " ns";
}

// The SVG's time axis (Note [Skipped time]): nanoseconds of virtual time to pixels.
class TimeAxis {
 public:
  // A stretch drawn to scale, from begin_ns to end_ns, starting at pixel x.
  struct Piece {
    std::int64_t begin_ns = 0;
    std::int64_t end_ns = 0;
    double x = 0;
  };

  explicit TimeAxis(const Layout& layout) {
    std::vector<std::int64_t> times = {0, layout.end_ns};
    for (const Span& span : layout.spans) {
      times.push_back(span.begin_ns);
      times.push_back(span.end_ns);
    }
    for (const SimEvent* event : layout.instants) {
      times.push_back(event->time.count());
    }
    std::sort(times.begin(), times.end());
    times.erase(std::unique(times.begin(), times.end()), times.end());
    // The quiet stretches, longest first; each skipped while it dwarfs what is left to scale.
    std::vector<std::pair<std::int64_t, std::int64_t>> quiet;  // (length, begin)
    for (std::size_t i = 1; i < times.size(); ++i) {
      quiet.emplace_back(times[i] - times[i - 1], times[i - 1]);
    }
    std::sort(quiet.begin(), quiet.end(), std::greater<>());
    std::int64_t to_scale = times.back() - times.front();
    std::vector<std::pair<std::int64_t, std::int64_t>> skipped;  // (begin, end)
    for (const auto& [length, begin] : quiet) {
      if (length < kSkipMinNs || length < kSkipRatio * (to_scale - length)) {
        break;
      }
      to_scale -= length;
      skipped.emplace_back(begin, begin + length);
    }
    std::sort(skipped.begin(), skipped.end());
    to_scale_us_ = std::max<std::int64_t>((to_scale + 999) / 1000, 1);
    us_width_ = std::min(kPlotWidthMax / static_cast<double>(to_scale_us_), kMicrosecondWidthMax);
    Piece piece{times.front(), 0, kLabelWidth};
    for (const auto& [begin, end] : skipped) {
      piece.end_ns = begin;
      pieces_.push_back(piece);
      piece = Piece{end, 0, x_in(piece, begin) + kBreakWidth};
    }
    piece.end_ns = times.back();
    pieces_.push_back(piece);
  }

  double x(std::int64_t ns) const {
    // The last piece that begins at or before `ns`.
    auto it = std::upper_bound(pieces_.begin(), pieces_.end(), ns,
                               [](std::int64_t t, const Piece& p) { return t < p.begin_ns; });
    return x_in(it == pieces_.begin() ? *it : *std::prev(it), ns);
  }
  // The right end of the axis: the run's end, rounded up to a whole microsecond (at least one
  // past the last stretch's start: a run of no virtual time still gets a lane to draw in).
  double right() const {
    const Piece& last = pieces_.back();
    return x_in(last, std::max((last.end_ns + 999) / 1000 * 1000, last.begin_ns + 1000));
  }
  const std::vector<Piece>& pieces() const { return pieces_; }
  // A tick spacing in microseconds for the time drawn to scale.
  std::int64_t tick_spacing() const { return tick_spacing_us(to_scale_us_); }

 private:
  double x_in(const Piece& piece, std::int64_t ns) const {
    return piece.x + static_cast<double>(ns - piece.begin_ns) / 1000.0 * us_width_;
  }

  std::vector<Piece> pieces_;     // in time order; a break between each two
  std::int64_t to_scale_us_ = 1;  // the time drawn to scale
  double us_width_ = 0;           // px per microsecond
};

constexpr const char* kStyle = R"(
  text { font-family: monospace; font-size: 11px; fill: #222; }
  .title { font-size: 13px; font-weight: bold; }
  .failure { fill: #b00; }
  .lane-bg { fill: #f4f4f4; }
  .axis { stroke: #bbb; stroke-width: 1; }
  .op { fill: #9ecae1; stroke: #3182bd; stroke-width: 1; }
  .op.failed { fill: #d62728; stroke: #7f0000; }
  .wait { fill: #fdd49e; stroke: #e6550d; stroke-width: 1; }
  .label { font-size: 10px; }
  .arrive { stroke: #31a354; stroke-width: 2; }
  .drop { fill: #756bb1; }
  .finalize { fill: #ffffff; stroke: #756bb1; stroke-width: 2; }
  .fail { stroke: #d62728; stroke-width: 2.5; }
  .end { fill: #444; }
  .end.abnormal { fill: #d62728; }
  rect.skip { fill: #ffffff; stroke: #999; stroke-dasharray: 3 3; }
)";

}  // namespace

std::string to_svg_timeline(const SimReport& report) {
  const Layout layout = lay_out(report);
  // Long runs shrink to the plot's width, skipped time to breaks (Note [Skipped time]).
  const TimeAxis axis(layout);
  const auto x_of = [&](std::int64_t ns) { return axis.x(ns); };
  std::vector<double> lane_top;
  double y = kTop;
  for (int rank = 0; rank < report.world_size; ++rank) {
    lane_top.push_back(y);
    y += kRowHeight * layout.rows[static_cast<std::size_t>(rank)] + kLaneGap;
  }
  const double lanes_bottom = y;
  const double width = std::max(axis.right() + kRight, kLegendWidth);
  const double height = lanes_bottom + 60;  // axis labels and legend
  const auto row_y = [&](int rank, int row) {
    return lane_top[static_cast<std::size_t>(rank)] + kRowHeight * row;
  };

  std::ostringstream out;
  out << R"(<svg xmlns="http://www.w3.org/2000/svg" width=")" << px(width) << R"(" height=")"
      << px(height) << R"(" viewBox="0 0 )" << px(width) << " " << px(height) << R"(">)"
      << "\n";
  out << "<style>" << kStyle << "</style>\n";
  out << R"(<rect width="100%" height="100%" fill="#ffffff"/>)"
      << "\n";
  out << R"(<text class="title" x="8" y="16">)"
      << xml_escape("chorus sim: " + std::to_string(report.world_size) + " ranks, " +
                    report.choice_source_text() + ", " + std::to_string(report.steps) +
                    " decisions, " + std::to_string(report.collectives_completed) +
                    " collectives completed")
      << "</text>\n";
  if (const std::string failure = first_failure(report); !failure.empty()) {
    const auto failure_chars = static_cast<std::size_t>((width - 16) / kCharWidth) - 12;
    std::string shown = failure.substr(0, failure_chars);
    if (failure.size() > failure_chars) {
      shown += "...";
    }
    out << R"(<text class="failure" x="8" y="32">)" << xml_escape("failed: " + shown) << "<title>"
        << xml_escape(failure) << "</title></text>\n";
  }

  // Lanes and the time axis.
  for (int rank = 0; rank < report.world_size; ++rank) {
    const int rows = layout.rows[static_cast<std::size_t>(rank)];
    out << R"(<g class="lane" data-rank=")" << rank << R"(">)"
        << R"(<rect class="lane-bg" x=")" << px(kLabelWidth) << R"(" y=")" << px(row_y(rank, 0))
        << R"(" width=")" << px(axis.right() - kLabelWidth) << R"(" height=")"
        << px(kRowHeight * rows) << R"("/>)"
        << R"(<text x="8" y=")" << px(row_y(rank, 0) + 15) << R"(">rank )" << rank
        << "</text></g>\n";
  }
  // Ticks in each stretch drawn to scale: where a stretch after a break begins, and at multiples
  // of one spacing; each clear of the label before it.
  const std::int64_t spacing = axis.tick_spacing();
  const std::vector<TimeAxis::Piece>& pieces = axis.pieces();
  double label_end = 0;  // px: where the last tick's label ends
  const auto tick = [&](std::int64_t us) {
    const double x = x_of(us * 1000);
    const std::string label = std::to_string(us) + "us";
    if (x < label_end) {
      return;
    }
    label_end = x + 4 + kTickCharWidth * static_cast<double>(label.size());
    out << R"(<line class="axis" x1=")" << px(x) << R"(" y1=")" << px(kTop - 4) << R"(" x2=")"
        << px(x) << R"(" y2=")" << px(lanes_bottom) << R"("/>)"
        << R"(<text class="label" x=")" << px(x + 2) << R"(" y=")" << px(lanes_bottom + 12)
        << R"(">)" << label << "</text>\n";
  };
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const std::int64_t first_us = (pieces[i].begin_ns + 999) / 1000;
    const std::int64_t last_us =
        i + 1 < pieces.size() ? pieces[i].end_ns / 1000 : (pieces[i].end_ns + 999) / 1000;
    if (i > 0 && first_us <= last_us) {
      tick(first_us);
    }
    for (std::int64_t us = (first_us + spacing - 1) / spacing * spacing; us <= last_us;
         us += spacing) {
      tick(us);
    }
  }

  // Spans: operations, then waits, in the order they began (Note [Timeline layout]).
  for (const Span& span : layout.spans) {
    const SimEvent& begin = *span.begin;
    const double x = x_of(span.begin_ns);
    // An operation that failed as it was issued still gets a box to see.
    const double box_width = std::max(x_of(span.end_ns) - x, span.wait ? 2.0 : kBoxWidthMin);
    const double top = row_y(begin.rank, span.row) + (span.wait ? 6 : 2);
    const double box_height = span.wait ? kRowHeight - 12 : kRowHeight - 4;
    const std::string label = (span.wait ? "wait " : "") + op_label(begin);
    std::string tip = label + " on " + begin.group + ", issued at " + begin.site.to_string() +
                      ", " + microseconds(span.begin_ns) + "-" + microseconds(span.end_ns) + "us";
    if (span.failed()) {
      tip += "\n" + span.end->detail;
    }
    out << R"(<rect class=")"
        << (span.wait       ? "wait"
            : span.failed() ? "op failed"
                            : "op")
        << R"(" data-rank=")" << begin.rank << R"(" data-op=")" << xml_escape(begin.op)
        << R"(" data-seq=")" << begin.seq << R"(" x=")" << px(x) << R"(" y=")" << px(top)
        << R"(" width=")" << px(box_width) << R"(" height=")" << px(box_height) << R"(">)"
        << "<title>" << xml_escape(tip) << "</title></rect>\n";
    // A label where it fits (about 6.2 px per character at 10px monospace).
    const auto fits = static_cast<std::size_t>((box_width - 4) / 6.2);
    if (!span.wait && fits >= 4) {
      std::string shown = label.size() <= fits ? label : label.substr(0, fits - 1) + "~";
      out << R"(<text class="label" x=")" << px(x + 2) << R"(" y=")" << px(top + 12) << R"(">)"
          << xml_escape(shown) << "</text>\n";
    }
  }

  // Breaks where time was skipped, over the spans that last through them.
  for (std::size_t i = 1; i < pieces.size(); ++i) {
    const double x = x_of(pieces[i].begin_ns) - kBreakWidth;
    out << R"(<g class="skip"><title>)"
        << xml_escape(skipped_text(pieces[i].begin_ns - pieces[i - 1].end_ns) +
                      " of virtual time skipped: no event from " +
                      microseconds(pieces[i - 1].end_ns) + "us to " +
                      microseconds(pieces[i].begin_ns) + "us")
        << R"(</title><rect class="skip" x=")" << px(x + 4) << R"(" y=")" << px(kTop - 4)
        << R"(" width=")" << px(kBreakWidth - 8) << R"(" height=")" << px(lanes_bottom - kTop + 4)
        << R"("/>)"
        << R"(<text class="label" x=")" << px(x) << R"(" y=")" << px(kTop - 8) << R"(">)"
        << xml_escape(skipped_text(pieces[i].begin_ns - pieces[i - 1].end_ns)) << "</text></g>\n";
  }

  // Instants, on row 0 of their rank's lane; those at the same moment side by side.
  std::map<std::pair<int, std::int64_t>, int> at_same_moment;
  for (const SimEvent* event : layout.instants) {
    // Arrivals are ticks at the bottom edge: they never hide another marker.
    const int earlier =
        event->kind == Kind::Arrive ? 0 : at_same_moment[{event->rank, event->time.count()}]++;
    const double x = x_of(event->time.count()) + kMarkerSpacing * earlier;
    const double top = row_y(event->rank, 0);
    const std::string tip = instant_name(*event) + " at " + microseconds(event->time.count()) +
                            "us" + (event->detail.empty() ? "" : ": " + event->detail);
    out << "<g class=\"" << event_kind_name(event->kind) << "\" data-rank=\"" << event->rank
        << "\"><title>" << xml_escape(tip) << "</title>";
    switch (event->kind) {
      case Kind::Arrive:
        out << R"(<line class="arrive" x1=")" << px(x) << R"(" y1=")" << px(top + kRowHeight - 6)
            << R"(" x2=")" << px(x) << R"(" y2=")" << px(top + kRowHeight) << R"("/>)";
        break;
      // Failures in the upper half of the row, drops and finalizations in the lower, so that
      // a drop during the unwinding of a failure stays visible.
      case Kind::Drop:
        out << R"(<path class="drop" d="M )" << px(x - 5) << " " << px(top + 12) << " L "
            << px(x + 5) << " " << px(top + 12) << " L " << px(x) << " " << px(top + 20)
            << R"( Z"/>)";
        break;
      case Kind::Finalize:
        out << R"(<circle class="finalize" cx=")" << px(x) << R"(" cy=")" << px(top + 16)
            << R"(" r="4"/>)";
        break;
      // The end of the rank's function: a bar across the row, red when it threw or crashed.
      case Kind::End:
        out << R"(<rect class="end)" << (ended_abnormally(*event) ? " abnormal" : "") << R"(" x=")"
            << px(x - 1.5) << R"(" y=")" << px(top + 1) << R"(" width="3" height=")"
            << px(kRowHeight - 2) << R"("/>)";
        break;
      default:  // Fail
        out << R"(<path class="fail" d="M )" << px(x - 4) << " " << px(top + 1) << " L "
            << px(x + 4) << " " << px(top + 9) << " M " << px(x + 4) << " " << px(top + 1) << " L "
            << px(x - 4) << " " << px(top + 9) << R"("/>)";
        break;
    }
    out << "</g>\n";
  }

  // Legend.
  const double legend_y = lanes_bottom + 26;
  out << R"(<g class="legend">)"
      << R"(<rect class="op" x="8" y=")" << px(legend_y) << R"(" width="18" height="12"/>)"
      << R"(<text x="30" y=")" << px(legend_y + 10) << R"(">operation (issue to complete)</text>)"
      << R"(<rect class="op failed" x="250" y=")" << px(legend_y) << R"(" width="18" height="12"/>)"
      << R"(<text x="272" y=")" << px(legend_y + 10) << R"(">failed</text>)"
      << R"(<rect class="wait" x="340" y=")" << px(legend_y + 2) << R"(" width="18" height="8"/>)"
      << R"(<text x="362" y=")" << px(legend_y + 10) << R"(">rank blocked in wait</text>)"
      << R"(<line class="arrive" x1="530" y1=")" << px(legend_y) << R"(" x2="530" y2=")"
      << px(legend_y + 12) << R"("/>)"
      << R"(<text x="538" y=")" << px(legend_y + 10) << R"(">arrive</text>)"
      << R"(<path class="drop" d="M 600 )" << px(legend_y + 2) << " L 610 " << px(legend_y + 2)
      << " L 605 " << px(legend_y + 10) << R"( Z"/>)"
      << R"(<text x="616" y=")" << px(legend_y + 10) << R"(">dropped un-waited</text>)"
      << R"(<circle class="finalize" cx="760" cy=")" << px(legend_y + 6) << R"(" r="4"/>)"
      << R"(<text x="770" y=")" << px(legend_y + 10) << R"(">finalized</text>)"
      << R"(<path class="fail" d="M 850 )" << px(legend_y + 1) << " L 860 " << px(legend_y + 11)
      << " M 860 " << px(legend_y + 1) << " L 850 " << px(legend_y + 11) << R"("/>)"
      << R"(<text x="866" y=")" << px(legend_y + 10) << R"(">failure</text>)"
      << R"(<rect class="end" x="936" y=")" << px(legend_y - 1) << R"(" width="3" height="14"/>)"
      << R"(<rect class="end abnormal" x="942" y=")" << px(legend_y - 1)
      << R"(" width="3" height="14"/>)"
      << R"(<text x="950" y=")" << px(legend_y + 10) << R"(">rank ended (red: threw)</text>)"
      << "</g>\n";
  out << "</svg>\n";
  return out.str();
}

}  // namespace chorus::sim
