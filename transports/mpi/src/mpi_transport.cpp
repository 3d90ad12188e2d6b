#include "mpi_transport.hpp"

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "chorus/check.hpp"
#include "chorus/kernels.hpp"

namespace chorus::mpi::detail {
namespace {

using transport::Buffer;
using transport::OpInfo;
using transport::OpKind;
using transport::OpSignature;

transport::OpSignature signature(OpKind kind, const Buffer& send, const Buffer& recv,
                                 const ReduceOp& reduce_op, int root) {
  transport::OpSignature result;
  result.kind = kind;
  result.dtype = send.dtype;
  result.send_count = send.count;
  result.recv_count = recv.count;
  result.reduce_op = reduce_op;
  result.root = root;
  return result;
}

// FNV-1a over the tag and ranks: the same id on every member, without communicating.
std::uint64_t comm_id_of(const std::string& tag, const std::vector<int>& ranks) {
  std::uint64_t hash = 14695981039346656037ULL;
  auto mix = [&hash](unsigned char byte) {
    hash ^= byte;
    hash *= 1099511628211ULL;
  };
  for (const char c : tag) {
    mix(static_cast<unsigned char>(c));
  }
  mix(0);
  for (const int rank : ranks) {
    for (int shift = 0; shift < 32; shift += 8) {
      mix(static_cast<unsigned char>((static_cast<unsigned>(rank) >> shift) & 0xFFU));
    }
  }
  return hash;
}

// Tags of chorus's control messages and MPI_Comm_create_group: the least MPI_TAG_UB the
// standard allows.
constexpr std::uint64_t kControlTagCount = 32767;

std::shared_ptr<void> scratch(std::size_t nbytes) {
  return {std::malloc(nbytes == 0 ? 1 : nbytes), &std::free};
}

}  // namespace

std::string group_label(const std::string& tag, const std::vector<int>& ranks) {
  std::string label = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    label += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  }
  label += "]";
  return tag.empty() ? label : "'" + tag + "' " + label;
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

// ---------------------------------------------------------------------------------------------
// MpiProcess

MpiProcess::MpiProcess() : user_ops_(std::make_unique<UserOps>()) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      throw TransportError(ErrorContext{-1, "MPI_Init_thread", -1, ""}, "MPI failed to start");
    }
    initialized_here_ = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw TransportError(ErrorContext{-1, "MPI_Init_thread", -1, ""},
                           "this MPI provides thread level " + std::to_string(provided) +
                               "; chorus needs MPI_THREAD_SERIALIZED (Note [MPI locking])");
    }
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  // Every rank starts here together (chorus::mpi::run), so this collective cannot strand one.
  if (const int code = MPI_Comm_dup(MPI_COMM_WORLD, &control_); code != MPI_SUCCESS) {
    throw TransportError(ErrorContext{rank_, "MPI_Comm_dup", -1, ""},
                         "creating chorus's control communicator failed: " + mpi_error_text(code));
  }
  // Ranks sharing this node (collective too, as above): Note [Wait backoff].
  MPI_Comm node = MPI_COMM_NULL;
  int node_size = world_size_;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
  }
  // All CPUs of the node, not this process's affinity mask: mpirun may bind each rank to one.
  const unsigned cpus = std::thread::hardware_concurrency();
  spin_waits_ = cpus > 0 && static_cast<unsigned>(node_size) <= cpus;
}

MpiProcess::~MpiProcess() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) {
    return;  // the program finalised MPI itself: the ops went with it
  }
  user_ops_.reset();
  MPI_Comm_free(&control_);
  if (initialized_here_) {
    MPI_Finalize();
  }
}

void MpiProcess::park(Started started) {
  // Called with the work's lock held, not the MPI lock.
  const std::lock_guard lock(mutex_);
  parked_.push_back(std::move(started));
}

// ---------------------------------------------------------------------------------------------
// MpiWork

MpiWork::MpiWork(std::shared_ptr<MpiProcess> process, Started started,
                 transport::Fingerprint fingerprint, ErrorContext context)
    : process_(std::move(process)),
      started_(std::move(started)),
      fingerprint_(std::move(fingerprint)),
      context_(std::move(context)) {}

