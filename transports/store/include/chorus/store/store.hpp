#pragma once

// chorus::store — a TCP rendezvous store: a key/value server that ranks use to find each other
// and exchange small blobs before any collective runs (NCCL's unique id, addresses, barriers).
// See docs/store.md for the wire protocol, the limits and the security model.
//
//   chorus::store::Server server;                            // 127.0.0.1, a free port
//   chorus::store::ClientOptions options;
//   options.port = server.port();
//   chorus::store::Client client(options);                   // connects (retrying) and says hello
//   client.set("rank/0", "hello");
//   std::string value = client.get("rank/1", std::chrono::seconds(30));   // blocks until set
//
// Every call that talks to the server takes a Deadline (a duration from now, or a time point);
// it defaults to kDefaultTimeout. Errors are chorus::Error subclasses (<chorus/error.hpp>):
// - Timeout          the deadline passed (a blocking get/wait/multi_get names the missing key);
// - InvalidArgument  the request breaks a limit (frame size, key count) or the data (add on a
//                    value that is not an integer);
// - Aborted          a blocking call was cancelled with cancel();
// - TransportError   the server refused the connection (token), closed it, or died.
// A Timeout answered by the server (a blocking call whose keys did not appear), a Timeout that
// says nothing was sent (the deadline passed before the call went out: while it waited for
// another thread's call, or a set/add/... called with a deadline already passed),
// InvalidArgument and Aborted leave the Client usable. After a TransportError, or a Timeout the
// server did not answer (no answer by the deadline), the connection's state is unknown, so the
// Client closes it: later calls throw TransportError.
//
// No Boost (or any networking) header is reachable from this header.

#include <chorus/error.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus::store {

namespace detail {
struct Request;
struct Response;
}  // namespace detail

// The default timeout of every call (as torch's TCPStore).
inline constexpr std::chrono::seconds kDefaultTimeout{300};

// The environment variable holding the shared secret, read by Server and Client when their
// options leave `token` unset.
inline constexpr std::string_view kTokenEnvironmentVariable = "CHORUS_STORE_TOKEN";

// When a call must have finished: an absolute steady-clock time point. Implicitly made from a
// duration (measured from the moment the Deadline is made, i.e. when the call starts) or a time
// point. Durations beyond 100 years are clamped (so `std::chrono::hours::max()` means "never").
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  template <class Rep, class Period>
  Deadline(std::chrono::duration<Rep, Period> timeout)  // NOLINT(google-explicit-constructor)
      : at_(from_timeout(clamp(timeout))) {}
  Deadline(Clock::time_point at) : at_(at) {}  // NOLINT(google-explicit-constructor)

  Clock::time_point at() const noexcept { return at_; }
  // Time left, never negative.
  std::chrono::milliseconds remaining() const noexcept;
  bool passed() const noexcept { return Clock::now() >= at_; }

 private:
  static constexpr std::chrono::hours kLongest{24 * 365 * 100};
  // Compared in floating point: any representation (int milliseconds, hours::max()) converts
  // without overflow.
  template <class Rep, class Period>
  static Clock::duration clamp(std::chrono::duration<Rep, Period> timeout) {
    const std::chrono::duration<double> seconds = timeout;
    if (seconds >= std::chrono::duration<double>(kLongest)) {
      return kLongest;
    }
    if (seconds <= -std::chrono::duration<double>(kLongest)) {
      return -Clock::duration(kLongest);
    }
    return std::chrono::duration_cast<Clock::duration>(timeout);
  }
  static Clock::time_point from_timeout(Clock::duration timeout) noexcept;

  Clock::time_point at_;
};

// ---------------------------------------------------------------------------------------------
// Server

