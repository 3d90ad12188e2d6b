#pragma once

// Note [Store wire protocol]
// Every message is a frame: a 4-byte little-endian body length, then the body. A request body is
// an opcode byte and the op's fields; a response body is a status byte, then (Ok) the op's
// result or (any other status) a message. Integers are little-endian; a string is a u32 length
// and its bytes; a list is a u32 count and its items. Parsing is strict: unknown opcodes,
// lengths past the end, trailing bytes and out-of-range numbers are refused, so every accepted
// body is the canonical encoding of what it parsed to (the fuzz target checks the round trip).
//
//   Hello       u32 magic "CHST", u16 version, str token         -> u64 frame_bytes_max
//   Set         str key, str value                               -> -
//   Get         u64 timeout_ms, str key                          -> str value
//   Add         str key, i64 delta                               -> i64 new value
//   CompareSet  str key, str expected, str desired               -> u8 present, [str value]
//   Wait        u64 timeout_ms, list<str> keys                   -> -
//   DeleteKey   str key                                          -> u8 existed
//   NumKeys     -                                                -> u64 count
//   MultiGet    u64 timeout_ms, list<str> keys                   -> list<str> values
//   MultiSet    list<str key, str value>                         -> -
//   Cancel      -                                                (no response: completes the
//                                                                 pending Get/Wait/MultiGet
//                                                                 with status Cancelled)
//
// A connection carries one request at a time: the client sends the next request after reading
// the previous response. While a Get/Wait/MultiGet is pending the only request allowed is
// Cancel. The first request must be Hello; a refused Hello is answered (status Refused) and the
// connection closed. Anything the server cannot parse closes that connection, nothing else.

#include <chorus/error.hpp>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus::store::detail {

inline constexpr std::uint32_t kMagic = 0x54534843;  // "CHST" read little-endian
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kFrameHeaderBytes = 4;
// The largest frame an unauthenticated connection may send (a Hello with its token): an
// anonymous peer cannot make the server allocate more than this.
inline constexpr std::size_t kHelloFrameBytesMax = 4096;
// Timeouts on the wire are capped (about 34 years) so that every clock computation fits.
inline constexpr std::uint64_t kTimeoutMsMax = std::uint64_t{1} << 40;

enum class Op : std::uint8_t {
  Hello = 1,
  Set = 2,
  Get = 3,
  Add = 4,
  CompareSet = 5,
  Wait = 6,
  DeleteKey = 7,
  NumKeys = 8,
  MultiGet = 9,
  MultiSet = 10,
  Cancel = 11,
};
inline constexpr std::uint8_t kOpFirst = 1;
inline constexpr std::uint8_t kOpLast = 11;

enum class Status : std::uint8_t {
  Ok = 0,
  Timeout = 1,
  Cancelled = 2,
  InvalidArgument = 3,
  Refused = 4,
};
inline constexpr std::uint8_t kStatusLast = 4;

std::string_view op_name(Op op) noexcept;

// One request. Which fields an op uses:
//   keys:    Set Get Add CompareSet DeleteKey: 1; Wait MultiGet MultiSet: n
//   values:  Set: 1; CompareSet: 2 (expected, desired); MultiSet: n (one per key); Hello: token
//   number:  Add: delta; Get Wait MultiGet: timeout in ms; Hello: version
struct Request {
  Op op = Op::NumKeys;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  std::int64_t number = 0;

  bool operator==(const Request&) const = default;
};

// One response to a request of op `op` (the response does not repeat it).
//   Ok:     values: Get: 1; MultiGet: n; CompareSet: 0 (absent) or 1
//           number: Hello: frame_bytes_max; Add: new value; DeleteKey: 0/1; NumKeys: count
//   other:  message says why
struct Response {
  Status status = Status::Ok;
  std::vector<std::string> values;
  std::int64_t number = 0;
  std::string message;

  bool operator==(const Response&) const = default;
};

inline Request make_request(Op op, std::vector<std::string> keys = {},
                            std::vector<std::string> values = {}, std::int64_t number = 0) {
  Request request;
  request.op = op;
  request.keys = std::move(keys);
  request.values = std::move(values);
  request.number = number;
  return request;
}

inline Response refusal(Status status, std::string message) {
  Response response;
  response.status = status;
  response.message = std::move(message);
  return response;
}

inline Response ok_number(std::int64_t number) {
  Response response;
  response.number = number;
  return response;
}

inline Response ok_value(std::string value) {
  Response response;
  response.values.push_back(std::move(value));
  return response;
}

// The context of a store error: the op ("store.get"), and the rank where one is known.
inline ErrorContext error_context(std::string op, int rank = -1) {
  ErrorContext context;
  context.rank = rank;
  context.op = std::move(op);
  return context;
}

// A body that breaks the protocol. what() names the offset.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whether a request of this op waits on the server for keys.
bool is_blocking(Op op) noexcept;

// encode_* return whole frames (header and body); parse_* take a body (no header) and throw
// ProtocolError. encode_* CHORUS_CHECK that the message is well formed (field counts as above).
std::vector<std::uint8_t> encode_request(const Request& request);
Request parse_request(std::span<const std::uint8_t> body);
std::vector<std::uint8_t> encode_response(Op op, const Response& response);
Response parse_response(Op op, std::span<const std::uint8_t> body);

// The frame of an Ok MultiGet response built straight from the stored values (the server's hot
// path: no copies into a Response).
std::vector<std::uint8_t> encode_multi_get_values(std::span<const std::string* const> values);
// Its body's size in bytes, to check against the frame limit before building it.
std::size_t multi_get_values_bytes(std::span<const std::string* const> values) noexcept;

// A frame header for a body of `body_bytes` (CHORUS_CHECKs it fits in 32 bits).
void write_frame_header(std::uint8_t* out, std::size_t body_bytes);
std::uint32_t read_frame_header(const std::uint8_t* in) noexcept;

}  // namespace chorus::store::detail
