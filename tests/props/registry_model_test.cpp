// A stateful model test of the work registry and of async result handles (Note [Work lifecycle],
// Note [Pending storage], DESIGN 2.4/2.7) with RapidCheck's rc::state: RapidCheck generates
// sequences of commands (issue, view, wait, read, drop, finalize, address reuse, transport
// progress), runs each against one rank and against a small model of what the rank must show,
// and compares the two after every command. A failing sequence is shrunk to a minimal one.
//
// The system under test is one rank on the FakeTransport (tests/support/fake_transport.hpp),
// bound to the test's thread. Nothing completes on its own there, so every command is
// deterministic: a transport work completes only when a Progress command completes it, or when
// core waits for it (every fake work is armed with complete_when_waited, standing in for peers
// that keep going: a wait finishes at once, on this thread, without a timeout). A world of one
// rank is enough: the registry is per rank, and the fake's "copy send to receive" is exactly the
// result of every collective on a group of one. A simulator world would add scheduling choices
// that this model does not need.
//
// The model. Each issued collective is a ModelWork with one storage per output; handles (plain
// results, views of them, and fresh tensors that no collective wrote) point at a storage and
// carry the exact Int64 values a read must return. A work is *registered* from issue until it is
// retired by a wait through any route (wait_tensor, wait_tensors, a data access) or finalized
// after its last storage died. The model predicts, after every command:
//   - is_pending() of every handle: its work is registered (views share it, completion inside
//     the transport does not clear it);
//   - the registry's count of distinct registered works (a coalesced call counts 1); the public
//     work_registry_size() returns it whenever no deferred drop is outstanding (it settles those
//     first, so calling it then would be a Finalize command);
//   - per transport work: how often core reached FakeWork::wait (once, when the first completion
//     route found the work not completed by Progress yet; never again), on_dropped,
//     defer_finalization asked, on_finalized;
//   - the unwaited report: the works finalized after a drop, by op and sequence number;
//   - every value read, bitwise.
// After the last command the rank ends (RankContext::finish): deferred drops are reported as
// drops, the other registered works as pending at rank exit, and nothing stays pending.
// Drops follow Note [Work lifecycle] step 3: the last storage of a registered work dying
// finalizes it right there, unless its transport work asked to defer (Issue's `defer`); a
// deferred drop stays registered until the rank settles (its next collective, wait_tensor,
// wait_tensors, work_registry_size; not a data access), or the rank ends.
//
// The wrong-model tests run the same commands against models with one planted misconception
// each (Flaw) and expect RapidCheck to find a counterexample: proof that the checks are not
// vacuous.

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <chorus/collectives.hpp>
#include <chorus/runtime.hpp>
#include <chorus/tensor.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "detail/rank_state.hpp"
#include "detail/storage.hpp"
#include "detail/tensor_access.hpp"
#include "detail/work_registry.hpp"
#include "support/fake_transport.hpp"

namespace chorus {
namespace {

using testing::FakeTransport;
using testing::FakeWork;
using Values = std::vector<std::int64_t>;

constexpr std::uint64_t kRapidCheckSeed = 20261201;  // the seed ctest passes in RC_PARAMS too
constexpr std::size_t kHandlesMax = 48;              // keeps every case's state small
constexpr std::size_t kWorksMax = 64;

// ---- The model.

// A misconception planted in the model, for the tests that prove the checks can fail.
enum class Flaw {
  None,
  ViewsNeverPending,          // forgets that views share their storage's pending state
  CompletionRetires,          // believes completion inside the transport clears pending
  CoalescedCountsEachOutput,  // counts a coalesced work once per live output
  DataAccessSettles,          // believes a data access also finalizes deferred drops
};

enum class Op { AllReduce, AllGatherDim0, AllGatherDim1, AllReduceCoalesced };

const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduce:
      return "all_reduce";
    case Op::AllGatherDim0:
    case Op::AllGatherDim1:
      return "all_gather_tensor";
    case Op::AllReduceCoalesced:
      return "all_reduce_coalesced";
  }
  return "?";
}

std::string shape_text(const Shape& shape) {
  std::string text = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    text += (d > 0 ? "x" : "") + std::to_string(shape[d]);
  }
  return text + "]";
}

std::int64_t numel_of(const Shape& shape) {
  std::int64_t numel = 1;
  for (const std::int64_t size : shape) {
    numel *= size;
  }
  return numel;
}

// Exact inputs: distinct full-range Int64 values per (work or fresh tensor, output, element), so
// a read of the wrong storage, or of memory a collective never wrote, cannot pass.
Values exact_values(std::uint64_t salt, std::uint64_t output, std::int64_t numel) {
  Values values(static_cast<std::size_t>(numel));
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint64_t x = (salt << 24) ^ (output << 12) ^ (i + 1);
    x *= 0x9E3779B97F4A7C15ull;  // odd multiplier: a bijection, so values stay distinct
    values[i] = static_cast<std::int64_t>(x ^ (x >> 29));
  }
  return values;
}