MpiWork::~MpiWork() {
  if (status_ == transport::WorkStatus::Pending && !started_.requests.empty()) {
    // MPI cannot cancel a collective: its buffers must outlive it, so they stay with the process
    // (a work is dropped pending only after a Timeout, on the way to ending the job).
    process_->park(std::move(started_));
  }
}

void MpiWork::poll() {
  if (status_ != transport::WorkStatus::Pending) {
    return;
  }
  int done = 0;
  int code = MPI_SUCCESS;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    code = MPI_Testall(static_cast<int>(started_.requests.size()), started_.requests.data(), &done,
                       MPI_STATUSES_IGNORE);
  }
  if (code != MPI_SUCCESS) {
    error_ = make_error(ErrorCode::TransportError, context_,
                        "MPI_Testall failed: " + mpi_error_text(code));
    status_ = transport::WorkStatus::Failed;
    return;
  }
  if (done == 0) {
    return;
  }
  try {
    for (const std::function<void()>& step : started_.after) {
      step();
    }
    status_ = transport::WorkStatus::Completed;
  } catch (...) {
    error_ = std::current_exception();
    status_ = transport::WorkStatus::Failed;
  }
  started_.after.clear();
  started_.keep_alive.clear();
}

bool MpiWork::is_completed() {
  const std::lock_guard lock(mutex_);
  poll();
  return status_ != transport::WorkStatus::Pending;
}

void MpiWork::wait(transport::Deadline deadline) {
  // Note [Wait backoff]: spin, yielding once per kSpinBetweenYields, unless oversubscribed.
  constexpr auto kSpinBetweenYields = std::chrono::microseconds(100);
  const bool spin = process_->spin_waits();
  auto last_yield = std::chrono::steady_clock::now();
  for (;;) {
    {
      const std::lock_guard lock(mutex_);
      poll();
      if (status_ == transport::WorkStatus::Failed) {
        std::rethrow_exception(error_);
      }
      if (status_ == transport::WorkStatus::Completed) {
        return;
      }
    }
    const auto clock_now = std::chrono::steady_clock::now();
    if (clock_now - process_->epoch() >= deadline.at) {
      throw Timeout(context_,
                    "not completed by its deadline; the operation stays pending. A peer of the "
                    "group has not issued it (or issued something else: MPI cannot tell which), "
                    "or is stuck");
    }
    // Note [MPI locking]: never hold the MPI lock while waiting.
    if (!spin || clock_now - last_yield >= kSpinBetweenYields) {
      std::this_thread::yield();
      last_yield = clock_now;
    }
  }
}

void MpiWork::wait_on(void* /*stream*/) {
  throw InvalidArgument(context_, "the mpi transport has no device streams (host memory only)");
}

transport::WorkStatus MpiWork::status() const {
  const std::lock_guard lock(mutex_);
  return status_;
}

std::exception_ptr MpiWork::error() const {
  const std::lock_guard lock(mutex_);
  return error_;
}

// ---------------------------------------------------------------------------------------------
// MpiComm

MpiComm::MpiComm(std::shared_ptr<MpiProcess> process, MPI_Comm comm, std::string tag,
                 std::vector<int> ranks, std::uint64_t id)
    : process_(std::move(process)),
      comm_(comm),
      tag_(std::move(tag)),
      ranks_(std::move(ranks)),
      label_(group_label(tag_, ranks_)),
      id_(id) {
  CHORUS_CHECK(comm_ != MPI_COMM_NULL);
  MPI_Comm_rank(comm_, &group_rank_);
  CHORUS_CHECK_GE(group_rank_, 0);
  CHORUS_CHECK_EQ(ranks_[static_cast<std::size_t>(group_rank_)], process_->rank());
}

MpiComm::~MpiComm() {
  const std::lock_guard mpi_lock(process_->mutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0) {
    MPI_Comm_free(&comm_);
  }
}

