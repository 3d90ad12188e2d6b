#pragma once

// The NCCL transport behind the transport seam (docs/nccl.md): NcclTransport is this process's
// rank on one CUDA device, NcclComm an NCCL communicator per group, NcclWork a CUDA event
// recorded on the communicator's stream after the operation.
//
// Note [NCCL work lifecycle]
// - Communicators are non-blocking (ncclConfig_t::blocking = 0): every NCCL call may return
//   ncclInProgress, and the transport polls ncclCommGetAsyncError until it leaves that state or
//   the deadline passes (then Timeout, and the communicator is aborted). Nothing waits inside
//   NCCL without a deadline.
// - An operation runs on the communicator's own stream, after the work already enqueued on the
//   caller's current stream (OpInfo::stream; Note [Current stream]: the legacy default stream
//   unless the rank set another; an event orders them), then an event is recorded: the Work.
//   is_completed() queries it; wait(deadline) polls it and ncclCommGetAsyncError until the
//   deadline; wait_on(stream) makes `stream` wait on it (no host block).
// - CPU buffers are staged: copied into pinned host memory (from the rank's pool, Note [Pinned
//   staging pool]) and device scratch before the
//   operation, copied back into pinned memory after it on the stream, and into the caller's
//   buffer by the Work when it completes. So core's CPU tensors run on NCCL too (core cannot
//   allocate CUDA storage yet); CUDA buffers are used in place.
// - Buffers (and staging memory) are kept alive until the Work completed or failed. A failure
//   after NCCL's kernels were enqueued (recording the event, enqueueing the copies back) aborts
//   the communicator and leaks them rather than free memory a kernel may still use; its error
//   names the operation. So the pinned blocks of the copies back are taken before the enqueue
//   (NcclComm::take_out_host): a cudaMallocHost that fails leaves the communicator usable.
// - A watchdog thread polls every outstanding Work: an asynchronous NCCL error, or an operation
//   older than the timeout, fails every outstanding Work of that communicator (TransportError
//   or Timeout) and aborts the communicator (ncclCommAbort); later operations on it throw
//   Aborted. ncclCommAbort stops the kernels, so their events complete while it runs: from the
//   moment abort() begins (CommState::aborting) a completed event no longer means a finished
//   operation, and a work not yet seen completed fails with the abort's error, never completes
//   with what an interrupted kernel left in its output.
// - On normal exit every communicator's ncclCommFinalize is started, then each is polled to
//   completion under the timeout and destroyed (a finalize completes only once the peers'
//   started too, and ranks may hold their communicators in different orders); an aborted one
//   is not touched again: the error queries of waits and the watchdog skip a communicator
//   ncclCommAbort freed.
// - Every NCCL call on a communicator, ncclCommGetAsyncError included, is made under its
//   CommState's mutex: NCCL documents its calls as not thread-safe (one thread at a time per
//   communicator) and exempts neither the error query nor ncclCommAbort
//   (CommState::async_error).

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "block_pool.hpp"
#include "chorus/error.hpp"
#include "chorus/nccl/nccl.hpp"
#include "chorus/store/store.hpp"
#include "chorus/transport/batch_abandon.hpp"
#include "chorus/transport/transport.hpp"
#include "mapping.hpp"

namespace chorus::nccl::detail {

ncclDataType_t nccl_type(Type type);
// "cudaErrorNoDevice (no CUDA-capable device is detected)".
std::string cuda_error_text(cudaError_t code);

// The CUDA stream of core's `void*` handle (Note [Current stream]): null is the legacy default
// stream.
inline cudaStream_t cuda_stream(void* stream) noexcept {
  return stream != nullptr ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
}
// "ncclSystemError (unhandled system error): <ncclGetLastError>".
std::string nccl_error_text(ncclResult_t code, ncclComm_t comm);

class NcclWork;
class Watchdog;

// One NCCL communicator and its stream, shared by the Comm and its Works.
class CommState {
 public:
  CommState(ncclComm_t comm, cudaStream_t stream, int device, std::string label,
            std::chrono::nanoseconds timeout);
  // Finalize then destroy, or nothing after an abort (Note [NCCL work lifecycle]).
  ~CommState();
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;

