#include "nccl_transport.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/transport/fnv1a.hpp"
#include "chorus/transport/group_label.hpp"
#include "device_scope.hpp"

namespace chorus::nccl::detail {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(std::chrono::nanoseconds timeout) {
  const Clock::time_point now = Clock::now();
  if (timeout >=
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::time_point::max() - now)) {
    return Clock::time_point::max();
  }
  return now + std::chrono::duration_cast<Clock::duration>(timeout);
}

std::string milliseconds_text(std::chrono::nanoseconds duration) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(duration).count()) +
         " ms";
}

// Polls (yielding) instead of blocking in CUDA or NCCL, so every wait has a deadline.
void pause_briefly() { std::this_thread::sleep_for(std::chrono::microseconds(50)); }

// Never frees `keep_alive`'s memory: what a kernel, or a copy queued on an aborted stream, may
// still use is leaked rather than freed (or handed out again by the staging pool) under it.
void leak(std::vector<std::shared_ptr<const void>>& keep_alive) {
  for (auto& keep : keep_alive) {
    new std::shared_ptr<const void>(std::move(keep));  // NOLINT: deliberate leak, see above
  }
  keep_alive.clear();
}

// Pinned host memory for the staging pool (Note [Pinned staging pool]).
void* allocate_pinned(std::size_t bytes) {
  void* data = nullptr;
  const cudaError_t code = cudaMallocHost(&data, std::max<std::size_t>(bytes, 1));
  if (code != cudaSuccess) {
    throw TransportError(ErrorContext{}, "nccl: cudaMallocHost(" + std::to_string(bytes) +
                                             ") failed: " + cuda_error_text(code));
  }
  return data;
}

// Freed pinned blocks a rank keeps for staging (Note [Pinned staging pool]).
constexpr std::size_t kPinnedKeepBytes = std::size_t{64} << 20;

// FNV-1a of the group's key: the same id on every member (fingerprints compare it).
std::uint64_t comm_id_of(const std::string& key) {
  transport::Fnv1a hash;
  for (const char byte : key) {
    hash.byte(static_cast<unsigned char>(byte));
  }
  return hash.value();
}

// The cache key of a group, and (under "chorus/nccl/comm/") its store prefix: "tag/0,1,".
std::string comm_key(const std::string& tag, const std::vector<int>& ranks) {
  std::string key = tag + "/";
  for (const int rank : ranks) {
    key += std::to_string(rank) + ",";
  }
  return key;
}

static_assert(kNoColor == NCCL_SPLIT_NOCOLOR);

// `cause` as the error of the work at `context`: the same code and text, naming that work's op
// and sequence number. An abort fails every outstanding work of a communicator with the error of
// the one that tripped it; rethrown unchanged, waiting on another work would name the first.
// A cause that is no chorus::Error (a rank's own exception) is kept as it is.
std::exception_ptr error_of_work(const std::exception_ptr& cause, const ErrorContext& context) {
  try {
    std::rethrow_exception(cause);
  } catch (const Error& error) {
    const ErrorContext& named = error.context();
    if (named.rank == context.rank && named.op == context.op && named.seq == context.seq &&
        named.group == context.group) {
      return cause;
    }
    return make_error(error.code(), context, error.detail());
  } catch (...) {
    return cause;
  }
}

}  // namespace

ncclDataType_t nccl_type(Type type) {
  switch (type) {
    case Type::Int8:
      return ncclInt8;
    case Type::Uint8:
      return ncclUint8;
    case Type::Int32:
      return ncclInt32;
    case Type::Uint32:
      return ncclUint32;
    case Type::Int64:
      return ncclInt64;
    case Type::Uint64:
      return ncclUint64;
    case Type::Float16:
      return ncclFloat16;
    case Type::Float32:
      return ncclFloat32;
    case Type::Float64:
      return ncclFloat64;
    case Type::Bfloat16:
      return ncclBfloat16;
  }
  CHORUS_CHECK(false);
  return ncclUint8;
}

std::string cuda_error_text(cudaError_t code) {
  return std::string(cudaGetErrorName(code)) + " (" + cudaGetErrorString(code) + ")";
}

std::string nccl_error_text(ncclResult_t code, ncclComm_t comm) {
  std::string text = ncclGetErrorString(code);
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0') {
    text += ": ";
    text += last;
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// CommState

CommState::CommState(ncclComm_t comm, cudaStream_t stream, int device, std::string label,
                     std::chrono::nanoseconds timeout)
    : comm_(comm), stream_(stream), device_(device), label_(std::move(label)), timeout_(timeout) {}

CommState::~CommState() {
  const std::lock_guard lock(mutex_);
  // The last holder may drop it on any thread (Note [Device scopes]).
  const DeviceScope scope(device_);
  if (!aborted_) {
    // Note [NCCL work lifecycle]: finalize (flushes outstanding operations), then destroy.
    ncclResult_t result = finalize_started_ ? finalize_result_ : ncclCommFinalize(comm_);
    if (result == ncclSuccess || result == ncclInProgress) {
      // One deadline for every communicator the transport finalized together (start_finalize):
      // with a peer that never finalizes, K communicators would otherwise take K timeouts.
      result = settle(finalize_started_ ? settle_by_ : deadline_after(timeout_));
    }
    if (result == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  cudaStreamDestroy(stream_);
}

ncclResult_t CommState::settle(Clock::time_point deadline) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) {
      return result;
    }
    if (state != ncclInProgress || Clock::now() >= deadline) {
      return state;
    }
    pause_briefly();
  }
}

void CommState::start_finalize(Clock::time_point settle_by) {
  const std::lock_guard lock(mutex_);
  if (aborted_ || finalize_started_) {
    return;
  }
  const DeviceScope scope(device_);
  finalize_result_ = ncclCommFinalize(comm_);
  finalize_started_ = true;
  settle_by_ = settle_by;
}

ncclResult_t CommState::async_error() {
  // Every ncclCommGetAsyncError on this communicator runs under mutex_, like every other NCCL
  // call on it. What is documented: NCCL calls are not thread-safe, only reentrant, and a
  // communicator may be used from several threads only one thread at a time (NCCL user guide,
  // "Thread Safety"); the error query is not exempted, and on a non-blocking communicator it is
  // part of the protocol (a call that returned ncclInProgress is polled with it until it leaves
  // that state before the next NCCL call). So a wait and the watchdog must not query at once, nor
  // query while an enqueue, split, finalize or abort runs. What the query does inside NCCL is not
  // documented and not relied on here. A holder of mutex_ is polling itself (settle, in an
  // enqueue, split or finalize) or aborting: no news from here meanwhile.
  const std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    return ncclInProgress;
  }
  if (aborted_) {
    return ncclSuccess;  // abort() failed the works itself; the communicator is freed
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
  return result != ncclSuccess ? result : state;
}

bool CommState::aborted() {
  const std::lock_guard lock(mutex_);
  return aborted_;
}