ErrorContext MpiComm::context_of(const OpInfo& info) const {
  return ErrorContext{process_->rank(), std::string(info.name), info.seq, label_};
}

void MpiComm::check(int code, const char* call, const OpInfo& info) const {
  if (code != MPI_SUCCESS) {
    throw TransportError(context_of(info), std::string(call) + " failed: " + mpi_error_text(code));
  }
}

int MpiComm::to_int_count(std::size_t count, const OpInfo& info) const {
  if (count > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw InvalidArgument(context_of(info),
                          "the mpi transport takes at most 2^31-1 elements per buffer and peer "
                          "(MPI counts are int); got " +
                              std::to_string(count));
  }
  return static_cast<int>(count);
}

void MpiComm::reduction(const Buffer& send, const ReduceOp& reduce_op, Plan& plan,
                        MPI_Datatype& datatype, MPI_Op& op) {
  plan = plan_reduction(send.dtype, reduce_op);
  datatype = mpi_datatype(plan.element);
  op = plan.op == OpChoice::User ? process_->user_ops().get(send.dtype, plan.user_kind)
                                 : builtin_op(plan.op);
}

const void* MpiComm::scaled_input(const Buffer& send, const ReduceOp& reduce_op, Started& started) {
  // f * x once per element, rounded to the dtype (kernels' premul step on one source).
  std::shared_ptr<void> copy = scratch(send.nbytes());
  const void* sources[1] = {send.data};
  kernels::reduce(copy.get(), sources, 1, send.count, send.dtype, reduce_op);
  started.keep_alive.push_back(copy);
  return copy.get();
}

std::shared_ptr<transport::Work> MpiComm::submit(Started started, const OpInfo& info) {
  if (batching_) {
    for (MPI_Request request : started.requests) {
      batch_.requests.push_back(request);
    }
    for (std::function<void()>& step : started.after) {
      batch_.after.push_back(std::move(step));
    }
    for (std::shared_ptr<const void>& kept : started.keep_alive) {
      batch_.keep_alive.push_back(std::move(kept));
    }
    for (const OpSignature& op : started.signatures) {
      batch_.signatures.push_back(op);
    }
    return nullptr;
  }
  transport::Fingerprint fingerprint{id_, info.seq, std::move(started.signatures)};
  return std::make_shared<MpiWork>(process_, std::move(started), std::move(fingerprint),
                                   context_of(info));
}

std::shared_ptr<transport::Work> MpiComm::all_reduce(const Buffer& send, const Buffer& recv,
                                                     const ReduceOp& reduce_op,
                                                     const OpInfo& info) {
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(send.dtype == recv.dtype);
  const int count = to_int_count(send.count, info);
  Started started;
  started.signatures.push_back(signature(OpKind::AllReduce, send, recv, reduce_op, -1));
  started.keep_alive = {send.keep_alive, recv.keep_alive};
  MPI_Request request = MPI_REQUEST_NULL;
  Plan plan;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    MPI_Datatype datatype = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    reduction(send, reduce_op, plan, datatype, op);
    const void* input = plan.scale_input ? scaled_input(send, reduce_op, started) : send.data;
    check(MPI_Iallreduce(input == recv.data ? MPI_IN_PLACE : input, recv.data, count, datatype, op,
                         comm_, &request),
          "MPI_Iallreduce", info);
  }
  started.requests.push_back(request);
  if (plan.divide_after) {
    started.after.emplace_back([data = recv.data, dtype = recv.dtype, n = recv.count,
                                size = size()] { divide_in_place(data, dtype, n, size); });
  }
  return submit(std::move(started), info);
}

