// Fuzz target: the rendezvous store's wire protocol parser (transports/store/src/protocol.cpp,
// Note [Store wire protocol]), fed raw bytes. The first byte picks what the rest is: even, a
// request body (what the server parses from any peer, hostile ones included); odd, the body of a
// response to the op (byte >> 1) % 10 + 1 (what a client parses). See docs/fuzzing.md.
//
// Invariants (a violation prints "chorus fuzz: invariant violated: ..." and aborts):
// - parsing either returns a message or throws ProtocolError whose message names the offset
//   ("at offset N: ..."); no other exception, no crash, no sanitizer report;
// - parsing is strict, so what it accepts is canonical: encoding the parsed message gives back
//   exactly the input bytes (after the frame header), and parsing that gives the same message.
// With CHORUS_FUZZ_EXPECT=parsed (or refused) every input must be accepted (or refused):
// ctest store_protocol_fuzz.seeds_parsed / .seeds_refused (violation.hpp). An empty input counts
// as refused.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protocol.hpp"
#include "violation.hpp"

namespace chorus::fuzz {
namespace {

namespace wire = chorus::store::detail;

void check_error(const wire::ProtocolError& error, const char* what) {
  if (std::string_view(error.what()).find("at offset ") == std::string_view::npos) {
    violated(std::string(what) + "'s error names no offset: " + error.what());
  }
}

std::span<const std::uint8_t> body_of(const std::vector<std::uint8_t>& frame) {
  check(frame.size() >= wire::kFrameHeaderBytes, "encoded frame shorter than its header");
  check(wire::read_frame_header(frame.data()) == frame.size() - wire::kFrameHeaderBytes,
        "frame header does not give the body's length");
  return std::span(frame).subspan(wire::kFrameHeaderBytes);
}

bool same_bytes(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

void run_request(std::span<const std::uint8_t> body) {
  wire::Request request;
  try {
    request = wire::parse_request(body);
  } catch (const wire::ProtocolError& error) {
    check_error(error, "parse_request");
    check_outcome(false, std::string("parse_request (") + error.what() + ")");
    return;
  } catch (const std::exception& error) {
    violated(std::string("parse_request threw something other than ProtocolError: ") +
             error.what());
  }
  check_outcome(true, "parse_request");
  const std::vector<std::uint8_t> frame = wire::encode_request(request);
  check(same_bytes(body_of(frame), body),
        "encode_request(parse_request(b)) != b for op " + std::string(op_name(request.op)));
  check(wire::parse_request(body_of(frame)) == request, "request round trip changed it");
}

void run_response(wire::Op op, std::span<const std::uint8_t> body) {
  wire::Response response;
  try {
    response = wire::parse_response(op, body);
  } catch (const wire::ProtocolError& error) {
    check_error(error, "parse_response");
    check_outcome(false, std::string("parse_response (") + error.what() + ")");
    return;
  } catch (const std::exception& error) {
    violated(std::string("parse_response threw something other than ProtocolError: ") +
             error.what());
  }
  check_outcome(true, "parse_response");
  const std::vector<std::uint8_t> frame = wire::encode_response(op, response);
  check(same_bytes(body_of(frame), body),
        "encode_response(parse_response(b)) != b for op " + std::string(op_name(op)));
  check(wire::parse_response(op, body_of(frame)) == response, "response round trip changed it");
  if (op == wire::Op::MultiGet && response.status == wire::Status::Ok) {
    // The server's direct encoder agrees with the generic one.
    std::vector<const std::string*> values;
    for (const std::string& value : response.values) {
      values.push_back(&value);
    }
    const std::vector<std::uint8_t> direct = wire::encode_multi_get_values(values);
    check(direct == frame, "encode_multi_get_values differs from encode_response");
    check(wire::multi_get_values_bytes(values) == body.size(),
          "multi_get_values_bytes is not the body's size");
  }
}

}  // namespace
}  // namespace chorus::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    chorus::fuzz::check_outcome(false, "an empty input (no selector byte)");
    return 0;
  }
  const std::span<const std::uint8_t> body(data + 1, size - 1);
  if ((data[0] & 1) == 0) {
    chorus::fuzz::run_request(body);
  } else {
    // Cancel (11) has no response: ops 1..10.
    const auto op = static_cast<chorus::store::detail::Op>((data[0] >> 1) % 10 + 1);
    chorus::fuzz::run_response(op, body);
  }
  return 0;
}