void CommState::track(const std::shared_ptr<NcclWork>& work) {
  std::erase_if(outstanding_, [](const std::weak_ptr<NcclWork>& entry) { return entry.expired(); });
  outstanding_.push_back(work);
}

void CommState::abort(const std::exception_ptr& error) {
  std::vector<std::shared_ptr<NcclWork>> works;
  {
    const std::lock_guard lock(mutex_);
    if (aborted_) {
      return;
    }
    aborted_ = true;
    aborting_.store(true);             // before the kernels quit: see aborting() and NcclWork::poll
    const DeviceScope scope(device_);  // a wait may abort on any thread (Note [Device scopes])
    ncclCommAbort(comm_);
    for (const std::weak_ptr<NcclWork>& entry : outstanding_) {
      if (std::shared_ptr<NcclWork> work = entry.lock()) {
        works.push_back(std::move(work));
      }
    }
    outstanding_.clear();
  }
  for (const std::shared_ptr<NcclWork>& work : works) {
    work->fail(error);  // outside the comm lock: poll() takes the work lock, then this one
  }
}

// ---------------------------------------------------------------------------------------------
// NcclWork

NcclWork::NcclWork(std::shared_ptr<CommState> comm, cudaEvent_t event, Started started,
                   transport::Fingerprint fingerprint, ErrorContext context)
    : comm_(std::move(comm)),
      event_(event),
      started_(std::move(started)),
      fingerprint_(std::move(fingerprint)),
      context_(std::move(context)) {}

NcclWork::~NcclWork() {
  // A work destroyed while pending (after a Timeout) leaves its memory to the stream: the event
  // is destroyed lazily by CUDA once it completes; staging memory is leaked rather than freed
  // under a running kernel.
  if (status_ == transport::WorkStatus::Pending) {
    leak(started_.keep_alive);
  }
  cudaEventDestroy(event_);
}

std::exception_ptr NcclWork::poll(std::chrono::nanoseconds timeout) {
  // Released after the lock (declared first, destroyed last): the last reference to a staging
  // block gives it back to its pool, and nothing that may block should run under the work's
  // lock, which status() takes for the watchdog.
  std::vector<std::shared_ptr<const void>> released;
  const std::lock_guard lock(mutex_);
  if (status_ != transport::WorkStatus::Pending) {
    return nullptr;
  }
  const cudaError_t query = cudaEventQuery(event_);
  if (query == cudaSuccess && comm_->aborting()) {
    // The event may have completed because ncclCommAbort stopped the kernels: the output holds
    // whatever they wrote. abort() fails this work with its error once ncclCommAbort returns.
    return nullptr;
  }
  if (query == cudaSuccess) {
    try {
      for (const std::function<void()>& step : started_.after) {
        step();
      }
      status_ = transport::WorkStatus::Completed;
    } catch (...) {
      status_ = transport::WorkStatus::Failed;
      error_ = std::current_exception();
    }
    started_.after.clear();
    released.swap(started_.keep_alive);
    return nullptr;
  }
  if (query != cudaErrorNotReady) {
    return make_error(ErrorCode::TransportError, context_,
                      "nccl: cudaEventQuery failed: " + cuda_error_text(query));
  }
  if (const ncclResult_t state = comm_->async_error();
      state != ncclSuccess && state != ncclInProgress) {
    return make_error(ErrorCode::TransportError, context_,
                      "nccl: asynchronous error on communicator " + comm_->label() + ": " +
                          nccl_error_text(state, comm_->comm()) + "; communicator aborted");
  }
  if (Clock::now() - started_at_ > timeout) {
    return make_error(ErrorCode::Timeout, context_,
                      "nccl: the operation did not complete within " + milliseconds_text(timeout) +
                          " (watchdog); communicator " + comm_->label() + " aborted");
  }
  return nullptr;
}

void NcclWork::fail(const std::exception_ptr& error) {
  const std::lock_guard lock(mutex_);
  if (status_ != transport::WorkStatus::Pending) {
    return;
  }
  status_ = transport::WorkStatus::Failed;
  error_ = error_of_work(error, context_);
  started_.after.clear();
  // The communicator was aborted: its kernels stop, but copies queued behind them on its stream
  // may still run and write staging blocks, which the pool would hand out again. Leaked, as
  // ~NcclWork does for a work dropped pending.
  leak(started_.keep_alive);
}

bool NcclWork::is_completed() {
  if (std::exception_ptr fatal = poll(std::chrono::nanoseconds::max())) {
    comm_->abort(fatal);
  }
  return status() != transport::WorkStatus::Pending;
}

void NcclWork::wait(transport::Deadline deadline) {
  while (true) {
    if (std::exception_ptr fatal = poll(std::chrono::nanoseconds::max())) {
      comm_->abort(fatal);
    }
    {
      const std::lock_guard lock(mutex_);
      if (status_ == transport::WorkStatus::Completed) {
        return;
      }
      if (status_ == transport::WorkStatus::Failed) {
        std::rethrow_exception(error_);
      }
    }
    // The deadline is on the transport's clock: steady_clock time (NcclTransport::now()).
    if (!deadline.is_never() && std::chrono::duration_cast<transport::Duration>(
                                    Clock::now().time_since_epoch()) >= deadline.at) {
      throw Timeout(context_, "nccl: wait passed its deadline; the operation is still pending");
    }
    pause_briefly();
  }
}

void NcclWork::wait_on(void* stream) {
  {
    const std::lock_guard lock(mutex_);
    if (status_ == transport::WorkStatus::Failed) {
      std::rethrow_exception(error_);  // known failed (watchdog, abort): no stream wait hides it
    }
  }
  // Core may call this on any thread (a result dropped there): the communicator's device for the
  // call (Note [Device scopes]).
  cudaError_t code = cudaSuccess;
  {
    const DeviceScope scope(comm_->device());
    code = cudaStreamWaitEvent(cuda_stream(stream), event_, 0);
  }
  if (code != cudaSuccess) {
    throw TransportError(context_, "nccl: cudaStreamWaitEvent failed: " + cuda_error_text(code));
  }
}

transport::WorkStatus NcclWork::status() const {
  const std::lock_guard lock(mutex_);
  return status_;
}

std::exception_ptr NcclWork::error() const {
  const std::lock_guard lock(mutex_);
  return error_;
}

// ---------------------------------------------------------------------------------------------
// Watchdog

Watchdog::Watchdog(std::chrono::nanoseconds timeout, int device)
    : timeout_(timeout), device_(device), thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::add(const std::shared_ptr<NcclWork>& work) {
  const std::lock_guard lock(mutex_);
  works_.push_back(work);
}

std::size_t Watchdog::aborts() const noexcept {
  const std::lock_guard lock(mutex_);
  return aborts_;
}

