#include "protocol.hpp"

#include <chorus/check.hpp>
#include <cstring>
#include <limits>
#include <string>

namespace chorus::store::detail {
namespace {

class Writer {
 public:
  Writer() { bytes_.resize(kFrameHeaderBytes); }

  void u8(std::uint8_t value) { bytes_.push_back(value); }
  void u16(std::uint16_t value) { little_endian(value, 2); }
  void u32(std::uint32_t value) { little_endian(value, 4); }
  void u64(std::uint64_t value) { little_endian(value, 8); }
  void i64(std::int64_t value) { u64(static_cast<std::uint64_t>(value)); }
  void str(std::string_view text) {
    CHORUS_CHECK(text.size() <= std::numeric_limits<std::uint32_t>::max());
    u32(static_cast<std::uint32_t>(text.size()));
    bytes_.insert(bytes_.end(), text.begin(), text.end());
  }
  void count(std::size_t n) {
    CHORUS_CHECK(n <= std::numeric_limits<std::uint32_t>::max());
    u32(static_cast<std::uint32_t>(n));
  }
  void reserve(std::size_t body_bytes) { bytes_.reserve(kFrameHeaderBytes + body_bytes); }

  std::vector<std::uint8_t> frame() && {
    write_frame_header(bytes_.data(), bytes_.size() - kFrameHeaderBytes);
    return std::move(bytes_);
  }

 private:
  void little_endian(std::uint64_t value, int bytes) {
    std::uint8_t encoded[8];
    for (int i = 0; i < bytes; ++i) {
      encoded[i] = static_cast<std::uint8_t>(value >> (8 * i));
    }
    bytes_.insert(bytes_.end(), encoded, encoded + bytes);
  }

  std::vector<std::uint8_t> bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> body) : body_(body) {}

  std::uint8_t u8() { return static_cast<std::uint8_t>(little_endian(1, "u8")); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(little_endian(2, "u16")); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(little_endian(4, "u32")); }
  std::uint64_t u64() { return little_endian(8, "u64"); }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  std::string str(const char* what) {
    const std::uint32_t length = u32();
    need(length, what);
    std::string text(reinterpret_cast<const char*>(body_.data() + offset_), length);
    offset_ += length;
    return text;
  }
  // A list count, checked against the bytes left (each item takes at least `item_bytes_min`),
  // so that a hostile count cannot make the parser reserve memory the body does not back.
  std::size_t count(std::size_t item_bytes_min, const char* what) {
    const std::uint32_t n = u32();
    if (n > remaining() / item_bytes_min) {
      fail(std::string(what) + " count " + std::to_string(n) + " exceeds the body");
    }
    return n;
  }
  std::int64_t timeout_ms() {
    const std::uint64_t ms = u64();
    if (ms > kTimeoutMsMax) {
      fail("timeout " + std::to_string(ms) + " ms exceeds the maximum");
    }
    return static_cast<std::int64_t>(ms);
  }
  void end() {
    if (offset_ != body_.size()) {
      fail(std::to_string(body_.size() - offset_) + " trailing bytes");
    }
  }
  std::size_t remaining() const noexcept { return body_.size() - offset_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw ProtocolError("at offset " + std::to_string(offset_) + ": " + what);
  }

 private:
  void need(std::size_t bytes, const char* what) const {
    if (bytes > remaining()) {
      fail(std::string("truncated ") + what + " (" + std::to_string(bytes) + " bytes needed, " +
           std::to_string(remaining()) + " left)");
    }
  }
  std::uint64_t little_endian(int bytes, const char* what) {
    need(static_cast<std::size_t>(bytes), what);
    std::uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) {
      value |= std::uint64_t{body_[offset_ + static_cast<std::size_t>(i)]} << (8 * i);
    }
    offset_ += static_cast<std::size_t>(bytes);
    return value;
  }

  std::span<const std::uint8_t> body_;
  std::size_t offset_ = 0;
};

// Smallest encoding of a string: its length word.
constexpr std::size_t kStringBytesMin = 4;

void check_shape(const Request& request, std::size_t keys, std::size_t values) {
  CHORUS_CHECK_EQ(request.keys.size(), keys);
  CHORUS_CHECK_EQ(request.values.size(), values);
}

std::size_t strings_bytes(const std::vector<std::string>& strings) {
  std::size_t bytes = 0;
  for (const std::string& text : strings) {
    bytes += kStringBytesMin + text.size();
  }
  return bytes;
}

}  // namespace

