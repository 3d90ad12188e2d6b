// The functional collectives: validation, desugaring, staging, and registration of the pending
// work (Note [Work lifecycle]). Transports see only contiguous buffers.

#include "chorus/collectives.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/runtime.hpp"
#include "chorus/trace.hpp"
#include "chorus/transport/recycled_blocks.hpp"
#include "chorus/transport/transport.hpp"
#include "detail/errors.hpp"
#include "detail/format.hpp"
#include "detail/group_internal.hpp"
#include "detail/rank_state.hpp"
#include "detail/shape_rules.hpp"
#include "detail/storage.hpp"
#include "detail/strided_copy.hpp"
#include "detail/tensor_access.hpp"
#include "detail/work_registry.hpp"

namespace chorus {
namespace {

using detail::ShapeRule;
using detail::TensorAccess;
using transport::Buffer;
using transport::OpKind;

// Note [Lowering]
// Transports see only real, non-Bool buffers: complex tensors travel as pairs of reals (their
// real view: count doubles, sum/avg/premul_sum act on each part alone, which is exactly the
// complex result), and Bool as UInt8 (min/max/band/bor/bxor on bytes 0/1 give 0/1, the Bool
// result). NCCL has neither dtype natively; the simulator could run both, but lowering on every
// transport keeps the bytes on the wire identical everywhere. Which ops may run on which dtype is
// checked on the original dtype first (ReduceOp::check_dtype), so e.g. max on complex stays an
// InvalidArgument rather than a max over real parts. A lowered buffer keeps the dtype it came
// from (Buffer::lowered_from), which every transport's signatures compare: n Complex64 elements
// against a peer's 2n Float32 ones move the same bytes but are a CollectiveMismatch.
// Bool bytes other than 0/1 are made 0/1 before they are sent (Note [Bool bytes]).
DType wire_dtype(DType dtype) noexcept {
  switch (dtype) {
    case DType::Complex64:
      return DType::Float32;
    case DType::Complex128:
      return DType::Float64;
    case DType::Bool:
      return DType::UInt8;
    default:
      return dtype;
  }
}

// Bool's band and bor, as the transport runs them: on the wire's bytes, which are 0 or 1, band
// is min and bor is max, reductions every transport has (NCCL has no bitwise ones, and would
// otherwise refuse what check_dtype allows on Bool). Other ops, and other dtypes (whose bytes
// are not 0/1), travel as they are; so does Bool's bxor. A reference, to `reduce_op` itself or
// to a constant (the transport's API takes the op by reference; no copy is needed here). So the
// result may live only as long as `reduce_op`: use it within the full expression, or copy it,
// when that is a temporary. Constant-initialised (Note [A valid op holds no string]).
constexpr ReduceOp kWireMin(ReduceOp::Kind::Min);
constexpr ReduceOp kWireMax(ReduceOp::Kind::Max);
const ReduceOp& wire_reduce_op(DType dtype, const ReduceOp& reduce_op) noexcept {
  if (dtype == DType::Bool && reduce_op.kind() == ReduceOp::Kind::BAnd) {
    return kWireMin;
  }
  if (dtype == DType::Bool && reduce_op.kind() == ReduceOp::Kind::BOr) {
    return kWireMax;
  }
  return reduce_op;
}

// Wire elements per tensor element.
std::size_t wire_lanes(DType dtype) noexcept { return is_complex(dtype) ? 2 : 1; }

// The block of `group`'s ranks that holds `rank` (ExpandedGroup::members_of without the copy),
// or empty.
std::span<const int> members_in(const ExpandedGroup& group, int rank) noexcept {
  if (group.group_size <= 0) {
    return {};
  }
  const auto size = static_cast<std::size_t>(group.group_size);
  const std::span<const int> ranks(group.ranks);
  for (std::size_t start = 0; start + size <= ranks.size(); start += size) {
    const std::span<const int> block = ranks.subspan(start, size);
    if (std::find(block.begin(), block.end(), rank) != block.end()) {
      return block;
    }
  }
  return {};
}

// How Call::check_input's errors name the input ("input", "input 2", "tensor"), spelled out only
// when one is raised.
struct InputName {
  std::string_view name = "input";
  std::int64_t index = -1;  // for the inputs of a coalesced call
  std::string text() const {
    return index < 0 ? std::string(name) : std::string(name) + " " + std::to_string(index);
  }
};

// One collective call on the calling rank, from validation to registration and tracing.
class Call {
 public:
  Call(std::string_view op, const GroupSpec& group, std::string_view tag, CallSite site)
      : op_(op), site_(site), group_(&group) {
    RankContext* context = RankContext::current();
    if (context == nullptr) {
      throw InvalidArgument(detail::make_context(op),
                            "called outside a rank: call collectives from the rank function "
                            "given to chorus::run or chorus::sim::run");
    }
    state_ = &context->state();
    state_->settle_unwaited();
    expanded_ = &expanded_lease_.take(*state_);
    // Note [Repeated world calls] in rank_state.hpp.
    const bool outermost = state_->expanded_groups_in_use() == 1;
    const auto* process_group = std::get_if<ProcessGroup>(&group.value());
    const bool on_world = outermost && process_group != nullptr &&
                          &process_group->ranks() == state_->built_world_ranks();
    // The tag the expansion would take; compared by size first: string_view's operator== calls
    // compare() out of line (~20 instructions) even for two empty tags, world()'s usual case.
    const std::string_view call_tag =
        process_group == nullptr || !tag.empty() ? tag : std::string_view(process_group->tag());
    if (on_world && state_->world_slot != nullptr && expanded_->tag.size() == call_tag.size() &&
        (call_tag.empty() || std::string_view(expanded_->tag) == call_tag)) {
      members_ = expanded_->ranks;
      slot_ = state_->world_slot;
    } else {
      if (outermost) {
        state_->world_slot = nullptr;
      }
      detail::expand_group_into(group, tag, op, *expanded_);
      members_ = members_in(*expanded_, state_->rank());  // a view into expanded_, never copied
      if (members_.empty()) {
        throw InvalidArgument(
            detail::make_context(op, -1, expanded_->to_string()),
            "rank " + std::to_string(state_->rank()) + " is not a member of the group");
      }
      slot_ = &state_->comm_slot(expanded_->tag, members_);
      if (on_world) {
        state_->world_slot = slot_;
      }
    }
    trace_ = state_->trace;
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  // register_work() follows start() at once, and gives the room back itself if the operation
  // does not start: here the outputs may be gone already (destroyed while unwinding).
  ~Call() {
    CHORUS_DCHECK(pending_ == nullptr);  // Note [A call's own checks]
  }

  int group_size() const noexcept { return static_cast<int>(members_.size()); }
  int group_rank() const noexcept {
    return static_cast<int>(std::find(members_.begin(), members_.end(), state_->rank()) -
                            members_.begin());
  }
  // Whether the inputs are meta tensors (traced without communication).
  bool meta() const noexcept { return meta_; }
  // The calling rank's work registry.
  const detail::WorkRegistry* registry() const noexcept { return state_->registry().get(); }
  // The calling rank's state.
  detail::RankState& state() const noexcept { return *state_; }

  // The context of errors raised before the op starts: the sequence number it would have had.
  ErrorContext context() const {
    return ErrorContext{state_->rank(), std::string(op_), meta_ ? -1 : slot_->next_seq,
                        slot_->label.str()};
  }
  [[noreturn]] void invalid(const std::string& detail) const {
    throw InvalidArgument(context(), detail);
  }
  // The rule's shape, or InvalidArgument with its error.
  ShapeRule checked(ShapeRule rule) const {
    if (!rule.ok()) {
      invalid(rule.error);
    }
    return rule;
  }

  // Checks an input tensor, the reduction (null for ops that do not reduce) and that the
  // transport can run `kind` on it. Meta inputs are accepted under tracing only, and a call's
  // inputs are all meta or none.
  // Here only the usual case, a host input on the device of the inputs before it (if any) in a
  // call the transport accepted last (Note [Supported calls]): it passes every check of
  // check_input_fully, which would change only what this changes. Everything else, errors
  // included, goes through check_input_fully from the start. Small, this part is inlined into the
  // collectives: the whole check out of line cost ~25 instructions a collective more, mostly its
  // call and the frame its error messages' strings made large.
  void check_input(const Tensor& input, OpKind kind, const ReduceOp* reduce_op,
                   const InputName& input_name = {}) {
    if (input.defined()) {
      const Device device = input.device();
      if (device.is_cpu() && (checked_inputs_ == 0 || (!meta_ && device == device_)) &&
          state_->last_supported == supported_call(kind, input.dtype(), reduce_op, device)) {
        meta_ = false;
        device_ = device;
        ++checked_inputs_;
        return;
      }
    }
    check_input_fully(input, kind, reduce_op, input_name);
  }
  // What Note [Supported calls] remembers of a call.
  static detail::RankState::SupportedCall supported_call(OpKind kind, DType dtype,
                                                         const ReduceOp* reduce_op,
                                                         Device device) noexcept {
    return detail::RankState::SupportedCall{
        kind,
        dtype,
        reduce_op != nullptr,
        reduce_op != nullptr ? reduce_op->kind() : ReduceOp::Kind::Sum,
        reduce_op != nullptr ? std::bit_cast<std::uint64_t>(reduce_op->premul_factor()) : 0,
        device};
  }
  [[gnu::noinline]] void check_input_fully(const Tensor& input, OpKind kind,
                                           const ReduceOp* reduce_op, const InputName& input_name) {
    if (!input.defined()) {
      invalid(input_name.text() + " is an undefined tensor");
    }
    const bool is_meta = input.device().is_meta();
    if (is_meta && trace_ == nullptr) {
      invalid(input_name.text() +
              " is a meta tensor: meta tensors carry no data to communicate (inside a "
              "TraceScope they are traced for their shapes, without communication)");
    }
    if (checked_inputs_ > 0 && is_meta != meta_) {
      invalid(input_name.text() + " is " + (is_meta ? "a meta tensor" : "not a meta tensor") +
              " but the inputs before it are " + (meta_ ? "meta" : "not meta") +
              ": a call traces all-meta inputs or communicates real ones, not a mix");
    }
    if (checked_inputs_ > 0 && !is_meta && input.device() != device_) {
      invalid(input_name.text() + " is on " + input.device().to_string() +
              " but the inputs before it are on " + device_.to_string() +
              ": a call's tensors share one device");
    }
    meta_ = is_meta;
    device_ = input.device();
    ++checked_inputs_;
    if (input.device().is_cuda() && !input.is_contiguous()) {
      invalid(input_name.text() + " is a non-contiguous " + input.device().to_string() +
              " tensor of shape " + detail::bracketed(input.sizes()) +
              ": packing it needs a device kernel, and chorus has none (pass a contiguous one)");
    }
    // Note [Supported calls] in rank_state.hpp. A call that repeats the last one the transport
    // accepted also skips check_dtype: that call passed it (last_supported is set only below),
    // and its verdict on a valid op depends on the op's kind and the dtype only, both in the key
    // (an invalid op never reaches last_supported).
    const detail::RankState::SupportedCall call =
        supported_call(kind, input.dtype(), reduce_op, input.device());
    const bool supported_before = !is_meta && state_->last_supported == call;
    if (reduce_op != nullptr && !supported_before) {
      if (std::string reason = reduce_op->check_dtype(input.dtype()); !reason.empty()) {
        invalid(reason);
      }
    }
    if (is_meta || supported_before) {
      return;
    }
    const DType wire = wire_dtype(input.dtype());
    std::string reason = state_->transport().supports(
        kind, wire,
        reduce_op != nullptr ? wire_reduce_op(input.dtype(), *reduce_op)
                             : ReduceOp(ReduceOp::Kind::Sum),
        input.device());
    if (reason.empty()) {
      state_->last_supported = call;
    } else {
      std::string lowered;
      if (wire != input.dtype()) {
        lowered = " lowered to " + std::string(dtype_name(wire));
      }
      invalid("transport '" + std::string(state_->transport().name()) + "' cannot run " +
              std::string(transport::op_kind_name(kind)) + " on " + input_name.text() + " (" +
              std::string(dtype_name(input.dtype())) + lowered + " on " +
              input.device().to_string() + "): " + reason);
    }
  }

  // An unknown reduce op name, refused even when no input would show it (an empty coalesced
  // list).
  void check_reduce_op(const ReduceOp& reduce_op) const {
    if (!reduce_op.is_valid()) {
      invalid(reduce_op.check_dtype(DType::Float32));
    }
  }

  // Checks the caller's output of an in-place form against the shape and dtype the op produces.
  void check_output(const Tensor& output, const Shape& expected, DType dtype) const {
    if (!output.defined()) {
      invalid("output is an undefined tensor");
    }
    if (output.device().is_meta() != meta_) {
      invalid(std::string("output is ") + (meta_ ? "not " : "") + "a meta tensor but the input is" +
              (meta_ ? "" : " not"));
    }
    if (output.sizes() != expected) {
      invalid("output shape " + detail::bracketed(output.sizes()) +
              " does not match the result shape " + detail::bracketed(expected));
    }
    if (output.dtype() != dtype) {
      invalid("output dtype " + std::string(dtype_name(output.dtype())) +
              " does not match the input dtype " + std::string(dtype_name(dtype)));
    }
    if (!meta_ && output.device() != device_) {
      invalid("output is on " + output.device().to_string() + " but the input is on " +
              device_.to_string());
    }
    if (output.device().is_cuda() && !output.is_contiguous()) {
      invalid("output is a non-contiguous " + output.device().to_string() +
              " tensor: writing it needs a device kernel, and chorus has none");
    }
    check_writable(output, "output");
  }

  // An in-place form's destination must hold one location per element: refused before the
  // sequence number is taken, not when the result is copied back.
  void check_writable(const Tensor& destination, const char* which) const {
    if (meta_) {
      return;  // shapes only, as Tensor::copy_ on meta tensors
    }
    if (const std::int64_t dim =
            detail::shared_location_dim(destination.sizes(), destination.strides());
        dim >= 0) {
      invalid(std::string(which) + " has stride 0 in dim " + std::to_string(dim) +
              " (an expanded view), so several elements share one memory location and the result "
              "cannot be written into it");
    }
  }

  // InvalidArgument unless the call's tensors are host tensors: `what` needs a host step
  // (rearranging blocks) after the transport, which chorus does not order on a device stream.
  void require_host(const std::string& what) const {
    if (device_.is_cuda()) {
      invalid(what + " on " + device_.to_string() +
              " rearranges blocks with a host copy once the transport is done; chorus does not yet "
              "order a strided device copy after it on the stream (use dim 0, or copy to the host "
              "with to(Device::cpu()))");
    }
  }

  // Note [A call's own checks]
  // A Call makes one operation: start(), then register_work() at once, from the same issue_*
  // function, with its outputs (never none). The checks of that order (no sequence number taken
  // yet and no work made ready before start(), both after it, none left at the end) are of
  // core's own code, settled in collectives.cpp, and ran at every collective: in debug builds
  // only, as Note [Work's own checks] in work_registry.cpp. start()'s test that the inputs are not
  // meta stays (the communicate_* functions rely on it).
  //
  // Everything validated: take the communicator and the sequence number, and make ready what
  // registering the operation's work under `outputs` (not empty) takes (Note [Registration] in
  // work_registry.hpp): the PendingWork with `fixup` (run once after the transport work
  // completed, e.g. all_gather's rearrangement) and room in the registry. Throws what setting up
  // the communicator throws, or std::bad_alloc: then nothing started and no sequence number is
  // taken. Start the operation with register_work(), at once: if the transport's call throws,
  // register_work() gives the sequence number back (Note [Transport contract]).
  // `fixup` by reference: passed down to the PendingWork without a move at each level.
  transport::Comm& start(std::span<const Tensor> outputs, std::function<void()>&& fixup = {}) {
    CHORUS_CHECK(!meta_);
    // Note [A call's own checks].
    CHORUS_DCHECK(seq_ < 0);  // one operation per call
    CHORUS_DCHECK(pending_ == nullptr);
    std::span<const int> parts;
    int part_size = 0;
    std::vector<int> storage;  // a MeshDim's parts
    transport::Comm& comm =
        detail::world_partition(*group_, *expanded_, state_->world_size(), parts, part_size,
                                storage)
            ? state_->ensure_partition_comm(*slot_, expanded_->tag, members_, parts, part_size)
            : state_->ensure_comm(*slot_, expanded_->tag, members_);
    stream_ = state_->stream_of(device_);
    prepare_registration(outputs, std::move(fixup), slot_->next_seq);
    seq_ = slot_->next_seq++;
    return comm;
  }
  transport::Comm& start(const Tensor& output, std::function<void()>&& fixup = {}) {
    return start(std::span<const Tensor>(&output, 1), std::move(fixup));
  }
  transport::OpInfo info() const { return transport::OpInfo{op_, seq_, site_, stream_}; }

  // Starts the operation: `start_operation()` hands it to the transport and returns its work
  // (not null). Then registers that work as pending under the outputs start() was given, which
  // allocates nothing and cannot fail (Note [Registration]): every operation that started is
  // registered, and waitable. Called right after start(), with the outputs alive: when
  // `start_operation` throws, the room start() reserved under them is given back here, and so is
  // the sequence number (Note [Transport contract]: a transport call that throws started nothing
  // and took no position, so the communicator's next call gets the same number), and the
  // exception propagates.
  template <class StartOperation>
  void register_work(StartOperation start_operation) {
    // Note [A call's own checks].
    CHORUS_DCHECK(seq_ >= 0);
    CHORUS_DCHECK(pending_ != nullptr);  // start() made it ready
    std::shared_ptr<transport::Work> work;
    try {
      work = start_operation();
    } catch (...) {
      state_->registry()->cancel_reservation(*pending_, output_storages());
      pending_.reset();
      // Nothing else numbered an operation on this communicator since start() (one rank, one
      // call at a time): the number taken is the last one.
      CHORUS_CHECK_EQ(slot_->next_seq, seq_ + 1);
      slot_->next_seq = seq_;
      throw;
    }
    pending_->attach(std::move(work));
    // Moved: the registry holds it now (Note [Atomic counts per operation]).
    state_->registry()->add_reserved(std::move(pending_), output_storages());
  }

  // Under a TraceScope: waits `outputs` and appends the call's record, whose op-specific fields
  // `describe(record)` fills. Nothing otherwise: only that test is inline, so a call that is not
  // traced does not call into the record's code (GCC did not inline all of it, and the call and
  // return cost ~20 instructions a collective).
  template <class Describe>
  void trace(std::span<const Tensor> outputs, Describe describe) const {
    if (trace_ != nullptr) [[unlikely]] {
      append_record(outputs, std::move(describe));
    }
  }
  template <class Describe>
  void trace(const Tensor& output, Describe describe) const {
    trace(std::span<const Tensor>(&output, 1), std::move(describe));
  }

 private:
  template <class Describe>
  [[gnu::noinline, gnu::cold]] void append_record(std::span<const Tensor> outputs,
                                                  Describe describe) const {
    if (!meta_) {
      wait_tensors(std::vector<Tensor>(outputs.begin(), outputs.end()));
    }
    OpRecord record;
    record.op = std::string(op_);
    record.tag = expanded_->tag;
    record.ranks = expanded_->ranks;
    record.group_size = group_size();
    record.rank = state_->rank();
    record.seq = meta_ ? -1 : seq_;
    record.meta = meta_;
    record.site = site_;
    for (const Tensor& output : outputs) {
      record.output_shapes.push_back(output.sizes());
    }
    describe(record);
    trace_->append(std::move(record));
  }

  std::string_view op_;
  CallSite site_;
  const GroupSpec* group_;  // the caller's, alive for the call
  detail::RankState* state_ = nullptr;
  // The rank's scratch group for this call (RankState::push_expanded_group), given back when
  // the call ends, including when its constructor throws.
  class ExpandedGroupLease {
   public:
    ExpandedGroupLease() = default;
    ExpandedGroupLease(const ExpandedGroupLease&) = delete;
    ExpandedGroupLease& operator=(const ExpandedGroupLease&) = delete;
    ~ExpandedGroupLease() {
      if (state_ != nullptr) {
        state_->pop_expanded_group(index_);
      }
    }
    ExpandedGroup& take(detail::RankState& state) {
      ExpandedGroup& group = state.push_expanded_group();
      state_ = &state;
      index_ = state.expanded_groups_in_use() - 1;
      return group;
    }

   private:
    detail::RankState* state_ = nullptr;
    std::size_t index_ = 0;
  };
  ExpandedGroupLease expanded_lease_;
  ExpandedGroup* expanded_ = nullptr;  // the leased group
  std::span<const int> members_;       // into expanded_->ranks
  detail::CommSlot* slot_ = nullptr;
  TraceScope* trace_ = nullptr;
  bool meta_ = false;
  Device device_;  // of the checked inputs
  int checked_inputs_ = 0;
  std::int64_t seq_ = -1;
  void* stream_ = nullptr;  // the current stream of device_ when the op started
  // What start() made ready for register_work() (Note [Registration]): the work, null before
  // start() and once registered, and its outputs' storages (one inline, several in the vector).
  std::shared_ptr<detail::PendingWork> pending_;
  detail::Storage* output_storage_ = nullptr;
  std::vector<detail::Storage*> output_storages_;

  std::span<detail::Storage* const> output_storages() const noexcept {
    if (!output_storages_.empty()) {
      return output_storages_;
    }
    return std::span<detail::Storage* const>(&output_storage_, 1);
  }

  // start()'s preparation; the work's sequence number will be `seq`. Throws std::bad_alloc, and
  // then leaves nothing to give back.
  void prepare_registration(std::span<const Tensor> outputs, std::function<void()>&& fixup,
                            std::int64_t seq) {
    CHORUS_DCHECK(!outputs.empty());  // Note [A call's own checks]
    const bool on_device = device_.is_cuda();
    // Note [Recycled blocks].
    auto pending = std::allocate_shared<detail::PendingWork>(
        transport::RecyclingAllocator<detail::PendingWork>{}, state_->rank(), op_, seq,
        slot_->label, site_, std::move(fixup), state_->transport_ptr(), state_->options().timeout,
        on_device ? detail::Completion::Stream : detail::Completion::Host,
        on_device ? detail::StreamSource{state_->streams(), device_.index()}
                  : detail::StreamSource{});
    if (outputs.size() == 1) {  // the common case, without a vector
      output_storage_ = TensorAccess::storage(outputs.front()).get();
    } else {
      output_storages_.reserve(outputs.size());
      for (const Tensor& output : outputs) {
        output_storages_.push_back(TensorAccess::storage(output).get());
      }
    }
    state_->registry()->reserve(*pending, output_storages());
    pending_ = std::move(pending);
  }
};

// A contiguous tensor's elements as a transport buffer (lowered, Note [Lowering]) that keeps
// their memory alive.
// `numel` is contiguous.numel(), when the caller knows it (Note [Remembered layout facts]).
Buffer buffer_of(const Tensor& contiguous, std::int64_t numel) {
  const auto& storage = TensorAccess::storage(contiguous);
  const DType dtype = contiguous.dtype();
  const DType wire = wire_dtype(dtype);
  return Buffer{contiguous.unsafe_data_ptr(),
                static_cast<std::size_t>(numel) * wire_lanes(dtype),
                wire,
                contiguous.device(),
                storage ? std::shared_ptr<const void>(storage->memory()) : nullptr,
                wire != dtype ? std::optional<DType>(dtype) : std::nullopt};
}
Buffer buffer_of(const Tensor& contiguous) { return buffer_of(contiguous, contiguous.numel()); }

// Note [Outputs shaped as their input]
// An output made by new_output_like from an input (all_reduce's) holds as many elements as the
// input, of its dtype, on its device, contiguous from its storage's first byte: its buffer is the
// input's send buffer with the output's memory, so buffer_like takes the count, the wire dtype,
// the device and the lowering from `send` instead of working them out again (buffer_of's dtype
// switches and its loop over the sizes, ~40 instructions an operation). The layout digest stays
// 0: only send buffers carry one (Note [Layout digest]).
Buffer buffer_like(const Buffer& send, const Tensor& output) {
  const std::shared_ptr<detail::Storage>& storage = TensorAccess::storage(output);
  // new_output_like's output has a storage (make_storage returns one or throws): core's own
  // invariant, checked in debug builds only (as Note [A fresh tensor's own checks] in tensor.cpp).
  CHORUS_DCHECK(storage != nullptr);
  // An output not made by new_output_like from the send buffer's tensor would not fit it.
  CHORUS_DCHECK(storage->nbytes() == send.nbytes());
  return Buffer{.data = storage->data(),
                .count = send.count,
                .dtype = send.dtype,
                .device = send.device,
                .keep_alive = storage->memory(),
                .lowered_from = send.lowered_from};
}

// Note [Layout digest]
// Ranks must agree on more than element counts: an all_reduce of a [6] tensor against a [2, 3]
// one, an all_gather_tensor of [2, 3] against [3, 2] along dim 1, or a reduce_scatter_tensor of
// [2, 2] along dim 0 against dim 1 move the same counts, and the transport would complete them
// with results laid out wrong (DESIGN: a shape mismatch is a CollectiveMismatch). So core digests
// what ranks must agree on about the API-level input (its sizes, and the op's gather/scatter dim
// normalised to [0, ndim), or -1) into Buffer::layout of the send buffer, which every transport's
// signatures compare. all_to_all_single's dim 0 legitimately differs (uneven splits): its digest
// leaves dim 0 out (the split counts are checked pairwise). A digest is computed with no
// allocation and one multiply per integer (FNV-1a's byte at a time cost eight dependent
// multiplies per integer, 2% of a simulated schedule): each integer is folded in with a
// multiply by the golden-ratio odd constant and a shift that brings its high bits down. Only
// equality matters, between ranks of one build (MPI ranks compare digests across processes, so
// ranks of builds from before and after this digest would report every call a layout mismatch).
// Never 0, which means "not set".
std::uint64_t layout_digest(std::span<const std::int64_t> sizes, std::int64_t dim) noexcept {
  constexpr std::uint64_t kOdd = 0x9E37'79B9'7F4A'7C15ULL;
  std::uint64_t digest = 0xCBF2'9CE4'8422'2325ULL;
  const auto fold = [&digest](std::uint64_t value) {
    digest = (digest ^ value) * kOdd;
    digest ^= digest >> 29;
  };
  fold(sizes.size());
  for (const std::int64_t size : sizes) {
    fold(static_cast<std::uint64_t>(size));
  }
  fold(static_cast<std::uint64_t>(dim));
  return digest != 0 ? digest : 1;
}

// layout_digest of `input`'s sizes and `dim`, remembered by the rank for the input's layout
// object (Note [Remembered layout digests] in rank_state.hpp). Only the comparison is inline: a
// digest made and remembered (a shared_ptr assignment) out of line kept GCC from inlining more of
// the collectives' path around it. For the input's whole sizes only: the memo's key (layout,
// dim) does not say which sizes were digested, so a caller digesting a part of them (a subspan)
// calls layout_digest itself.
[[gnu::noinline]] std::uint64_t digest_and_remember(detail::RankState& state, const Tensor& input,
                                                    std::int64_t dim) {
  const std::uint64_t digest = layout_digest(input.sizes(), dim);
  if (const std::shared_ptr<const detail::TensorLayout>& layout = TensorAccess::layout(input)) {
    state.digested_layout = layout;
    state.digested_dim = dim;
    state.layout_digest = digest;
    // Note [Remembered layout facts]: of the layout alone (a tensor with a layout is defined).
    state.digested_numel = detail::shape_numel(layout->sizes);
    state.digested_contiguous = input.is_contiguous();
    state.digested_contiguous_strides =
        detail::has_contiguous_strides(layout->sizes, layout->strides);
  }
  return digest;
}
std::uint64_t layout_digest_of(detail::RankState& state, const Tensor& input, std::int64_t dim) {
  const std::shared_ptr<const detail::TensorLayout>& layout = TensorAccess::layout(input);
  if (layout != nullptr && layout == state.digested_layout && dim == state.digested_dim) {
    return state.layout_digest;
  }
  return digest_and_remember(state, input, dim);
}

// `buffer` with the layout digest of `sizes` and `dim` (Note [Layout digest]).
Buffer with_layout(Buffer buffer, std::span<const std::int64_t> sizes,
                   std::int64_t dim = -1) noexcept {
  buffer.layout = layout_digest(sizes, dim);
  return buffer;
}

// A contiguous buffer holding `input`'s elements (the input itself when already contiguous).
// Note [Bool bytes]
// A Bool tensor made by from_blob or DLPack may hold bytes other than 0 and 1 (any nonzero byte
// is true). On the wire Bool is UInt8 (Note [Lowering]), where bxor of 2 and 1 is 3 (true, but
// true xor true is false) and bor/max of 2 and 1 is 2 (true, but not a canonical byte). So a
// host Bool input with such a byte is sent as a 0/1 copy; the scan costs one pass over bytes
// that are about to be sent anyway. A CUDA Bool input is sent as it is (its bytes cannot be
// read from the host without a copy and a sync).

// Whether every byte of a contiguous host Bool tensor is 0 or 1.
bool has_canonical_bool_bytes(const Tensor& contiguous) {
  const auto* bytes = static_cast<const unsigned char*>(contiguous.unsafe_data_ptr());
  const auto count = static_cast<std::size_t>(contiguous.numel());
  unsigned char above_one = 0;
  for (std::size_t i = 0; i < count; ++i) {
    above_one |= static_cast<unsigned char>(bytes[i] & 0xfe);
  }
  return above_one == 0;
}

// Sets every nonzero byte of a contiguous host Bool tensor to 1.
void canonicalize_bool_bytes(Tensor& contiguous) {
  auto* bytes = static_cast<unsigned char*>(contiguous.unsafe_data_ptr());
  const auto count = static_cast<std::size_t>(contiguous.numel());
  for (std::size_t i = 0; i < count; ++i) {
    bytes[i] = bytes[i] != 0 ? 1 : 0;
  }
}

// Whether `contiguous` is a host Bool tensor holding a byte other than 0 and 1.
bool needs_canonical_bool_bytes(const Tensor& contiguous) {
  return contiguous.dtype() == DType::Bool && contiguous.device().is_cpu() &&
         !has_canonical_bool_bytes(contiguous);
}

// Reads the input, so it waits for work pending on it first. A host Bool input is sent with
// 0/1 bytes (Note [Bool bytes]).
// input_buffer of a defined, contiguous host input of `numel` elements.
Buffer contiguous_host_input_buffer(const Tensor& input, std::int64_t numel) {
  // What contiguous() does for a contiguous host tensor (wait, then the tensor itself), without
  // copying the Tensor: access_data's wait without its undefined, meta and device checks (this
  // one is a defined host tensor), keeping its check that there is a storage.
  const std::shared_ptr<detail::Storage>& storage = TensorAccess::storage(input);
  CHORUS_CHECK(storage != nullptr);
  storage->wait_ready();
  if (!needs_canonical_bool_bytes(input)) {
    return buffer_of(input, numel);
  }
  Tensor copy = input.clone();
  canonicalize_bool_bytes(copy);
  return buffer_of(copy);
}
Buffer input_buffer(const Tensor& input) {
  if (input.defined() && input.device().is_cpu() && input.is_contiguous()) {
    return contiguous_host_input_buffer(input, input.numel());
  }
  Tensor contiguous = input.contiguous();  // a fresh copy here whenever it is a host tensor
  if (needs_canonical_bool_bytes(contiguous)) {
    canonicalize_bool_bytes(contiguous);
  }
  return buffer_of(contiguous);
}

// allocate_output's errors, made out of line: their strings gave every output's allocation a
// large frame.
[[noreturn, gnu::cold, gnu::noinline]] void output_does_not_fit(const Call& call,
                                                                const Shape& shape, DType dtype,
                                                                Device device) {
  call.invalid("cannot allocate the output: shape " + detail::bracketed(shape) + " of " +
               std::string(dtype_name(dtype)) + " on " + device.to_string() +
               " does not fit in memory");
}
[[noreturn, gnu::cold, gnu::noinline]] void output_refused(const Call& call,
                                                           const InvalidArgument& error) {
  call.invalid("cannot allocate the output: " + error.detail());
}
// Makes an output with `make` (a Tensor factory for `shape`, `dtype`, `device`). An output too
// large for memory, or too large to address at all, is the caller's InvalidArgument naming
// `call`, raised before anything starts (not the factory's error, which names no collective).
template <class Make>
Tensor allocate_output(const Call& call, const Shape& shape, DType dtype, Device device,
                       Make make) {
  try {
    return make();
  } catch (const std::bad_alloc&) {
    output_does_not_fit(call, shape, dtype, device);
  } catch (const InvalidArgument& error) {
    output_refused(call, error);
  }
}

// A fresh output of `shape` on `device` (pending once registered); its buffer is buffer_of(it).
// The Tensor alone, not a pair with its buffer: made in the caller's variable, where a pair's
// members were moved out at every operation.
Tensor new_output(const Call& call, const Shape& shape, DType dtype, Device device) {
  return allocate_output(call, shape, dtype, device,
                         [&] { return detail::TensorAccess::empty(shape, dtype, device); });
}

// new_output of `input`'s shape, dtype and device, sharing `input`'s layout when that is the
// contiguous one (TensorAccess::empty_like).
Tensor new_output_like(const Call& call, const Tensor& input) {
  return allocate_output(call, input.sizes(), input.dtype(), input.device(),
                         [&] { return detail::TensorAccess::empty_like(input); });
}
// new_output_like from what the caller knows of `input`'s layout (TensorAccess::empty_like).
Tensor new_output_like(const Call& call, const Tensor& input, bool contiguous_strides,
                       std::size_t nbytes) {
  return allocate_output(call, input.sizes(), input.dtype(), input.device(), [&] {
    return detail::TensorAccess::empty_like(input, contiguous_strides, nbytes);
  });
}

// A meta output under tracing: no memory, but the same refusal of shapes too large to address.
Tensor meta_output(const Call& call, const Shape& shape, DType dtype) {
  return allocate_output(call, shape, dtype, Device::meta(),
                         [&] { return detail::TensorAccess::empty(shape, dtype, Device::meta()); });
}

// The operations of one coalesced call: staged one by one, then started as one NCCL-style group
// that yields one work, registered under every output.
class Batch {
 public:
  void add(const Call& call, Buffer send, const Shape& output_shape, DType dtype, Device device) {
    Tensor output = new_output(call, output_shape, dtype, device);
    Buffer recv = buffer_of(output);
    sends_.push_back(std::move(send));
    outputs_.push_back(std::move(output));
    recvs_.push_back(std::move(recv));
  }