std::shared_ptr<transport::Work> MpiComm::all_gather(const Buffer& send, const Buffer& recv,
                                                     const OpInfo& info) {
  CHORUS_CHECK_EQ(recv.count, send.count * ranks_.size());
  CHORUS_CHECK(send.dtype == recv.dtype);
  const int count = to_int_count(send.count, info);
  to_int_count(recv.count, info);
  Started started;
  started.signatures.push_back(signature(OpKind::AllGather, send, recv, ReduceOp::Kind::Sum, -1));
  started.keep_alive = {send.keep_alive, recv.keep_alive};
  const MPI_Datatype datatype = mpi_datatype(movement_element(send.dtype));
  // In place when send is this rank's own block of recv.
  const bool in_place = send.data == static_cast<const char*>(recv.data) +
                                         static_cast<std::size_t>(group_rank_) * send.nbytes();
  MPI_Request request = MPI_REQUEST_NULL;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send.data, count, datatype, recv.data, count,
                         datatype, comm_, &request),
          "MPI_Iallgather", info);
  }
  started.requests.push_back(request);
  return submit(std::move(started), info);
}

std::shared_ptr<transport::Work> MpiComm::reduce_scatter(const Buffer& send, const Buffer& recv,
                                                         const ReduceOp& reduce_op,
                                                         const OpInfo& info) {
  CHORUS_CHECK_EQ(send.count, recv.count * ranks_.size());
  CHORUS_CHECK(send.dtype == recv.dtype);
  const int count = to_int_count(recv.count, info);
  to_int_count(send.count, info);
  Started started;
  started.signatures.push_back(signature(OpKind::ReduceScatter, send, recv, reduce_op, -1));
  started.keep_alive = {send.keep_alive, recv.keep_alive};
  MPI_Request request = MPI_REQUEST_NULL;
  Plan plan;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    MPI_Datatype datatype = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    reduction(send, reduce_op, plan, datatype, op);
    const void* input = plan.scale_input ? scaled_input(send, reduce_op, started) : send.data;
    check(MPI_Ireduce_scatter_block(input, recv.data, count, datatype, op, comm_, &request),
          "MPI_Ireduce_scatter_block", info);
  }
  started.requests.push_back(request);
  if (plan.divide_after) {
    started.after.emplace_back([data = recv.data, dtype = recv.dtype, n = recv.count,
                                size = size()] { divide_in_place(data, dtype, n, size); });
  }
  return submit(std::move(started), info);
}

std::shared_ptr<transport::Work> MpiComm::all_to_all(const Buffer& send,
                                                     const std::vector<std::size_t>& send_counts,
                                                     const Buffer& recv,
                                                     const std::vector<std::size_t>& recv_counts,
                                                     const OpInfo& info) {
  CHORUS_CHECK_EQ(send_counts.size(), ranks_.size());
  CHORUS_CHECK_EQ(recv_counts.size(), ranks_.size());
  CHORUS_CHECK(send.dtype == recv.dtype);
  to_int_count(send.count, info);  // displacements are int too
  to_int_count(recv.count, info);
  // counts and displacements: [send counts, send displs, recv counts, recv displs]
  auto layout = std::make_shared<std::vector<int>>(4 * ranks_.size());
  const std::size_t n = ranks_.size();
  int send_offset = 0;
  int recv_offset = 0;
  for (std::size_t peer = 0; peer < n; ++peer) {
    (*layout)[peer] = to_int_count(send_counts[peer], info);
    (*layout)[n + peer] = send_offset;
    (*layout)[2 * n + peer] = to_int_count(recv_counts[peer], info);
    (*layout)[3 * n + peer] = recv_offset;
    send_offset += (*layout)[peer];
    recv_offset += (*layout)[2 * n + peer];
  }
  CHORUS_CHECK_EQ(static_cast<std::size_t>(send_offset), send.count);
  CHORUS_CHECK_EQ(static_cast<std::size_t>(recv_offset), recv.count);
  Started started;
  started.signatures.push_back(signature(OpKind::AllToAll, send, recv, ReduceOp::Kind::Sum, -1));
  started.keep_alive = {send.keep_alive, recv.keep_alive, layout};
  const void* input = send.data;
  if (send.data == recv.data && send.count > 0) {
    // MPI's in-place alltoallv has other semantics: exchange from a copy.
    std::shared_ptr<void> copy = scratch(send.nbytes());
    std::memcpy(copy.get(), send.data, send.nbytes());
    input = copy.get();
    started.keep_alive.push_back(copy);
  }
  const MPI_Datatype datatype = mpi_datatype(movement_element(send.dtype));
  const int* counts = layout->data();
  MPI_Request request = MPI_REQUEST_NULL;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    check(MPI_Ialltoallv(input, counts, counts + n, datatype, recv.data, counts + 2 * n,
                         counts + 3 * n, datatype, comm_, &request),
          "MPI_Ialltoallv", info);
  }
  started.requests.push_back(request);
  return submit(std::move(started), info);
}