void Watchdog::loop() {
  cudaSetDevice(device_);
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kPollInterval);
    std::vector<std::shared_ptr<NcclWork>> pending;
    // Finished works this loop may hold the last reference to: released after unlocking, since
    // the last one of a communicator finalizes it (waiting up to the timeout; add() is not
    // blocked meanwhile, but no other communicator is watched).
    std::vector<std::shared_ptr<NcclWork>> finished;
    std::erase_if(works_, [&](const std::weak_ptr<NcclWork>& entry) {
      std::shared_ptr<NcclWork> work = entry.lock();
      if (!work) {
        return true;
      }
      if (work->status() != transport::WorkStatus::Pending) {
        finished.push_back(std::move(work));
        return true;
      }
      pending.push_back(std::move(work));
      return false;
    });
    lock.unlock();
    finished.clear();
    for (const std::shared_ptr<NcclWork>& work : pending) {
      if (std::exception_ptr fatal = work->poll(timeout_)) {
        work->comm()->abort(fatal);
        const std::lock_guard count_lock(mutex_);
        ++aborts_;
      }
    }
    pending.clear();
    lock.lock();
  }
}

// ---------------------------------------------------------------------------------------------
// NcclComm

NcclComm::NcclComm(std::shared_ptr<CommState> state, std::shared_ptr<Watchdog> watchdog,
                   std::string tag, std::vector<int> ranks, int group_rank, std::uint64_t id,
                   int rank, std::chrono::nanoseconds timeout,
                   std::shared_ptr<store::Store> check_store, std::shared_ptr<BlockPool> pinned)
    : state_(std::move(state)),
      watchdog_(std::move(watchdog)),
      tag_(std::move(tag)),
      ranks_(std::move(ranks)),
      group_rank_(group_rank),
      id_(id),
      rank_(rank),
      timeout_(timeout),
      check_store_(std::move(check_store)),
      pinned_(std::move(pinned)) {
  CHORUS_CHECK_GE(group_rank_, 0);
  CHORUS_CHECK_LT(group_rank_, size());
}

ErrorContext NcclComm::context_of(const transport::OpInfo& info) const {
  return ErrorContext{rank_, std::string(info.name), info.seq,
                      transport::group_label(tag_, ranks_)};
}

void NcclComm::check_device(const transport::Buffer& buffer, const transport::OpInfo& info) const {
  if (buffer.device.is_meta() ||
      (buffer.device.is_cuda() && buffer.device.index() != state_->device())) {
    throw InvalidArgument(context_of(info),
                          "nccl: buffer on " + buffer.device.to_string() +
                              ", expected cpu or cuda:" + std::to_string(state_->device()));
  }
}

// An operation cannot be captured into a CUDA graph here: it stages CPU buffers through host
// memory, takes and frees pinned blocks (cudaMallocHost/cudaFreeHost, illegal during a global
// capture, which they invalidate), polls NCCL from the host until its enqueue settled, and
// records an event for the Work that a graph replay would not record again. Let through, it
// fails later and obscurely (an invalidated capture, cudaErrorStreamCaptureUnsupported from an
// unrelated call, a Work that never completes). So it is refused before anything is done: before
// the pinned pool frees, the collective check and the communicator's lock, so the communicator
// stays usable. cudaStreamIsCapturing on the legacy default stream answers
// cudaErrorStreamCaptureImplicit while a blocking stream captures: refused too. Only the
// operation's own stream is asked: a capture on another stream (even in the global mode, which
// forbids the cudaFreeHost and cudaMallocHost here) is not detected, and such an operation fails
// later with whatever CUDA error those calls return.
void NcclComm::refuse_if_capturing(const transport::OpInfo& info) const {
  cudaSetDevice(state_->device());
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t code = cudaStreamIsCapturing(cuda_stream(info.stream), &status);
  if (code == cudaSuccess && status == cudaStreamCaptureStatusNone) {
    return;
  }
  const std::string advice =
      "; the NCCL backend cannot run a collective inside a graph capture: issue it before "
      "cudaStreamBeginCapture or after cudaStreamEndCapture";
  if (code == cudaSuccess) {
    throw InvalidArgument(
        context_of(info),
        std::string("nccl: ") +
            (info.stream == nullptr ? "the legacy default stream" : "the rank's current stream") +
            ", which the operation is ordered after, is capturing a CUDA graph" + advice);
  }
  if (code == cudaErrorStreamCaptureImplicit) {
    // Raised by this call: not a sticky error, cleared so that later checks do not see it.
    // (Other codes are left alone: cudaStreamIsCapturing may return the error of an earlier
    // asynchronous launch, which is not this check's to clear.)
    cudaGetLastError();
    throw InvalidArgument(context_of(info),
                          "nccl: the operation is ordered after the legacy default stream, which "
                          "cannot be used while another stream captures a CUDA graph" +
                              advice);
  }
  throw TransportError(context_of(info),
                       "nccl: cudaStreamIsCapturing, asked whether the stream is capturing a CUDA "
                       "graph, returned an error (a CUDA error was pending, from an earlier "
                       "launch?): " +
                           cuda_error_text(code));
}

Plan NcclComm::plan_or_throw(DType dtype, const ReduceOp& reduce_op,
                             const transport::OpInfo& info) const {
  std::string problem;
  std::optional<Plan> plan = plan_reduction(dtype, reduce_op, problem);
  if (!plan) {
    throw InvalidArgument(context_of(info), problem);
  }
  return *plan;
}

void* NcclComm::stage_in(const transport::Buffer& buffer, bool copy_in, Started& started) {
  started.keep_alive.push_back(buffer.keep_alive);
  if (buffer.device.is_cuda()) {
    return buffer.data;
  }
  const std::size_t bytes = std::max<std::size_t>(buffer.nbytes(), 1);
  void* device_data = nullptr;
  cudaError_t code = cudaMallocAsync(&device_data, bytes, state_->stream());
  if (code != cudaSuccess) {
    throw TransportError(ErrorContext{}, "nccl: cudaMallocAsync(" + std::to_string(bytes) +
                                             ") failed: " + cuda_error_text(code));
  }
  // Freed (in stream order) when the Work releases its keep_alive, after the operation and the
  // copy back completed.
  started.keep_alive.push_back(
      std::shared_ptr<const void>(device_data, [stream = state_->stream()](const void* pointer) {
        cudaFreeAsync(const_cast<void*>(pointer), stream);
      }));
  if (copy_in && buffer.nbytes() > 0) {
    std::shared_ptr<void> host = pinned_->take(buffer.nbytes());
    std::memcpy(host.get(), buffer.data, buffer.nbytes());
    code = cudaMemcpyAsync(device_data, host.get(), buffer.nbytes(), cudaMemcpyHostToDevice,
                           state_->stream());
    if (code != cudaSuccess) {
      throw TransportError(ErrorContext{},
                           "nccl: cudaMemcpyAsync failed: " + cuda_error_text(code));
    }
    started.keep_alive.push_back(std::move(host));
  }
  return device_data;
}

std::shared_ptr<void> NcclComm::take_out_host(const transport::Buffer& buffer) {
  if (buffer.device.is_cuda() || buffer.nbytes() == 0) {
    return nullptr;
  }
  return pinned_->take(buffer.nbytes());
}

