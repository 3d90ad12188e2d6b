// Store (the request building and error mapping shared by every client), Deadline, PrefixStore
// and Rendezvous. The wire lives in protocol.cpp, the connection in client.cpp.

#include <algorithm>
#include <chorus/check.hpp>
#include <chorus/error.hpp>
#include <chorus/store/store.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol.hpp"

namespace chorus::store {
namespace {

using detail::error_context;
using detail::make_request;
using detail::ok_number;
using detail::ok_value;
using detail::Op;
using detail::refusal;
using detail::Request;
using detail::Response;
using detail::Status;

// The time a Rendezvous call's counting out (Rendezvous::finish) has at least, whatever is left
// of the call's deadline: a few round trips to a live server take milliseconds; this only bounds
// the wait on a server that stopped answering.
constexpr std::chrono::seconds kCountOutGrace{5};

ErrorContext context(Op op) { return error_context("store." + std::string(op_name(op))); }

// Turns a refusal into the matching chorus error.
void check(Op op, const Response& response) {
  switch (response.status) {
    case Status::Ok:
      return;
    case Status::Timeout:
      throw Timeout(context(op), response.message);
    case Status::Cancelled:
      throw Aborted(context(op), response.message);
    case Status::InvalidArgument:
      throw InvalidArgument(context(op), response.message);
    case Status::Refused:
      throw TransportError(context(op), response.message);
  }
  CHORUS_CHECK(false);
}

}  // namespace

Deadline::Clock::time_point Deadline::from_timeout(Clock::duration timeout) noexcept {
  return Clock::now() + timeout;
}

std::chrono::milliseconds Deadline::remaining() const noexcept {
  // Compared before subtracting: at_ may be time_point::min(), whose distance to now overflows.
  const Clock::time_point now = Clock::now();
  if (at_ <= now) {
    return std::chrono::milliseconds(0);
  }
  return std::chrono::ceil<std::chrono::milliseconds>(at_ - now);
}

Store::~Store() = default;

Response Store::forward(Store& store, Request& request, Deadline deadline) {
  return store.round_trip(request, deadline);
}

void Store::set(std::string_view key, std::string_view value, Deadline deadline) {
  Request request = make_request(Op::Set, {std::string(key)}, {std::string(value)});
  check(request.op, round_trip(request, deadline));
}

std::string Store::get(std::string_view key, Deadline deadline) {
  // The timeout on the wire is filled in by Client::round_trip, when the request is sent.
  Request request = make_request(Op::Get, {std::string(key)});
  Response response = round_trip(request, deadline);
  check(request.op, response);
  CHORUS_CHECK_EQ(response.values.size(), std::size_t{1});
  return std::move(response.values[0]);
}

std::int64_t Store::add(std::string_view key, std::int64_t delta, Deadline deadline) {
  Request request = make_request(Op::Add, {std::string(key)}, {}, delta);
  const Response response = round_trip(request, deadline);
  check(request.op, response);
  return response.number;
}

std::optional<std::string> Store::compare_set(std::string_view key, std::string_view expected,
                                              std::string_view desired, Deadline deadline) {
  Request request = make_request(Op::CompareSet, {std::string(key)},
                                 {std::string(expected), std::string(desired)});
  Response response = round_trip(request, deadline);
  check(request.op, response);
  if (response.values.empty()) {
    return std::nullopt;
  }
  return std::move(response.values[0]);
}

void Store::wait(const std::vector<std::string>& keys, Deadline deadline) {
  Request request = make_request(Op::Wait, keys);
  check(request.op, round_trip(request, deadline));
}

bool Store::delete_key(std::string_view key, Deadline deadline) {
  Request request = make_request(Op::DeleteKey, {std::string(key)});
  const Response response = round_trip(request, deadline);
  check(request.op, response);
  return response.number == 1;
}

std::int64_t Store::num_keys(Deadline deadline) {
  Request request = make_request(Op::NumKeys);
  const Response response = round_trip(request, deadline);
  check(request.op, response);
  return response.number;
}

std::vector<std::string> Store::multi_get(const std::vector<std::string>& keys, Deadline deadline) {
  Request request = make_request(Op::MultiGet, keys);
  Response response = round_trip(request, deadline);
  check(request.op, response);
  if (response.values.size() != keys.size()) {
    throw TransportError(context(request.op),
                         "the store answered " + std::to_string(response.values.size()) +
                             " values for " + std::to_string(keys.size()) + " keys");
  }
  return std::move(response.values);
}

void Store::multi_set(const std::vector<std::pair<std::string, std::string>>& items,
                      Deadline deadline) {
  Request request = make_request(Op::MultiSet);
  request.keys.reserve(items.size());
  request.values.reserve(items.size());
  for (const auto& [key, value] : items) {
    request.keys.push_back(key);
    request.values.push_back(value);
  }
  check(request.op, round_trip(request, deadline));
}

// ---------------------------------------------------------------------------------------------

PrefixStore::PrefixStore(std::string prefix, Store& base)
    : prefix_(std::move(prefix)), base_(base) {}

void PrefixStore::cancel() noexcept { base_.cancel(); }

Response PrefixStore::round_trip(Request& request, Deadline deadline) {
  for (std::string& key : request.keys) {
    key.insert(0, prefix_ + "/");
  }
  return forward(base_, request, deadline);
}

// ---------------------------------------------------------------------------------------------

Rendezvous::Rendezvous(Store& store, int rank, int world_size)
    : store_(store), rank_(rank), world_size_(world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InvalidArgument(error_context("store.rendezvous", rank),
                          "rank " + std::to_string(rank) + " is not in a world of size " +
                              std::to_string(world_size));
  }
}