  // Fails every outstanding Work with `error` (NcclWork::fail: each naming its own op and
  // sequence number) and aborts the communicator. Idempotent.
  void abort(const std::exception_ptr& error);
  // Starts ncclCommFinalize now, so that the destructor only settles it: at the transport's end
  // every communicator's finalize is started before any is waited for (a finalize completes
  // only once the other ranks' finalize of it started too, and ranks may hold their
  // communicators in different orders). The destructor waits for it until `settle_by`, one
  // deadline shared by all the transport's communicators. Nothing after an abort; idempotent.
  void start_finalize(std::chrono::steady_clock::time_point settle_by);
  // Polls ncclCommGetAsyncError until it leaves ncclInProgress. Returns ncclSuccess or the
  // error; ncclInProgress when `deadline` passed first. Call with mutex() held.
  ncclResult_t settle(std::chrono::steady_clock::time_point deadline);
  // The asynchronous error state (ncclSuccess, ncclInProgress or an error); ncclSuccess once
  // aborted (abort() fails the works itself). Thread-safe and non-blocking: takes mutex() only
  // if it is free, and answers ncclInProgress ("no news") while another thread holds it.
  ncclResult_t async_error();

  std::mutex& mutex() noexcept { return mutex_; }
  ncclComm_t comm() const noexcept { return comm_; }
  cudaStream_t stream() const noexcept { return stream_; }
  int device() const noexcept { return device_; }
  const std::string& label() const noexcept { return label_; }
  bool aborted();  // takes mutex()
  bool aborted_locked() const noexcept { return aborted_; }
  // Whether abort() has begun. Set before ncclCommAbort, which makes the communicator's kernels
  // quit and their events complete while abort() still runs: a work whose event completes then
  // holds an aborted result, not a finished one (NcclWork::poll). Lock-free.
  bool aborting() const noexcept { return aborting_.load(); }
  // Remembers `work` for abort(); call with mutex() held.
  void track(const std::shared_ptr<NcclWork>& work);

 private:
  // Guards every NCCL call on comm_ (enqueues, error queries, split, abort, finalize) and the
  // fields below.
  std::mutex mutex_;
  bool finalize_started_ = false;
  ncclResult_t finalize_result_ = ncclSuccess;
  std::chrono::steady_clock::time_point settle_by_;  // start_finalize's deadline
  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  std::string label_;
  std::chrono::nanoseconds timeout_;
  bool aborted_ = false;
  std::atomic<bool> aborting_{false};
  std::vector<std::weak_ptr<NcclWork>> outstanding_;
};

// What one started operation (or coalesced batch) leaves to its Work.
struct Started {
  // Run once, in order, after the event completed (copy staged results into CPU buffers).
  std::vector<std::function<void()>> after;
  std::vector<std::shared_ptr<const void>> keep_alive;
  std::vector<transport::OpSignature> signatures;
};

class NcclWork final : public transport::Work, public std::enable_shared_from_this<NcclWork> {
 public:
  NcclWork(std::shared_ptr<CommState> comm, cudaEvent_t event, Started started,
           transport::Fingerprint fingerprint, ErrorContext context);
  ~NcclWork() override;

  bool is_completed() override;
  void wait(transport::Deadline deadline) override;
  void wait_on(void* stream) override;
  transport::WorkStatus status() const override;
  std::exception_ptr error() const override;
  const transport::Fingerprint& fingerprint() const override { return fingerprint_; }

  // Fails the work with `error` unless it finished already (abort, watchdog). A chorus::Error
  // that names another work (the one whose failure aborted the communicator) is re-made with
  // the same code and text and this work's context, so wait() names this work's op and seq.
  void fail(const std::exception_ptr& error);
  // Queries the event once and finishes the work when it completed. Returns the error that
  // must abort the communicator (an asynchronous NCCL error, or the op exceeded `timeout`), or
  // null. Called by waits and the watchdog.
  std::exception_ptr poll(std::chrono::nanoseconds timeout);
  const std::shared_ptr<CommState>& comm() const noexcept { return comm_; }

 private:
  std::shared_ptr<CommState> comm_;
  cudaEvent_t event_;
  Started started_;
  transport::Fingerprint fingerprint_;
  ErrorContext context_;
  std::chrono::steady_clock::time_point started_at_ = std::chrono::steady_clock::now();
  mutable std::mutex mutex_;  // guards everything below and serialises poll()
  transport::WorkStatus status_ = transport::WorkStatus::Pending;
  std::exception_ptr error_;
};

// The watchdog of one process (Note [NCCL work lifecycle]): a thread polling every registered
// pending Work every kPollInterval.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::nanoseconds timeout, int device);
  ~Watchdog();  // stops and joins the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void add(const std::shared_ptr<NcclWork>& work);
  // Watchdog aborts so far (tests, logs).
  std::size_t aborts() const noexcept;

 private:
  static constexpr std::chrono::milliseconds kPollInterval{10};
  void loop();

  std::chrono::nanoseconds timeout_;
  int device_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::size_t aborts_ = 0;
  std::vector<std::weak_ptr<NcclWork>> works_;
  std::thread thread_;
};