std::shared_ptr<transport::Work> MpiComm::broadcast(const Buffer& send, const Buffer& recv,
                                                    int root, const OpInfo& info) {
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(root >= 0 && root < size());
  const int count = to_int_count(recv.count, info);
  Started started;
  started.signatures.push_back(signature(OpKind::Broadcast, send, recv, ReduceOp::Kind::Sum, root));
  started.keep_alive = {send.keep_alive, recv.keep_alive};
  if (group_rank_ == root && send.data != recv.data && recv.count > 0) {
    std::memcpy(recv.data, send.data, recv.nbytes());
  }
  const MPI_Datatype datatype = mpi_datatype(movement_element(recv.dtype));
  MPI_Request request = MPI_REQUEST_NULL;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    check(MPI_Ibcast(recv.data, count, datatype, root, comm_, &request), "MPI_Ibcast", info);
  }
  started.requests.push_back(request);
  return submit(std::move(started), info);
}

std::shared_ptr<transport::Work> MpiComm::reduce(const Buffer& send, const Buffer& recv,
                                                 const ReduceOp& reduce_op, int root,
                                                 const OpInfo& info) {
  CHORUS_CHECK_EQ(send.count, recv.count);
  CHORUS_CHECK(root >= 0 && root < size());
  const int count = to_int_count(send.count, info);
  Started started;
  started.signatures.push_back(signature(OpKind::Reduce, send, recv, reduce_op, root));
  started.keep_alive = {send.keep_alive, recv.keep_alive};
  const bool is_root = group_rank_ == root;
  MPI_Request request = MPI_REQUEST_NULL;
  Plan plan;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    MPI_Datatype datatype = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    reduction(send, reduce_op, plan, datatype, op);
    const void* input = plan.scale_input ? scaled_input(send, reduce_op, started) : send.data;
    // recv is written on root only (Comm::reduce); only root may reduce in place.
    const void* send_arg = is_root && input == recv.data ? MPI_IN_PLACE : input;
    check(MPI_Ireduce(send_arg, is_root ? recv.data : nullptr, count, datatype, op, root, comm_,
                      &request),
          "MPI_Ireduce", info);
  }
  started.requests.push_back(request);
  if (plan.divide_after && is_root) {
    started.after.emplace_back([data = recv.data, dtype = recv.dtype, n = recv.count,
                                size = size()] { divide_in_place(data, dtype, n, size); });
  }
  return submit(std::move(started), info);
}

void MpiComm::begin_group() {
  CHORUS_CHECK(!batching_);
  batching_ = true;
  batch_ = Started{};
}

std::shared_ptr<transport::Work> MpiComm::end_group(const OpInfo& info) {
  CHORUS_CHECK(batching_);
  batching_ = false;
  Started batch = std::move(batch_);
  batch_ = Started{};
  return submit(std::move(batch), info);
}

// ---------------------------------------------------------------------------------------------
// MpiTransport

MpiTransport::MpiTransport(std::shared_ptr<MpiProcess> process, std::chrono::nanoseconds timeout)
    : process_(std::move(process)), timeout_(timeout) {}