  // `start_one(comm, send, recv, dtype)` starts one staged operation inside the group; `dtype`
  // is its tensor's (the buffers carry the wire dtype).
  template <class StartOne>
  std::vector<Tensor> issue(Call& call, StartOne start_one) {
    transport::Comm& comm = call.start(outputs_);
    call.register_work([&] {
      comm.begin_group();
      for (std::size_t i = 0; i < sends_.size(); ++i) {
        // batched: no work yet
        CHORUS_CHECK(start_one(comm, sends_[i], recvs_[i], outputs_[i].dtype()) == nullptr);
      }
      return comm.end_group(call.info());
    });
    return std::move(outputs_);
  }

 private:
  std::vector<Buffer> sends_;
  std::vector<Tensor> outputs_;
  std::vector<Buffer> recvs_;
};

// ---- all_gather along a dim other than 0: the transport gathers rank blocks, in [W,
// *input_shape] order, into the output's own memory; completion rearranges them in place through
// a scratch copy (the seed's cat(chunk(res, W, 0), dim=gather_dim)), so no wait happens before
// first use. Gathering into the output itself, not into a staging tensor, lets the simulator's
// poison and guard pages cover the bytes the caller holds while the gather is pending (they
// covered only the staging tensor, and an early read saw stale memory).

std::function<void()> gather_fixup(const Tensor& staging, const Tensor& output,
                                   std::int64_t gather_dim, int group_size) {
  const Shape& in_shape = staging.sizes();  // [W, s0, ..., s(n-1)]
  const Shape out_strides = detail::contiguous_strides(output.sizes());
  const auto d = static_cast<std::size_t>(gather_dim);
  // The output's dim d (size W * s_d, stride c_d) split into (W, s_d), W moved to the front.
  Shape dst_strides;
  dst_strides.push_back(in_shape[d + 1] * out_strides[d]);
  dst_strides.insert(dst_strides.end(), out_strides.begin(), out_strides.end());
  CHORUS_CHECK_EQ(static_cast<int>(in_shape[0]), group_size);
  // The closure holds the output's *memory*, not its storage: holding the storage would keep
  // the output alive forever (Note [Work lifecycle]: a drop must be able to happen).
  std::shared_ptr<void> out_memory = TensorAccess::storage(output)->memory();
  return [staging, out_memory, dst_strides, in_shape]() {
    if (staging.nbytes() == 0) {
      return;  // nothing gathered (and no memory: memcpy takes no null pointer)
    }
    std::memcpy(staging.unsafe_data_ptr(), out_memory.get(), staging.nbytes());
    detail::strided_copy(out_memory.get(), dst_strides, staging.unsafe_data_ptr(),
                         detail::contiguous_strides(in_shape), in_shape, staging.element_size());
  };
}

// reduce_scatter along a dim other than 0: a contiguous copy of the input with the W chunks along
// `scatter_dim` moved to the front (the seed's cat(chunk(input, W, dim))), so chunk r is block r.
Tensor scatter_staging(const Tensor& input, std::int64_t scatter_dim, int group_size) {
  const auto d = static_cast<std::size_t>(scatter_dim);
  Shape sizes = {group_size};
  sizes.insert(sizes.end(), input.sizes().begin(), input.sizes().end());
  sizes[d + 1] /= group_size;
  Shape src_strides = {input.strides()[d] * sizes[d + 1]};
  src_strides.insert(src_strides.end(), input.strides().begin(), input.strides().end());
  Tensor staging = Tensor::empty(input.sizes(), input.dtype());
  wait_tensor(input);
  detail::strided_copy(staging.unsafe_data_ptr(), detail::contiguous_strides(sizes),
                       input.unsafe_data_ptr(), src_strides, sizes, input.element_size());
  return staging;
}

// ---- The single-tensor collectives, shared by the functional and in-place forms. Each issues
// on a validated Call and returns the pending output (a meta output for meta inputs).
//
// Note [One returned variable]
// GCC builds a function's named local in its caller's result object (the named return value
// optimization) only when every return statement returns that one variable. An issue_* function
// that returned meta_output(...) for meta inputs and its `output` otherwise built the output in a
// local of its own and moved it into the result: a Tensor move and the moved-from Tensor's end,
// ~24 instructions at every all_reduce. So each issue_* function is the meta test and a return of
// a call: communicate_*, for real inputs, whose every return names its one output (a prvalue
// returned from a call is the caller's result object itself, C++17).

// issue_all_reduce for inputs that are not meta (Call::start checks it).
Tensor communicate_all_reduce(Call& call, const Tensor& input, const ReduceOp& reduce_op) {
  // Note [Remembered layout facts]
  // A loop of collectives passes tensors of one layout (Note [Remembered layout digests] in
  // rank_state.hpp), and all_reduce asked each input's layout the same three questions again:
  // whether it is contiguous (input_buffer), its element count (the send buffer's count) and
  // whether its strides are exactly the contiguous ones, with its byte count (new_output_like's
  // empty_like), loops over its sizes and strides in three functions (with the calls and checks
  // around them, ~80 instructions an operation for a 1-d input). They are functions of the layout
  // alone, which is immutable, so the rank remembers them with the layout's digest, and an input
  // whose layout is the remembered one takes them. The digest is looked up first (it neither throws
  // nor waits), which remembers the input's layout when it was not: after it, an input with a
  // layout is the remembered one. The facts are copied out before the input's wait.
  detail::RankState& state = call.state();
  const std::uint64_t digest = layout_digest_of(state, input, -1);
  const bool remembered = TensorAccess::layout(input) != nullptr;
  const std::int64_t numel = state.digested_numel;
  const bool contiguous_strides = state.digested_contiguous_strides;
  // The digest set in place: with_layout's by-value Buffer was one more move (and a moved-from
  // Buffer's end) per operation.
  Buffer send = remembered && state.digested_contiguous && input.device().is_cpu()
                    ? contiguous_host_input_buffer(input, numel)
                    : input_buffer(input);
  send.layout = digest;
  Tensor output = remembered
                      ? new_output_like(call, input, contiguous_strides,
                                        static_cast<std::size_t>(numel) * input.element_size())
                      : new_output_like(call, input);
  Buffer recv = buffer_like(send, output);
  transport::Comm& comm = call.start(output);
  // recv by an init-capture: clang 14 cannot capture a structured binding (the same below).
  call.register_work([&, &recv = recv] {
    return comm.all_reduce(send, recv, wire_reduce_op(input.dtype(), reduce_op), call.info());
  });
  return output;
}
Tensor issue_all_reduce(Call& call, const Tensor& input, const ReduceOp& reduce_op) {
  if (call.meta()) {
    return meta_output(call, input.sizes(), input.dtype());
  }
  return communicate_all_reduce(call, input, reduce_op);  // Note [One returned variable]
}

// issue_all_gather for inputs that are not meta (Call::start checks it).
Tensor communicate_all_gather(Call& call, const Tensor& input, const ShapeRule& rule) {
  const bool rearranges = rule.dim != 0 && input.dim() != 0;
  if (rearranges) {
    call.require_host("all_gather along dim " + std::to_string(rule.dim));
  }
  Buffer send = with_layout(input_buffer(input), input.sizes(), rule.dim);
  Tensor output = new_output(call, rule.shape, input.dtype(), input.device());
  Buffer recv = buffer_of(output);
  if (!rearranges) {
    transport::Comm& comm = call.start(output);
    call.register_work([&, &recv = recv] { return comm.all_gather(send, recv, call.info()); });
    return output;
  }
  Shape staging_shape = {call.group_size()};
  staging_shape.insert(staging_shape.end(), input.sizes().begin(), input.sizes().end());
  Tensor staging = new_output(call, staging_shape, input.dtype(), input.device());
  transport::Comm& comm =
      call.start(output, gather_fixup(staging, output, rule.dim, call.group_size()));
  call.register_work([&, &recv = recv] { return comm.all_gather(send, recv, call.info()); });
  return output;
}
Tensor issue_all_gather(Call& call, const Tensor& input, const ShapeRule& rule) {
  if (call.meta()) {
    return meta_output(call, rule.shape, input.dtype());
  }
  return communicate_all_gather(call, input, rule);  // Note [One returned variable]
}

// issue_reduce_scatter for inputs that are not meta (Call::start checks it).
Tensor communicate_reduce_scatter(Call& call, const Tensor& input, const ReduceOp& reduce_op,
                                  const ShapeRule& rule) {
  if (rule.dim != 0) {
    call.require_host("reduce_scatter along dim " + std::to_string(rule.dim));
  }
  // Two calls, not `input_buffer(dim == 0 ? input : staging)`: that conditional is a prvalue,
  // which copies `input` (its shape and strides vectors) on every call.
  Buffer send =
      with_layout(rule.dim == 0 ? input_buffer(input)
                                : input_buffer(scatter_staging(input, rule.dim, call.group_size())),
                  input.sizes(), rule.dim);
  Tensor output = new_output(call, rule.shape, input.dtype(), input.device());
  Buffer recv = buffer_of(output);
  transport::Comm& comm = call.start(output);
  call.register_work([&, &recv = recv] {
    return comm.reduce_scatter(send, recv, wire_reduce_op(input.dtype(), reduce_op), call.info());
  });
  return output;
}
Tensor issue_reduce_scatter(Call& call, const Tensor& input, const ReduceOp& reduce_op,
                            const ShapeRule& rule) {
  if (call.meta()) {
    return meta_output(call, rule.shape, input.dtype());
  }
  return communicate_reduce_scatter(call, input, reduce_op, rule);  // Note [One returned variable]
}

// The input shape and dtype of a single-tensor call, for its record.
void describe_input(OpRecord& record, const Tensor& input) {
  record.input_shapes = {input.sizes()};
  record.dtype = input.dtype();
}

// Elements per row of dim 0 (the product of the other dims; 1 for a 1-d input).
std::size_t row_elements(const Shape& shape) {
  std::size_t row = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) {
    row *= static_cast<std::size_t>(shape[d]);
  }
  return row;
}

// Note [Reused count lists]
// all_to_all_single hands the transport two lists of wire counts, one per group rank. They are
// the rank's scratch (RankState::send_counts_scratch, recv_counts_scratch), refilled by each
// call, so only a rank's first all_to_all (or one on a larger group) allocates them: two
// allocations and frees per operation were a tenth of its issue cost on MPI. A rank issues one
// call at a time, and a transport reads the lists during its all_to_all call only (the
// transport contract), so nothing still reads a list when the next call refills it.
//
// Fills `counts` with one wire count per group rank: `splits` scaled by the elements of a row,
// or an even split of `rows` when there are none. Throws std::bad_alloc (before anything
// started) when the list must grow and cannot.
void fill_wire_counts(std::vector<std::size_t>& counts,
                      const std::optional<std::vector<std::int64_t>>& splits, std::int64_t rows,
                      int group_size, std::size_t row, DType dtype) {
  const std::size_t per_row = row * wire_lanes(dtype);
  if (!splits) {
    counts.assign(static_cast<std::size_t>(group_size),
                  static_cast<std::size_t>(rows / group_size) * per_row);
    return;
  }
  counts.resize(splits->size());
  for (std::size_t i = 0; i < splits->size(); ++i) {
    counts[i] = static_cast<std::size_t>((*splits)[i]) * per_row;
  }
}

}  // namespace

Tensor all_reduce(const Tensor& input, ReduceOp reduce_op, const GroupSpec& group,
                  std::string_view tag, CallSite site) {
  Call call("all_reduce", group, tag, site);
  call.check_input(input, OpKind::AllReduce, &reduce_op);
  Tensor output = issue_all_reduce(call, input, reduce_op);
  call.trace(output, [&](OpRecord& record) {
    record.reduce_op = reduce_op;
    describe_input(record, input);
  });
  return output;
}

Tensor all_gather_tensor(const Tensor& input, std::int64_t gather_dim, const GroupSpec& group,
                         std::string_view tag, CallSite site) {
  Call call("all_gather_tensor", group, tag, site);
  call.check_input(input, OpKind::AllGather, nullptr);
  const ShapeRule rule =
      call.checked(detail::all_gather_rule(input.sizes(), gather_dim, call.group_size()));
  Tensor output = issue_all_gather(call, input, rule);
  call.trace(output, [&](OpRecord& record) {
    describe_input(record, input);
    record.dims = {rule.dim};
  });
  return output;
}

Tensor reduce_scatter_tensor(const Tensor& input, ReduceOp reduce_op, std::int64_t scatter_dim,
                             const GroupSpec& group, std::string_view tag, CallSite site) {
  Call call("reduce_scatter_tensor", group, tag, site);
  call.check_input(input, OpKind::ReduceScatter, &reduce_op);
  const ShapeRule rule =
      call.checked(detail::reduce_scatter_rule(input.sizes(), scatter_dim, call.group_size()));
  Tensor output = issue_reduce_scatter(call, input, reduce_op, rule);
  call.trace(output, [&](OpRecord& record) {
    record.reduce_op = reduce_op;
    describe_input(record, input);
    record.dims = {rule.dim};
  });
  return output;
}

// ---- Coalesced forms.

namespace {

// Input shapes and dtypes of a coalesced call, for its record.
void describe_inputs(OpRecord& record, const std::vector<Tensor>& inputs) {
  for (const Tensor& input : inputs) {
    record.input_shapes.push_back(input.sizes());
  }
  if (!inputs.empty()) {
    record.dtype = inputs.front().dtype();
  }
  for (const Tensor& input : inputs) {
    if (input.dtype() != record.dtype) {  // mixed: record every input's dtype
      for (const Tensor& each : inputs) {
        record.input_dtypes.push_back(each.dtype());
      }
      break;
    }
  }
}

}  // namespace

std::vector<Tensor> all_reduce_coalesced(const std::vector<Tensor>& inputs, ReduceOp reduce_op,
                                         const GroupSpec& group, std::string_view tag,
                                         CallSite site) {
  Call call("all_reduce_coalesced", group, tag, site);
  call.check_reduce_op(reduce_op);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    call.check_input(inputs[i], OpKind::AllReduce, &reduce_op,
                     {"input", static_cast<std::int64_t>(i)});
  }
  std::vector<Tensor> outputs;
  if (call.meta()) {
    for (const Tensor& input : inputs) {
      outputs.push_back(meta_output(call, input.sizes(), input.dtype()));
    }
  } else if (!inputs.empty()) {  // nothing to communicate otherwise; the group was validated
    Batch batch;
    for (const Tensor& input : inputs) {
      batch.add(call, with_layout(input_buffer(input), input.sizes()), input.sizes(), input.dtype(),
                input.device());
    }
    outputs = batch.issue(
        call, [&](transport::Comm& comm, const Buffer& send, const Buffer& recv, DType dtype) {
          return comm.all_reduce(send, recv, wire_reduce_op(dtype, reduce_op), call.info());
        });
  }
  call.trace(outputs, [&](OpRecord& record) {
    record.reduce_op = reduce_op;
    describe_inputs(record, inputs);
  });
  return outputs;
}