std::string Rendezvous::next_name(std::string_view what) {
  return "chorus.rendezvous/" + std::to_string(calls_++) + "/" + std::string(what);
}

// Every rank counts itself out; the last one removes the call's keys, so repeated calls do not
// accumulate keys (the store has a key limit). Nobody reads them after counting out.
//
// The call's own deadline may be all but used up by then (a get or multi_get that got its
// answer just in time): the call succeeded, and the counting out must not fail it, nor leave
// the last rank's keys behind. So this housekeeping (an add, then deletes: non-blocking calls,
// answered at once by a live server) gets at least kCountOutGrace of its own.
void Rendezvous::finish(const std::string& name, std::vector<std::string> keys,
                        Deadline call_deadline) {
  const Deadline deadline(std::max(
      call_deadline.at(), Deadline::Clock::now() + Deadline::Clock::duration(kCountOutGrace)));
  const std::string done = name + "/done";
  const std::int64_t finished = store_.add(done, 1, deadline);
  // More ranks through the call than the world holds: the ranks disagree on the world size (or
  // another world shares these keys). Caller misuse, reported, not an abort.
  if (finished < 1 || finished > world_size_) {
    throw InvalidArgument(error_context("store.rendezvous", rank_),
                          "rank " + std::to_string(rank_) + " counted itself out of " + name +
                              " as number " + std::to_string(finished) + " of a world of " +
                              std::to_string(world_size_) +
                              ": the ranks disagree on the world size, or another world uses "
                              "the same store keys (give each world its own PrefixStore)");
  }
  if (finished == world_size_) {
    keys.push_back(done);
    for (const std::string& key : keys) {
      store_.delete_key(key, deadline);
    }
  }
}

std::string Rendezvous::broadcast_bytes(int root, std::string_view blob, Deadline deadline) {
  if (root < 0 || root >= world_size_) {
    throw InvalidArgument(error_context("store.broadcast_bytes", rank_),
                          "root " + std::to_string(root) + " is not in a world of size " +
                              std::to_string(world_size_));
  }
  const std::string name = next_name("broadcast");
  const std::string key = name + "/value";
  std::string result;
  if (rank_ == root) {
    store_.set(key, blob, deadline);
    result = std::string(blob);
  } else {
    result = store_.get(key, deadline);
  }
  finish(name, {key}, deadline);
  return result;
}

std::vector<std::string> Rendezvous::allgather_bytes(std::string_view blob, Deadline deadline) {
  const std::string name = next_name("allgather");
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) {
    keys.push_back(name + "/" + std::to_string(r));
  }
  store_.set(keys[static_cast<std::size_t>(rank_)], blob, deadline);
  std::vector<std::string> values = store_.multi_get(keys, deadline);
  CHORUS_CHECK_EQ(values.size(), keys.size());
  finish(name, std::move(keys), deadline);
  return values;
}

void Rendezvous::barrier(Deadline deadline) { pass_barrier(/*wait=*/true, deadline); }

// barrier() without the wait: the same keys, so the others' barrier of this number counts this
// rank in. Counting out at once is safe: 'done' reaches world_size only once every rank arrived
// (the others count out after 'released'), so whoever deletes the keys then, this rank
// included, deletes them after everyone is done with them.
void Rendezvous::arrive(Deadline deadline) { pass_barrier(/*wait=*/false, deadline); }

void Rendezvous::pass_barrier(bool wait, Deadline deadline) {
  const std::string name = next_name("barrier");
  const std::string arrived = name + "/arrived";
  const std::string released = name + "/released";
  if (store_.add(arrived, 1, deadline) == world_size_) {
    store_.set(released, "1", deadline);
  }
  if (wait) {
    store_.wait({released}, deadline);
  }
  finish(name, {arrived, released}, deadline);
}