struct ModelWork {
  Op op = Op::AllReduce;
  bool defer = false;                // its transport work asks core to defer a drop's finalization
  bool transport_completed = false;  // FakeWork::complete ran (Progress, or a wait reached it)
  bool transport_waited = false;     // core reached FakeWork::wait (at most once)
  bool registered = true;            // not yet retired (waited) or finalized
  bool dropped = false;              // every storage died while registered
  bool finalized = false;            // completed as unwaited after the drop: a report line
};

struct ModelHandle {
  int work = -1;  // -1: a fresh tensor no collective wrote (AddressReuse)
  int storage = 0;
  bool view = false;
  Shape shape;
  Values values;  // what a read returns, row-major
};

struct Model {
  Flaw flaw = Flaw::None;
  std::vector<ModelWork> works;            // index = sequence number on the rank's group {0}
  std::vector<ModelHandle> handles;        // in the order the SUT holds them
  std::vector<std::size_t> storage_bytes;  // by model storage id
  std::size_t freed_bytes = 0;  // bytes of a storage the previous command destroyed (0: none)
  std::size_t reuse_bytes = 0;  // freed_bytes as the command being applied found it

  bool pending(const ModelHandle& handle) const {
    if (handle.work < 0) {
      return false;
    }
    if (flaw == Flaw::ViewsNeverPending && handle.view) {
      return false;
    }
    return works[static_cast<std::size_t>(handle.work)].registered;
  }

  bool has_handles(int work) const {
    return std::any_of(handles.begin(), handles.end(),
                       [work](const ModelHandle& h) { return h.work == work; });
  }
  bool storage_alive(int storage) const {
    return std::any_of(handles.begin(), handles.end(),
                       [storage](const ModelHandle& h) { return h.storage == storage; });
  }

  // Distinct registered works.
  std::size_t registered_count() const {
    std::size_t count = 0;
    for (std::size_t w = 0; w < works.size(); ++w) {
      if (!works[w].registered) {
        continue;
      }
      if (flaw == Flaw::CoalescedCountsEachOutput) {
        std::vector<int> live;
        for (const ModelHandle& h : handles) {
          if (h.work == static_cast<int>(w) &&
              std::find(live.begin(), live.end(), h.storage) == live.end()) {
            live.push_back(h.storage);
          }
        }
        count += std::max<std::size_t>(1, live.size());
      } else {
        count += 1;
      }
    }
    return count;
  }

  bool deferred_outstanding() const {
    return std::any_of(works.begin(), works.end(),
                       [](const ModelWork& w) { return w.registered && w.dropped; });
  }

  // Core completes a registered work: it reaches the transport's wait only when the work has
  // not completed there yet.
  void complete(ModelWork& work) {
    if (!work.transport_completed) {
      work.transport_waited = true;
      work.transport_completed = true;
    }
  }
  // A wait through any route.
  void retire(int work_index) {
    if (work_index < 0) {
      return;
    }
    ModelWork& work = works[static_cast<std::size_t>(work_index)];
    if (work.registered) {
      complete(work);
      work.registered = false;
    }
  }
  void finalize(ModelWork& work) {
    complete(work);
    work.registered = false;
    work.finalized = true;
  }
  // RankState::settle_unwaited: every deferred drop is finalized.
  void settle() {
    for (ModelWork& work : works) {
      if (work.registered && work.dropped) {
        finalize(work);
      }
    }
  }
  // Drops handle `index` (Note [Work lifecycle], step 3).
  void drop(std::size_t index) {
    const ModelHandle handle = handles[index];
    handles.erase(handles.begin() + static_cast<std::ptrdiff_t>(index));
    if (storage_alive(handle.storage)) {
      return;  // another handle shares the storage
    }
    freed_bytes = storage_bytes[static_cast<std::size_t>(handle.storage)];
    if (handle.work < 0 || has_handles(handle.work)) {
      return;  // a fresh tensor, or the work still has a live output
    }
    ModelWork& work = works[static_cast<std::size_t>(handle.work)];
    if (!work.registered) {
      return;  // waited already: nothing pending to drop
    }
    work.dropped = true;
    if (!work.defer) {
      finalize(work);
    }
  }

  int new_storage(std::int64_t numel) {
    storage_bytes.push_back(static_cast<std::size_t>(numel) * sizeof(std::int64_t));
    return static_cast<int>(storage_bytes.size() - 1);
  }
};

// ---- The system under test.

// What the commands did across every case of a run, for the coverage test.
struct Stats {
  std::map<std::string, int> runs;  // by command name
  int address_reuses = 0;           // fresh tensors that got the freed address back
  int deferred_finalizations = 0;   // deferred drops a settle finalized
  int waits_after_progress = 0;     // waits of a work Progress had completed
};

struct Sut {
  explicit Sut(Stats& stats_in) : stats(stats_in) {}

  detail::WorkRegistry& registry() { return *context.state().registry(); }
  std::shared_ptr<FakeWork> work(int index) {
    return transport->works().at(static_cast<std::size_t>(index));
  }

  Stats& stats;
  std::shared_ptr<FakeTransport> transport = std::make_shared<FakeTransport>();
  RankContext context{transport};
  ScopedRankBinding binding{&context};
  std::vector<Tensor> handles;          // declared last: they go before the rank does
  const void* freed_address = nullptr;  // storage the last Drop destroyed
  Model model;                          // the model after the latest command
};