std::vector<Tensor> all_gather_into_tensor_coalesced(const std::vector<Tensor>& inputs,
                                                     const GroupSpec& group, std::string_view tag,
                                                     CallSite site) {
  Call call("all_gather_into_tensor_coalesced", group, tag, site);
  std::vector<Shape> shapes;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    call.check_input(inputs[i], OpKind::AllGather, nullptr,
                     {"input", static_cast<std::int64_t>(i)});
    shapes.push_back(
        call.checked(detail::all_gather_rule(inputs[i].sizes(), 0, call.group_size())).shape);
  }
  std::vector<Tensor> outputs;
  if (call.meta()) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      outputs.push_back(meta_output(call, shapes[i], inputs[i].dtype()));
    }
  } else if (!inputs.empty()) {
    Batch batch;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      batch.add(call, with_layout(input_buffer(inputs[i]), inputs[i].sizes(), 0), shapes[i],
                inputs[i].dtype(), inputs[i].device());
    }
    outputs = batch.issue(
        call, [&](transport::Comm& comm, const Buffer& send, const Buffer& recv, DType /*dtype*/) {
          return comm.all_gather(send, recv, call.info());
        });
  }
  call.trace(outputs, [&](OpRecord& record) {
    describe_inputs(record, inputs);
    record.dims.assign(inputs.size(), 0);
  });
  return outputs;
}

