#pragma once

// chorus::nccl — the NCCL transport (docs/nccl.md). One process is one chorus rank on one CUDA
// device; ranks find each other through the TCP rendezvous store (chorus/store/store.hpp).
// Users reach it through chorus::run with --transport=nccl; this header is for the launcher and
// for tests. It includes neither <cuda_runtime.h> nor <nccl.h>: CUDA and NCCL are private
// dependencies of chorus::nccl.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/dtype.hpp"
#include "chorus/error.hpp"
#include "chorus/reduce_op.hpp"
#include "chorus/runtime.hpp"
#include "chorus/store/store.hpp"
#include "chorus/transport/transport.hpp"

namespace chorus::nccl {

// How a (dtype, reduction) pair runs on NCCL, for documentation, tests and Transport::supports;
// computed without calling CUDA or NCCL. Names are NCCL's ("ncclFloat32", "ncclSum"), or
// "ncclRedOpCreatePreMulSum" for premul_sum.
struct Mapping {
  std::string datatype;  // the ncclDataType_t the elements travel as
  std::string op;        // the ncclRedOp_t
  // Elements per chorus element: 2 for complex dtypes (reduced as pairs of real parts).
  int count_factor = 1;
};

// The mapping of `reduce_op` on `dtype`. Throws InvalidArgument when `reduce_op` is not valid
// for `dtype` (ReduceOp::check_dtype) or when NCCL cannot carry it out (bitwise ops on integers,
// bxor on Bool); the message names the backend ("nccl: ..."). Never blocks; thread-safe.
Mapping describe_mapping(DType dtype, const ReduceOp& reduce_op);

// Empty when describe_mapping(dtype, reduce_op) succeeds, else its reason. Never throws.
std::string mapping_problem(DType dtype, const ReduceOp& reduce_op);

// Where this process sits in the job and where the store is: torchrun's environment variables
// (parse_environment). chorus::run fills it from whichever launcher started the process
// (chorus::launch_environment: torchrun, Open MPI's mpirun or Slurm's srun) instead.
struct Environment {
  int rank = 0;                   // RANK
  int world_size = 1;             // WORLD_SIZE
  int local_rank = 0;             // LOCAL_RANK (unset: RANK); picks the CUDA device
  std::string master_addr;        // MASTER_ADDR
  std::uint16_t master_port = 0;  // MASTER_PORT
};

// Reads the Environment through `lookup` (a getenv; null result = unset). Throws
// InvalidArgument naming the variable when one is missing or malformed (RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT are required; 0 <= RANK < WORLD_SIZE; 1 <= MASTER_PORT <= 65535).
// Thread-safe when `lookup` is.
Environment parse_environment(const std::function<const char*(const char*)>& lookup);
// parse_environment over the process environment (std::getenv).
Environment read_environment();

// The unique-id exchange of communicator set-up: rank 0 of `rendezvous` calls `make_id` (NCCL's
// ncclGetUniqueId, serialised) and every rank returns its bytes (Rendezvous::broadcast_bytes).
// Throws InvalidArgument when rank 0's id is not `id_bytes` long, and the store's errors
// (Timeout when rank 0 does not publish by `deadline`). When `make_id` throws, or its id has the
// wrong length, rank 0 publishes that failure instead of an id and throws its own error; the
// other ranks throw TransportError "nccl: rank 0 of this communicator could not make its unique
// id: <its error>" at once. Blocks; one thread per Rendezvous.
std::string exchange_unique_id(store::Rendezvous& rendezvous, std::size_t id_bytes,
                               const std::function<std::string()>& make_id,
                               store::Deadline deadline);

// The number of CUDA devices the runtime sees, or the reason there are none: the error text of
// cudaGetDeviceCount ("no CUDA device: cudaGetDeviceCount returned cudaErrorNoDevice (...)").
// Never throws.
struct DeviceCount {
  int count = 0;
  std::string problem;  // empty when count > 0
};
DeviceCount cuda_device_count() noexcept;

// One line naming what this process runs on, for logs from a GPU machine: the NCCL library's
// version (ncclGetVersion), the CUDA runtime's and the driver's, and each device's name and
// whether it has stream-ordered memory pools (chorus allocates CUDA storage from one):
// "NCCL 2.28.3; CUDA runtime 13.0, driver 13.0; cuda:0 NVIDIA H200 (memory pools: yes)". A query
// that fails is named in place of its value. Never throws.
std::string platform_report() noexcept;

// How the transport builds a part of a partition of the world (Note [Partitioned groups],
// Note [NCCL communicator set-up]) with ncclCommSplit of the world communicator: color = the
// smallest rank of the calling rank's part (the same on every member however each lists the
// parts), key = its position in that part (so the new communicator's ranks are in group order). A
// rank that has its part's communicator already (`has_existing`) still takes part, with kNoColor
// (NCCL_SPLIT_NOCOLOR), and gets no new communicator. Computed without calling CUDA or NCCL; never
// blocks; thread-safe. Throws InvalidArgument
// ("nccl: ...") when `partition` is not a partition of [0, world_size) whose part
// `partition.index` holds `rank`.
inline constexpr int kNoColor = -1;
struct SplitPlan {
  int color = kNoColor;
  int key = 0;
};
SplitPlan split_plan(const transport::Partition& partition, int world_size, int rank,
                     bool has_existing);

// Note [Split agreement]
// ncclCommSplit is collective over the whole world communicator and pairs the world's calls in
// order, so a program that uses a partition on some ranks only, or first uses two partitions in
// different orders, would wait inside the split until the timeout (and abort the world
// communicator) or get communicators of other ranks. Before its k-th split every rank therefore
// agrees with every world rank, through the store (Note [Store agreement]), on which partition it
// splits (split_description):
// - ranks that do not publish by the deadline: Timeout naming them, before any rank enters the
//   split (the world communicator is untouched), also on ranks that arrive later;
// - a rank whose description differs: CollectiveMismatch on every rank, naming the first such
//   rank and both partitions.

// The tag and the parts of a partition in a form every member computes alike: parts keep their
// members' order (the group order, which the split's keys follow) and are listed by smallest
// rank, however the caller ordered them. "'tp' [[0, 1], [2, 3]]".
std::string split_description(const std::string& tag, const transport::Partition& partition);

// Note [Store agreement]
// One round in which `members` (global ranks) agree through the store: each publishes a string
// under `prefix` + its rank and reads everyone's. Deadlines differ between members (each starts
// when its member arrives), so a member that stops waiting first marks every key still absent
// (compare_set from absent): a member arriving later finds the mark in its own key, one waiting
// meanwhile finds it among the others', and both end in Timeout too, so no member goes ahead
// alone. The last member out removes the round's keys; a round some member never reached keeps
// them. Used for splits (Note [Split agreement]) and --check-collectives (check_collective).
struct StoreRound {
  std::string prefix;        // keys: prefix + "<rank>", and prefix + "done"
  std::vector<int> members;  // global ranks
  int me = -1;               // this rank's index in members
  ErrorContext context;      // of the errors
  std::string what;          // "split #2 (partition ...)", for the errors
  std::string who;           // "world rank": "world ranks [1, 3] did not reach ..."
  std::string consequence;   // "no rank enters the split"
  std::string contract;      // the rule the program broke, appended to Timeout's detail
  store::Deadline deadline = store::Deadline::Clock::time_point::max();
  // For each store call that settles the round after the wait (marking, counting out, removing
  // the keys), measured from that call.
  std::chrono::milliseconds grace = std::chrono::seconds(5);
};

// Publishes `mine` and returns every member's string, in members' order. Throws Timeout naming
// the members that had not published by the deadline, or a member that gave up.
std::vector<std::string> agree_through_store(store::Store& store, const StoreRound& round,
                                             const std::string& mine);

// Note [NCCL collective check]
// With --check-collectives (NcclRunOptions::check_collectives) every operation (or coalesced
// batch) starts only after the members of its communicator agreed through the store on it:
// - its description (check_description: the op name and each op's kind, dtype, counts,
//   reduction and root; all_to_all only its dtype, since uneven splits differ by design; and
//   the digest of the tensors' shapes and gather/scatter dims core set, "[shapes/dims 1a2b3c4d]"),
//   the same text on every member; premul_sum's factor compared bit for bit;
// - all_to_all's split sizes (SplitSizes), pairwise: what each member sends each member,
//   itself included, is what that member expects from it. Every member publishes its own, so
//   every member checks every pair and names the same first mismatch (the MPI transport's check
//   needs an extra exchange for this and names the pair only on the member that sees it).
// A difference is a CollectiveMismatch on every member before NCCL sees anything, so the
// communicator stays usable; a member that does not arrive is named in a Timeout. It costs a
// few store round trips per operation (none on a group of one): a debugging mode, off by
// default. Issuing blocks until the members described theirs, so under the check ranks must
// issue the operations of different communicators in the same order: a program that interleaves
// two groups differently per rank (which NCCL runs, each communicator on its own stream) times
// out under the check. The transport's own argument checks (device, dtype, reduction) come after
// core numbered the operation, so a failing one would leave the peers waiting for this rank
// until their deadline; core runs the same checks first (Transport::supports), so through core
// they do not fail.
std::string check_description(std::string_view name,
                              const std::vector<transport::OpSignature>& ops);

// One all_to_all's element counts to and from each member of its group, in group order.
struct SplitSizes {
  std::vector<std::size_t> send;
  std::vector<std::size_t> recv;
};

// Check round `round_index` of the communicator `comm_key` (tag and members, the same on every
// member), for its operation `seq`; `members` are global ranks in group order, this rank is
// members[group_rank]. `splits`: the split sizes of the operation's all_to_alls, in order.
// `grace` as StoreRound::grace. The store keys are the round's, the errors name the operation:
// a member counts the rounds it entered (NcclComm::check_rounds_), and a round that failed
// (mismatch, timeout) is never entered again, while core gives the failed operation's sequence
// number back (Note [Transport contract]), so a retry is operation `seq` again in a fresh round.
void check_collective(store::Store& store, const std::string& comm_key,
                      const std::vector<int>& members, int group_rank, std::int64_t seq,
                      std::int64_t round_index, const std::string& description,
                      const std::vector<SplitSizes>& splits, const ErrorContext& context,
                      store::Deadline deadline,
                      std::chrono::milliseconds grace = std::chrono::seconds(5));

// Note [Split agreement], round `split_index` of this process, on `store` (keys under
// "chorus/nccl/split/<split_index>/"). `rank` and `world_size` are the world's; `label` names
// the group in errors. Blocks until every rank published or `deadline`; one call per rank and
// round.
void agree_on_split(store::Store& store, int rank, int world_size, std::int64_t split_index,
                    const std::string& description, const std::string& label,
                    store::Deadline deadline);

struct NcclRunOptions {
  // How long a wait, a communicator's set-up and an operation watched by the watchdog may take
  // before they end in Timeout.
  std::chrono::nanoseconds timeout = std::chrono::minutes(10);
  // The environment; nullopt: read_environment() (torchrun's variables only).
  std::optional<Environment> environment;
  // Build the parts of a partition of the world (a list of rank lists, a MeshDim) with
  // ncclCommSplit of the world communicator instead of a unique id per part (Note [NCCL
  // communicator set-up]). Off by default: a split is collective over the whole world, so every
  // world rank must reach the first operation on each partition, in the same order relative to
  // its other partitions — a program that uses a partition on some ranks only, or first uses two
  // partitions in different orders on different ranks, runs on the simulator and MPI but would
  // wait in the split until the timeout. The environment variable CHORUS_NCCL_SPLIT=1 turns it
  // on as well.
  bool split_partitions = false;
  // Note [NCCL collective check] (chorus::run's --check-collectives).
  bool check_collectives = false;
  // Bytes of freed host storage each rank keeps for reuse (RankOptions::host_pool_bytes_max).
  // Outputs larger than this come fresh from the heap every time, paying first touch of every
  // page; `chorus bench` raises it to keep its largest outputs.
  std::size_t host_pool_bytes_max = std::size_t{64} << 20;
};

// Device::cuda storages on CUDA device `device` (Note [Device memory] in chorus/runtime.hpp),
// ordered on the stream core passes: the rank's current stream (Note [Current stream] in
// chorus/stream.hpp), which the NCCL transport orders its operations and waits by. run() installs
// one for the rank's device; a launcher of its own passes it in RankOptions::device_memory.
std::shared_ptr<DeviceMemory> cuda_device_memory(int device);

// Runs `rank_main` as this process's rank (chorus::run with transport "nccl" calls this): takes
// the environment (NcclRunOptions::environment, else read_environment(); a bad one throws
// InvalidArgument, on a machine without a GPU too), checks that a CUDA device exists (else throws
// TransportError "no CUDA device: ..."), selects device local_rank % device count, connects to
// the store at master_addr:master_port (rank 0 hosts it),
// binds a RankContext over the NCCL transport (with cuda_device_memory(device), so the rank
// can allocate Device::cuda(device) tensors), runs the rank function, finishes the rank and
// destroys its communicators (finalize, then destroy). Returns 0 when the rank succeeded; when
// it failed, prints "chorus: rank R of N failed: <error>", aborts its communicators (so peers
// see an error instead of hanging) and returns 1. Throws InvalidArgument for a bad environment.
int run(const NcclRunOptions& options, std::function<void()> rank_main);

}  // namespace chorus::nccl
