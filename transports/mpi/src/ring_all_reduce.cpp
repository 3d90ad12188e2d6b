// chorus's ring all_reduce over MPI point-to-point messages (Note [Ring all_reduce]).

#include "ring_all_reduce.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "chorus/check.hpp"
#include "chorus/kernels.hpp"
#include "mpi_errors.hpp"

namespace chorus::mpi::detail {
namespace {

// An MPI call of a ring failed (caught in start() and progress()).
struct RingFailure {
  std::string what;
};

void check_call(int code, const char* call) {
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw RingFailure{std::string(call) + " failed (ring all_reduce): " +
                      std::string(text, static_cast<std::size_t>(length))};
  }
}

}  // namespace

std::size_t RingAllReduce::chunk_offset(std::size_t count, int size, int chunk) {
  const auto n = static_cast<std::size_t>(size);
  const auto c = static_cast<std::size_t>(chunk);
  return c * (count / n) + std::min(c, count % n);
}

std::size_t RingAllReduce::chunk_count(std::size_t count, int size, int chunk) {
  const auto n = static_cast<std::size_t>(size);
  return count / n + (static_cast<std::size_t>(chunk) < count % n ? 1 : 0);
}

bool RingAllReduce::fits(std::size_t count, DType dtype, int group_size) {
  return chunk_count(count, group_size, 0) <=
         static_cast<std::size_t>(std::numeric_limits<int>::max()) / element_size(dtype);
}

bool RingAllReduce::keeps_order(DType dtype, const ReduceOp& reduce_op) {
  const bool ordered =
      reduce_op.kind() == ReduceOp::Kind::Min || reduce_op.kind() == ReduceOp::Kind::Max;
  return !(ordered && is_floating(dtype));
}

RingAllReduce::RingAllReduce(const void* input, void* output, std::size_t count, DType dtype,
                             const ReduceOp& step_op, MPI_Comm comm, int group_rank, int group_size,
                             int tag)
    : input_(static_cast<const char*>(input)),
      output_(static_cast<char*>(output)),
      count_(count),
      dtype_(dtype),
      element_size_(element_size(dtype)),
      step_op_(step_op),
      comm_(comm),
      rank_(group_rank),
      size_(group_size),
      tag_(tag),
      total_steps_(2 * (group_size - 1)),
      scratch_(std::make_unique_for_overwrite<char[]>(chunk_count(count, group_size, 0) *
                                                      element_size(dtype))) {
  CHORUS_CHECK(group_size >= 2);
  CHORUS_CHECK(0 <= group_rank && group_rank < group_size);
  CHORUS_CHECK(fits(count, dtype, group_size));
}

// Parked rings (after a Timeout) are destroyed after MPI_Finalize: no MPI calls here.
RingAllReduce::~RingAllReduce() = default;

char* RingAllReduce::output_chunk(int chunk) const {
  return output_ + chunk_offset(count_, size_, chunk) * element_size_;
}

const char* RingAllReduce::input_chunk(int chunk) const {
  return input_ + chunk_offset(count_, size_, chunk) * element_size_;
}

int RingAllReduce::chunk_bytes(int chunk) const {
  return static_cast<int>(chunk_count(count_, size_, chunk) * element_size_);
}

void RingAllReduce::start() {
  try {
    post_step();
  } catch (const RingFailure& failure) {
    failure_ = failure.what;
  }
}

void RingAllReduce::post_step() {
  const int right = wrap(rank_ + 1);
  const int left = wrap(rank_ - 1);
  const void* send = nullptr;
  void* receive = nullptr;
  int send_chunk = 0;
  int receive_chunk = 0;
  if (step_ < size_ - 1) {  // reduce-scatter
    send_chunk = wrap(rank_ - step_);
    receive_chunk = wrap(rank_ - step_ - 1);
    send = step_ == 0 ? input_chunk(send_chunk) : output_chunk(send_chunk);
    receive = scratch_.get();
  } else {  // all-gather
    const int t = step_ - (size_ - 1);
    send_chunk = wrap(rank_ + 1 - t);
    receive_chunk = wrap(rank_ - t);
    send = output_chunk(send_chunk);
    receive = output_chunk(receive_chunk);
  }
  receive_bytes_ = chunk_bytes(receive_chunk);
  receive_ = receive;
  check_call(MPI_Irecv(receive, receive_bytes_, MPI_BYTE, left, tag_, comm_, &requests_[0]),
             "MPI_Irecv");
  check_call(MPI_Isend(send, chunk_bytes(send_chunk), MPI_BYTE, right, tag_, comm_, &requests_[1]),
             "MPI_Isend");
}

void RingAllReduce::note_received(int arrived) {
  if (arrived == receive_bytes_) {
    return;
  }
  // The rest of a short chunk is zeros, not what the memory held: the step still reduces it.
  if (0 <= arrived && arrived < receive_bytes_) {
    std::memset(static_cast<char*>(receive_) + arrived, 0,
                static_cast<std::size_t>(receive_bytes_ - arrived));
  }
  if (size_message_.empty()) {
    size_message_ = message_size_mismatch(world_rank_of(comm_, wrap(rank_ - 1)), arrived,
                                          receive_bytes_, "bytes", " in the ring all_reduce");
  }
}

void RingAllReduce::finish_step() {
  if (step_ >= size_ - 1) {
    return;  // all-gather steps received straight into the output
  }
  const int chunk = wrap(rank_ - step_ - 1);
  const void* sources[2] = {scratch_.get(), input_chunk(chunk)};
  kernels::reduce(output_chunk(chunk), sources, 2, chunk_count(count_, size_, chunk), dtype_,
                  step_op_);
}

bool RingAllReduce::progress() {
  try {
    while (!done()) {
      int completed = 0;
      std::array<MPI_Status, 2> statuses{};
      const int code = MPI_Testall(2, requests_.data(), &completed, statuses.data());
      if (code != MPI_SUCCESS) {
        // MPI reports MPI_ERR_IN_STATUS once both requests completed: a receive truncated (a
        // longer message than posted for) beside a send that succeeded is a size mismatch, and
        // the ring goes on as after a short receive ("Sizes"). Anything else ends it.
        if (!truncated(code, statuses, 0) || statuses[1].MPI_ERROR != MPI_SUCCESS) {
          // requests_[0] receives from the left neighbour, [1] sends to the right.
          const std::array<int, 2> peers = {world_rank_of(comm_, wrap(rank_ - 1)),
                                            world_rank_of(comm_, wrap(rank_ + 1))};
          throw RingFailure{mpi_requests_failure("MPI_Testall", code, statuses, peers) +
                            " (ring all_reduce)"};
        }
        for (MPI_Request& request : requests_) {
          if (request != MPI_REQUEST_NULL) {
            MPI_Request_free(&request);  // a failed request MPI left allocated
          }
        }
        note_received(kLongerMessage);
      } else if (completed == 0) {
        return false;
      } else {
        int arrived = 0;
        MPI_Get_count(&statuses[0], MPI_BYTE, &arrived);
        note_received(arrived);
      }
      finish_step();
      ++step_;
      if (step_ < total_steps_) {
        post_step();
      }
    }
    if (!size_message_.empty()) {
      mismatched_ = true;
      failure_ = size_message_;
    }
  } catch (const RingFailure& failure) {
    failure_ = failure.what;
  }
  return true;
}

}  // namespace chorus::mpi::detail
