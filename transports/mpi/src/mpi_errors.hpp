#pragma once

// MPI error codes as the text chorus's errors carry (docs/mpi.md, "Every MPI call returns its
// error").

#include <mpi.h>

#include <cstddef>
#include <span>
#include <string>

namespace chorus::mpi::detail {

// "MPI_ERR_TRUNCATE: message truncated (MPI error 15)" for an MPI error code.
std::string mpi_error_text(int code);

// `rank` of `comm` as a rank of MPI_COMM_WORLD, or -1 when it is none or cannot be translated.
int world_rank_of(MPI_Comm comm, int rank);

// What a failed MPI_Testall or MPI_Waitall over `statuses` (one per request, filled by that
// call) reports: "<call> failed: " and MPI's text. MPI_ERR_IN_STATUS names no error itself (the
// real one, MPI_ERR_TRUNCATE say, is in the failed request's status), so for it the text is the
// first failed request's own error and, when the caller knows it, its peer as a world rank:
// `peers[i]` for request i (-1, or no entry: none to name). The status's MPI_SOURCE is never
// read: MPI leaves it undefined for a collective's request (MPI-3.1, 5.12; Open MPI writes 0,
// which named the group's first rank whoever failed), and the point-to-point callers know their
// peers. Call with the MPI lock held (Note [MPI locking]).
std::string mpi_requests_failure(const char* call, int code, std::span<const MPI_Status> statuses,
                                 std::span<const int> peers = {});

// Whether request `request` of a failed MPI_Testall or MPI_Waitall (`code`, `statuses`) was a
// receive whose message was longer than it posted for (MPI_ERR_TRUNCATE in its status).
bool truncated(int code, std::span<const MPI_Status> statuses, std::size_t request);

// CollectiveMismatch's detail for a receive whose message had another size than this rank posted
// for (Note [Direct exchanges], "Short messages"; Note [Ring all_reduce], "Sizes"): "rank <peer>
// sent <arrived> <unit> where this rank expected <expected><where>: the ranks issued different
// operations or sizes at this point (...)". `peer` is a world rank, `unit` "elements" or "bytes"
// (plural; "1 element" drops its s), `where` empty or " in the ring all_reduce"; `arrived` is
// kLongerMessage for a longer message (truncated) and MPI_UNDEFINED for one that is not a whole
// number of elements.
inline constexpr int kLongerMessage = -1;
std::string message_size_mismatch(int peer, int arrived, int expected, const std::string& unit,
                                  const std::string& where);

}  // namespace chorus::mpi::detail