void NcclComm::stage_out(const transport::Buffer& buffer, void* device_data,
                         std::shared_ptr<void> host, Started& started) {
  if (buffer.device.is_cuda() || buffer.nbytes() == 0) {
    CHORUS_CHECK(host == nullptr);
    return;
  }
  CHORUS_CHECK(host != nullptr);  // taken before the enqueue (take_out_host)
  const cudaError_t code = cudaMemcpyAsync(host.get(), device_data, buffer.nbytes(),
                                           cudaMemcpyDeviceToHost, state_->stream());
  if (code != cudaSuccess) {
    throw TransportError(ErrorContext{}, "nccl: cudaMemcpyAsync failed: " + cuda_error_text(code));
  }
  started.after.emplace_back([data = buffer.data, host, bytes = buffer.nbytes()] {
    std::memcpy(data, host.get(), bytes);
  });
  started.keep_alive.push_back(std::move(host));
}

ncclRedOp_t NcclComm::reduction(const Plan& plan, const ReduceOp& reduce_op,
                                std::vector<ncclRedOp_t>& created) {
  switch (plan.op) {
    case Op::Sum:
      return ncclSum;
    case Op::Prod:
      return ncclProd;
    case Op::Max:
      return ncclMax;
    case Op::Min:
      return ncclMin;
    case Op::Avg:
      return ncclAvg;
    case Op::PremulSum:
      break;
  }
  std::string scalar = premul_scalar(plan.type, reduce_op.premul_factor());
  ncclRedOp_t op{};
  const ncclResult_t result = ncclRedOpCreatePreMulSum(&op, scalar.data(), nccl_type(plan.type),
                                                       ncclScalarHostImmediate, state_->comm());
  if (result != ncclSuccess) {
    throw TransportError(ErrorContext{}, "nccl: ncclRedOpCreatePreMulSum failed: " +
                                             nccl_error_text(result, state_->comm()));
  }
  created.push_back(op);
  return op;
}

void NcclComm::abandon_batch() noexcept {
  // core will not call end_group: nothing of the batch was enqueued yet.
  batching_ = false;
  batch_.clear();
  batch_signatures_.clear();
  batch_splits_.clear();
}

std::shared_ptr<transport::Work> NcclComm::launch(const transport::OpSignature& signature,
                                                  const transport::OpInfo& info, Enqueue enqueue,
                                                  std::optional<SplitSizes> splits) {
  if (batching_) {
    refuse_if_capturing(info);  // here, not at end_group: the op that was issued is named
    batch_.push_back(std::move(enqueue));
    batch_signatures_.push_back(signature);
    if (splits) {
      batch_splits_.push_back(std::move(*splits));
    }
    return nullptr;
  }
  std::vector<Enqueue> enqueues;
  enqueues.push_back(std::move(enqueue));
  std::vector<SplitSizes> all_splits;
  if (splits) {
    all_splits.push_back(std::move(*splits));
  }
  return start(std::move(enqueues), {signature}, all_splits, info);
}

std::shared_ptr<transport::Work> NcclComm::start(std::vector<Enqueue> enqueues,
                                                 std::vector<transport::OpSignature> signatures,
                                                 const std::vector<SplitSizes>& splits,
                                                 const transport::OpInfo& info) {
  const ErrorContext context = context_of(info);
  refuse_if_capturing(info);  // selects the device; before cudaFreeHost below (own stream only)
  // Staging blocks the pool did not keep are freed here, before the communicator's lock (Note
  // [Pinned staging pool]): cudaFreeHost waits for running kernels, and the watchdog needs that
  // lock to abort a hung one.
  pinned_->free_unkept();
  if (check_store_ != nullptr) {
    // Before anything reaches NCCL: a mismatch leaves the communicator usable.
    // A round is counted when entered, whatever its outcome (Note [NCCL collective check]).
    const std::int64_t round = check_rounds_++;
    check_collective(*check_store_, comm_key(tag_, ranks_), ranks_, group_rank_, info.seq, round,
                     check_description(info.name, signatures), splits, context,
                     store::Deadline(deadline_after(timeout_)));
  }
  std::unique_lock lock(state_->mutex());
  if (state_->aborted_locked()) {
    throw Aborted(
        context, "nccl: communicator " + state_->label() + " was aborted after an earlier failure");
  }
  cudaSetDevice(state_->device());
  auto check_cuda = [&context](cudaError_t code, const char* call) {
    if (code != cudaSuccess) {
      throw TransportError(context,
                           std::string("nccl: ") + call + " failed: " + cuda_error_text(code));
    }
  };
  // Order the operation after the caller's work on its current stream (Note [Current stream]).
  cudaEvent_t ready = nullptr;
  check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  {
    // Destroyed on every path (CUDA releases it once the wait on it is done).
    const std::unique_ptr<CUevent_st, decltype(&cudaEventDestroy)> owner(ready, &cudaEventDestroy);
    check_cuda(cudaEventRecord(ready, cuda_stream(info.stream)), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(state_->stream(), ready, 0), "cudaStreamWaitEvent");
  }

  Started started;
  started.signatures = std::move(signatures);
  std::vector<ncclRedOp_t> created;
  auto destroy_created = [&] {
    for (ncclRedOp_t op : created) {
      ncclRedOpDestroy(op, state_->comm());  // allowed once the last call using it returned
    }
    created.clear();
  };
  try {
    for (const Enqueue& enqueue : enqueues) {
      enqueue.before(started, created);
    }
  } catch (const TransportError& error) {
    destroy_created();
    if (!error.context().op.empty()) {
      throw;
    }
    // Staging and premul_sum set-up (cudaMallocHost, cudaMallocAsync, cudaMemcpyAsync,
    // ncclRedOpCreatePreMulSum) know no operation: name this one.
    throw TransportError(context, error.detail());
  } catch (...) {
    destroy_created();
    throw;
  }
  ncclResult_t result = ncclGroupStart();
  for (std::size_t i = 0;
       i < enqueues.size() && (result == ncclSuccess || result == ncclInProgress); ++i) {
    result = enqueues[i].call();
  }
  if (const ncclResult_t end = ncclGroupEnd(); result == ncclSuccess || result == ncclInProgress) {
    result = end;
  }
  const auto deadline = deadline_after(timeout_);
  if (result == ncclInProgress || result == ncclSuccess) {
    result = state_->settle(deadline);
  }
  if (result == ncclInProgress) {
    created.clear();  // NCCL's group may still use them: the abort below frees them
  } else {
    destroy_created();
  }
  if (result != ncclSuccess) {
    const bool timed_out = result == ncclInProgress;
    std::exception_ptr error =
        timed_out ? make_error(ErrorCode::Timeout, context,
                               "nccl: enqueueing did not finish within " +
                                   milliseconds_text(timeout_) + "; communicator aborted")
                  : make_error(ErrorCode::TransportError, context,
                               "nccl: " + nccl_error_text(result, state_->comm()) +
                                   "; communicator aborted");
    lock.unlock();  // abort() takes the comm lock
    state_->abort(error);
    std::rethrow_exception(error);
  }
  // NCCL's kernels are enqueued now: from here a failure must not free what they use. It
  // aborts the communicator (its kernels stop) and leaks the buffers, as ~NcclWork does. So
  // nothing here takes pinned or device memory, which can run out: the pinned blocks of the
  // copies back were taken in `before` (take_out_host); what is left are stream calls, the event
  // and small host allocations (the Work, its lists), whose failure aborts like any other below.
  cudaEvent_t event = nullptr;
  std::shared_ptr<NcclWork> work;
  try {
    for (const Enqueue& enqueue : enqueues) {
      enqueue.after(started);  // copies back, behind NCCL's kernels on the stream
    }
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(event, state_->stream()), "cudaEventRecord");
    transport::Fingerprint fingerprint{id_, info.seq, started.signatures};
    work = std::make_shared<NcclWork>(state_, event, std::move(started), std::move(fingerprint),
                                      context);  // owns the event and the buffers from here
    state_->track(work);
    watchdog_->add(work);
  } catch (...) {
    // Named after this operation (a CUDA call of stage_out or the event knows none), and saying
    // what its failure did: the works that read this error learn why the communicator is gone.
    std::exception_ptr error = std::current_exception();
    try {
      throw;
    } catch (const Error& failure) {
      if (failure.context().op.empty()) {
        error = make_error(failure.code(), context, failure.detail() + "; communicator aborted");
      }
    } catch (...) {
      // Not chorus's: kept as it is.
    }
    if (work == nullptr) {
      leak(started.keep_alive);
      if (event != nullptr) {
        cudaEventDestroy(event);
      }
    }
    lock.unlock();         // abort() takes the comm lock
    state_->abort(error);  // fails (and so leaks for) the work if it was tracked
    std::rethrow_exception(error);
  }
  return work;
}