// Note [Exit barrier]
// A rank that hosts the store (rank 0 under nccl::run, as torch's TCPStore under torchrun) must
// keep its server up until no other rank still talks to it. Rendezvous::barrier is not enough:
// it returns on a rank as soon as that rank counted itself out, while the other ranks may still
// be waiting for 'released', counting out or deleting keys; a server destroyed then closes their
// connections under those calls (TransportError "closed the connection (server gone?)" after a
// correct job). So after the barrier every rank but 0 makes one last call, set("left/<rank>"),
// and rank 0 waits for all of those keys before it returns. The server handles requests in
// order on one thread, and the handler that applies a set also writes its answer (Asio writes to
// the socket at once when nothing is queued there, as here: a client waits for each answer
// before its next request) before rank 0's wait is answered; rank 0 then makes world_size - 1
// more round trips, deleting the keys (it is the last rank to use them). So when rank 0 returns
// every other rank's last answer is in the kernel, and a server stopped then sends it before
// closing the connection.
//
// A rank that failed must not wait in the barrier (nothing it could learn there helps it exit),
// but if it only left, the others would wait for it until their deadline (10 min under
// nccl::run) and then report a Timeout on a barrier key that names nobody. So it calls
// exit_barrier_failed instead, in this order:
//  1. compare_set("failed", "", "rank <r> failed: <what>"): the first failure wins, later ones
//     (ranks failing together) leave it;
//  2. Rendezvous::arrive: counted into the barrier (and out of it) without waiting;
//  3. set("left/<r>") unless it is rank 0: its last call, as a successful rank's.
// The failure key is set before the rank arrives, so a rank released from the barrier finds it
// whenever any rank reported; each reads it (a compare_set that never swaps: a read that does
// not block) before its own set("left/<rank>"), and throws RankFailure with it afterwards. Rank 0
// reads it too and throws only after its wait for the left keys, so its server still outlives
// every other rank's last call; it then deletes the failure key with the others (nobody reads it
// after leaving). A failed rank 0 that hosts the server cannot do this: its server goes away as
// it exits, and the others' calls fail at once with TransportError (server gone), which is
// prompt, if less clear. When the store outlives rank 0 (a launcher's), rank 0 may report too.
namespace {

constexpr std::string_view kFailedKey = "chorus.exit/failed";

std::string left_key(int rank) { return "chorus.exit/left/" + std::to_string(rank); }

// The job's reported failure, if any, without blocking: compare_set with an expected value no
// failure holds (each starts with "rank ") never swaps, and answers the value or nullopt.
std::optional<std::string> reported_failure(Store& store, Deadline deadline) {
  const std::string never(1, '\0');
  return store.compare_set(kFailedKey, never, never, deadline);
}

}  // namespace

void exit_barrier(Store& store, int rank, int world_size, Deadline deadline) {
  Rendezvous rendezvous(store, rank, world_size);  // checks rank and world_size
  rendezvous.barrier(deadline);
  const std::optional<std::string> failure = reported_failure(store, deadline);
  const auto throw_failure = [&] {
    if (failure) {
      throw RankFailure(error_context("store.exit_barrier", rank), *failure);
    }
  };
  if (rank != 0) {
    store.set(left_key(rank), "", deadline);  // this rank's last call on the store
    throw_failure();
    return;
  }
  std::vector<std::string> left;
  left.reserve(static_cast<std::size_t>(world_size - 1));
  for (int r = 1; r < world_size; ++r) {
    left.push_back(left_key(r));
  }
  if (!left.empty()) {
    store.wait(left, deadline);
  }
  // The others are gone: the deletes only keep a store that outlives the job (a launcher's)
  // from growing. Like Rendezvous's counting out, they get a grace past a used-up deadline.
  const Deadline housekeeping(
      std::max(deadline.at(), Deadline::Clock::now() + Deadline::Clock::duration(kCountOutGrace)));
  for (const std::string& key : left) {
    store.delete_key(key, housekeeping);
  }
  if (failure) {
    store.delete_key(kFailedKey, housekeeping);
  }
  throw_failure();
}

void exit_barrier_failed(Store& store, int rank, int world_size, std::string_view what,
                         Deadline deadline) {
  Rendezvous rendezvous(store, rank, world_size);  // checks rank and world_size
  std::string failure = "rank " + std::to_string(rank) + " failed: ";
  failure += what.substr(0, kFailureTextBytesMax);
  if (what.size() > kFailureTextBytesMax) {
    failure += " [...]";
  }
  store.compare_set(kFailedKey, "", failure, deadline);  // Note [Exit barrier], step 1
  rendezvous.arrive(deadline);
  if (rank != 0) {
    store.set(left_key(rank), "", deadline);  // this rank's last call on the store
  }
}

}  // namespace chorus::store