std::string handle_text(const Model& model, std::size_t index) {
  const ModelHandle& h = model.handles[index];
  std::ostringstream out;
  out << "handle " << index << " (" << (h.work < 0 ? "fresh" : "work " + std::to_string(h.work))
      << (h.view ? ", view " : ", plain ") << shape_text(h.shape) << ")";
  return out.str();
}

// Compares the rank with `model` (see the file comment for what is checked).
void verify(const Model& model, Sut& sut) {
  RC_ASSERT(sut.handles.size() == model.handles.size());
  std::map<int, std::size_t> first_of_storage;
  for (std::size_t i = 0; i < model.handles.size(); ++i) {
    const Tensor& t = sut.handles[i];
    const ModelHandle& h = model.handles[i];
    if (t.is_pending() != model.pending(h)) {
      RC_FAIL(handle_text(model, i) + ": is_pending() is " + (t.is_pending() ? "true" : "false") +
              ", the model says " + (model.pending(h) ? "true" : "false"));
    }
    RC_ASSERT(t.sizes() == h.shape);
    const auto [it, inserted] = first_of_storage.emplace(h.storage, i);
    if (!inserted) {
      RC_ASSERT(t.shares_storage(sut.handles[it->second]));
    }
  }
  const std::size_t expected = model.registered_count();
  const std::size_t registered = sut.registry().size();  // does not settle deferred drops
  if (registered != expected) {
    RC_FAIL("the registry holds " + std::to_string(registered) + " works, the model says " +
            std::to_string(expected));
  }
  if (!model.deferred_outstanding()) {
    // Settling has nothing to do, so the public count is a pure observation here.
    const std::size_t size = work_registry_size();
    if (size != expected) {
      RC_FAIL("work_registry_size() is " + std::to_string(size) + ", the model says " +
              std::to_string(expected));
    }
  }
  const std::vector<std::shared_ptr<FakeWork>> fakes = sut.transport->works();
  RC_ASSERT(fakes.size() == model.works.size());
  std::vector<std::pair<std::int64_t, std::string>> expected_report;
  for (std::size_t w = 0; w < model.works.size(); ++w) {
    const ModelWork& mw = model.works[w];
    const FakeWork& fake = *fakes[w];
    const std::string which = "work " + std::to_string(w) + " (" + op_name(mw.op) + ")";
    if (fake.waits() != (mw.transport_waited ? 1 : 0)) {
      RC_FAIL(which + ": core reached the transport's wait " + std::to_string(fake.waits()) +
              " times, the model says " + (mw.transport_waited ? "1" : "0"));
    }
    RC_ASSERT((fake.status() != transport::WorkStatus::Pending) == mw.transport_completed);
    if (fake.drops() != (mw.dropped ? 1 : 0) || fake.defer_asked() != (mw.dropped ? 1 : 0)) {
      RC_FAIL(which + ": on_dropped " + std::to_string(fake.drops()) + ", defer asked " +
              std::to_string(fake.defer_asked()) + ", the model says " +
              (mw.dropped ? "1, 1" : "0, 0"));
    }
    if (fake.finalizations() != (mw.finalized ? 1 : 0)) {
      RC_FAIL(which + ": on_finalized " + std::to_string(fake.finalizations()) +
              " times, the model says " + (mw.finalized ? "1" : "0"));
    }
    if (mw.finalized) {
      expected_report.emplace_back(static_cast<std::int64_t>(w), op_name(mw.op));
    }
  }
  // Deferred drops settle in the registry's map order: compare as sets, by sequence number.
  std::vector<std::pair<std::int64_t, std::string>> report;
  for (const UnwaitedWork& line : sut.registry().unwaited()) {
    RC_ASSERT(!line.at_rank_exit);
    RC_ASSERT(line.error.empty());
    report.emplace_back(line.seq, line.op);
  }
  std::sort(report.begin(), report.end());
  if (report != expected_report) {
    RC_FAIL("the unwaited report has " + std::to_string(report.size()) +
            " lines, the model expects " + std::to_string(expected_report.size()) +
            " (or other works)");
  }
}

// ---- Commands. (RC_PRE and RC_ASSERT capture their expression, so `&&` inside one does not
// short-circuit: every guard that protects an index is a separate RC_PRE.) Each draws its arguments
// from the model in its constructor (RC_PRE discards one that cannot apply), states its
// preconditions again in checkPreconditions (shrinking removes earlier commands), acts on the SUT
// in act(), and changes the model in update(). run() checks the whole model after every command.

using CommandBase = rc::state::Command<Model, Sut>;

class ModelCommand : public CommandBase {
 public:
  void apply(Model& model) const final {
    model.reuse_bytes = model.freed_bytes;
    model.freed_bytes = 0;  // only the command right after a drop may reuse its address
    update(model);
  }
  void run(const Model& before, Sut& sut) const final {
    ++sut.stats.runs[name()];
    act(before, sut);
    Model after = nextState(before);
    verify(after, sut);
    sut.model = std::move(after);
  }
  void show(std::ostream& out) const override { out << name(); }

 protected:
  virtual std::string name() const = 0;
  virtual void update(Model& model) const = 0;
  virtual void act(const Model& before, Sut& sut) const = 0;
};

