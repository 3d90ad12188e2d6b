#include "chorus/error.hpp"

#include <string>
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

Error::Error(ErrorCode code, ErrorContext context, std::string detail)
    : std::runtime_error(format_message(code, context, detail)),
      code_(code),
      context_(std::move(context)),
      detail_(std::move(detail)) {}

std::exception_ptr make_error(ErrorCode code, ErrorContext context, std::string detail) {
  try {
    throw_error(code, std::move(context), std::move(detail));
  } catch (...) {
    return std::current_exception();
  }
}

void throw_error(ErrorCode code, ErrorContext context, std::string detail) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      throw InvalidArgument(std::move(context), std::move(detail));
    case ErrorCode::CollectiveMismatch:
      throw CollectiveMismatch(std::move(context), std::move(detail));
    case ErrorCode::Timeout:
      throw Timeout(std::move(context), std::move(detail));
    case ErrorCode::Deadlock:
      throw Deadlock(std::move(context), std::move(detail));
    case ErrorCode::RankFailure:
      throw RankFailure(std::move(context), std::move(detail));
    case ErrorCode::TransportError:
      throw TransportError(std::move(context), std::move(detail));
    case ErrorCode::Aborted:
      throw Aborted(std::move(context), std::move(detail));
    case ErrorCode::InputModified:
      throw InputModified(std::move(context), std::move(detail));
  }
  throw Error(code, std::move(context), std::move(detail));
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

void throw_invalid(std::string_view op, std::string detail) {
  throw InvalidArgument(make_context(op), std::move(detail));
}

}  // namespace detail
}  // namespace chorus
