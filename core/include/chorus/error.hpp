#pragma once

// The chorus::Error hierarchy. Every error names the rank, the op, its sequence number within the
// group's communicator, and the group, so a message read at 3 a.m. says where to look.

#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace chorus {

enum class ErrorCode : std::uint8_t {
  InvalidArgument,     // caller misuse detected at the API boundary (consumes no sequence number)
  CollectiveMismatch,  // ranks issued different collectives at the same sequence number
  Timeout,             // a wait passed its deadline
  Deadlock,            // no rank can make progress (simulator), or a peer left without joining
  RankFailure,         // a peer rank died; this collective can never complete
  TransportError,      // the transport reported a failure
  Aborted,             // the communicator was aborted after an earlier failure
  InputModified,       // a rank wrote a collective's input before the collective completed
};

std::string_view error_code_name(ErrorCode code) noexcept;

// Where an error happened. Fields that do not apply keep their defaults and are left out of the
// message: rank -1 (outside any rank), seq -1 (no sequence number), empty op or group.
struct ErrorContext {
  int rank = -1;
  std::string op;
  std::int64_t seq = -1;
  std::string group;
};

// Base of every exception chorus throws. what() is
// "chorus::<Code>: [rank R] <op> #<seq> on group <group>: <detail>".
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, ErrorContext context, std::string detail);
  // Copies share the parts and cannot throw; there is no move, so an error moved from keeps them.
  Error(const Error&) noexcept = default;
  Error& operator=(const Error&) noexcept = default;
  ~Error() override = default;

  ErrorCode code() const noexcept { return code_; }
  const ErrorContext& context() const noexcept { return parts_->context; }
  // The message without the context prefix.
  const std::string& detail() const noexcept { return parts_->detail; }

 private:
  // Shared, so that copying an error cannot throw (std::make_exception_ptr and a catch by value
  // copy it).
  struct Parts {
    ErrorContext context;
    std::string detail;
  };
  ErrorCode code_;
  std::shared_ptr<const Parts> parts_;
};

#define CHORUS_DECLARE_ERROR(Name)                                         \
  class Name : public Error {                                              \
   public:                                                                 \
    Name(ErrorContext context, std::string detail)                         \
        : Error(ErrorCode::Name, std::move(context), std::move(detail)) {} \
  }

CHORUS_DECLARE_ERROR(InvalidArgument);
CHORUS_DECLARE_ERROR(CollectiveMismatch);
CHORUS_DECLARE_ERROR(Timeout);
CHORUS_DECLARE_ERROR(Deadlock);
CHORUS_DECLARE_ERROR(RankFailure);
CHORUS_DECLARE_ERROR(TransportError);
CHORUS_DECLARE_ERROR(Aborted);
CHORUS_DECLARE_ERROR(InputModified);

#undef CHORUS_DECLARE_ERROR

// Builds the subclass that matches `code`, for transports that store an error in a Work and
// rethrow it later with its dynamic type intact. Out of memory making it, the std::bad_alloc is
// returned as the error.
std::exception_ptr make_error(ErrorCode code, ErrorContext context, std::string detail);
// The same, but an empty exception_ptr where making the error ran out of memory, for callers
// that fall back to an error made in advance. Never throws.
std::exception_ptr try_make_error(ErrorCode code, ErrorContext context,
                                  std::string detail) noexcept;

// what() of `error`, or a fixed text for an exception not derived from std::exception.
std::string describe(const std::exception_ptr& error);

// Throws the subclass that matches `code`.
[[noreturn]] void throw_error(ErrorCode code, ErrorContext context, std::string detail);

}  // namespace chorus