std::size_t draw_handle(const Model& model) {
  RC_PRE(!model.handles.empty());
  return *rc::gen::inRange<std::size_t>(0, model.handles.size());
}

// A collective on the rank's group {0}: all_reduce, all_gather_tensor along dim 0 or 1, or
// all_reduce_coalesced of 1-3 tensors; 1-D or 2-D Int64 inputs of 1-8 elements.
class Issue final : public ModelCommand {
 public:
  Issue(Op op, std::vector<Shape> shapes, bool defer)
      : op_(op), shapes_(std::move(shapes)), defer_(defer) {}
  explicit Issue(const Model& model) {
    RC_PRE(model.works.size() < kWorksMax);
    RC_PRE(model.handles.size() < kHandlesMax);
    op_ = *rc::gen::element(Op::AllReduce, Op::AllGatherDim0, Op::AllGatherDim1,
                            Op::AllReduceCoalesced);
    const std::size_t count =
        op_ == Op::AllReduceCoalesced ? *rc::gen::inRange<std::size_t>(1, 4) : 1;
    for (std::size_t i = 0; i < count; ++i) {
      const bool two_d = op_ == Op::AllGatherDim1 || *rc::gen::arbitrary<bool>();
      if (two_d) {
        shapes_.push_back(
            {*rc::gen::inRange<std::int64_t>(1, 4), *rc::gen::inRange<std::int64_t>(1, 4)});
      } else {
        shapes_.push_back({*rc::gen::inRange<std::int64_t>(1, 9)});
      }
    }
    defer_ = *rc::gen::arbitrary<bool>();
  }

  void checkPreconditions(const Model& model) const override {
    RC_PRE(model.works.size() < kWorksMax);
    RC_PRE(model.handles.size() < kHandlesMax);
  }
  void show(std::ostream& out) const override {
    out << "Issue(" << op_name(op_) << (op_ == Op::AllGatherDim1 ? " dim 1" : "");
    for (const Shape& shape : shapes_) {
      out << " " << shape_text(shape);
    }
    out << (defer_ ? ", defers a drop)" : ")");
  }

 protected:
  std::string name() const override { return "Issue"; }
  void update(Model& model) const override {
    model.settle();  // every collective settles first
    const auto seq = static_cast<std::uint64_t>(model.works.size());
    model.works.push_back(ModelWork{op_, defer_});
    for (std::size_t j = 0; j < shapes_.size(); ++j) {
      // A group of one: every op's result is its input (all_gather: one block along its dim).
      const std::int64_t numel = numel_of(shapes_[j]);
      model.handles.push_back(ModelHandle{static_cast<int>(seq), model.new_storage(numel), false,
                                          shapes_[j], exact_values(seq, j, numel)});
    }
  }
  void act(const Model& before, Sut& sut) const override {
    const auto seq = static_cast<std::uint64_t>(before.works.size());
    std::vector<Tensor> inputs;
    for (std::size_t j = 0; j < shapes_.size(); ++j) {
      inputs.push_back(Tensor::from_vector(exact_values(seq, j, numel_of(shapes_[j])), shapes_[j]));
    }
    std::vector<Tensor> outputs;
    switch (op_) {
      case Op::AllReduce:
        outputs.push_back(all_reduce(inputs[0], "sum", {0}));
        break;
      case Op::AllGatherDim0:
        outputs.push_back(all_gather_tensor(inputs[0], 0, {0}));
        break;
      case Op::AllGatherDim1:
        outputs.push_back(all_gather_tensor(inputs[0], 1, {0}));
        break;
      case Op::AllReduceCoalesced:
        outputs = all_reduce_coalesced(inputs, "sum", {0});
        break;
    }
    const std::shared_ptr<FakeWork> fake = sut.transport->last_work();
    fake->complete_when_waited();  // peers that keep going: a wait completes it at once
    if (defer_) {
      fake->defer_finalization_when_dropped();
    }
    for (Tensor& output : outputs) {
      sut.handles.push_back(std::move(output));
    }
  }

 private:
  Op op_ = Op::AllReduce;
  std::vector<Shape> shapes_;
  bool defer_ = false;
};

// A view of a held handle: narrow along dim 0, flatten, or a 2-D reshape. Never waits.
class View final : public ModelCommand {
 public:
  enum class Kind { Narrow, Flatten, Reshape };
  View(std::size_t handle, Kind kind, std::int64_t a, std::int64_t b)
      : handle_(handle), kind_(kind), a_(a), b_(b) {}
  explicit View(const Model& model) : handle_(draw_handle(model)) {
    RC_PRE(model.handles.size() < kHandlesMax);
    const Shape& shape = model.handles[handle_].shape;
    const std::int64_t numel = numel_of(shape);
    kind_ = *rc::gen::element(Kind::Narrow, Kind::Flatten, Kind::Reshape);
    if (kind_ == Kind::Narrow) {
      a_ = *rc::gen::inRange<std::int64_t>(0, shape[0]);
      b_ = *rc::gen::inRange<std::int64_t>(1, shape[0] - a_ + 1);
    } else if (kind_ == Kind::Reshape) {
      std::vector<std::int64_t> divisors;
      for (std::int64_t d = 1; d <= numel; ++d) {
        if (numel % d == 0) {
          divisors.push_back(d);
        }
      }
      a_ = *rc::gen::elementOf(divisors);
    }
  }