std::shared_ptr<transport::Work> NcclComm::all_reduce(const transport::Buffer& send,
                                                      const transport::Buffer& recv,
                                                      const ReduceOp& reduce_op,
                                                      const transport::OpInfo& info) {
  const BatchAbandon abandon(*this);
  CHORUS_CHECK_EQ(send.count, recv.count);
  check_device(send, info);
  check_device(recv, info);
  const Plan plan = plan_or_throw(send.dtype, reduce_op, info);
  const transport::OpSignature signature =
      transport::OpSignature::of(transport::OpKind::AllReduce, send, recv, reduce_op, -1);
  auto p = std::make_shared<Pointers>();
  Enqueue enqueue;
  enqueue.before = [this, p, send, recv, reduce_op, plan](Started& started,
                                                          std::vector<ncclRedOp_t>& created) {
    p->in = stage_in(send, true, started);
    p->out = recv.data == send.data ? p->in : stage_in(recv, false, started);
    p->out_host = take_out_host(recv);
    p->op = reduction(plan, reduce_op, created);
  };
  enqueue.call = [this, p, count = send.count * static_cast<std::size_t>(plan.count_factor),
                  type = nccl_type(plan.type)] {
    return ncclAllReduce(p->in, p->out, count, type, p->op, state_->comm(), state_->stream());
  };
  enqueue.after = [this, p, recv](Started& started) {
    stage_out(recv, p->out, std::move(p->out_host), started);
  };
  return launch(signature, info, std::move(enqueue));
}

std::shared_ptr<transport::Work> NcclComm::all_gather(const transport::Buffer& send,
                                                      const transport::Buffer& recv,
                                                      const transport::OpInfo& info) {
  const BatchAbandon abandon(*this);
  CHORUS_CHECK_EQ(recv.count, send.count * static_cast<std::size_t>(size()));
  check_device(send, info);
  check_device(recv, info);
  const transport::OpSignature signature =
      transport::OpSignature::of(transport::OpKind::AllGather, send, recv, ReduceOp::Kind::Sum, -1);
  auto p = std::make_shared<Pointers>();
  Enqueue enqueue;
  enqueue.before = [this, p, send, recv](Started& started, std::vector<ncclRedOp_t>&) {
    p->in = stage_in(send, true, started);
    p->out = stage_in(recv, false, started);
    p->out_host = take_out_host(recv);
  };
  enqueue.call = [this, p, bytes = send.nbytes()] {
    return ncclAllGather(p->in, p->out, bytes, ncclUint8, state_->comm(), state_->stream());
  };
  enqueue.after = [this, p, recv](Started& started) {
    stage_out(recv, p->out, std::move(p->out_host), started);
  };
  return launch(signature, info, std::move(enqueue));
}

std::shared_ptr<transport::Work> NcclComm::reduce_scatter(const transport::Buffer& send,
                                                          const transport::Buffer& recv,
                                                          const ReduceOp& reduce_op,
                                                          const transport::OpInfo& info) {
  const BatchAbandon abandon(*this);
  CHORUS_CHECK_EQ(send.count, recv.count * static_cast<std::size_t>(size()));
  check_device(send, info);
  check_device(recv, info);
  const Plan plan = plan_or_throw(send.dtype, reduce_op, info);
  const transport::OpSignature signature =
      transport::OpSignature::of(transport::OpKind::ReduceScatter, send, recv, reduce_op, -1);
  auto p = std::make_shared<Pointers>();
  Enqueue enqueue;
  enqueue.before = [this, p, send, recv, reduce_op, plan](Started& started,
                                                          std::vector<ncclRedOp_t>& created) {
    p->in = stage_in(send, true, started);
    p->out = stage_in(recv, false, started);
    p->out_host = take_out_host(recv);
    p->op = reduction(plan, reduce_op, created);
  };
  enqueue.call = [this, p, count = recv.count * static_cast<std::size_t>(plan.count_factor),
                  type = nccl_type(plan.type)] {
    return ncclReduceScatter(p->in, p->out, count, type, p->op, state_->comm(), state_->stream());
  };
  enqueue.after = [this, p, recv](Started& started) {
    stage_out(recv, p->out, std::move(p->out_host), started);
  };
  return launch(signature, info, std::move(enqueue));
}

