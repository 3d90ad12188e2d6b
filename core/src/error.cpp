#include "chorus/error.hpp"

#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "chorus/runtime.hpp"
#include "detail/errors.hpp"

namespace chorus {
namespace {

std::string format_message(ErrorCode code, const ErrorContext& context, const std::string& detail) {
  std::string out = "chorus::";
  out += error_code_name(code);
  out += ':';
  const std::size_t bare = out.size();
  if (context.rank >= 0) {
    out += " [rank " + std::to_string(context.rank) + "]";
  }
  if (!context.op.empty()) {
    out += ' ';
    out += context.op;
    if (context.seq >= 0) {
      out += " #" + std::to_string(context.seq);
    }
  }
  if (!context.group.empty()) {
    out += " on group " + context.group;
  }
  // An error with no context reads "chorus::InvalidArgument: detail", not "...:: detail".
  out += out.size() == bare ? " " : ": ";
  out += detail;
  return out;
}

}  // namespace

std::string_view error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return "InvalidArgument";
    case ErrorCode::CollectiveMismatch:
      return "CollectiveMismatch";
    case ErrorCode::Timeout:
      return "Timeout";
    case ErrorCode::Deadlock:
      return "Deadlock";
    case ErrorCode::RankFailure:
      return "RankFailure";
    case ErrorCode::TransportError:
      return "TransportError";
    case ErrorCode::Aborted:
      return "Aborted";
    case ErrorCode::InputModified:
      return "InputModified";
  }
  return "Unknown";
}

static_assert(std::is_nothrow_copy_constructible_v<Error>);

Error::Error(ErrorCode code, ErrorContext context, std::string detail)
    : std::runtime_error(format_message(code, context, detail)),
      code_(code),
      parts_(std::make_shared<const Parts>(Parts{std::move(context), std::move(detail)})) {}

std::exception_ptr try_make_error(ErrorCode code, ErrorContext context,
                                  std::string detail) noexcept {
  // std::make_exception_ptr builds the exception in place, without a throw and catch (and the
  // unwinder's search) that std::current_exception would need.
  try {
    switch (code) {
      case ErrorCode::InvalidArgument:
        return std::make_exception_ptr(InvalidArgument(std::move(context), std::move(detail)));
      case ErrorCode::CollectiveMismatch:
        return std::make_exception_ptr(CollectiveMismatch(std::move(context), std::move(detail)));
      case ErrorCode::Timeout:
        return std::make_exception_ptr(Timeout(std::move(context), std::move(detail)));
      case ErrorCode::Deadlock:
        return std::make_exception_ptr(Deadlock(std::move(context), std::move(detail)));
      case ErrorCode::RankFailure:
        return std::make_exception_ptr(RankFailure(std::move(context), std::move(detail)));
      case ErrorCode::TransportError:
        return std::make_exception_ptr(TransportError(std::move(context), std::move(detail)));
      case ErrorCode::Aborted:
        return std::make_exception_ptr(Aborted(std::move(context), std::move(detail)));
      case ErrorCode::InputModified:
        return std::make_exception_ptr(InputModified(std::move(context), std::move(detail)));
    }
    return std::make_exception_ptr(Error(code, std::move(context), std::move(detail)));
  } catch (...) {  // out of memory formatting the message or sharing its parts
    return nullptr;
  }
}

std::exception_ptr make_error(ErrorCode code, ErrorContext context, std::string detail) {
  if (std::exception_ptr error = try_make_error(code, std::move(context), std::move(detail))) {
    return error;
  }
  return std::make_exception_ptr(std::bad_alloc());
}

void throw_error(ErrorCode code, ErrorContext context, std::string detail) {
  // The error of `code`'s type, as make_error builds it: std::bad_alloc where it cannot be made
  // (try_make_error maps any exception raised making it, a std::length_error too, to that).
  std::rethrow_exception(make_error(code, std::move(context), std::move(detail)));
}

std::string describe(const std::exception_ptr& error) {
  if (!error) {
    return "no error";
  }
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

namespace detail {

ErrorContext make_context(std::string_view op, std::int64_t seq, std::string group) {
  ErrorContext context;
  if (RankContext* rank = RankContext::current()) {
    context.rank = rank->rank();
  }
  context.op = std::string(op);
  context.seq = seq;
  context.group = std::move(group);
  return context;
}

std::exception_ptr raised_by_calling_rank(const std::exception_ptr& error) noexcept {
  const RankContext* caller = RankContext::current();
  if (caller == nullptr || error == nullptr) {
    return error;
  }
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    const int issuer = e.context().rank;
    if (issuer < 0 || issuer == caller->rank()) {
      return error;
    }
    try {
      ErrorContext context = e.context();
      context.rank = caller->rank();
      // try_make_error, not make_error: out of memory making the error, make_error would return
      // a std::bad_alloc, and the failure would be lost.
      std::exception_ptr raised = try_make_error(
          e.code(), std::move(context),
          "rank " + std::to_string(issuer) + " issued this collective and rank " +
              std::to_string(caller->rank()) + " waited on its result: " + e.detail());
      return raised != nullptr ? raised : error;  // out of memory: the issuer's error
    } catch (...) {
      return error;  // out of memory: the issuer's error
    }
  } catch (...) {
    return error;
  }
}

void throw_invalid(std::string_view op, std::string detail) {
  throw InvalidArgument(make_context(op), std::move(detail));
}

}  // namespace detail
}  // namespace chorus