  void checkPreconditions(const Model& model) const override {
    RC_PRE(handle_ < model.handles.size());
    RC_PRE(model.handles.size() < kHandlesMax);
    const Shape& shape = model.handles[handle_].shape;
    if (kind_ == Kind::Narrow) {
      RC_PRE(a_ >= 0);
      RC_PRE(b_ >= 1);
      RC_PRE(a_ + b_ <= shape[0]);
    } else if (kind_ == Kind::Reshape) {
      RC_PRE(numel_of(shape) % a_ == 0);
    }
  }
  void show(std::ostream& out) const override {
    out << "View(handle " << handle_ << ", ";
    switch (kind_) {
      case Kind::Narrow:
        out << "narrow(0, " << a_ << ", " << b_ << "))";
        break;
      case Kind::Flatten:
        out << "flatten)";
        break;
      case Kind::Reshape:
        out << "view(" << a_ << ", -1))";
        break;
    }
  }

 protected:
  std::string name() const override { return "View"; }
  void update(Model& model) const override {
    ModelHandle view = model.handles[handle_];
    view.view = true;
    const std::int64_t numel = numel_of(view.shape);
    switch (kind_) {
      case Kind::Narrow: {
        const std::int64_t row = numel / view.shape[0];
        view.values = Values(view.values.begin() + a_ * row, view.values.begin() + (a_ + b_) * row);
        view.shape[0] = b_;
        break;
      }
      case Kind::Flatten:
        view.shape = {numel};
        break;
      case Kind::Reshape:
        view.shape = {a_, numel / a_};
        break;
    }
    model.handles.push_back(std::move(view));
  }
  void act(const Model& before, Sut& sut) const override {
    const Tensor& base = sut.handles[handle_];
    const Shape& shape = before.handles[handle_].shape;
    switch (kind_) {
      case Kind::Narrow:
        sut.handles.push_back(base.narrow(0, a_, b_));
        break;
      case Kind::Flatten:
        sut.handles.push_back(base.flatten());
        break;
      case Kind::Reshape:
        sut.handles.push_back(base.view({a_, numel_of(shape) / a_}));
        break;
    }
  }

 private:
  std::size_t handle_ = 0;
  Kind kind_ = Kind::Flatten;
  std::int64_t a_ = 0;
  std::int64_t b_ = 0;
};

// wait_tensor on a held handle: a plain tensor (Wait) or a view (WaitView).
template <bool kOnView>
class WaitOne final : public ModelCommand {
 public:
  explicit WaitOne(std::size_t handle) : handle_(handle) {}
  explicit WaitOne(const Model& model) {
    std::vector<std::size_t> candidates;
    for (std::size_t i = 0; i < model.handles.size(); ++i) {
      if (model.handles[i].view == kOnView) {
        candidates.push_back(i);
      }
    }
    RC_PRE(!candidates.empty());
    handle_ = *rc::gen::elementOf(candidates);
  }

  void checkPreconditions(const Model& model) const override {
    RC_PRE(handle_ < model.handles.size());
    RC_PRE(model.handles[handle_].view == kOnView);
  }
  void show(std::ostream& out) const override { out << name() << "(handle " << handle_ << ")"; }

 protected:
  std::string name() const override { return kOnView ? "WaitView" : "Wait"; }
  void update(Model& model) const override {
    model.settle();
    model.retire(model.handles[handle_].work);
  }
  void act(const Model& before, Sut& sut) const override {
    const ModelHandle& h = before.handles[handle_];
    if (h.work >= 0 && before.works[static_cast<std::size_t>(h.work)].registered &&
        before.works[static_cast<std::size_t>(h.work)].transport_completed) {
      ++sut.stats.waits_after_progress;
    }
    const Tensor waited = wait_tensor(sut.handles[handle_]);
    RC_ASSERT(waited.shares_storage(sut.handles[handle_]));
    RC_ASSERT(waited.sizes() == h.shape);
    RC_ASSERT(waited.storage_offset() == sut.handles[handle_].storage_offset());
  }

 private:
  std::size_t handle_ = 0;
};
using Wait = WaitOne<false>;
using WaitView = WaitOne<true>;

// wait_tensors on 1-4 held handles (repeats, views and fresh tensors allowed).
class WaitTensors final : public ModelCommand {
 public:
  explicit WaitTensors(std::vector<std::size_t> handles) : handles_(std::move(handles)) {}
  explicit WaitTensors(const Model& model) {
    RC_PRE(!model.handles.empty());
    const std::size_t count = *rc::gen::inRange<std::size_t>(1, 5);
    for (std::size_t i = 0; i < count; ++i) {
      handles_.push_back(*rc::gen::inRange<std::size_t>(0, model.handles.size()));
    }
  }

  void checkPreconditions(const Model& model) const override {
    RC_PRE(!handles_.empty());
    for (const std::size_t h : handles_) {
      RC_PRE(h < model.handles.size());
    }
  }
  void show(std::ostream& out) const override {
    out << "WaitTensors(handles";
    for (const std::size_t h : handles_) {
      out << " " << h;
    }
    out << ")";
  }