std::vector<Tensor> reduce_scatter_tensor_coalesced(const std::vector<Tensor>& inputs,
                                                    ReduceOp reduce_op,
                                                    const std::vector<std::int64_t>& scatter_dims,
                                                    const GroupSpec& group, std::string_view tag,
                                                    CallSite site) {
  Call call("reduce_scatter_tensor_coalesced", group, tag, site);
  call.check_reduce_op(reduce_op);
  if (scatter_dims.size() != inputs.size()) {
    call.invalid("scatter_dims has " + std::to_string(scatter_dims.size()) + " entries for " +
                 std::to_string(inputs.size()) + " inputs: expected one per input");
  }
  std::vector<ShapeRule> rules;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string which = "input " + std::to_string(i);
    call.check_input(inputs[i], OpKind::ReduceScatter, &reduce_op,
                     {"input", static_cast<std::int64_t>(i)});
    rules.push_back(call.checked(
        detail::reduce_scatter_rule(inputs[i].sizes(), scatter_dims[i], call.group_size(), which)));
    if (rules.back().dim != 0) {
      call.require_host("reduce_scatter of " + which + " along dim " +
                        std::to_string(rules.back().dim));
    }
  }
  std::vector<Tensor> outputs;
  if (call.meta()) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      outputs.push_back(meta_output(call, rules[i].shape, inputs[i].dtype()));
    }
  } else if (!inputs.empty()) {
    Batch batch;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& input = inputs[i];
      const std::int64_t dim = rules[i].dim;
      batch.add(call,
                with_layout(dim == 0 ? input_buffer(input)
                                     : input_buffer(scatter_staging(input, dim, call.group_size())),
                            input.sizes(), dim),
                rules[i].shape, input.dtype(), input.device());
    }
    outputs = batch.issue(
        call, [&](transport::Comm& comm, const Buffer& send, const Buffer& recv, DType dtype) {
          return comm.reduce_scatter(send, recv, wire_reduce_op(dtype, reduce_op), call.info());
        });
  }
  call.trace(outputs, [&](OpRecord& record) {
    record.reduce_op = reduce_op;
    describe_inputs(record, inputs);
    for (const ShapeRule& rule : rules) {
      record.dims.push_back(rule.dim);
    }
  });
  return outputs;
}