std::string_view op_name(Op op) noexcept {
  switch (op) {
    case Op::Hello:
      return "hello";
    case Op::Set:
      return "set";
    case Op::Get:
      return "get";
    case Op::Add:
      return "add";
    case Op::CompareSet:
      return "compare_set";
    case Op::Wait:
      return "wait";
    case Op::DeleteKey:
      return "delete_key";
    case Op::NumKeys:
      return "num_keys";
    case Op::MultiGet:
      return "multi_get";
    case Op::MultiSet:
      return "multi_set";
    case Op::Cancel:
      return "cancel";
  }
  return "unknown";
}

bool is_blocking(Op op) noexcept { return op == Op::Get || op == Op::Wait || op == Op::MultiGet; }

void write_frame_header(std::uint8_t* out, std::size_t body_bytes) {
  CHORUS_CHECK(body_bytes <= std::numeric_limits<std::uint32_t>::max());
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<std::uint8_t>(body_bytes >> (8 * i));
  }
}

std::uint32_t read_frame_header(const std::uint8_t* in) noexcept {
  std::uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    value |= std::uint32_t{in[i]} << (8 * i);
  }
  return value;
}

std::vector<std::uint8_t> encode_request(const Request& request) {
  Writer out;
  out.reserve(16 + strings_bytes(request.keys) + strings_bytes(request.values));
  out.u8(static_cast<std::uint8_t>(request.op));
  switch (request.op) {
    case Op::Hello:
      check_shape(request, 0, 1);
      CHORUS_CHECK(request.number >= 0 && request.number <= 0xffff);
      out.u32(kMagic);
      out.u16(static_cast<std::uint16_t>(request.number));
      out.str(request.values[0]);
      break;
    case Op::Set:
      check_shape(request, 1, 1);
      out.str(request.keys[0]);
      out.str(request.values[0]);
      break;
    case Op::Get:
      check_shape(request, 1, 0);
      CHORUS_CHECK(request.number >= 0 &&
                   static_cast<std::uint64_t>(request.number) <= kTimeoutMsMax);
      out.u64(static_cast<std::uint64_t>(request.number));
      out.str(request.keys[0]);
      break;
    case Op::Add:
      check_shape(request, 1, 0);
      out.str(request.keys[0]);
      out.i64(request.number);
      break;
    case Op::CompareSet:
      check_shape(request, 1, 2);
      out.str(request.keys[0]);
      out.str(request.values[0]);
      out.str(request.values[1]);
      break;
    case Op::Wait:
    case Op::MultiGet:
      check_shape(request, request.keys.size(), 0);
      CHORUS_CHECK(request.number >= 0 &&
                   static_cast<std::uint64_t>(request.number) <= kTimeoutMsMax);
      out.u64(static_cast<std::uint64_t>(request.number));
      out.count(request.keys.size());
      for (const std::string& key : request.keys) {
        out.str(key);
      }
      break;
    case Op::DeleteKey:
      check_shape(request, 1, 0);
      out.str(request.keys[0]);
      break;
    case Op::NumKeys:
    case Op::Cancel:
      check_shape(request, 0, 0);
      break;
    case Op::MultiSet:
      check_shape(request, request.keys.size(), request.keys.size());
      out.count(request.keys.size());
      for (std::size_t i = 0; i < request.keys.size(); ++i) {
        out.str(request.keys[i]);
        out.str(request.values[i]);
      }
      break;
  }
  return std::move(out).frame();
}

Request parse_request(std::span<const std::uint8_t> body) {
  Reader in(body);
  Request request;
  const std::uint8_t op = in.u8();
  if (op < kOpFirst || op > kOpLast) {
    in.fail("unknown opcode " + std::to_string(op));
  }
  request.op = static_cast<Op>(op);
  switch (request.op) {
    case Op::Hello: {
      const std::uint32_t magic = in.u32();
      if (magic != kMagic) {
        in.fail("bad magic (not a chorus store client)");
      }
      request.number = in.u16();
      request.values.push_back(in.str("token"));
      break;
    }
    case Op::Set:
      request.keys.push_back(in.str("key"));
      request.values.push_back(in.str("value"));
      break;
    case Op::Get:
      request.number = in.timeout_ms();
      request.keys.push_back(in.str("key"));
      break;
    case Op::Add:
      request.keys.push_back(in.str("key"));
      request.number = in.i64();
      break;
    case Op::CompareSet:
      request.keys.push_back(in.str("key"));
      request.values.push_back(in.str("expected value"));
      request.values.push_back(in.str("desired value"));
      break;
    case Op::Wait:
    case Op::MultiGet: {
      request.number = in.timeout_ms();
      const std::size_t n = in.count(kStringBytesMin, "key");
      request.keys.reserve(n);
      for (std::size_t i = 0; i < n; ++i) {
        request.keys.push_back(in.str("key"));
      }
      break;
    }
    case Op::DeleteKey:
      request.keys.push_back(in.str("key"));
      break;
    case Op::NumKeys:
    case Op::Cancel:
      break;
    case Op::MultiSet: {
      const std::size_t n = in.count(2 * kStringBytesMin, "item");
      request.keys.reserve(n);
      request.values.reserve(n);
      for (std::size_t i = 0; i < n; ++i) {
        request.keys.push_back(in.str("key"));
        request.values.push_back(in.str("value"));
      }
      break;
    }
  }
  in.end();
  return request;
}