 protected:
  std::string name() const override { return "WaitTensors"; }
  void update(Model& model) const override {
    model.settle();
    for (const std::size_t h : handles_) {
      model.retire(model.handles[h].work);
    }
  }
  void act(const Model& /*before*/, Sut& sut) const override {
    std::vector<Tensor> tensors;
    for (const std::size_t h : handles_) {
      tensors.push_back(sut.handles[h]);
    }
    const std::vector<Tensor> returned = wait_tensors(tensors);
    RC_ASSERT(returned.size() == tensors.size());
    for (std::size_t i = 0; i < returned.size(); ++i) {
      RC_ASSERT(returned[i].shares_storage(tensors[i]));
    }
  }

 private:
  std::vector<std::size_t> handles_;
};

// A data access: to_vector or data_ptr of a held handle. Waits; the values must be exact.
class Read final : public ModelCommand {
 public:
  Read(std::size_t handle, bool via_data_ptr) : handle_(handle), via_data_ptr_(via_data_ptr) {}
  explicit Read(const Model& model)
      : handle_(draw_handle(model)), via_data_ptr_(*rc::gen::arbitrary<bool>()) {}

  void checkPreconditions(const Model& model) const override {
    RC_PRE(handle_ < model.handles.size());
  }
  void show(std::ostream& out) const override {
    out << "Read(handle " << handle_ << (via_data_ptr_ ? ", data_ptr)" : ", to_vector)");
  }

 protected:
  std::string name() const override { return "Read"; }
  void update(Model& model) const override {
    if (model.flaw == Flaw::DataAccessSettles) {
      model.settle();
    }
    model.retire(model.handles[handle_].work);
  }
  void act(const Model& before, Sut& sut) const override {
    const Tensor& t = sut.handles[handle_];
    Values seen;
    if (via_data_ptr_) {
      RC_ASSERT(t.is_contiguous());  // every handle here is
      const std::int64_t* data = t.data_ptr<std::int64_t>();
      seen.assign(data, data + t.numel());
    } else {
      seen = t.to_vector<std::int64_t>();
    }
    const Values& expected = before.handles[handle_].values;
    if (seen.size() != expected.size() ||
        std::memcmp(seen.data(), expected.data(), seen.size() * sizeof(std::int64_t)) != 0) {
      RC_FAIL(handle_text(before, handle_) + ": read values that differ from the exact result");
    }
  }

 private:
  std::size_t handle_ = 0;
  bool via_data_ptr_ = false;
};

// The storage base address of `t`, remembered when a drop destroys the storage.
const void* storage_address(const Tensor& t) { return detail::TensorAccess::storage(t)->data(); }

// Drops one held handle. When it was the last handle of its storage the storage dies; when that
// was the work's last storage, the work is finalized or its finalization deferred.
class Drop final : public ModelCommand {
 public:
  explicit Drop(std::size_t handle) : handle_(handle) {}
  explicit Drop(const Model& model) : handle_(draw_handle(model)) {}

  void checkPreconditions(const Model& model) const override {
    RC_PRE(handle_ < model.handles.size());
  }
  void show(std::ostream& out) const override { out << "Drop(handle " << handle_ << ")"; }

 protected:
  std::string name() const override { return "Drop"; }
  void update(Model& model) const override { model.drop(handle_); }
  void act(const Model& /*before*/, Sut& sut) const override {
    const void* address = storage_address(sut.handles[handle_]);
    sut.handles.erase(sut.handles.begin() + static_cast<std::ptrdiff_t>(handle_));
    sut.freed_address = address;  // used only when the model says the storage died
  }

 private:
  std::size_t handle_ = 0;
};

// Drops every handle of one work, the one at the highest index first, so the last handle to its
// tensors goes last.
class DropLast final : public ModelCommand {
 public:
  explicit DropLast(int work) : work_(work) {}
  explicit DropLast(const Model& model) {
    std::vector<int> works;
    for (const ModelHandle& h : model.handles) {
      if (h.work >= 0 && std::find(works.begin(), works.end(), h.work) == works.end()) {
        works.push_back(h.work);
      }
    }
    RC_PRE(!works.empty());
    work_ = *rc::gen::elementOf(works);
  }

  void checkPreconditions(const Model& model) const override { RC_PRE(model.has_handles(work_)); }
  void show(std::ostream& out) const override { out << "DropLast(work " << work_ << ")"; }