// ---- all_to_all_single, broadcast, reduce, permute_tensor.

Tensor all_to_all_single(const Tensor& input,
                         std::optional<std::vector<std::int64_t>> output_split_sizes,
                         std::optional<std::vector<std::int64_t>> input_split_sizes,
                         const GroupSpec& group, std::string_view tag, CallSite site) {
  Call call("all_to_all_single", group, tag, site);
  call.check_input(input, OpKind::AllToAll, nullptr);
  const int size = call.group_size();
  const ShapeRule rule = call.checked(
      detail::all_to_all_rule(input.sizes(), output_split_sizes, input_split_sizes, size));
  Tensor output;
  if (call.meta()) {
    output = meta_output(call, rule.shape, input.dtype());
  } else {
    const std::size_t row = row_elements(input.sizes());
    // Note [Reused count lists].
    std::vector<std::size_t>& send_counts = call.state().send_counts_scratch;
    std::vector<std::size_t>& recv_counts = call.state().recv_counts_scratch;
    fill_wire_counts(send_counts, input_split_sizes, input.size(0), size, row, input.dtype());
    fill_wire_counts(recv_counts, output_split_sizes, input.size(0), size, row, input.dtype());
    // Dim 0 differs between ranks by design (Note [Layout digest]).
    Buffer send = with_layout(input_buffer(input), std::span(input.sizes()).subspan(1));
    Tensor fresh = new_output(call, rule.shape, input.dtype(), input.device());
    Buffer recv = buffer_of(fresh);
    output = std::move(fresh);
    transport::Comm& comm = call.start(output);
    call.register_work([&, &recv = recv] {
      return comm.all_to_all(send, send_counts, recv, recv_counts, call.info());
    });
  }
  call.trace(output, [&](OpRecord& record) {
    describe_input(record, input);
    record.output_split_sizes = output_split_sizes;
    record.input_split_sizes = input_split_sizes;
  });
  return output;
}