class NcclComm final : public transport::Comm {
 public:
  // `check_store`: the store for Note [NCCL collective check], null when the check is off.
  NcclComm(std::shared_ptr<CommState> state, std::shared_ptr<Watchdog> watchdog, std::string tag,
           std::vector<int> ranks, int group_rank, std::uint64_t id, int rank,
           std::chrono::nanoseconds timeout, std::shared_ptr<store::Store> check_store,
           std::shared_ptr<BlockPool> pinned);

  std::uint64_t id() const noexcept override { return id_; }
  const std::string& tag() const noexcept override { return tag_; }
  const std::vector<int>& ranks() const noexcept override { return ranks_; }
  int group_rank() const noexcept override { return group_rank_; }

  std::shared_ptr<transport::Work> all_reduce(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const ReduceOp& reduce_op,
                                              const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> all_gather(const transport::Buffer& send,
                                              const transport::Buffer& recv,
                                              const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> reduce_scatter(const transport::Buffer& send,
                                                  const transport::Buffer& recv,
                                                  const ReduceOp& reduce_op,
                                                  const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> all_to_all(const transport::Buffer& send,
                                              const std::vector<std::size_t>& send_counts,
                                              const transport::Buffer& recv,
                                              const std::vector<std::size_t>& recv_counts,
                                              const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> broadcast(const transport::Buffer& send,
                                             const transport::Buffer& recv, int root,
                                             const transport::OpInfo& info) override;
  std::shared_ptr<transport::Work> reduce(const transport::Buffer& send,
                                          const transport::Buffer& recv, const ReduceOp& reduce_op,
                                          int root, const transport::OpInfo& info) override;
  // Operations between begin_group and end_group are enqueued inside one
  // ncclGroupStart/ncclGroupEnd at end_group.
  void begin_group() override;
  std::shared_ptr<transport::Work> end_group(const transport::OpInfo& info) override;

  const std::shared_ptr<CommState>& state() const noexcept { return state_; }

 private:
  // One operation in three phases, so that a batch is one NCCL group and stream order stays
  // right: `before` stages CPU inputs in and creates premul_sum ops (outside the group), `call`
  // makes the NCCL calls (inside ncclGroupStart/ncclGroupEnd), `after` enqueues the copies back
  // of staged outputs (once the group settled: only then are NCCL's kernels on the stream).
  struct Pointers {
    void* in = nullptr;
    void* out = nullptr;
    ncclRedOp_t op = ncclSum;
    // The pinned block stage_out copies a CPU result into: taken in `before`, since a failure
    // after the enqueue aborts the communicator (take_out_host).
    std::shared_ptr<void> out_host;
  };
  struct Enqueue {
    std::function<void(Started&, std::vector<ncclRedOp_t>&)> before;
    std::function<ncclResult_t()> call;
    std::function<void(Started&)> after;
  };
  using BatchAbandon = transport::BatchAbandon<NcclComm>;
  friend BatchAbandon;
  // Drops the open batch, if any (an operation method threw inside it).
  void abandon_batch() noexcept;

  // Starts one operation now, or defers it into the open batch. `splits`: all_to_all's split
  // sizes, for the check (Note [NCCL collective check]).
  std::shared_ptr<transport::Work> launch(const transport::OpSignature& signature,
                                          const transport::OpInfo& info, Enqueue enqueue,
                                          std::optional<SplitSizes> splits = std::nullopt);
  std::shared_ptr<transport::Work> start(std::vector<Enqueue> enqueues,
                                         std::vector<transport::OpSignature> signatures,
                                         const std::vector<SplitSizes>& splits,
                                         const transport::OpInfo& info);
  ErrorContext context_of(const transport::OpInfo& info) const;
  // The device pointer for `buffer`: the buffer itself on CUDA, else device scratch, filled
  // from the buffer when `copy_in` (staging, Note [NCCL work lifecycle]).
  void* stage_in(const transport::Buffer& buffer, bool copy_in, Started& started);
  // After the operation: copies `device_data` back into a CPU `buffer` (nothing for CUDA).
  // The pinned block stage_out needs for `buffer` (null for a CUDA or empty buffer). Called in
  // `before`: a cudaMallocHost that fails there leaves the communicator usable.
  std::shared_ptr<void> take_out_host(const transport::Buffer& buffer);
  // Copies `device_data` back into `host` (from take_out_host) on the stream, and into `buffer`
  // when the Work completes.
  void stage_out(const transport::Buffer& buffer, void* device_data, std::shared_ptr<void> host,
                 Started& started);
  // The NCCL op for `plan` (premul_sum: a new op, destroyed after the enqueue).
  ncclRedOp_t reduction(const Plan& plan, const ReduceOp& reduce_op,
                        std::vector<ncclRedOp_t>& created);
  Plan plan_or_throw(DType dtype, const ReduceOp& reduce_op, const transport::OpInfo& info) const;
  void check_device(const transport::Buffer& buffer, const transport::OpInfo& info) const;
  // InvalidArgument when the operation's stream (OpInfo::stream, Note [Current stream]) is
  // capturing a CUDA graph: see the definition. Selects the communicator's device.
  void refuse_if_capturing(const transport::OpInfo& info) const;

  std::shared_ptr<CommState> state_;
  std::shared_ptr<Watchdog> watchdog_;
  std::string tag_;
  std::vector<int> ranks_;
  int group_rank_;
  std::uint64_t id_;
  int rank_;
  std::chrono::nanoseconds timeout_;
  std::shared_ptr<store::Store> check_store_;  // Note [NCCL collective check]; null: off
  std::int64_t check_rounds_ = 0;  // check rounds this member entered (check_collective's round)
  std::shared_ptr<BlockPool> pinned_;  // staging blocks, Note [Pinned staging pool]
  bool batching_ = false;
  std::vector<Enqueue> batch_;
  std::vector<transport::OpSignature> batch_signatures_;
  std::vector<SplitSizes> batch_splits_;
};

class NcclTransport final : public transport::Transport {
 public:
  // `store` is shared by every rank of the job (rank 0's server); `device` this rank's CUDA
  // device. `timeout` bounds communicator set-up, enqueues and (watchdog) every operation.
  // `split_partitions`: NcclRunOptions::split_partitions.
  NcclTransport(Environment environment, std::shared_ptr<store::Store> store, int device,
                std::chrono::nanoseconds timeout, bool split_partitions = false,
                bool check_collectives = false);
  ~NcclTransport() override;

  std::string_view name() const noexcept override { return "nccl"; }
  int rank() const noexcept override { return environment_.rank; }
  int world_size() const noexcept override { return environment_.world_size; }
  Device device() const noexcept override { return Device::cuda(device_); }
  std::shared_ptr<transport::Comm> create_comm(const std::string& tag,
                                               const std::vector<int>& ranks) override;
  // ncclCommSplit of the world communicator (Note [NCCL communicator set-up]).
  std::shared_ptr<transport::Comm> create_partition_comm(
      const std::string& tag, const transport::Partition& partition,
      const std::shared_ptr<transport::Comm>& existing) override;
  transport::Duration now() override;
  std::string supports(transport::OpKind kind, DType dtype, const ReduceOp& reduce_op,
                       Device device) const override;

  // Aborts every communicator (a failed rank: peers get an error instead of hanging).
  void abort_all(const std::exception_ptr& error);

 private:
  // Wraps a communicator whose set-up finished (or is being polled by `settle_new`): the
  // stream, the CommState and the NcclComm, cached under `key`. Aborts `comm` on failure.
  // `result` is what the set-up call returned.
  std::shared_ptr<NcclComm> adopt(ncclComm_t comm, ncclResult_t result, const std::string& key,
                                  const std::string& tag, const std::vector<int>& ranks,
                                  int group_rank, const ErrorContext& context,
                                  std::chrono::steady_clock::time_point deadline,
                                  const char* set_up_call, const std::string& hint);

  Environment environment_;
  std::shared_ptr<store::Store> store_;
  int device_;
  std::chrono::nanoseconds timeout_;
  bool split_partitions_;    // NcclRunOptions::split_partitions
  bool check_collectives_;   // NcclRunOptions::check_collectives
  std::int64_t splits_ = 0;  // rounds of Note [Split agreement] so far
  std::shared_ptr<Watchdog> watchdog_;
  std::shared_ptr<BlockPool> pinned_;  // shared by the rank's communicators
  std::map<std::string, std::shared_ptr<NcclComm>> comms_;
  std::vector<std::shared_ptr<CommState>> states_;
  // A unique-id exchange that failed, per comm key: its error's type and detail, thrown again
  // (naming it) on every later create_comm of the group (Note [NCCL communicator set-up],
  // "Retries").
  struct FailedSetUp {
    ErrorCode code;
    std::string detail;
  };
  std::map<std::string, FailedSetUp> failed_set_ups_;
};

// Rank 0's store server (when it hosts it) and this rank's connection (Note [NCCL store] in
// nccl_run.cpp).
struct StoreConnection {
  std::unique_ptr<store::Server> server;
  std::shared_ptr<store::Client> client;
};

// Rank 0 hosts the store at MASTER_ADDR:MASTER_PORT, or connects to the one listening there
// already (the address is in use: a launcher's); every other rank connects, retrying until
// `timeout`. Throws TransportError on rank 0 when it can neither host the store nor find the
// address in use (MASTER_ADDR is not this host's, say), and the Client's errors (Timeout when
// no store answers in time). Blocks.
StoreConnection connect_store(const Environment& environment, std::chrono::nanoseconds timeout);

}  // namespace chorus::nccl::detail