 protected:
  std::string name() const override { return "DropLast"; }
  void update(Model& model) const override {
    for (std::size_t i = model.handles.size(); i-- > 0;) {
      if (model.handles[i].work == work_) {
        model.drop(i);
      }
    }
  }
  void act(const Model& before, Sut& sut) const override {
    for (std::size_t i = before.handles.size(); i-- > 0;) {
      if (before.handles[i].work == work_) {
        sut.freed_address = storage_address(sut.handles[i]);
        sut.handles.erase(sut.handles.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  }

 private:
  int work_ = 0;
};

// Right after a drop destroyed a storage: a fresh tensor of the same byte size, which the rank's
// pool may place at the freed address. It is a different storage: never pending, its own values.
class AddressReuse final : public ModelCommand {
 public:
  AddressReuse() = default;
  explicit AddressReuse(const Model& model) { RC_PRE(model.freed_bytes > 0); }

  void checkPreconditions(const Model& model) const override {
    RC_PRE(model.freed_bytes > 0);
    RC_PRE(model.handles.size() < kHandlesMax);
  }

 protected:
  std::string name() const override { return "AddressReuse"; }
  void update(Model& model) const override {
    const auto numel = static_cast<std::int64_t>(model.reuse_bytes / sizeof(std::int64_t));
    const int storage = model.new_storage(numel);
    model.handles.push_back(ModelHandle{-1, storage, false, {numel}, fresh_values(storage, numel)});
  }
  void act(const Model& before, Sut& sut) const override {
    const auto numel = static_cast<std::int64_t>(before.freed_bytes / sizeof(std::int64_t));
    const auto storage = static_cast<int>(before.storage_bytes.size());
    Tensor fresh = Tensor::from_vector(fresh_values(storage, numel));
    if (storage_address(fresh) == sut.freed_address) {
      ++sut.stats.address_reuses;
    }
    sut.handles.push_back(std::move(fresh));
  }

 private:
  static Values fresh_values(int storage, std::int64_t numel) {
    return exact_values(0xF00000u + static_cast<std::uint64_t>(storage), 0, numel);
  }
};

// Completes one transport work (the oldest incomplete one, or a chosen one). Nothing is waited:
// every handle stays pending and the registry keeps the work.
class Progress final : public ModelCommand {
 public:
  explicit Progress(int work) : work_(work) {}
  explicit Progress(const Model& model) {
    std::vector<int> incomplete;
    for (std::size_t w = 0; w < model.works.size(); ++w) {
      if (!model.works[w].transport_completed) {
        incomplete.push_back(static_cast<int>(w));
      }
    }
    RC_PRE(!incomplete.empty());
    work_ = *rc::gen::arbitrary<bool>() ? incomplete.front() : *rc::gen::elementOf(incomplete);
  }

  void checkPreconditions(const Model& model) const override {
    RC_PRE(work_ >= 0);
    RC_PRE(static_cast<std::size_t>(work_) < model.works.size());
    RC_PRE(!model.works[static_cast<std::size_t>(work_)].transport_completed);
  }
  void show(std::ostream& out) const override { out << "Progress(work " << work_ << ")"; }

 protected:
  std::string name() const override { return "Progress"; }
  void update(Model& model) const override {
    ModelWork& work = model.works[static_cast<std::size_t>(work_)];
    work.transport_completed = true;
    if (model.flaw == Flaw::CompletionRetires) {
      work.registered = false;
    }
  }
  void act(const Model& /*before*/, Sut& sut) const override { sut.work(work_)->complete(); }

 private:
  int work_ = 0;
};

// Settles the rank: work_registry_size() (whose count must match), or wait_tensor on an
// undefined tensor. Either finalizes every deferred drop.
class Finalize final : public ModelCommand {
 public:
  explicit Finalize(bool via_size) : via_size_(via_size) {}
  explicit Finalize(const Model& /*model*/) : via_size_(*rc::gen::arbitrary<bool>()) {}

  void show(std::ostream& out) const override {
    out << (via_size_ ? "Finalize(work_registry_size)" : "Finalize(wait_tensor(Tensor()))");
  }

 protected:
  std::string name() const override { return "Finalize"; }
  void update(Model& model) const override { model.settle(); }
  void act(const Model& before, Sut& sut) const override {
    sut.stats.deferred_finalizations += static_cast<int>(
        std::count_if(before.works.begin(), before.works.end(),
                      [](const ModelWork& w) { return w.registered && w.dropped; }));
    if (via_size_) {
      const std::size_t size = work_registry_size();
      const std::size_t expected = nextState(before).registered_count();
      if (size != expected) {
        RC_FAIL("work_registry_size() is " + std::to_string(size) + ", the model says " +
                std::to_string(expected));
      }
    } else {
      (void)wait_tensor(Tensor());
    }
  }

 private:
  bool via_size_ = false;
};

// Every command; Issue twice, so that sequences hold enough works.
const auto kCommands =
    rc::state::gen::execOneOfWithArgs<Issue, Issue, View, Wait, WaitView, WaitTensors, Read, Drop,
                                      DropLast, AddressReuse, Progress, Finalize>();

// One generated sequence against a fresh rank, then the rank's end: every work still registered
// is completed and reported (deferred drops as drops, the rest at rank exit), nothing stays
// pending.
void check_sequence(Flaw flaw, Stats& stats) {
  Sut sut(stats);
  Model initial;
  initial.flaw = flaw;
  sut.model = initial;
  rc::state::check(initial, sut, kCommands);
  const Model& model = sut.model;
  std::size_t dropped = 0;
  std::size_t at_exit = 0;
  for (const ModelWork& work : model.works) {
    dropped += work.finalized || (work.registered && work.dropped) ? 1 : 0;
    at_exit += work.registered && !work.dropped ? 1 : 0;
  }
  const RankContext::Summary summary = sut.context.finish();
  RC_ASSERT(summary.error == nullptr);
  RC_ASSERT(summary.unwaited.size() == dropped + at_exit);
  const auto exits = std::count_if(summary.unwaited.begin(), summary.unwaited.end(),
                                   [](const UnwaitedWork& line) { return line.at_rank_exit; });
  RC_ASSERT(static_cast<std::size_t>(exits) == at_exit);
  RC_ASSERT(sut.registry().size() == 0u);
  for (const Tensor& t : sut.handles) {
    RC_ASSERT(!t.is_pending());
  }
}

RC_GTEST_PROP(RegistryModel, EveryCommandSequenceMatchesTheModel, ()) {
  Stats stats;
  check_sequence(Flaw::None, stats);
}

// ---- The model machinery checked directly.

// Runs the property over `cases` sequences with a fixed seed, quietly.
class QuietListener final : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription& /*description*/) override {}
  void onShrinkTried(const rc::detail::CaseDescription& /*shrink*/, bool /*accepted*/) override {}
  void onTestFinished(const rc::detail::TestMetadata& /*metadata*/,
                      const rc::detail::TestResult& /*result*/) override {}
};

rc::detail::TestResult check_model(Flaw flaw, Stats& stats, int cases = 100) {
  rc::detail::TestParams params;
  params.seed = kRapidCheckSeed;
  params.maxSuccess = cases;
  rc::detail::TestMetadata metadata;
  metadata.id = "RegistryModel";
  metadata.description = metadata.id;
  QuietListener listener;
  return rc::detail::checkTestable([&] { check_sequence(flaw, stats); }, metadata, params,
                                   listener);
}

std::string result_text(const rc::detail::TestResult& result) {
  std::ostringstream out;
  rc::detail::printResultMessage(result, out);
  return out.str();
}

// The counterexample's commands, one per line of its shown value.
std::size_t counterexample_commands(const rc::detail::FailureResult& failure) {
  std::size_t commands = 0;
  for (const auto& [type, value] : failure.counterExample) {
    commands += static_cast<std::size_t>(std::count(value.begin(), value.end(), '\n'));
  }
  return commands;
}

TEST(RegistryModel, GeneratedSequencesReachEveryCommandAndEveryPath) {
  Stats stats;
  const rc::detail::TestResult result = check_model(Flaw::None, stats);
  ASSERT_TRUE(result.is<rc::detail::SuccessResult>()) << result_text(result);
  int total = 0;
  for (const auto& [command, runs] : stats.runs) {
    std::cout << command << ": " << runs << "\n";
    total += runs;
  }
  std::cout << "commands: " << total << ", address reuses: " << stats.address_reuses
            << ", deferred drops finalized by Finalize: " << stats.deferred_finalizations
            << ", waits after Progress: " << stats.waits_after_progress << "\n";
  for (const char* command : {"Issue", "View", "Wait", "WaitView", "WaitTensors", "Read", "Drop",
                              "DropLast", "AddressReuse", "Progress", "Finalize"}) {
    EXPECT_GE(stats.runs[command], 20) << command;
  }
  EXPECT_GT(stats.address_reuses, 0) << "the pool never handed a freed address back";
  EXPECT_GT(stats.deferred_finalizations, 0);
  EXPECT_GT(stats.waits_after_progress, 0);
}

struct FlawCase {
  Flaw flaw;
  const char* name;
  const char* symptom;       // in the failure's description
  std::size_t commands_max;  // the shrunk counterexample's length, hand-minimal + slack
};

// Names the case in test listings (gtest would print its bytes, pointers included).
void PrintTo(const FlawCase& flaw, std::ostream* out) { *out << flaw.name; }

class RegistryModelWrong : public ::testing::TestWithParam<FlawCase> {};

TEST_P(RegistryModelWrong, IsCaughtAndShrunk) {
  const FlawCase& flaw = GetParam();
  Stats stats;
  const rc::detail::TestResult result = check_model(flaw.flaw, stats);
  ASSERT_TRUE(result.is<rc::detail::FailureResult>()) << result_text(result);
  const auto& failure = result.get<rc::detail::FailureResult>();
  EXPECT_NE(failure.description.find(flaw.symptom), std::string::npos) << result_text(result);
  EXPECT_LE(counterexample_commands(failure), flaw.commands_max) << result_text(result);
}

// Hand-minimal counterexamples: Issue + View; Issue + Progress; Issue(coalesced of 2); Issue
// (defers) + Issue + DropLast + Read.
std::string flaw_name(const ::testing::TestParamInfo<FlawCase>& param) { return param.param.name; }

INSTANTIATE_TEST_SUITE_P(
    PlantedMisconceptions, RegistryModelWrong,
    ::testing::Values(FlawCase{Flaw::ViewsNeverPending, "ViewsNeverPending", "is_pending()", 2},
                      FlawCase{Flaw::CompletionRetires, "CompletionRetires", "is_pending()", 2},
                      FlawCase{Flaw::CoalescedCountsEachOutput, "CoalescedCountsEachOutput",
                               "the registry holds", 1},
                      FlawCase{Flaw::DataAccessSettles, "DataAccessSettles", "the registry holds",
                               4}),
    flaw_name);

}  // namespace
}  // namespace chorus