std::shared_ptr<transport::Work> NcclComm::all_to_all(const transport::Buffer& send,
                                                      const std::vector<std::size_t>& send_counts,
                                                      const transport::Buffer& recv,
                                                      const std::vector<std::size_t>& recv_counts,
                                                      const transport::OpInfo& info) {
  const BatchAbandon abandon(*this);
  CHORUS_CHECK_EQ(send_counts.size(), static_cast<std::size_t>(size()));
  CHORUS_CHECK_EQ(recv_counts.size(), static_cast<std::size_t>(size()));
  check_device(send, info);
  check_device(recv, info);
  const bool compared = check_store_ != nullptr && size() > 1;  // Note [NCCL collective check]
  if (std::string problem = transport::self_split_problem(send_counts, recv_counts, group_rank_);
      !compared && !problem.empty()) {
    // Only this rank knows: its peers wait for it until the watchdog's deadline. Under
    // --check-collectives every member of a larger group reports it instead.
    throw InvalidArgument(context_of(info), "nccl: " + problem);
  }
  const transport::OpSignature signature =
      transport::OpSignature::of(transport::OpKind::AllToAll, send, recv, ReduceOp::Kind::Sum, -1);
  auto p = std::make_shared<Pointers>();
  Enqueue enqueue;
  enqueue.before = [this, p, send, recv](Started& started, std::vector<ncclRedOp_t>&) {
    p->in = stage_in(send, true, started);
    p->out = stage_in(recv, false, started);
    p->out_host = take_out_host(recv);
  };
  enqueue.call = [this, p, send, recv, send_counts, recv_counts] {
    const std::size_t element = element_size(send.dtype);
    std::size_t send_offset = 0;
    std::size_t recv_offset = 0;
    // Inside start()'s group: NCCL fuses every send and receive.
    for (int peer = 0; peer < size(); ++peer) {
      const auto index = static_cast<std::size_t>(peer);
      const std::size_t send_bytes = send_counts[index] * element;
      const std::size_t recv_bytes = recv_counts[index] * element;
      ncclResult_t result = ncclSend(static_cast<char*>(p->in) + send_offset, send_bytes, ncclUint8,
                                     peer, state_->comm(), state_->stream());
      if (result == ncclSuccess || result == ncclInProgress) {
        result = ncclRecv(static_cast<char*>(p->out) + recv_offset, recv_bytes, ncclUint8, peer,
                          state_->comm(), state_->stream());
      }
      if (result != ncclSuccess && result != ncclInProgress) {
        return result;
      }
      send_offset += send_bytes;
      recv_offset += recv_bytes;
    }
    CHORUS_CHECK_EQ(send_offset, send.nbytes());
    CHORUS_CHECK_EQ(recv_offset, recv.nbytes());
    return ncclSuccess;
  };
  enqueue.after = [this, p, recv](Started& started) {
    stage_out(recv, p->out, std::move(p->out_host), started);
  };
  return launch(signature, info, std::move(enqueue),
                compared ? std::optional(SplitSizes{send_counts, recv_counts}) : std::nullopt);
}

std::shared_ptr<transport::Work> NcclComm::broadcast(const transport::Buffer& send,
                                                     const transport::Buffer& recv, int root,
                                                     const transport::OpInfo& info) {
  const BatchAbandon abandon(*this);
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(root >= 0 && root < size());
  check_device(send, info);
  check_device(recv, info);
  const transport::OpSignature signature = transport::OpSignature::of(
      transport::OpKind::Broadcast, send, recv, ReduceOp::Kind::Sum, root);
  auto p = std::make_shared<Pointers>();
  Enqueue enqueue;
  enqueue.before = [this, p, send, recv, root](Started& started, std::vector<ncclRedOp_t>&) {
    p->in = stage_in(send, group_rank_ == root, started);  // read on the root only
    p->out = recv.data == send.data ? p->in : stage_in(recv, false, started);
    p->out_host = take_out_host(recv);
  };
  enqueue.call = [this, p, root, bytes = send.nbytes()] {
    return ncclBroadcast(p->in, p->out, bytes, ncclUint8, root, state_->comm(), state_->stream());
  };
  enqueue.after = [this, p, recv](Started& started) {
    stage_out(recv, p->out, std::move(p->out_host), started);
  };
  return launch(signature, info, std::move(enqueue));
}

std::shared_ptr<transport::Work> NcclComm::reduce(const transport::Buffer& send,
                                                  const transport::Buffer& recv,
                                                  const ReduceOp& reduce_op, int root,
                                                  const transport::OpInfo& info) {
  const BatchAbandon abandon(*this);
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(root >= 0 && root < size());
  check_device(send, info);
  check_device(recv, info);
  const Plan plan = plan_or_throw(send.dtype, reduce_op, info);
  const transport::OpSignature signature =
      transport::OpSignature::of(transport::OpKind::Reduce, send, recv, reduce_op, root);
  auto p = std::make_shared<Pointers>();
  Enqueue enqueue;
  enqueue.before = [this, p, send, recv, reduce_op, plan, root](Started& started,
                                                                std::vector<ncclRedOp_t>& created) {
    p->in = stage_in(send, true, started);
    p->out = recv.data == send.data ? p->in : stage_in(recv, false, started);
    if (group_rank_ == root) {
      p->out_host = take_out_host(recv);  // recv is written on the root only
    }
    p->op = reduction(plan, reduce_op, created);
  };
  enqueue.call = [this, p, root, count = send.count * static_cast<std::size_t>(plan.count_factor),
                  type = nccl_type(plan.type)] {
    return ncclReduce(p->in, p->out, count, type, p->op, root, state_->comm(), state_->stream());
  };
  enqueue.after = [this, p, recv, root](Started& started) {
    if (group_rank_ == root) {
      stage_out(recv, p->out, std::move(p->out_host), started);  // recv: written on the root only
    }
  };
  return launch(signature, info, std::move(enqueue));
}

void NcclComm::begin_group() {
  CHORUS_CHECK(!batching_);
  CHORUS_CHECK(batch_.empty());
  CHORUS_CHECK(batch_splits_.empty());
  batching_ = true;
}

std::shared_ptr<transport::Work> NcclComm::end_group(const transport::OpInfo& info) {
  CHORUS_CHECK(batching_);
  batching_ = false;
  std::vector<Enqueue> enqueues = std::move(batch_);
  std::vector<transport::OpSignature> signatures = std::move(batch_signatures_);
  std::vector<SplitSizes> splits = std::move(batch_splits_);
  batch_.clear();
  batch_signatures_.clear();
  batch_splits_.clear();
  return start(std::move(enqueues), std::move(signatures), splits, info);
}

// ---------------------------------------------------------------------------------------------
// NcclTransport

NcclTransport::NcclTransport(Environment environment, std::shared_ptr<store::Store> store,
                             int device, std::chrono::nanoseconds timeout, bool split_partitions,
                             bool check_collectives)
    : environment_(std::move(environment)),
      store_(std::move(store)),
      device_(device),
      timeout_(timeout),
      split_partitions_(split_partitions),
      check_collectives_(check_collectives),
      watchdog_(std::make_shared<Watchdog>(timeout, device)),
      pinned_(BlockPool::make(
          allocate_pinned, [](void* block) { cudaFreeHost(block); }, kPinnedKeepBytes)) {}

NcclTransport::~NcclTransport() {
  const Clock::time_point settle_by = deadline_after(timeout_);
  for (const std::shared_ptr<CommState>& state : states_) {
    state->start_finalize(settle_by);  // every one started before any is waited for
  }
  comms_.clear();
  states_.clear();  // the last owners finalize and destroy (Note [NCCL work lifecycle])
}

transport::Duration NcclTransport::now() {
  return std::chrono::duration_cast<transport::Duration>(Clock::now().time_since_epoch());
}