struct ServerOptions {
  // The address to listen on. Only loopback by default: a store reachable from the network must
  // be asked for (e.g. "0.0.0.0"), and should then have a token.
  std::string host = "127.0.0.1";
  // 0: the system picks a free port; Server::port() reports it.
  std::uint16_t port = 0;
  // The shared secret a client must present when it connects. nullopt: $CHORUS_STORE_TOKEN when
  // set and non-empty, else no token (every client is accepted). An empty string: no token.
  std::optional<std::string> token;
  // The largest frame (request or response body) the server reads or writes. A larger request
  // closes the connection (the client checks first and throws InvalidArgument instead); a
  // response that would be larger is answered with InvalidArgument.
  std::size_t frame_bytes_max = std::size_t{64} << 20;
  // The most keys the store holds; a set/add/compare_set/multi_set that would create more is
  // refused with InvalidArgument.
  std::size_t keys_max = std::size_t{1} << 20;
  // A connection that has not presented its hello (and token) within this time is closed.
  // Positive, at most 2^40 ms (the store's longest timeout: a timer set further overflows).
  std::chrono::milliseconds handshake_timeout{10'000};
};

// What Server throws when its address is taken (bind failed with EADDRINUSE): another server
// (a launcher's store, say) listens there already. Every other failure to listen is a plain
// TransportError.
class AddressInUse final : public TransportError {
 public:
  using TransportError::TransportError;
};

// The store server: listens at construction and serves on its own thread (one io_context,
// asynchronous, no thread per client) until stop() or destruction. Thread-safe.
class Server {
 public:
  // Binds and listens. Throws AddressInUse (a TransportError) when the address is taken,
  // TransportError when it cannot listen otherwise (an address not of this host, a bad host) and
  // InvalidArgument for nonsensical options (a zero limit, a handshake timeout that is not
  // positive or is above 2^40 ms).
  explicit Server(ServerOptions options = {});
  // stop().
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  const std::string& host() const noexcept;
  // The port it listens on (the chosen one when ServerOptions::port was 0).
  std::uint16_t port() const noexcept;
  // Closes the listening socket and every connection (clients blocked in a call get
  // TransportError at once) and joins the server thread. Idempotent; blocks until done.
  void stop();
  // Connections open now (authenticated or not). For tests and monitoring.
  std::size_t connections() const noexcept;
  // Blocking calls (get, wait, multi_get) waiting for keys now. For tests and monitoring.
  std::size_t waiting() const noexcept;
  // Keys the server keeps a list of waiters for: bounded by the waits still live (plus a
  // constant), whatever number of distinct keys earlier waits timed out on. For tests and
  // monitoring.
  std::size_t waited_keys() const noexcept;

  // The implementation (server.cpp); named here only so that its internal types can refer to it.
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// The client interface, shared by Client (a connection) and PrefixStore (a view of another).
//
// Values are byte strings: std::string holds any bytes, NUL included.
//
// Thread-safety: a Store may be used from several threads; its calls are serialized (one
// request on the wire at a time). A call waits for another thread's call on the same connection
// no longer than its own deadline: then it throws Timeout without sending anything, and the
// connection stays usable. cancel() is the exception: it may be called from any thread
// while another is blocked in get/wait/multi_get.
class Store {
 public:
  virtual ~Store();

  // Sets `key` to `value` (creating or replacing it); wakes every client waiting for the key.
  void set(std::string_view key, std::string_view value, Deadline deadline = kDefaultTimeout);
  // Blocks until `key` exists, then returns its value. Timeout (naming the key) at the deadline.
  std::string get(std::string_view key, Deadline deadline = kDefaultTimeout);
  // Atomically adds `delta` to the integer stored at `key` (absent: 0) and returns the new value.
  // The value is kept as decimal text, so get() returns e.g. "3". InvalidArgument when the
  // stored value is not a decimal int64 or the sum overflows.
  std::int64_t add(std::string_view key, std::int64_t delta, Deadline deadline = kDefaultTimeout);
  // Atomically: if `key` holds `expected` — or is absent and `expected` is empty — sets it to
  // `desired`. Returns the value `key` holds afterwards (`desired` when the swap happened),
  // nullopt when it is absent (absent and `expected` non-empty: nothing happens).
  std::optional<std::string> compare_set(std::string_view key, std::string_view expected,
                                         std::string_view desired,
                                         Deadline deadline = kDefaultTimeout);
  // Blocks until every key in `keys` exists. Timeout (naming a missing key) at the deadline;
  // Aborted when cancel() is called meanwhile.
  void wait(const std::vector<std::string>& keys, Deadline deadline = kDefaultTimeout);
  // Removes `key`; true when it existed.
  bool delete_key(std::string_view key, Deadline deadline = kDefaultTimeout);
  // The number of keys in the whole store (a PrefixStore counts every key, not only its own).
  std::int64_t num_keys(Deadline deadline = kDefaultTimeout);
  // Blocks until every key exists, then returns their values in the order asked (one round
  // trip). Timeout/Aborted as wait().
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Deadline deadline = kDefaultTimeout);
  // Sets every (key, value) pair, in order, atomically with respect to other clients.
  void multi_set(const std::vector<std::pair<std::string, std::string>>& items,
                 Deadline deadline = kDefaultTimeout);