std::vector<std::uint8_t> encode_response(Op op, const Response& response) {
  CHORUS_CHECK(op != Op::Cancel);
  Writer out;
  out.reserve(16 + response.message.size() + strings_bytes(response.values));
  out.u8(static_cast<std::uint8_t>(response.status));
  if (response.status != Status::Ok) {
    CHORUS_CHECK(response.values.empty());
    out.str(response.message);
    return std::move(out).frame();
  }
  CHORUS_CHECK(response.message.empty());
  switch (op) {
    case Op::Hello:
    case Op::NumKeys:
      CHORUS_CHECK(response.values.empty() && response.number >= 0);
      out.u64(static_cast<std::uint64_t>(response.number));
      break;
    case Op::Set:
    case Op::Wait:
    case Op::MultiSet:
      CHORUS_CHECK(response.values.empty() && response.number == 0);
      break;
    case Op::Get:
      CHORUS_CHECK_EQ(response.values.size(), std::size_t{1});
      out.str(response.values[0]);
      break;
    case Op::Add:
      CHORUS_CHECK(response.values.empty());
      out.i64(response.number);
      break;
    case Op::CompareSet:
      CHORUS_CHECK(response.values.size() <= 1 && response.number == 0);
      out.u8(response.values.empty() ? 0 : 1);
      if (!response.values.empty()) {
        out.str(response.values[0]);
      }
      break;
    case Op::DeleteKey:
      CHORUS_CHECK(response.values.empty() && (response.number == 0 || response.number == 1));
      out.u8(static_cast<std::uint8_t>(response.number));
      break;
    case Op::MultiGet:
      CHORUS_CHECK(response.number == 0);
      out.count(response.values.size());
      for (const std::string& value : response.values) {
        out.str(value);
      }
      break;
    case Op::Cancel:
      break;
  }
  return std::move(out).frame();
}

Response parse_response(Op op, std::span<const std::uint8_t> body) {
  Reader in(body);
  Response response;
  const std::uint8_t status = in.u8();
  if (status > kStatusLast) {
    in.fail("unknown status " + std::to_string(status));
  }
  response.status = static_cast<Status>(status);
  if (response.status != Status::Ok) {
    response.message = in.str("message");
    in.end();
    return response;
  }
  switch (op) {
    case Op::Hello:
    case Op::NumKeys: {
      const std::uint64_t number = in.u64();
      if (number > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        in.fail("count out of range");
      }
      response.number = static_cast<std::int64_t>(number);
      break;
    }
    case Op::Set:
    case Op::Wait:
    case Op::MultiSet:
      break;
    case Op::Get:
      response.values.push_back(in.str("value"));
      break;
    case Op::Add:
      response.number = in.i64();
      break;
    case Op::CompareSet: {
      const std::uint8_t present = in.u8();
      if (present > 1) {
        in.fail("presence flag " + std::to_string(present));
      }
      if (present == 1) {
        response.values.push_back(in.str("value"));
      }
      break;
    }
    case Op::DeleteKey: {
      const std::uint8_t existed = in.u8();
      if (existed > 1) {
        in.fail("existence flag " + std::to_string(existed));
      }
      response.number = existed;
      break;
    }
    case Op::MultiGet: {
      const std::size_t n = in.count(kStringBytesMin, "value");
      response.values.reserve(n);
      for (std::size_t i = 0; i < n; ++i) {
        response.values.push_back(in.str("value"));
      }
      break;
    }
    case Op::Cancel:
      in.fail("cancel has no response");
  }
  in.end();
  return response;
}

std::size_t multi_get_values_bytes(std::span<const std::string* const> values) noexcept {
  std::size_t bytes = 1 + 4;  // status, count
  for (const std::string* value : values) {
    bytes += kStringBytesMin + value->size();
  }
  return bytes;
}

std::vector<std::uint8_t> encode_multi_get_values(std::span<const std::string* const> values) {
  Writer out;
  out.reserve(multi_get_values_bytes(values));
  out.u8(static_cast<std::uint8_t>(Status::Ok));
  out.count(values.size());
  for (const std::string* value : values) {
    CHORUS_CHECK(value != nullptr);
    out.str(*value);
  }
  return std::move(out).frame();
}

}  // namespace chorus::store::detail