std::string NcclTransport::supports(transport::OpKind kind, DType dtype, const ReduceOp& reduce_op,
                                    Device device) const {
  if (device.is_meta()) {
    return "nccl: meta tensors have no storage to communicate";
  }
  if (device.is_cuda() && device.index() != device_) {
    return "nccl: this rank runs on cuda:" + std::to_string(device_) + ", not " +
           device.to_string();
  }
  if (transport::op_kind_reduces(kind)) {
    return mapping_problem(dtype, reduce_op);
  }
  return {};
}

void NcclTransport::abort_all(const std::exception_ptr& error) {
  for (const std::shared_ptr<CommState>& state : states_) {
    state->abort(error);
  }
}

std::shared_ptr<transport::Comm> NcclTransport::create_comm(const std::string& tag,
                                                            const std::vector<int>& ranks) {
  const std::string label = transport::group_label(tag, ranks);
  const ErrorContext context{environment_.rank, "create_comm", -1, label};
  const auto member = std::find(ranks.begin(), ranks.end(), environment_.rank);
  if (member == ranks.end()) {
    throw InvalidArgument(context, "nccl: rank " + std::to_string(environment_.rank) +
                                       " is not a member of the group");
  }
  const std::string key = comm_key(tag, ranks);
  if (auto found = comms_.find(key); found != comms_.end()) {
    return found->second;
  }
  const ErrorContext set_up_context{environment_.rank, "communicator set-up", -1, label};
  if (auto failed = failed_set_ups_.find(key); failed != failed_set_ups_.end()) {
    // Retries, below: never run the exchange again on these keys.
    throw_error(failed->second.code, set_up_context,
                "nccl: the group's set-up failed earlier: " + failed->second.detail +
                    "; a retry is not supported on NCCL");
  }
  const int group_rank = static_cast<int>(member - ranks.begin());
  const int group_size = static_cast<int>(ranks.size());

  // Note [NCCL communicator set-up]
  // Two ways, by how core names the group (Note [Partitioned groups], transport.hpp); either
  // way the communicator is non-blocking, cached per (tag, ranks), and finalized and destroyed
  // as every other (Note [NCCL work lifecycle]).
  // - A group named by one rank list (create_comm, here) gets its own unique id through the
  //   store (a prefix per group), not ncclCommSplit: only its members call create_comm, while
  //   ncclCommSplit is collective over the parent communicator, so non-members would have to
  //   call it too (with NCCL_SPLIT_NOCOLOR), and they never learn that the group exists.
  // - With NcclRunOptions::split_partitions (or CHORUS_NCCL_SPLIT=1), a part of a partition of
  //   the world (create_partition_comm: a list of rank lists or a MeshDim covering the world) is
  //   split from the world communicator, since every world rank reaches that operation:
  //   ncclCommSplit(world, color = the part's smallest rank, key = the rank's position in it)
  //   (split_plan; the smallest rank, not the part's index in the caller's list, so ranks that
  //   list the parts in other orders still agree). A rank whose part's communicator exists
  //   already still calls it, with NCCL_SPLIT_NOCOLOR: the split is collective over the world.
  //   The world communicator is created first (unique id) when needed. The split holds the
  //   world communicator's lock and is polled on it (settle) until it finished or the timeout
  //   passed; a timeout (Timeout) or a failed split (TransportError) aborts the world
  //   communicator, as a failed enqueue on it would. NCCL writes the new communicator only once
  //   the split finished; then it is polled in turn, as a unique-id set-up is, and its size and
  //   this rank's place in it are checked against the part (ranks that reached their first
  //   operations on two partitions in different orders pair the wrong splits: TransportError
  //   instead of a communicator of other ranks).
  //   Off by default, because the split makes the set-up collective over the whole world where
  //   the simulator and MPI need only the part's members: a program that uses a partition on
  //   some ranks only, or first uses partitions in different orders, would wait in the split
  //   until the timeout and abort the world communicator; Note [Split agreement] turns that
  //   into a Timeout naming the missing ranks, or a CollectiveMismatch, before the split.
  // - Otherwise, and for a partition of one part, the part gets the unique-id set-up above.
  // Retries. Core calls create_comm again for a group whose set-up threw (ensure_comm keeps no
  // communicator), but the unique-id exchange cannot run twice: a fresh Rendezvous on the
  // group's prefix numbers its calls from 0 again, so a retry uses the failed attempt's keys,
  // and what that attempt left there (rank 0's id, published after the others gave up; a
  // partial 'done' count) lets a rank read the old id, or count out early and delete keys
  // another rank has not read yet. So a failed exchange is remembered per group
  // (failed_set_ups_) and every later create_comm of the group throws its error type again,
  // naming the first error, without touching the store. (A failure after the exchange, in
  // ncclCommInitRankConfig, is not remembered: the exchange's keys were all counted out.)
  store::PrefixStore prefix("chorus/nccl/comm/" + key, *store_);
  store::Rendezvous rendezvous(prefix, group_rank, group_size);
  const auto deadline = deadline_after(timeout_);
  std::string id_bytes;
  try {
    id_bytes = exchange_unique_id(
        rendezvous, sizeof(ncclUniqueId),
        [&context] {
          ncclUniqueId id{};
          const ncclResult_t result = ncclGetUniqueId(&id);
          if (result != ncclSuccess) {
            throw TransportError(context, "nccl: ncclGetUniqueId failed: " +
                                              std::string(ncclGetErrorString(result)));
          }
          return std::string(id.internal, sizeof(id.internal));
        },
        store::Deadline(deadline));
  } catch (const Error& error) {
    // The same error, at this rank and group (exchange_unique_id knows only the rank in the
    // group), naming the rank that makes the id: a Timeout here is the root not arriving.
    std::string detail = error.detail() + " (rank 0 of this communicator is rank " +
                         std::to_string(ranks.front()) + ")";
    failed_set_ups_.insert_or_assign(key, FailedSetUp{error.code(), detail});  // Retries, above
    throw_error(error.code(), set_up_context, std::move(detail));
  }
  ncclUniqueId id{};
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));

  cudaSetDevice(device_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // Note [NCCL work lifecycle]: poll with a deadline instead
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, group_size, id, group_rank, &config);
  return adopt(comm, result, key, tag, ranks, group_rank, context, deadline,
               "ncclCommInitRankConfig", "a member did not join?");
}

