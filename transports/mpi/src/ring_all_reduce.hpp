#pragma once

// chorus's own all_reduce schedule over MPI point-to-point messages (Note [Ring all_reduce]).

#include <mpi.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "chorus/dtype.hpp"
#include "chorus/reduce_op.hpp"

namespace chorus::mpi::detail {

// Note [Ring all_reduce]
// Open MPI's nonblocking all_reduce (coll/libnbc) runs at 0.6-0.8 of its blocking one
// (coll/tuned) between a few KiB and 2 MiB on shared memory (docs/performance.md), and chorus
// makes nonblocking calls only: a blocking call could not honour a wait's deadline. So for
// those sizes the transport runs its own schedule, the ring that tuned and NCCL use: a
// reduce-scatter, then an all-gather, n - 1 steps each, as MPI_Isend/MPI_Irecv pairs on the
// group's communicator. A step is posted when the previous one completed, from the transport's
// polls ("Progress" below). MpiSchedule chooses between this and MPI_Iallreduce.
//
// The buffer is cut into n chunks (the first count % n of them one element longer; chunks may
// be empty). Reduce-scatter step s: rank r sends chunk r - s to rank r + 1 (its own input at
// s = 0, then the partial result it computed the step before), receives chunk r - s - 1 from
// rank r - 1 into scratch memory, and stores partial (+) own input of that chunk in its output.
// After n - 1 steps rank r holds the finished chunk r + 1, computed there alone:
// chunk c = (((x_c (+) x_c+1) (+) x_c+2) ... (+) x_c+n-1), ranks taken mod n, one rounding per
// step (chorus::kernels with two sources). All-gather step t: send chunk r + 1 - t, receive chunk
// r - t into the output; every rank ends with the same bits.
//
// Ties: chunk c's fold starts at rank c, not at group rank 0. Sums and products do not care
// (a + b == b + a bitwise), nor do integer min/max; a floating min/max does: on ties (-0 and +0,
// NaN payloads) the kernels keep the left operand, so the ring would pick another rank's zero or
// NaN than the simulator's group-rank fold. Those run on MPI's collective instead, whose chorus
// user op is declared non-commutative (keeps_order).
//
// 16-bit float sums reach the ring widened to float32 (Note [Widened 16-bit reductions]).
//
// Sizes: every step's receive is posted for the chunk this rank's count gives. A peer whose
// count differs (a mismatched program, without --check-collectives) sends another size: a
// longer message is MPI's truncation error (in the receive's status), a shorter one shows in
// MPI_Get_count. Either way the ring still runs its remaining steps, so that its peers are not
// left waiting for messages it would not send, then fails the work with CollectiveMismatch
// naming the first sender of another size and both sizes (mismatched()). A rank whose own
// receives all had their sizes completes, with whatever the mismatched chunks held: undefined,
// as any mismatch is without --check-collectives.
//
// Buffers: the output is written only in chunks the schedule has finished with, so input and
// output may be the same buffer (in place). avg and premul_sum reach the ring as sums (the
// work divides afterwards or the input was scaled first, Note [MPI mapping]).
//
// Progress: Open MPI advances every nonblocking collective of the process from any MPI test
// call, so a rank waiting on one operation still plays its part in the others. A ring needs the
// same: otherwise two ranks waiting on two rings in opposite orders, or a rank blocked setting
// up a communicator while a peer waits on its ring, would wait for each other until the
// deadline. So the process keeps every ring in flight (MpiProcess::add_ring) and every poll of
// the transport advances them all (MpiProcess::progress_rings): a work's wait or
// is_completed, the collective check's exchanges and communicator set-up. The reductions run
// under the MPI lock, like MPI's own in MPI_Test.
//
// Messages: each ring on a communicator takes the next of kP2pTags tags (MpiComm::take_p2p_tag,
// shared with Note [Direct exchanges]), in issue order (the same on every rank, coalesced
// batches included), so operations in flight at the same time never match each other's
// messages; MPI keeps point-to-point traffic apart from collectives on the same communicator.
// Two operations share a tag only if kP2pTags others were issued while the first was pending.
inline constexpr int kP2pTags = 32767;  // the least MPI_TAG_UB the standard allows

class RingAllReduce {
 public:
  // `input` and `output` hold `count` elements of `dtype` (they may be the same buffer);
  // `step_op` is the reduction of one step (sum for avg and premul_sum). The caller keeps the
  // buffers alive until progress() returned true. Call every member with the MPI lock held.
  RingAllReduce(const void* input, void* output, std::size_t count, DType dtype,
                const ReduceOp& step_op, MPI_Comm comm, int group_rank, int group_size, int tag);
  ~RingAllReduce();
  RingAllReduce(const RingAllReduce&) = delete;
  RingAllReduce& operator=(const RingAllReduce&) = delete;

  // Posts the first step. An MPI failure is kept (failed(), failure()).
  void start();
  // Advances as far as completed messages allow; returns done(). An MPI failure is kept and
  // ends the ring (its requests are left as they are).
  bool progress();
  bool finished() const noexcept { return step_.load() == total_steps_; }
  bool failed() const noexcept { return !failure_.empty(); }
  bool done() const noexcept { return finished() || failed(); }
  // "MPI_Isend failed (ring all_reduce): ..." once failed().
  const std::string& failure() const noexcept { return failure_; }
  // Whether the failure is a message of another size than this rank posted for ("Sizes").
  bool mismatched() const noexcept { return mismatched_; }

  // Whether a ring can carry `count` elements of `dtype` over `group_size` ranks: one chunk's
  // bytes travel as an int count of MPI_BYTE.
  static bool fits(std::size_t count, DType dtype, int group_size);
  // Whether the ring's fold gives the group-rank-order result of `reduce_op` on `dtype`: all but
  // a floating min/max (Note [Ring all_reduce], "Ties").
  static bool keeps_order(DType dtype, const ReduceOp& reduce_op);
  // Chunk c's first element and element count (public for tests of the layout).
  static std::size_t chunk_offset(std::size_t count, int size, int chunk);
  static std::size_t chunk_count(std::size_t count, int size, int chunk);

 private:
  void post_step();
  void finish_step();
  // Notes what a completed step's receive got, `arrived` bytes or kLongerMessage, when it is
  // not what was posted for ("Sizes").
  void note_received(int arrived);
  int wrap(int chunk) const noexcept { return ((chunk % size_) + size_) % size_; }
  char* output_chunk(int chunk) const;
  const char* input_chunk(int chunk) const;
  int chunk_bytes(int chunk) const;

  const char* input_;
  char* output_;
  std::size_t count_;
  DType dtype_;
  std::size_t element_size_;
  ReduceOp step_op_;
  MPI_Comm comm_;
  int rank_;
  int size_;
  int tag_;
  // Advanced under the MPI lock; atomic because Started::in_flight() reads finished() without
  // it (a dropped work asks while another thread's poll progresses every ring).
  std::atomic<int> step_{0};
  int total_steps_;
  std::unique_ptr<char[]> scratch_;
  std::array<MPI_Request, 2> requests_{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int receive_bytes_ = 0;  // what the current step's receive was posted for
  void* receive_ = nullptr;
  std::string failure_;
  std::string size_message_;  // the first receive of another size's, reported once the ring ends
  bool mismatched_ = false;
};

}  // namespace chorus::mpi::detail