Tensor broadcast(const Tensor& input, int src, const GroupSpec& group, std::string_view tag,
                 CallSite site) {
  Call call("broadcast", group, tag, site);
  call.check_input(input, OpKind::Broadcast, nullptr);
  const ShapeRule rule =
      call.checked(detail::rooted_rule(input.sizes(), src, call.group_size(), "src"));
  Tensor output;
  if (call.meta()) {
    output = meta_output(call, rule.shape, input.dtype());
  } else {
    Tensor fresh = new_output(call, rule.shape, input.dtype(), input.device());
    Buffer recv = buffer_of(fresh);
    output = std::move(fresh);
    // Only the root's input is read (and so waited for); elsewhere send is a stand-in.
    Buffer send = with_layout(call.group_rank() == src ? input_buffer(input) : recv, input.sizes());
    transport::Comm& comm = call.start(output);
    call.register_work([&, &recv = recv] { return comm.broadcast(send, recv, src, call.info()); });
  }
  call.trace(output, [&](OpRecord& record) {
    describe_input(record, input);
    record.src = src;
  });
  return output;
}

Tensor reduce(const Tensor& input, ReduceOp reduce_op, int dst, const GroupSpec& group,
              std::string_view tag, CallSite site) {
  Call call("reduce", group, tag, site);
  call.check_input(input, OpKind::Reduce, &reduce_op);
  const ShapeRule rule =
      call.checked(detail::rooted_rule(input.sizes(), dst, call.group_size(), "dst"));
  Tensor output;
  if (call.meta()) {
    output = meta_output(call, rule.shape, input.dtype());
  } else {
    Buffer send = with_layout(input_buffer(input), input.sizes());
    // The transport writes the root's output only; the others hold zeros.
    output = allocate_output(call, rule.shape, input.dtype(), input.device(), [&] {
      return call.group_rank() == dst ? Tensor::empty(rule.shape, input.dtype(), input.device())
                                      : Tensor::zeros(rule.shape, input.dtype(), input.device());
    });
    Buffer recv = buffer_of(output);
    transport::Comm& comm = call.start(output);
    call.register_work([&] {
      return comm.reduce(send, recv, wire_reduce_op(input.dtype(), reduce_op), dst, call.info());
    });
  }
  call.trace(output, [&](OpRecord& record) {
    record.reduce_op = reduce_op;
    describe_input(record, input);
    record.src = dst;
  });
  return output;
}