std::shared_ptr<NcclComm> NcclTransport::adopt(ncclComm_t comm, ncclResult_t result,
                                               const std::string& key, const std::string& tag,
                                               const std::vector<int>& ranks, int group_rank,
                                               const ErrorContext& context,
                                               Clock::time_point deadline, const char* set_up_call,
                                               const std::string& hint) {
  CHORUS_CHECK(!comms_.contains(key));
  CHORUS_CHECK_GE(group_rank, 0);
  CHORUS_CHECK_LT(static_cast<std::size_t>(group_rank), ranks.size());
  cudaStream_t stream = nullptr;
  if (const cudaError_t code = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      code != cudaSuccess) {
    if (comm != nullptr) {
      ncclCommAbort(comm);
    }
    throw TransportError(context, "nccl: cudaStreamCreate failed: " + cuda_error_text(code));
  }
  auto state = std::make_shared<CommState>(comm, stream, device_, context.group, timeout_);
  if (result == ncclSuccess || result == ncclInProgress) {
    const std::lock_guard lock(state->mutex());
    result = state->settle(deadline);
  }
  if (result != ncclSuccess) {
    const bool timed_out = result == ncclInProgress;
    std::exception_ptr error =
        timed_out ? make_error(ErrorCode::Timeout, context,
                               std::string("nccl: ") + set_up_call + " did not finish within " +
                                   milliseconds_text(timeout_) + " (" + hint + ")")
                  : make_error(ErrorCode::TransportError, context,
                               std::string("nccl: ") + set_up_call +
                                   " failed: " + nccl_error_text(result, comm));
    state->abort(error);
    std::rethrow_exception(error);
  }
  auto created = std::make_shared<NcclComm>(state, watchdog_, tag, ranks, group_rank,
                                            comm_id_of(key), environment_.rank, timeout_,
                                            check_collectives_ ? store_ : nullptr, pinned_);
  states_.push_back(state);
  comms_.emplace(key, created);
  return created;
}

std::shared_ptr<transport::Comm> NcclTransport::create_partition_comm(
    const std::string& tag, const transport::Partition& partition,
    const std::shared_ptr<transport::Comm>& existing) {
  const int rank = environment_.rank;
  // Note [NCCL communicator set-up]. Throws InvalidArgument for anything but a partition of the
  // world holding this rank.
  const SplitPlan plan = split_plan(partition, environment_.world_size, rank, existing != nullptr);
  const std::vector<int>& ranks = partition.own();
  const ErrorContext context{rank, "create_comm", -1, transport::group_label(tag, ranks)};
  if (!split_partitions_ || partition.parts.size() == 1) {
    // Not splitting (the default: NcclRunOptions::split_partitions), or one part: every rank is
    // a member, so the members-only set-up is collective over the world already.
    // One part: every rank is a member, so the members-only set-up is collective over the world
    // already, and a split would only copy the world communicator.
    return existing ? existing : create_comm(tag, ranks);
  }
  // Note [Split agreement]: every world rank splits the same partition as its split #k, or
  // every rank learns who does not, before anyone enters the split.
  agree_on_split(*store_, rank, environment_.world_size, splits_++,
                 split_description(tag, partition), context.group,
                 store::Deadline(deadline_after(timeout_)));
  const std::string key = comm_key(tag, ranks);
  if (existing) {
    CHORUS_CHECK(comms_.contains(key));  // core's communicator is this transport's
    CHORUS_CHECK_EQ(plan.color, kNoColor);
  } else {
    // Only a one-part partition's key ("" and the world) can be cached without core knowing.
    CHORUS_CHECK(!comms_.contains(key));
    CHORUS_CHECK_NE(plan.color, kNoColor);
  }

  // The parent: the world communicator, created first if this is the job's first use of it
  // (every world rank is in this operation, so all of them create it together).
  std::vector<int> world(static_cast<std::size_t>(environment_.world_size));
  for (std::size_t i = 0; i < world.size(); ++i) {
    world[i] = static_cast<int>(i);
  }
  const std::shared_ptr<CommState> parent =
      std::static_pointer_cast<NcclComm>(create_comm("", world))->state();

  const auto deadline = deadline_after(timeout_);
  const std::string what = "ncclCommSplit of the world communicator (color " +
                           std::to_string(plan.color) + ", key " + std::to_string(plan.key) + ")";
  // NCCL writes the new communicator when the split finished, from its own thread (the parent
  // is non-blocking): the slot lives on the heap, and is leaked if the split never finishes.
  auto child = std::make_unique<ncclComm_t>(nullptr);
  ncclResult_t result = ncclSuccess;
  {
    std::unique_lock lock(parent->mutex());  // the split is an operation on the parent
    if (parent->aborted_locked()) {
      throw Aborted(context, "nccl: the world communicator was aborted after an earlier failure; " +
                                 what + " is impossible");
    }
    cudaSetDevice(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // Note [NCCL work lifecycle]: poll with a deadline instead
    result = ncclCommSplit(parent->comm(), plan.color, plan.key, child.get(), &config);
    if (result == ncclSuccess || result == ncclInProgress) {
      result = parent->settle(deadline);
    }
    if (result != ncclSuccess) {
      const bool timed_out = result == ncclInProgress;
      std::exception_ptr error =
          timed_out
              ? make_error(ErrorCode::Timeout, context,
                           "nccl: " + what + " did not finish within " +
                               milliseconds_text(timeout_) +
                               " (a world rank did not reach this operation?); world "
                               "communicator aborted")
              : make_error(ErrorCode::TransportError, context,
                           "nccl: " + what + " failed: " + nccl_error_text(result, parent->comm()) +
                               "; world communicator aborted");
      if (timed_out) {
        (void)child.release();  // NOLINT: NCCL may still write it (see above)
      } else if (*child != nullptr) {
        // A split whose set-up failed still hands out the child (with its threads): free it.
        ncclCommAbort(*child);
      }
      lock.unlock();  // abort() takes the comm lock
      parent->abort(error);
      std::rethrow_exception(error);
    }
  }
  if (existing) {
    CHORUS_CHECK(*child == nullptr);  // NCCL_SPLIT_NOCOLOR makes no communicator
    return existing;
  }
  if (*child == nullptr) {
    throw TransportError(context, "nccl: " + what + " finished without a communicator");
  }
  // The split settled on the parent; the child may still be finishing its own set-up.
  std::shared_ptr<NcclComm> made =
      adopt(*child, ncclInProgress, key, tag, ranks, plan.key, context, deadline, "ncclCommSplit",
            "the new communicator did not finish its set-up");
  // A split pairs the world's calls in order: ranks that first used partitions in different
  // orders get communicators of other ranks. Refuse one that is not this part.
  int count = 0;
  int user_rank = -1;
  {
    const std::lock_guard lock(made->state()->mutex());
    (void)ncclCommCount(made->state()->comm(), &count);
    (void)ncclCommUserRank(made->state()->comm(), &user_rank);
  }
  if (count != static_cast<int>(ranks.size()) || user_rank != plan.key) {
    std::exception_ptr error = make_error(
        ErrorCode::TransportError, context,
        "nccl: " + what + " made a communicator of " + std::to_string(count) +
            " ranks where this rank is " + std::to_string(user_rank) + ", not the part " +
            transport::group_label(tag, ranks) +
            " (world ranks reached their first operations on partitions in different orders?)");
    made->state()->abort(error);
    // Core records the partition's communicator only when this returns: a later use of the
    // partition comes back here without one, and must find no stale cache entry (states_ keeps
    // the aborted state for the end of the run).
    comms_.erase(key);
    std::rethrow_exception(error);
  }
  return made;
}

}  // namespace chorus::nccl::detail