  // Cancels the blocking call (get, wait, multi_get) in progress on this store's connection, if
  // any: it throws Aborted. Does nothing when no blocking call is in progress, or when the call
  // completes before the server sees the cancellation. Never blocks for long: it does not wait
  // for a request another thread is still writing (a cancel() that comes while a blocking call's
  // request is written is sent by that thread right after it). Never throws.
  virtual void cancel() noexcept = 0;

 protected:
  Store() = default;
  // Sends `request` (keys as this store names them) and returns the server's answer.
  virtual detail::Response round_trip(detail::Request& request, Deadline deadline) = 0;
  // round_trip on another store (for views).
  static detail::Response forward(Store& store, detail::Request& request, Deadline deadline);
};

struct ClientOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  // The shared secret presented at connect. nullopt: $CHORUS_STORE_TOKEN (unset: none).
  std::optional<std::string> token;
  // Called on the connecting thread each time every address of the server failed to connect
  // (refused: nobody listens there yet), or the host's name could not be resolved for now
  // (EAI_AGAIN: the name server did not answer), and the client is about to try again, with the
  // reason ("Connection refused", "Temporary failure in name resolution"). For logging, and for
  // tests that must know a client was refused. Empty: nothing is called. What it throws ends the
  // connecting, out of the constructor.
  std::function<void(const std::string& reason)> on_connect_retry = nullptr;
};

// A connection to a Server. Connecting retries (a server that is not up yet, a name server that
// did not answer) until the deadline.
class Client final : public Store {
 public:
  // Connects and presents the token; blocks until connected or the deadline, the lookup of a
  // host name included (it runs on a helper thread, which the client waits for no longer than
  // the deadline; a numeric host needs no lookup). Throws Timeout when no server answers by the
  // deadline (or the host's name still fails to resolve with a temporary failure, EAI_AGAIN, at
  // it, or the name server has not answered by then), TransportError when the server refuses
  // the connection (wrong or missing token, protocol version) or closes it, or when the peer is
  // not a chorus store (its first reply is longer than a handshake's), InvalidArgument for a
  // host that does not resolve (any other resolver failure, at once).
  explicit Client(ClientOptions options, Deadline deadline = kDefaultTimeout);
  ~Client() override;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void cancel() noexcept override;
  // The largest request body the server accepts (it said so at connect).
  std::size_t frame_bytes_max() const noexcept;

 protected:
  detail::Response round_trip(detail::Request& request, Deadline deadline) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A view of another store with every key prefixed by `prefix` + "/" (one per communicator, like
// torch's PrefixStore). Views nest. The view does not own `base`, which must outlive it.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store& base);

  const std::string& prefix() const noexcept { return prefix_; }
  void cancel() noexcept override;

 protected:
  detail::Response round_trip(detail::Request& request, Deadline deadline) override;

 private:
  std::string prefix_;
  Store& base_;
};

// ---------------------------------------------------------------------------------------------
// Byte collectives over a store, for bootstrapping communicators (NCCL's unique id, Gloo's
// addresses). Every rank of a world of `world_size` constructs one Rendezvous on the same store
// (or the same prefix) and makes the same calls in the same order: each call uses fresh keys
// (numbered per Rendezvous), and the last rank through a call deletes them. Errors are those of
// the store calls underneath (Timeout naming the key of a rank that has not arrived), and
// InvalidArgument when more ranks count out of a call than the world holds (ranks that disagree
// on world_size). Once a call has its answer, counting out of it (an add, and the last rank's
// deletes) may take up to 5 s past its deadline rather than fail it. Not thread-safe: one
// Rendezvous per rank, used by one thread at a time.
class Rendezvous {
 public:
  // InvalidArgument unless 0 <= rank < world_size.
  Rendezvous(Store& store, int rank, int world_size);

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }

  // Returns `root`'s blob on every rank (the other ranks' `blob` is ignored). Blocks until the
  // root has published it.
  std::string broadcast_bytes(int root, std::string_view blob, Deadline deadline = kDefaultTimeout);
  // Returns every rank's blob, indexed by rank. Blocks until all have published.
  std::vector<std::string> allgather_bytes(std::string_view blob,
                                           Deadline deadline = kDefaultTimeout);
  // Returns when every rank has reached its barrier call of the same number.
  void barrier(Deadline deadline = kDefaultTimeout);
  // Counts this rank into its barrier call of the next number, and out of it, without waiting
  // for the others: for a rank that leaves instead (exit_barrier_failed). The other ranks'
  // barrier returns once every rank has arrived. Blocks only for its own round trips.
  void arrive(Deadline deadline = kDefaultTimeout);

 private:
  std::string next_name(std::string_view what);
  void finish(const std::string& name, std::vector<std::string> keys, Deadline call_deadline);
  // barrier() and arrive(): counts this rank in (the last to arrive releases the others),
  // waits for the release when `wait`, and counts it out.
  void pass_barrier(bool wait, Deadline deadline);

  Store& store_;
  int rank_;
  int world_size_;
  std::int64_t calls_ = 0;
};

// The barrier a job passes before its processes exit when one of its ranks hosts the store
// (Note [Exit barrier] in store.cpp). Returns on every rank once every rank has called it; rank
// 0 returns last: only once every other rank has made its last store call of the barrier and
// received the answer, so a store server that rank 0 hosts may be stopped (destroyed) the
// moment exit_barrier returns there, without any other rank losing the connection mid-call.
// Rank 0 is the one that must host the store, if a rank does. Ranks make no other calls on
// `store` after it. Once per job and key space: give it a store (or PrefixStore) no other
// exit_barrier uses; on success it removes the keys it made (a rank that fails or times out
// leaves its keys in a store that outlives the job, as Rendezvous does). Blocks; errors are those
// of Rendezvous::barrier and, on rank 0, a Timeout naming the key of the first rank that did not
// leave by the deadline. InvalidArgument unless 0 <= rank < world_size. When a rank reported
// its failure with exit_barrier_failed, every rank that called exit_barrier throws RankFailure
// (op store.exit_barrier) once released, its detail the first reported failure ("rank 2 failed:
// <what>"); rank 0 throws it only after every other rank has left, as on success, and removes
// the keys then too.
void exit_barrier(Store& store, int rank, int world_size, Deadline deadline = kDefaultTimeout);

// For a rank that failed and exits at once instead of calling exit_barrier (Note [Exit barrier]):
// publishes "rank <rank> failed: <what>" as the job's failure unless another rank's came first
// (<what> cut at kFailureTextBytesMax bytes), counts this rank into the exit barrier without
// waiting for the others, and (rank != 0) leaves it, so the ranks in exit_barrier are released
// and throw RankFailure naming this rank instead of waiting out their deadline. A few round trips;
// never waits for another rank. Give it a short deadline: a rank that failed should not linger.
// The rank that hosts the server cannot use it (its server goes when it exits: the others get
// TransportError); rank 0 may when the store outlives it (a launcher's). Errors are those of the
// store calls; InvalidArgument unless 0 <= rank < world_size.
void exit_barrier_failed(Store& store, int rank, int world_size, std::string_view what,
                         Deadline deadline = kDefaultTimeout);

// The most bytes of exit_barrier_failed's `what` that are published.
inline constexpr std::size_t kFailureTextBytesMax = 4096;

}  // namespace chorus::store