Tensor permute_tensor(const Tensor& input, const std::vector<int>& src_dst, const GroupSpec& group,
                      std::string_view tag, CallSite site) {
  Call call("permute_tensor", group, tag, site);
  call.check_input(input, OpKind::AllToAll, nullptr);
  const int size = call.group_size();
  const ShapeRule rule = call.checked(detail::permute_rule(input.sizes(), src_dst, size));
  Tensor output;
  if (call.meta()) {
    output = meta_output(call, rule.shape, input.dtype());
  } else {
    // An all_to_all in which each rank sends its whole input to its destination only, as the
    // seed lowers it. A rank nobody sends to receives nothing and keeps zeros (JAX semantics).
    const int me = call.group_rank();
    const auto elements = static_cast<std::size_t>(input.numel()) * wire_lanes(input.dtype());
    std::vector<std::size_t> send_counts(static_cast<std::size_t>(size), 0);
    std::vector<std::size_t> recv_counts(static_cast<std::size_t>(size), 0);
    bool receives = false;
    for (int m = 0; m < size; ++m) {
      if (src_dst[static_cast<std::size_t>(m)] == me) {
        recv_counts[static_cast<std::size_t>(m)] = elements;
        receives = true;
      }
    }
    if (const int dst = src_dst[static_cast<std::size_t>(me)]; dst >= 0) {
      send_counts[static_cast<std::size_t>(dst)] = elements;
    }
    Buffer send = with_layout(input_buffer(input), input.sizes());
    if (std::all_of(send_counts.begin(), send_counts.end(),
                    [](std::size_t count) { return count == 0; })) {
      send.count = 0;
    }
    output = allocate_output(call, rule.shape, input.dtype(), input.device(), [&] {
      return receives ? Tensor::empty(rule.shape, input.dtype(), input.device())
                      : Tensor::zeros(rule.shape, input.dtype(), input.device());
    });
    Buffer recv = buffer_of(output);
    if (!receives) {
      recv.count = 0;
    }
    transport::Comm& comm = call.start(output);
    call.register_work(
        [&] { return comm.all_to_all(send, send_counts, recv, recv_counts, call.info()); });
  }
  call.trace(output, [&](OpRecord& record) {
    describe_input(record, input);
    record.src_dst = src_dst;
  });
  return output;
}

