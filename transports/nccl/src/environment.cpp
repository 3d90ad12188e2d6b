// The torchrun environment and the unique-id exchange (chorus/nccl/nccl.hpp): no CUDA, no NCCL.

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "chorus/error.hpp"
#include "chorus/nccl/nccl.hpp"

namespace chorus::nccl {
namespace {

[[noreturn]] void bad_variable(const std::string& name, const char* value,
                               const std::string& expected) {
  throw InvalidArgument(ErrorContext{-1, "nccl::parse_environment", -1, ""},
                        value == nullptr
                            ? "environment variable " + name + " is not set (" + expected +
                                  "); start ranks with chorus launch or "
                                  "torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR "
                                  "and MASTER_PORT"
                            : "environment variable " + name + "='" + std::string(value) +
                                  "' is invalid: expected " + expected);
}

// A decimal integer in [low, high]; no sign, no junk.
long long parse_integer(const std::string& name, const char* value, long long low, long long high) {
  const std::string expected =
      "an integer from " + std::to_string(low) + " to " + std::to_string(high);
  if (value == nullptr) {
    bad_variable(name, value, expected);
  }
  const std::string text = value;
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    bad_variable(name, value, expected);
  }
  const long long parsed = std::stoll(text);
  if (parsed < low || parsed > high) {
    bad_variable(name, value, expected);
  }
  return parsed;
}

}  // namespace

Environment parse_environment(const std::function<const char*(const char*)>& lookup) {
  constexpr long long kWorldSizeMax = 1 << 20;
  Environment environment;
  environment.world_size =
      static_cast<int>(parse_integer("WORLD_SIZE", lookup("WORLD_SIZE"), 1, kWorldSizeMax));
  environment.rank =
      static_cast<int>(parse_integer("RANK", lookup("RANK"), 0, environment.world_size - 1));
  const char* local_rank = lookup("LOCAL_RANK");
  environment.local_rank =
      local_rank == nullptr
          ? environment.rank
          : static_cast<int>(parse_integer("LOCAL_RANK", local_rank, 0, kWorldSizeMax - 1));
  const char* master_addr = lookup("MASTER_ADDR");
  if (master_addr == nullptr || *master_addr == '\0') {
    bad_variable("MASTER_ADDR", master_addr, "a host name or address");
  }
  environment.master_addr = master_addr;
  environment.master_port =
      static_cast<std::uint16_t>(parse_integer("MASTER_PORT", lookup("MASTER_PORT"), 1, 65535));
  return environment;
}

Environment read_environment() {
  return parse_environment([](const char* name) {
    return std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read-only use
  });
}

namespace {

// What rank 0 publishes in place of an id it could not make: the marker, then its error's text,
// never id_bytes long (an id is exactly that long), so every rank fails at once instead of
// waiting out the deadline for an id that never comes.
constexpr std::string_view kFailedIdMarker = "chorus: no unique id: ";

std::string failed_id_payload(std::string text, std::size_t id_bytes) {
  std::string payload = std::string(kFailedIdMarker) + text;
  if (payload.size() == id_bytes) {
    payload.insert(kFailedIdMarker.size(), " ");  // the reader drops the spaces after the marker
  }
  return payload;
}

}  // namespace

std::string exchange_unique_id(store::Rendezvous& rendezvous, std::size_t id_bytes,
                               const std::function<std::string()>& make_id,
                               store::Deadline deadline) {
  std::string id;
  if (rendezvous.rank() == 0) {
    try {
      id = make_id();
      if (id.size() != id_bytes) {
        throw InvalidArgument(ErrorContext{0, "nccl::exchange_unique_id", -1, ""},
                              "nccl: the unique id has " + std::to_string(id.size()) +
                                  " bytes, expected " + std::to_string(id_bytes));
      }
    } catch (const std::exception& error) {
      // The others learn of it (below), then this rank throws its own error. A failure to
      // publish is secondary: the peers time out then, as without this.
      try {
        (void)rendezvous.broadcast_bytes(0, failed_id_payload(error.what(), id_bytes), deadline);
      } catch (const std::exception&) {
      }
      throw;
    }
  }
  std::string received;
  try {
    received = rendezvous.broadcast_bytes(0, id, deadline);
  } catch (const Error& error) {
    // The store's error names only its call and key ("store.get: key '.../broadcast/0' was not
    // set within ..."): say which rank this is and what it waited for.
    const std::string what = rendezvous.rank() == 0
                                 ? "nccl: rank 0 of this communicator could not share its "
                                   "unique id through the store: "
                                 : "nccl: the unique id from rank 0 of this communicator did "
                                   "not arrive: ";
    throw_error(error.code(), ErrorContext{rendezvous.rank(), "nccl::exchange_unique_id", -1, ""},
                what + error.context().op + ": " + error.detail());
  }
  if (received.size() != id_bytes && std::string_view(received).starts_with(kFailedIdMarker)) {
    throw TransportError(
        ErrorContext{rendezvous.rank(), "nccl::exchange_unique_id", -1, ""},
        "nccl: rank 0 of this communicator could not make its unique id: " +
            received.substr(std::min(received.size(),
                                     received.find_first_not_of(' ', kFailedIdMarker.size()))));
  }
  if (received.size() != id_bytes) {
    throw InvalidArgument(ErrorContext{rendezvous.rank(), "nccl::exchange_unique_id", -1, ""},
                          "nccl: received a unique id of " + std::to_string(received.size()) +
                              " bytes, expected " + std::to_string(id_bytes));
  }
  return received;
}

}  // namespace chorus::nccl
