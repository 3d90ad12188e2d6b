#include "mpi_errors.hpp"

namespace chorus::mpi::detail {
int world_rank_of(MPI_Comm comm, int rank) {
  int size = 0;
  if (comm == MPI_COMM_NULL || MPI_Comm_size(comm, &size) != MPI_SUCCESS || rank < 0 ||
      rank >= size) {
    return -1;
  }
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group world_group = MPI_GROUP_NULL;
  int world_rank = MPI_UNDEFINED;
  if (MPI_Comm_group(comm, &group) == MPI_SUCCESS &&
      MPI_Comm_group(MPI_COMM_WORLD, &world_group) == MPI_SUCCESS) {
    MPI_Group_translate_ranks(group, 1, &rank, world_group, &world_rank);
  }
  if (group != MPI_GROUP_NULL) {
    MPI_Group_free(&group);
  }
  if (world_group != MPI_GROUP_NULL) {
    MPI_Group_free(&world_group);
  }
  return world_rank == MPI_UNDEFINED ? -1 : world_rank;
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length)) + " (MPI error " +
         std::to_string(code) + ")";
}

std::string mpi_requests_failure(const char* call, int code, std::span<const MPI_Status> statuses,
                                 std::span<const int> peers) {
  const std::string failed = std::string(call) + " failed: ";
  if (code != MPI_ERR_IN_STATUS) {
    return failed + mpi_error_text(code);
  }
  for (std::size_t i = 0; i < statuses.size(); ++i) {
    const int error = statuses[i].MPI_ERROR;
    // MPI_ERR_PENDING: a request that neither failed nor completed (MPI_Waitall's statuses).
    if (error == MPI_SUCCESS || error == MPI_ERR_PENDING) {
      continue;
    }
    const int peer = i < peers.size() ? peers[i] : -1;
    return failed + mpi_error_text(error) + " (request " + std::to_string(i + 1) + " of " +
           std::to_string(statuses.size()) +
           (peer >= 0 ? ", with rank " + std::to_string(peer) : std::string()) + ")";
  }
  // MPI said a status holds the error but none does: report what MPI returned.
  return failed + mpi_error_text(code) + " (no request's status names an error)";
}

bool truncated(int code, std::span<const MPI_Status> statuses, std::size_t request) {
  if (code != MPI_ERR_IN_STATUS || request >= statuses.size()) {
    return false;
  }
  int error_class = MPI_SUCCESS;
  return MPI_Error_class(statuses[request].MPI_ERROR, &error_class) == MPI_SUCCESS &&
         error_class == MPI_ERR_TRUNCATE;
}

std::string message_size_mismatch(int peer, int arrived, int expected, const std::string& unit,
                                  const std::string& where) {
  // "1 element", "2 elements".
  const auto amount = [&unit](int n) {
    return std::to_string(n) + " " + (n == 1 ? unit.substr(0, unit.size() - 1) : unit);
  };
  const std::string sent =
      arrived == kLongerMessage ? "more than the " + amount(expected) + " this rank expected"
      : arrived == MPI_UNDEFINED
          ? "a message that is not a whole number of " + unit + " where this rank expected " +
                amount(expected)
          : amount(arrived) + " where this rank expected " + std::to_string(expected);
  return "rank " + std::to_string(peer) + " sent " + sent + where +
         ": the ranks issued different operations or sizes at this point (--check-collectives "
         "compares them before anything is sent)";
}

}  // namespace chorus::mpi::detail