void MpiTransport::rendezvous(const std::vector<int>& ranks, std::uint64_t id,
                              const ErrorContext& context) {
  const std::size_t n = ranks.size();
  // Buffers and requests live on the heap: after a Timeout the process keeps them (park).
  auto ids = std::make_shared<std::vector<std::uint64_t>>(n + 1, 0);  // [peers..., mine]
  (*ids)[n] = id;
  Started pending;
  pending.keep_alive.push_back(ids);
  std::vector<MPI_Request> receives(n, MPI_REQUEST_NULL);
  const int tag = static_cast<int>(id % kControlTagCount);
  {
    const std::lock_guard mpi_lock(process_->mutex());
    for (std::size_t i = 0; i < n; ++i) {
      if (ranks[i] == process_->rank()) {
        continue;
      }
      MPI_Request send = MPI_REQUEST_NULL;
      MPI_Isend(&(*ids)[n], 1, MPI_UINT64_T, ranks[i], tag, process_->control(), &send);
      pending.requests.push_back(send);
      MPI_Irecv(&(*ids)[i], 1, MPI_UINT64_T, ranks[i], tag, process_->control(), &receives[i]);
    }
  }
  const auto deadline = now() + timeout_;
  for (;;) {
    std::vector<int> missing;
    {
      const std::lock_guard mpi_lock(process_->mutex());
      for (std::size_t i = 0; i < n; ++i) {
        int arrived = 1;
        if (receives[i] != MPI_REQUEST_NULL) {
          MPI_Test(&receives[i], &arrived, MPI_STATUS_IGNORE);
        }
        if (arrived == 0) {
          missing.push_back(ranks[i]);
        }
      }
    }
    if (missing.empty()) {
      break;
    }
    if (now() >= deadline) {
      for (MPI_Request request : receives) {
        pending.requests.push_back(request);
      }
      process_->park(std::move(pending));
      std::string list;
      for (const int rank : missing) {
        list += (list.empty() ? "" : ", ") + std::to_string(rank);
      }
      throw Timeout(context, "ranks [" + list + "] of group " + context.group +
                                 " did not reach its set-up within the timeout: they have not "
                                 "issued any operation on this group (returned, stuck, or "
                                 "running different code)");
    }
    std::this_thread::yield();
  }
  {
    const std::lock_guard mpi_lock(process_->mutex());
    MPI_Waitall(static_cast<int>(pending.requests.size()), pending.requests.data(),
                MPI_STATUSES_IGNORE);  // every peer received: the sends are done or nearly
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (ranks[i] != process_->rank() && (*ids)[i] != id) {
      throw CollectiveMismatch(context, "rank " + std::to_string(ranks[i]) +
                                            " is setting up a different group at the same time "
                                            "(its ranks or tag differ)");
    }
  }
}

std::shared_ptr<transport::Comm> MpiTransport::create_comm(const std::string& tag,
                                                           const std::vector<int>& ranks) {
  CHORUS_CHECK(!ranks.empty());
  const ErrorContext context{process_->rank(), "communicator set-up", -1, group_label(tag, ranks)};
  const std::uint64_t id = comm_id_of(tag, ranks);
  rendezvous(ranks, id, context);
  MPI_Comm comm = MPI_COMM_NULL;
  {
    const std::lock_guard mpi_lock(process_->mutex());
    // Collective over the members only (MPI 3); all of them are here (the rendezvous).
    MPI_Group world_group = MPI_GROUP_NULL;
    MPI_Group group = MPI_GROUP_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &group);
    const int code = MPI_Comm_create_group(MPI_COMM_WORLD, group,
                                           static_cast<int>(id % kControlTagCount), &comm);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (code != MPI_SUCCESS) {
      throw TransportError(context, "MPI_Comm_create_group failed: " + mpi_error_text(code));
    }
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  }
  return std::make_shared<MpiComm>(process_, comm, tag, ranks, id);
}

transport::Duration MpiTransport::now() {
  return std::chrono::duration_cast<transport::Duration>(std::chrono::steady_clock::now() -
                                                         process_->epoch());
}

std::string MpiTransport::supports(OpKind /*kind*/, DType /*dtype*/, const ReduceOp& /*reduce_op*/,
                                   Device device) const {
  // Every dtype and reduction maps (Note [MPI mapping]); only host memory moves.
  if (!device.is_cpu()) {
    return "the mpi transport moves host memory only";
  }
  return {};
}

}  // namespace chorus::mpi::detail