// ---- In-place forms: the functional collective, landed in the caller's tensor before return.

Tensor& all_reduce_inplace(Tensor& tensor, ReduceOp reduce_op, const GroupSpec& group,
                           std::string_view tag, CallSite site) {
  Call call("all_reduce_inplace", group, tag, site);
  call.check_input(tensor, OpKind::AllReduce, &reduce_op, {"tensor"});
  call.check_writable(tensor, "tensor");
  if (!call.meta()) {
    const auto& storage = TensorAccess::storage(tensor);
    if (tensor.is_contiguous() && storage->made_by(call.registry())) {
      // Truly in place: one buffer is both send and recv, as NCCL allows. Only into a storage
      // this rank made: another rank's (or one made outside the ranks) is staged like a strided
      // tensor, so works of two ranks never sit on one storage (Note [Pending storage]).
      wait_tensor(tensor);
      if (tensor.dtype() == DType::Bool && tensor.device().is_cpu()) {
        canonicalize_bool_bytes(tensor);  // the result overwrites it (Note [Bool bytes])
      }
      const Buffer buffer = with_layout(buffer_of(tensor), tensor.sizes());
      transport::Comm& comm = call.start(tensor);
      call.register_work([&] {
        return comm.all_reduce(buffer, buffer, wire_reduce_op(tensor.dtype(), reduce_op),
                               call.info());
      });
      wait_tensor(tensor);
    } else {
      tensor.copy_(issue_all_reduce(call, tensor, reduce_op));  // waits for the result
    }
  }
  call.trace(tensor, [&](OpRecord& record) {
    record.reduce_op = reduce_op;
    describe_input(record, tensor);
  });
  return tensor;
}

Tensor& all_gather_tensor_inplace(Tensor& output, const Tensor& input, const GroupSpec& group,
                                  std::string_view tag, std::int64_t gather_dim, CallSite site) {
  Call call("all_gather_tensor_inplace", group, tag, site);
  call.check_input(input, OpKind::AllGather, nullptr);
  const ShapeRule rule =
      call.checked(detail::all_gather_rule(input.sizes(), gather_dim, call.group_size()));
  call.check_output(output, rule.shape, input.dtype());
  if (!call.meta()) {
    output.copy_(issue_all_gather(call, input, rule));  // waits for the result
  }
  call.trace(output, [&](OpRecord& record) {
    describe_input(record, input);
    record.dims = {rule.dim};
  });
  return output;
}

Tensor& reduce_scatter_tensor_inplace(Tensor& output, const Tensor& input, ReduceOp reduce_op,
                                      const GroupSpec& group, std::int64_t scatter_dim,
                                      std::string_view tag, CallSite site) {
  Call call("reduce_scatter_tensor_inplace", group, tag, site);
  call.check_input(input, OpKind::ReduceScatter, &reduce_op);
  const ShapeRule rule =
      call.checked(detail::reduce_scatter_rule(input.sizes(), scatter_dim, call.group_size()));
  call.check_output(output, rule.shape, input.dtype());
  if (!call.meta()) {
    output.copy_(issue_reduce_scatter(call, input, reduce_op, rule));
  }
  call.trace(output, [&](OpRecord& record) {
    record.reduce_op = reduce_op;
    describe_input(record, input);
    record.dims = {rule.dim};
  });
  return output;
}

// The rank's deferred errors (Note [Work lifecycle], step 3), raised at explicit waits too:
// after the wait's own works, so another work's error never leaves the wait undone (a caller
// that catches it would hold a tensor still pending, and all_reduce_inplace would return with
// its own collective in flight).
void settle_calling_rank() {
  if (RankContext* context = RankContext::current()) {
    context->state().settle_unwaited();
  }
}

void wait_storage_of(const Tensor& tensor) {
  if (const auto& storage = TensorAccess::storage(tensor)) {
    storage->wait_ready();
  }
}

Tensor wait_tensor(const Tensor& tensor) {
  wait_storage_of(tensor);
  settle_calling_rank();
  return tensor;
}

std::vector<Tensor> wait_tensors(const std::vector<Tensor>& tensors) {
  // Group the pending storages by registry (normally all the calling rank's), so each distinct
  // work is waited once.
  std::map<detail::WorkRegistry*,
           std::pair<std::shared_ptr<detail::WorkRegistry>, std::vector<const detail::Storage*>>>
      by_registry;
  for (const Tensor& tensor : tensors) {
    const auto& storage = TensorAccess::storage(tensor);
    if (storage && storage->is_pending()) {
      if (std::shared_ptr<detail::WorkRegistry> registry = storage->registry()) {
        auto& [owner, storages] = by_registry[registry.get()];
        owner = registry;
        storages.push_back(storage.get());
      }
    }
  }
  std::exception_ptr first_error;
  for (auto& [key, group] : by_registry) {
    try {
      group.first->wait_storages(group.second);
    } catch (...) {
      if (!first_error) {
        first_error = std::current_exception();
      }
    }
  }
  if (!first_error) {
    for (const Tensor& tensor : tensors) {
      try {
        wait_storage_of(tensor);  // failures of works waited earlier
      } catch (...) {
        first_error = std::current_exception();
        break;
      }
    }
  }
  if (first_error) {
    std::rethrow_exception(detail::raised_by_calling_rank(first_error));
  }
  settle_calling_rank();
  return tensors;
}

std::size_t work_registry_size() {
  RankContext* context = RankContext::current();
  if (context == nullptr) {
    detail::throw_invalid("work_registry_size", "called outside a rank");
  }
  context->state().settle_unwaited();
  return context->state().registry()->size();
}

std::string unsupported_reduction(DType dtype, const ReduceOp& reduce_op, Device device) {
  RankContext* context = RankContext::current();
  if (context == nullptr) {
    detail::throw_invalid("unsupported_reduction", "called outside a rank");
  }
  if (std::string reason = reduce_op.check_dtype(dtype); !reason.empty()) {
    return reason;
  }
  if (device.is_meta()) {
    return {};  // traced, never communicated (chorus/trace.hpp)
  }
  // What Call::check_input asks, on the lowered dtype and op (Note [Lowering]).
  return context->state().transport().supports(OpKind::AllReduce, wire_dtype(dtype),
                                               wire_reduce_op(dtype, reduce_op), device);
}

}  // namespace chorus
