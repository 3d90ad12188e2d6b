// One MPI job per ctest (tests/CMakeLists.txt, label mpi), run under mpirun with
// --transport=mpi. Each --mode is a behaviour the job must show; a wrong result throws, which
// aborts the job (chorus::mpi::run) and fails the test.
//
//   ops      collectives on the world and on subgroups, in place, coalesced, waited from another
//            thread, and Open MPI's saturating 8-bit sums (ompi#8045) avoided; exit 0.
//   throw    rank 1 throws after its first collective; the job ends non-zero naming rank 1.
//   timeout  rank 0 issues an all_reduce on [0, 1] that rank 1 never issues: rank 0's Timeout
//            names rank 1 as missing (Note [Communicator rendezvous]), and the job ends.
//   timeout_op  the same after the group exists: rank 0's Timeout names its rank, op, sequence
//            number and group.
//   late_rank  with an infinite timeout (RunOptions::timeout = nanoseconds::max(), set here),
//            rank 1 issues its first all_reduce, and then its second, ~200 ms after the others:
//            the communicator set-up and (with --check-collectives) the check's exchange wait for
//            it instead of timing out on their first poll; exact sums.
//   mismatch  (with --check-collectives) the last rank issues all_gather where the others
//            all_reduce: CollectiveMismatch naming both sides (Note [Collective check]).
//   splits   (with --check-collectives) all_to_all_single where rank 1 sends rank 0 one element
//            more than rank 0 expects: CollectiveMismatch naming the pair.
//   self_split  rank 0's all_to_all_single sends itself more than it expects from itself:
//            InvalidArgument naming the counts, on either MPI schedule; with
//            --check-collectives, CollectiveMismatch on every member.
//   big_all_to_all  (3 ranks or more, with the test seam CHORUS_MPI_INT_COUNT_MAX=100) an uneven
//            all_to_all_single whose total on the last rank (and byte offsets on every rank)
//            passes the lowered int limit while every per-peer count fits: exact results on
//            every rank, on either MPI schedule (Note [MPI int counts]); exit 0.
//   group_order  ranks 0 and 1 first use two groups they share in opposite orders (MPI would
//            deadlock creating the communicators): CollectiveMismatch on both
//            (Note [Communicator rendezvous]).
//   group_cycle  (3 ranks) the first uses of groups a = {0, 1}, b = {1, 2}, c = {0, 2} form a
//            cycle (rank 0 issues on a then c, rank 1 on b then a, rank 2 on c then b): every
//            set-up waits for a rank busy with the next, until the timeout, whose message names
//            the group that rank is setting up (Note [Communicator rendezvous], "Busy peers").
//   setup_retry  (run rank 0 with a short --timeout-ms, rank 1 with a long one) rank 0's
//            set-up of group g times out and is caught; after a world all_reduce that tells
//            rank 1 so, both set g up and all_reduce on it: the timed-out set-up's receive was
//            cancelled, so it does not take rank 1's message (Note [Communicator rendezvous],
//            "Leftovers"); the retry's own message, left at rank 1, is dropped there as stale
//            at the next set-up (h), and a set-up of another group (h2) after a timed-out one
//            (g2) is refused until g2 is retried ("Stale messages").
//   busy_leftover  (3 ranks, rank 0 with a short --timeout-ms) rank 0 times out setting up g =
//            {0, 1} and retries it, which leaves its retry's message at rank 1 ("Stale
//            messages"); then rank 0 sets up a = {0, 1} while rank 1 sets up b = {1, 2}, which
//            rank 2 joins only after rank 0's Timeout: that Timeout names what rank 1 is doing,
//            though the leftover came first ("Busy peers"); exit 0.
//   setup_counts  (3 ranks, rank 1 with a short --timeout-ms) ranks 0 and 1 set up g = {0, 1, 2}
//            while rank 2 sets up h = {0, 2}: rank 0 and 2 get CollectiveMismatch, rank 1 a
//            Timeout; then ranks 0 and 1 set up j = {0, 1} and all_reduce on it ("Stale
//            messages": both counted their exchanged pair).
//   setup_retry_late  (3 ranks, rank 0 with a short --timeout-ms) rank 0's set-up of g =
//            {0, 1, 2} times out having paired with rank 1 only; rank 2 arrives after that
//            Timeout (it waits in an all_reduce on h = {0, 2}, set up first, that rank 0 issues
//            after it), pairs with rank 1 and with rank 0's message, and ranks 1 and 2 wait in
//            MPI_Comm_create_group; rank 0's retries wait for rank 2 only (the first, before
//            rank 2 can arrive, times out naming rank 2 alone), and all_reduce on g sums to 3
//            ("Partial set-ups"); exit 0.
//   setup_retry_both  (3 ranks, ranks 0 and 1 with a short --timeout-ms) ranks 0 and 1 both
//            time out setting up g = {0, 1, 2}, having paired with each other; rank 2 arrives
//            after both (through all_reduces on h0 = {0, 2} and h1 = {1, 2}, set up first), and
//            both retries skip the pair they already exchanged: all_reduce on g sums to 3.
//   setup_moved_on  (3 ranks, ranks 0 and 1 with a short --timeout-ms) ranks 0 and 1 time out
//            setting up g = {0, 1, 2}, which rank 2 never issues, having paired with each
//            other; rank 1 then sets up y = {0, 1} while rank 0 retries g: rank 0's retry gets a
//            CollectiveMismatch naming rank 1 (which will never create g) instead of going on
//            to wait for rank 2, and rank 0 then sets up y with rank 1 ("Partial set-ups").
//   check_deadline  (3 ranks, with --check-collectives; ranks 0 and 1 with --timeout-ms=T, rank
//            2 with a shorter one) an all_to_all_single on the world, whose check takes three
//            rounds: rank 2 times out in the first (rank 1 is not there) and leaves, telling rank
//            1 through an all_reduce on h = {1, 2}, and waits for the job's end; rank 1 then
//            issues it, which completes the first round, and the second waits for rank 2 for
//            ever. Rank 0's Timeout must come
//            by its deadline, T after it issued the operation, not a second T after the first
//            round ended (Note [Collective check]); rank 0 prints how long it took and ends
//            the job.
//   sigkill  rank 1 SIGKILLs itself after its first collective while the others wait in the
//            next one; mpirun ends the job non-zero.
//   rings    all_reduce over uneven chunk counts in every dtype and several reductions, many in
//            flight at once and waited in reverse or in opposite orders, coalesced, in place;
//            reduce_scatter then all_gather; exact results, and inexact sums bit-identical on
//            every rank (run with CHORUS_MPI_SCHEDULE=chorus to test Note [Ring all_reduce] and
//            Note [Direct exchanges], and without).
//   rounding 16-bit float sum, avg, premul_sum and product whose 16-bit running sums overflow
//            (or, for premul_sum, whose rounded f * x would be subnormal), and float min/max
//            with ties (-0/+0, NaN payloads), at 8 and 6144 elements per rank: all_reduce,
//            reduce_scatter and reduce bit-identical to chorus::kernels::reduce over all ranks'
//            inputs in group-rank order (Note [Widened 16-bit reductions], Note [Ring
//            all_reduce], "Ties"); run under each schedule.
//   small    all_reduce and reduce_scatter below 4 KiB per rank, every reduction on 16-bit
//            floats, float32 and integers: results identical on every rank and exact where the
//            arithmetic is; with --kernel-order also bit-identical to chorus::kernels::reduce
//            over all ranks' inputs in group-rank order (the simulator's fixed order), which the
//            direct exchange of Note [Direct exchanges], "Small operations", computes and MPI's
//            own collectives do not promise (run it where Auto takes that exchange:
//            CHORUS_MPI_NODE_CPUS at least the rank count, up to 8 ranks).

#include <algorithm>
#include <chorus/chorus.hpp>
#include <chorus/kernels.hpp>
#include <chrono>
#include <cmath>
#include <complex>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

void require(bool condition, const std::string& what) {
  if (!condition) {
    throw std::runtime_error("rank " + std::to_string(chorus::rank()) + ": " + what);
  }
}

template <typename T>
std::vector<T> iota_like(std::size_t n, T first) {
  std::vector<T> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    values[i] = static_cast<T>(first + static_cast<T>(i));
  }
  return values;
}

void ops() {
  const int rank = chorus::rank();
  const int n = chorus::world_size();

  // 40 Int8 elements per rank (past Open MPI's 16-element AVX path), sums that wrap.
  constexpr std::size_t kBytes = 40;
  std::vector<std::int8_t> bytes(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) {
    bytes[i] = static_cast<std::int8_t>(static_cast<int>(i) * 13 - 100 + rank * 50);
  }
  const std::vector<std::int8_t> byte_sum =
      chorus::all_reduce(chorus::Tensor::from_vector(bytes), "sum", chorus::world())
          .to_vector<std::int8_t>();
  for (std::size_t i = 0; i < kBytes; ++i) {
    std::uint8_t expected = 0;
    for (int r = 0; r < n; ++r) {
      expected = static_cast<std::uint8_t>(
          expected + static_cast<std::uint8_t>(static_cast<int>(i) * 13 - 100 + r * 50));
    }
    require(static_cast<std::uint8_t>(byte_sum[i]) == expected,
            "Int8 sum element " + std::to_string(i) + " is " + std::to_string(byte_sum[i]));
  }

  // ones * rank over the world, in place.
  chorus::Tensor ones =
      chorus::Tensor::from_vector(std::vector<float>(5, static_cast<float>(rank)));
  chorus::all_reduce_inplace(ones, "sum", chorus::world());
  for (const float value : ones.to_vector<float>()) {
    require(value == static_cast<float>(n * (n - 1) / 2), "in-place sum " + std::to_string(value));
  }

  // Even and odd ranks as two groups (2-D MPMD lists): each group's max of its ranks.
  std::vector<std::vector<int>> parity(2);
  for (int r = 0; r < n; ++r) {
    parity[static_cast<std::size_t>(r % 2)].push_back(r);
  }
  if (n % 2 == 0) {  // 2-D lists need equal sizes
    const std::vector<int>& mine = parity[static_cast<std::size_t>(rank % 2)];
    const std::vector<std::int32_t> max =
        chorus::all_reduce(chorus::Tensor::from_vector(std::vector<std::int32_t>{rank, -rank}),
                           "max", parity)
            .to_vector<std::int32_t>();
    require(max[0] == mine.back() && max[1] == -mine.front(), "parity max");
  }

  // all_gather on dim 1, reduce_scatter back, broadcast from the last rank, reduce to rank 0.
  const chorus::Tensor row =
      chorus::Tensor::from_vector(iota_like<std::int64_t>(3, 10 * rank), {1, 3});
  const std::vector<std::int64_t> gathered =
      chorus::all_gather_tensor(row, 1, chorus::world()).to_vector<std::int64_t>();
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 3; ++i) {
      require(gathered[static_cast<std::size_t>(3 * r + i)] == 10 * r + i, "all_gather dim 1");
    }
  }
  const std::vector<double> scattered =
      chorus::reduce_scatter_tensor(
          chorus::Tensor::from_vector(iota_like<double>(static_cast<std::size_t>(2 * n), 1.0)),
          "avg", 0, chorus::world())
          .to_vector<double>();
  require(scattered == std::vector<double>{2.0 * rank + 1, 2.0 * rank + 2}, "reduce_scatter avg");
  const std::vector<std::int32_t> broadcast =
      chorus::broadcast(chorus::Tensor::from_vector(std::vector<std::int32_t>{rank, 7}), n - 1,
                        chorus::world())
          .to_vector<std::int32_t>();
  require(broadcast == std::vector<std::int32_t>{n - 1, 7}, "broadcast");
  const std::vector<std::int32_t> reduced =
      chorus::reduce(chorus::Tensor::from_vector(std::vector<std::int32_t>{rank + 1}), "product", 0,
                     chorus::world())
          .to_vector<std::int32_t>();
  if (rank == 0) {
    std::int32_t factorial = 1;
    for (int r = 1; r <= n; ++r) {
      factorial *= r;
    }
    require(reduced[0] == factorial, "reduce product");
  }

  // Uneven all_to_all_single: rank r sends j + 1 copies of r to rank j.
  std::vector<std::int64_t> send_sizes;
  std::vector<std::int64_t> recv_sizes;
  std::vector<float> outgoing;
  for (int j = 0; j < n; ++j) {
    send_sizes.push_back(j + 1);
    recv_sizes.push_back(rank + 1);
    outgoing.insert(outgoing.end(), static_cast<std::size_t>(j + 1), static_cast<float>(rank));
  }
  const std::vector<float> incoming =
      chorus::all_to_all_single(chorus::Tensor::from_vector(outgoing), recv_sizes, send_sizes,
                                chorus::world())
          .to_vector<float>();
  std::size_t at = 0;
  for (int i = 0; i < n; ++i) {
    for (int copy = 0; copy <= rank; ++copy) {
      require(incoming[at++] == static_cast<float>(i),
              "all_to_all_single block " + std::to_string(i));
    }
  }

  // A coalesced pair, waited by another thread.
  std::vector<chorus::Tensor> pair =
      chorus::all_reduce_coalesced({chorus::Tensor::from_vector(std::vector<float>{1.0f}),
                                    chorus::Tensor::from_vector(std::vector<std::int32_t>{rank})},
                                   "sum", chorus::world());
  std::thread waiter([&pair] { chorus::wait_tensors(pair); });
  waiter.join();
  require(pair[0].to_vector<float>()[0] == static_cast<float>(n), "coalesced float");
  require(pair[1].to_vector<std::int32_t>()[0] == n * (n - 1) / 2, "coalesced int");
  require(chorus::work_registry_size() == 0, "registry empty at the end");

  // A waited collective's buffers go with its last tensor: its work lets go of them when it
  // completes, and the process keeps only the emptied vectors for the next operation (Note
  // [Recycled Started]).
  std::vector<float> blob = {1.0f, 2.0f};
  bool released = false;
  {
    chorus::Tensor input =
        chorus::Tensor::from_blob(blob.data(), {2}, chorus::DType::Float32, chorus::Device::cpu(),
                                  [&released](void*) { released = true; });
    chorus::Tensor sum = chorus::all_reduce(input, "sum", chorus::world());
    require(sum.to_vector<float>() ==
                std::vector<float>{static_cast<float>(n), 2.0f * static_cast<float>(n)},
            "all_reduce of a blob");
  }
  require(released, "a waited collective's input is released with its last tensor");
  if (rank == 0) {
    std::printf("mpi_job ops: all checks passed on %d ranks\n", n);
  }
}

// Rank r's exact small-integer input element i, and the sum over ranks of it.
double ring_input(int rank, std::size_t i) {
  return static_cast<double>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11) -
                             5);
}

chorus::Tensor ring_tensor(int rank, std::size_t count, chorus::DType dtype) {
  std::vector<double> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    values[i] = ring_input(rank, i);
  }
  return chorus::Tensor::from_vector(values).to(dtype);
}

void rings() {
  const int rank = chorus::rank();
  const int n = chorus::world_size();
  // Counts below, at and above the group size, and many chunks with a remainder.
  const std::vector<std::size_t> counts = {1, static_cast<std::size_t>(n) + 1, 10007, 65536 + 3};
  const std::vector<chorus::DType> dtypes = {chorus::DType::Int8,     chorus::DType::Int32,
                                             chorus::DType::Int64,    chorus::DType::Float16,
                                             chorus::DType::BFloat16, chorus::DType::Float32,
                                             chorus::DType::Float64,  chorus::DType::Complex64};
  // Everything issued first, then waited newest first: every ring in flight at once.
  struct Issued {
    chorus::Tensor result;
    std::size_t count;
    chorus::DType dtype;
  };
  std::vector<Issued> issued;
  for (const chorus::DType dtype : dtypes) {
    for (const std::size_t count : counts) {
      issued.push_back({chorus::all_reduce(ring_tensor(rank, count, dtype), "sum", chorus::world()),
                        count, dtype});
    }
  }
  for (auto it = issued.rbegin(); it != issued.rend(); ++it) {
    chorus::wait_tensor(it->result);
    const std::vector<double> got =
        it->result.to(chorus::DType::Float64).to_vector<double>();  // complex: the real part
    for (std::size_t i = 0; i < it->count; ++i) {
      double expected = 0;
      for (int r = 0; r < n; ++r) {
        expected += ring_input(r, i);
      }
      if (it->dtype == chorus::DType::Int8) {  // wraps
        expected = static_cast<double>(static_cast<std::int8_t>(static_cast<int>(expected)));
      }
      require(got[i] == expected, std::string(chorus::dtype_name(it->dtype)) + " sum of " +
                                      std::to_string(it->count) + ", element " + std::to_string(i) +
                                      ": " + std::to_string(got[i]));
    }
  }

  // Waited in opposite orders on odd and even ranks: each ring needs its peers' polls, which a
  // wait on another operation must give (Note [Ring all_reduce], "Progress").
  {
    std::vector<chorus::Tensor> pending;
    for (int i = 0; i < 4; ++i) {
      pending.push_back(chorus::all_reduce(ring_tensor(rank, 20000, chorus::DType::Float32), "sum",
                                           chorus::world()));
    }
    for (int i = 0; i < 4; ++i) {
      chorus::wait_tensor(pending[static_cast<std::size_t>(rank % 2 == 0 ? i : 3 - i)]);
    }
  }

  // A wait on an operation without a ring advances the rings in flight too (Note [Lean polls]):
  // rank 0 waits on an all_gather that the others issue only once their ring all_reduce, which
  // needs rank 0's polls for its later steps, completed.
  {
    const chorus::Tensor ring = chorus::all_reduce(ring_tensor(rank, 20000, chorus::DType::Float32),
                                                   "sum", chorus::world());
    const chorus::Tensor block = chorus::Tensor::from_vector(std::vector<float>(8, 1.0f));
    if (rank == 0) {
      const chorus::Tensor gathered = chorus::all_gather_tensor(block, 0, chorus::world());
      chorus::wait_tensor(gathered);
      chorus::wait_tensor(ring);
    } else {
      chorus::wait_tensor(ring);
      chorus::wait_tensor(chorus::all_gather_tensor(block, 0, chorus::world()));
    }
  }

  // Inexact float sums: whatever the order, every rank gets the same bits.
  {
    std::vector<float> values(10007);
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = 0.1f * static_cast<float>(i) + static_cast<float>(rank) / 3.0f + 1e-7f;
    }
    const chorus::Tensor sum =
        chorus::all_reduce(chorus::Tensor::from_vector(values), "sum", chorus::world());
    // all_gather moves bytes unchanged; compare each rank's block with rank 0's bit for bit.
    const std::vector<float> all =
        chorus::all_gather_tensor(sum, 0, chorus::world()).to_vector<float>();
    for (int r = 1; r < n; ++r) {
      require(std::memcmp(all.data(), all.data() + static_cast<std::size_t>(r) * values.size(),
                          values.size() * sizeof(float)) == 0,
              "rank " + std::to_string(r) + "'s inexact sum differs from rank 0's");
    }
  }

  // max (NaN from the last rank propagates), avg (integers truncate), premul_sum, product.
  const std::size_t count = 10007;
  chorus::Tensor with_nan = ring_tensor(rank, count, chorus::DType::Float32);
  if (rank == n - 1) {
    with_nan.data_ptr<float>()[5] = std::nanf("");
  }
  const std::vector<float> max =
      chorus::all_reduce(with_nan, "max", chorus::world()).to_vector<float>();
  const std::vector<std::int32_t> avg =
      chorus::all_reduce(ring_tensor(rank, count, chorus::DType::Int32), "avg", chorus::world())
          .to_vector<std::int32_t>();
  const std::vector<double> premul =
      chorus::all_reduce(ring_tensor(rank, count, chorus::DType::Float64),
                         chorus::ReduceOp::premul_sum(0.5), chorus::world())
          .to_vector<double>();
  std::vector<double> twos(count, 1.0);
  twos[count - 1] = 2.0;
  const std::vector<double> product =
      chorus::all_reduce(chorus::Tensor::from_vector(twos), "product", chorus::world())
          .to_vector<double>();
  for (std::size_t i = 0; i < count; ++i) {
    double sum = 0;
    double largest = ring_input(0, i);
    for (int r = 0; r < n; ++r) {
      sum += ring_input(r, i);
      largest = std::max(largest, ring_input(r, i));
    }
    require(i == 5 ? std::isnan(max[i]) : max[i] == static_cast<float>(largest),
            "max element " + std::to_string(i));
    require(avg[i] == static_cast<std::int32_t>(sum) / n, "avg element " + std::to_string(i));
    require(premul[i] == 0.5 * sum, "premul_sum element " + std::to_string(i));
    require(product[i] == (i == count - 1 ? std::ldexp(1.0, n) : 1.0),
            "product element " + std::to_string(i));
  }

  // reduce_scatter and all_gather over the same data (Note [Direct exchanges] under chorus's
  // schedule): rank r's block of the sum, then every block back.
  for (const chorus::DType dtype : {chorus::DType::Int8, chorus::DType::Float16,
                                    chorus::DType::Float32, chorus::DType::Complex64}) {
    const std::size_t block = 4099;
    const std::size_t total = block * static_cast<std::size_t>(n);
    const chorus::Tensor mine =
        chorus::reduce_scatter_tensor(ring_tensor(rank, total, dtype), "sum", 0, chorus::world());
    const std::vector<double> everything = chorus::all_gather_tensor(mine, 0, chorus::world())
                                               .to(chorus::DType::Float64)
                                               .to_vector<double>();
    for (std::size_t i = 0; i < total; ++i) {
      double expected = 0;
      for (int r = 0; r < n; ++r) {
        expected += ring_input(r, i);
      }
      if (dtype == chorus::DType::Int8) {
        expected = static_cast<double>(static_cast<std::int8_t>(static_cast<int>(expected)));
      }
      require(everything[i] == expected, std::string(chorus::dtype_name(dtype)) +
                                             " reduce_scatter + all_gather element " +
                                             std::to_string(i));
    }
  }

  // In place, and a coalesced pair of different sizes.
  chorus::Tensor in_place = ring_tensor(rank, count, chorus::DType::Float32);
  chorus::all_reduce_inplace(in_place, "sum", chorus::world());
  std::vector<chorus::Tensor> pair = chorus::all_reduce_coalesced(
      {ring_tensor(rank, count, chorus::DType::Int64), ring_tensor(rank, 3, chorus::DType::Int64)},
      "sum", chorus::world());
  chorus::wait_tensors(pair);
  const std::vector<float> in_place_values = in_place.to_vector<float>();
  const std::vector<std::int64_t> first = pair[0].to_vector<std::int64_t>();
  const std::vector<std::int64_t> second = pair[1].to_vector<std::int64_t>();
  for (std::size_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int r = 0; r < n; ++r) {
      sum += ring_input(r, i);
    }
    require(in_place_values[i] == static_cast<float>(sum), "in place element " + std::to_string(i));
    require(first[i] == static_cast<std::int64_t>(sum), "coalesced element " + std::to_string(i));
    if (i < 3) {
      require(second[i] == static_cast<std::int64_t>(sum), "coalesced small element");
    }
  }
  require(chorus::work_registry_size() == 0, "registry empty at the end");
  if (rank == 0) {
    std::printf("mpi_job rings: all checks passed on %d ranks\n", n);
  }
}

// Rank r's input to the small reductions: values that round in 16-bit floats.
chorus::Tensor small_input(int r, std::size_t count, chorus::DType dtype) {
  std::vector<double> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    values[i] = dtype == chorus::DType::Int32 || dtype == chorus::DType::Int8
                    ? static_cast<double>((r * 7 + static_cast<int>(i) * 3) % 23 - 11)
                    : 1000.0 + 0.37 * r + 0.11 * static_cast<double>(i);
  }
  return chorus::Tensor::from_vector(values).to(dtype);
}

// Whether two tensors of one dtype hold the same bytes.
bool same_bytes(const chorus::Tensor& a, const chorus::Tensor& b) { return a.bitwise_equal(b); }

void small(bool kernel_order) {
  const int rank = chorus::rank();
  const int n = chorus::world_size();
  const std::size_t per_rank = 6;
  const std::size_t count = per_rank * static_cast<std::size_t>(n);
  struct Case {
    chorus::DType dtype;
    chorus::ReduceOp op;
  };
  const std::vector<Case> cases = {{chorus::DType::Float16, "sum"},
                                   {chorus::DType::Float16, "avg"},
                                   {chorus::DType::Float16, chorus::ReduceOp::premul_sum(0.3)},
                                   {chorus::DType::Float16, "max"},
                                   {chorus::DType::BFloat16, "avg"},
                                   {chorus::DType::BFloat16, chorus::ReduceOp::premul_sum(0.3)},
                                   {chorus::DType::Float32, "avg"},
                                   {chorus::DType::Float32, "product"},
                                   {chorus::DType::Int32, "avg"},
                                   {chorus::DType::Int32, "sum"},
                                   {chorus::DType::Int32, "bxor"},
                                   {chorus::DType::Int8, "min"}};
  // Issued all at once, waited after.
  std::vector<chorus::Tensor> reduced;
  std::vector<chorus::Tensor> scattered;
  for (const Case& c : cases) {
    reduced.push_back(chorus::all_reduce(small_input(rank, count, c.dtype), c.op, chorus::world()));
    scattered.push_back(
        chorus::reduce_scatter_tensor(small_input(rank, count, c.dtype), c.op, 0, chorus::world()));
  }
  chorus::wait_tensors(scattered);
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    const std::string what = std::string(chorus::dtype_name(c.dtype)) + " " + c.op.to_string();
    // The same bits on every rank: every rank's result, gathered, against rank 0's.
    const chorus::Tensor everyone = chorus::all_gather_tensor(reduced[k], 0, chorus::world());
    for (int r = 1; r < n; ++r) {
      require(same_bytes(everyone.narrow(0, static_cast<std::int64_t>(count) * r,
                                         static_cast<std::int64_t>(count)),
                         everyone.narrow(0, 0, static_cast<std::int64_t>(count))),
              what + " all_reduce: rank " + std::to_string(r) + " differs from rank 0");
    }
    // The fold over every rank's input in group-rank order. Integers: any order gives it.
    std::vector<chorus::Tensor> inputs;
    std::vector<const void*> sources;
    for (int r = 0; r < n; ++r) {
      inputs.push_back(small_input(r, count, c.dtype));
      sources.push_back(inputs.back().unsafe_data_ptr());  // never pending
    }
    chorus::Tensor expected = chorus::Tensor::empty({static_cast<std::int64_t>(count)}, c.dtype);
    chorus::kernels::reduce(expected.unsafe_data_ptr(), sources.data(), sources.size(), count,
                            c.dtype, c.op);
    const bool exact = c.dtype == chorus::DType::Int32 || c.dtype == chorus::DType::Int8;
    if (kernel_order || exact) {
      require(same_bytes(reduced[k], expected), what + " all_reduce differs from the fold");
      require(same_bytes(scattered[k], expected
                                           .narrow(0, static_cast<std::int64_t>(per_rank) * rank,
                                                   static_cast<std::int64_t>(per_rank))
                                           .contiguous()),
              what + " reduce_scatter differs from the fold");
    }
  }
  require(chorus::work_registry_size() == 0, "registry empty at the end");
  if (rank == 0) {
    std::printf("mpi_job small: all checks passed on %d ranks%s\n", n,
                kernel_order ? " (kernel order)" : "");
  }
}

// Rank r's element i for the rounding mode: integers in [-60000, 60000] whose partial sums
// leave Float16's range (65504) in group-rank order, while every float32 sum of them is exact
// (so any order gives the fold's bits); products of small powers of two and signs.
double rounding_value(int r, std::size_t i, chorus::ReduceOp::Kind kind) {
  const auto k = static_cast<int>(i % 7);
  if (kind == chorus::ReduceOp::Kind::Product) {
    return (r + k) % 3 == 0 ? -2.0 : ((r + k) % 3 == 1 ? 0.5 : 1.0);
  }
  if (k == 0) {
    return 60000.0;  // avg 60000 everywhere; the 16-bit running sum overflowed at once
  }
  return (r % 2 == 0 ? 1.0 : -1.0) * (60000.0 - 1000.0 * k) + static_cast<double>(r);
}

chorus::Tensor rounding_input(int r, std::size_t count, chorus::DType dtype,
                              const chorus::ReduceOp& op) {
  std::vector<double> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    values[i] = rounding_value(r, i, op.kind());
  }
  if (op.kind() == chorus::ReduceOp::Kind::PremulSum) {
    std::fill(values.begin(), values.end(), 1e-4);  // the same on every rank: any order agrees
  }
  if (dtype == chorus::DType::BFloat16) {
    for (double& value : values) {
      value *= 0x1p100;  // bf16 shares float32's range: scale into its overflow
    }
  }
  return chorus::Tensor::from_vector(values).to(dtype);
}

// 16-bit float sums, averages, premul_sums and products on every path MPI takes (direct exchange,
// ring, MPI's collectives; all_reduce, reduce_scatter, reduce) against the simulator's fold in
// group-rank order, bit for bit (Note [Widened 16-bit reductions]); and float min/max with ties
// (-0/+0, NaN payloads) against the same fold (Note [Ring all_reduce], "Ties").
void rounding() {
  const int rank = chorus::rank();
  const int n = chorus::world_size();
  using chorus::DType;
  struct Case {
    DType dtype;
    chorus::ReduceOp op;
  };
  const std::vector<Case> cases = {
      {DType::Float16, "avg"},      {DType::Float16, "sum"},
      {DType::Float16, "product"},  {DType::Float16, chorus::ReduceOp::premul_sum(1e-3)},
      {DType::BFloat16, "avg"},     {DType::BFloat16, "sum"},
      {DType::BFloat16, "product"}, {DType::BFloat16, chorus::ReduceOp::premul_sum(1e-3)},
  };
  const auto fold = [n](const std::function<chorus::Tensor(int)>& input, std::size_t count,
                        DType dtype, const chorus::ReduceOp& op) {
    std::vector<chorus::Tensor> inputs;
    std::vector<const void*> sources;
    for (int r = 0; r < n; ++r) {
      inputs.push_back(input(r));
      sources.push_back(inputs.back().unsafe_data_ptr());  // never pending
    }
    chorus::Tensor expected = chorus::Tensor::empty({static_cast<std::int64_t>(count)}, dtype);
    chorus::kernels::reduce(expected.unsafe_data_ptr(), sources.data(), sources.size(), count,
                            dtype, op);
    return expected;
  };
  // 8 elements: the direct exchange or MPI's collective; 6144 (12 KiB): the ring or MPI's.
  for (const std::size_t per_rank : {std::size_t{8}, std::size_t{6144}}) {
    const std::size_t count = per_rank * static_cast<std::size_t>(n);
    for (const Case& c : cases) {
      const std::string what = std::string(chorus::dtype_name(c.dtype)) + " " + c.op.to_string() +
                               " of " + std::to_string(count);
      const auto input = [&](int r) { return rounding_input(r, count, c.dtype, c.op); };
      const chorus::Tensor expected = fold(input, count, c.dtype, c.op);
      require(same_bytes(chorus::all_reduce(input(rank), c.op, chorus::world()), expected),
              what + ": all_reduce differs from the fold");
      require(same_bytes(chorus::reduce_scatter_tensor(input(rank), c.op, 0, chorus::world()),
                         expected
                             .narrow(0, static_cast<std::int64_t>(per_rank) * rank,
                                     static_cast<std::int64_t>(per_rank))
                             .contiguous()),
              what + ": reduce_scatter differs from the fold");
      const int root = n - 1;
      const chorus::Tensor reduced = chorus::reduce(input(rank), c.op, root, chorus::world());
      chorus::wait_tensor(reduced);
      if (rank == root) {
        require(same_bytes(reduced, expected), what + ": reduce differs from the fold");
      } else {
        // Zeros (collectives.hpp), although this member's float32 scratch held the operations'
        // sums just before: neither converted nor divided into its output.
        require(
            same_bytes(reduced, chorus::Tensor::zeros({static_cast<std::int64_t>(count)}, c.dtype)),
            what + ": a non-root member's reduce output is not zeros");
      }
    }
    // Ties: rank r holds +0 (r even) or -0, and a NaN whose payload is r + 1.
    for (const DType dtype : {DType::Float32, DType::Float16, DType::Float64}) {
      for (const char* op : {"min", "max"}) {
        const auto input = [&](int r) {
          std::vector<double> values(count, r % 2 == 0 ? 0.0 : -0.0);
          chorus::Tensor tensor = chorus::Tensor::from_vector(values).to(dtype);
          auto* bytes = static_cast<unsigned char*>(tensor.unsafe_data_ptr());
          const std::size_t size = chorus::element_size(dtype);
          for (std::size_t i = 1; i < count; i += 3) {  // a quiet NaN with payload r + 1
            unsigned char* element = bytes + i * size;
            if (size == 2) {
              const auto half = static_cast<std::uint16_t>(0x7E00u | static_cast<unsigned>(r + 1));
              std::memcpy(element, &half, 2);
            } else if (size == 4) {
              const std::uint32_t bits = 0x7FC0'0000u | static_cast<std::uint32_t>(r + 1);
              std::memcpy(element, &bits, 4);
            } else {
              const std::uint64_t bits =
                  0x7FF8'0000'0000'0000ull | static_cast<std::uint64_t>(r + 1);
              std::memcpy(element, &bits, 8);
            }
          }
          return tensor;
        };
        const std::string what =
            std::string(chorus::dtype_name(dtype)) + " " + op + " ties of " + std::to_string(count);
        const chorus::Tensor expected = fold(input, count, dtype, chorus::ReduceOp(op));
        require(same_bytes(chorus::all_reduce(input(rank), op, chorus::world()), expected),
                what + ": all_reduce differs from the fold");
        require(same_bytes(chorus::reduce_scatter_tensor(input(rank), op, 0, chorus::world()),
                           expected
                               .narrow(0, static_cast<std::int64_t>(per_rank) * rank,
                                       static_cast<std::int64_t>(per_rank))
                               .contiguous()),
                what + ": reduce_scatter differs from the fold");
      }
    }
  }
  require(chorus::work_registry_size() == 0, "registry empty at the end");
  if (rank == 0) {
    std::printf("mpi_job rounding: all checks passed on %d ranks\n", n);
  }
}

void throwing() {
  (void)chorus::all_reduce(chorus::Tensor::from_vector(std::vector<float>{1.0f}), "sum",
                           chorus::world())
      .to_vector<float>();
  if (chorus::rank() == 1) {
    throw std::runtime_error("planted failure in rank 1's own code");
  }
  // The others wait here for rank 1, which never comes: the abort ends them.
  (void)chorus::all_reduce(chorus::Tensor::from_vector(std::vector<float>{1.0f}), "sum",
                           chorus::world())
      .to_vector<float>();
}

void timeout_op() {
  (void)chorus::all_reduce(chorus::Tensor::from_vector(std::vector<float>{1.0f}), "sum",
                           chorus::world())
      .to_vector<float>();
  if (chorus::rank() == 0) {
    (void)chorus::all_reduce(chorus::Tensor::from_vector(std::vector<float>{1.0f}), "sum",
                             chorus::world())
        .to_vector<float>();  // rank 1 never issues it
  }
}

void timeout() {
  if (chorus::rank() == 0) {
    (void)chorus::all_reduce(chorus::Tensor::from_vector(std::vector<float>{1.0f}), "sum",
                             chorus::world())
        .to_vector<float>();  // rank 1 never issues it
  }
}

void late_rank() {
  // Lateness, not synchronisation: rank 1 arrives well after the others started waiting.
  constexpr auto kLate = std::chrono::milliseconds(200);
  const int n = chorus::world_size();
  for (int round = 0; round < 2; ++round) {
    if (chorus::rank() == 1) {
      std::this_thread::sleep_for(kLate);
    }
    const std::vector<float> sum =
        chorus::all_reduce(chorus::Tensor::from_vector(std::vector<float>{1.0f}), "sum",
                           chorus::world())
            .to_vector<float>();
    require(sum == std::vector<float>{static_cast<float>(n)},
            "late all_reduce #" + std::to_string(round) + " is " + std::to_string(sum[0]));
  }
  if (chorus::rank() == 0) {
    std::printf("mpi_job late_rank: all checks passed on %d ranks\n", n);
  }
}

void mismatch() {
  const chorus::Tensor input = chorus::Tensor::from_vector(std::vector<float>{1, 2, 3, 4});
  if (chorus::rank() == chorus::world_size() - 1) {
    (void)chorus::all_gather_tensor(input, 0, chorus::world()).to_vector<float>();
  } else {
    (void)chorus::all_reduce(input, "sum", chorus::world()).to_vector<float>();
  }
}

// all_to_all_single of one element from every rank to every rank, except that rank `sender`
// sends rank `receiver` 1 + `extra` (its split sizes disagree with what `receiver` expects).
void all_to_all_with_extra(int sender, int receiver, std::int64_t extra) {
  const int n = chorus::world_size();
  std::vector<std::int64_t> send_sizes(static_cast<std::size_t>(n), 1);
  const std::vector<std::int64_t> recv_sizes(static_cast<std::size_t>(n), 1);
  if (chorus::rank() == sender) {
    send_sizes[static_cast<std::size_t>(receiver)] = 1 + extra;
  }
  std::int64_t total = 0;
  for (const std::int64_t size : send_sizes) {
    total += size;
  }
  const chorus::Tensor input =
      chorus::Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(total), 1.0f));
  (void)chorus::all_to_all_single(input, recv_sizes, send_sizes, chorus::world())
      .to_vector<float>();
}

// Rank 1 sends rank 0 one element more than rank 0 expects.
void splits() { all_to_all_with_extra(1, 0, 1); }

// Rank 1 sends rank 0 nothing where rank 0 expects one element: without --check-collectives
// MPI completes the short receive, and chorus's size check fails rank 0's wait (Note [Direct
// exchanges], "Short messages") instead of handing it an element nobody sent.
void short_splits() { all_to_all_with_extra(1, 0, -1); }

// The last rank all_reduces one float more than the others, through the ring (run with
// CHORUS_MPI_SCHEDULE=chorus): its chunks are longer, so some receive is truncated and some is
// short. Every rank catches its error and says what it got, so that no abort hides another
// rank's: a rank whose receive had another size gets CollectiveMismatch naming the sender (Note
// [Ring all_reduce], "Sizes"), after the ring's remaining steps, so none waits for the deadline;
// a rank whose receives all had their sizes completes (undefined without --check-collectives).
void ring_sizes() {
  const int n = chorus::world_size();
  const std::size_t count = 4096 + (chorus::rank() == n - 1 ? 1 : 0);
  std::string said;
  try {
    (void)chorus::all_reduce(chorus::Tensor::from_vector(std::vector<float>(count, 1.0f)), "sum",
                             chorus::world())
        .to_vector<float>();
    said = "completed";
  } catch (const chorus::CollectiveMismatch& error) {
    said = error.what();
  }
  std::printf("ring_sizes rank %d: %s\n", chorus::rank(), said.c_str());
  std::fflush(stdout);
}

// Small operations whose messages have the same size on every rank but that differ otherwise
// (run with CHORUS_MPI_NODE_CPUS=8, so they take the small direct exchange): the signature each
// message carries fails the work with CollectiveMismatch (Note [Direct exchanges], "Signed
// messages") instead of every rank folding with its own op. Rank 0 passes premul_sum(1), the
// others premul_sum(10).
void small_factor_mismatch() {
  const chorus::Tensor input = chorus::Tensor::from_vector(std::vector<float>{1, 2});
  const double factor = chorus::rank() == 0 ? 1.0 : 10.0;
  const std::vector<float> result =
      chorus::all_reduce(input, chorus::ReduceOp::premul_sum(factor), chorus::world())
          .to_vector<float>();
  throw std::runtime_error("the mismatched all_reduce completed with " + std::to_string(result[0]));
}

// Rank 0 all_reduces 2 floats, the others reduce_scatter 2 per rank: equal messages.
void small_kind_mismatch() {
  const int n = chorus::world_size();
  if (chorus::rank() == 0) {
    (void)chorus::all_reduce(chorus::Tensor::from_vector(std::vector<float>{1, 2}), "sum",
                             chorus::world())
        .to_vector<float>();
  } else {
    (void)chorus::reduce_scatter_tensor(
        chorus::Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(2 * n), 1.0f)),
        "sum", 0, chorus::world())
        .to_vector<float>();
  }
  throw std::runtime_error("the mismatched operations completed");
}

// Rank 0 all_reduces 2 Complex64 elements, the others 4 Float32: the bytes moved agree, the
// dtypes do not (Note [Lowering] in core; Buffer::lowered_from). Caught by the signed small
// messages, and by --check-collectives at any size.
void dtype_mismatch() {
  const chorus::Tensor input =
      chorus::rank() == 0
          ? chorus::Tensor::from_vector(std::vector<std::complex<float>>{{1, 2}, {3, 4}})
          : chorus::Tensor::from_vector(std::vector<float>{1, 2, 3, 4});
  (void)chorus::wait_tensor(chorus::all_reduce(input, "sum", chorus::world()));
  throw std::runtime_error("the mismatched all_reduce completed");
}

// A [2, 2] tensor against a [4] one: equal counts, different shapes (Note [Layout digest] in
// core), caught by the signed small messages and by --check-collectives.
void shape_mismatch() {
  const chorus::Tensor input = chorus::Tensor::from_vector(
      std::vector<float>{1, 2, 3, 4}, chorus::rank() == 0 ? chorus::Shape{2, 2} : chorus::Shape{4});
  (void)chorus::wait_tensor(chorus::all_reduce(input, "sum", chorus::world()));
  throw std::runtime_error("the mismatched all_reduce completed");
}

// Rank 0 sends itself two elements but expects one from itself: InvalidArgument before anything
// is posted (the peers' counts agree with each other, so only rank 0 can tell), or with
// --check-collectives a CollectiveMismatch from the pairwise comparison on every member.
void self_split() { all_to_all_with_extra(0, 0, 1); }

// Rank r sends rank j `count(r, j)` int32s, r * 10000 + j * 100 + k for k < count: the last rank
// 40 to each, the others 10 + j, so only the last rank's total (40 n) passes 100, the limit
// CHORUS_MPI_INT_COUNT_MAX sets for this test (Note [MPI int counts]).
void big_all_to_all() {
  const int n = chorus::world_size();
  const int rank = chorus::rank();
  require(n >= 3, "big_all_to_all runs on 3 ranks or more");
  const auto count = [n](int from, int to) { return from == n - 1 ? 40 : 10 + to; };
  std::vector<std::int64_t> send_sizes;
  std::vector<std::int64_t> recv_sizes;
  std::vector<std::int32_t> outgoing;
  for (int j = 0; j < n; ++j) {
    send_sizes.push_back(count(rank, j));
    recv_sizes.push_back(count(j, rank));
    for (int k = 0; k < count(rank, j); ++k) {
      outgoing.push_back(rank * 10000 + j * 100 + k);
    }
  }
  const std::vector<std::int32_t> incoming =
      chorus::all_to_all_single(chorus::Tensor::from_vector(outgoing), recv_sizes, send_sizes,
                                chorus::world())
          .to_vector<std::int32_t>();
  std::size_t at = 0;
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < count(i, rank); ++k) {
      require(at < incoming.size() && incoming[at] == i * 10000 + rank * 100 + k,
              "big_all_to_all: element " + std::to_string(k) + " from rank " + std::to_string(i));
      ++at;
    }
  }
  require(at == incoming.size(), "big_all_to_all: received size");
  if (rank == 0) {
    std::printf("mpi_job big_all_to_all: all checks passed on %d ranks\n", n);
  }
}

void group_order() {
  const chorus::ProcessGroup first = chorus::new_group({0, 1}, "a");
  const chorus::ProcessGroup second = chorus::new_group({0, 1}, "b");
  const chorus::Tensor input = chorus::Tensor::from_vector(std::vector<float>{1.0f});
  if (chorus::rank() == 0) {
    (void)chorus::all_reduce(input, "sum", first).to_vector<float>();
    (void)chorus::all_reduce(input, "sum", second).to_vector<float>();
  } else if (chorus::rank() == 1) {
    (void)chorus::all_reduce(input, "sum", second).to_vector<float>();
    (void)chorus::all_reduce(input, "sum", first).to_vector<float>();
  }
}

void group_cycle() {
  const chorus::ProcessGroup a = chorus::new_group({0, 1}, "a");
  const chorus::ProcessGroup b = chorus::new_group({1, 2}, "b");
  const chorus::ProcessGroup c = chorus::new_group({0, 2}, "c");
  const chorus::ProcessGroup* order[3][2] = {{&a, &c}, {&b, &a}, {&c, &b}};
  const chorus::Tensor input = chorus::Tensor::from_vector(std::vector<float>{1.0f});
  for (const chorus::ProcessGroup* group : order[chorus::rank()]) {
    (void)chorus::all_reduce(input, "sum", *group).to_vector<float>();
  }
  throw std::runtime_error("the cyclic first uses of groups completed");
}

void check_deadline(std::chrono::nanoseconds timeout) {
  const chorus::Tensor one = chorus::Tensor::from_vector(std::vector<float>{1.0f});
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 3.0f,
          "first world all_reduce");  // the world's set-up, before h's
  const chorus::ProcessGroup h = chorus::new_group({1, 2}, "h");
  const std::vector<std::int64_t> sizes(3, 1);
  const auto all_to_all = [&] {
    (void)chorus::all_to_all_single(chorus::Tensor::from_vector(std::vector<float>(3, 1.0f)), sizes,
                                    sizes, chorus::world())
        .to_vector<float>();
  };
  if (chorus::rank() == 2) {
    try {
      all_to_all();  // rank 1 is in h's set-up, waiting for this rank
      throw std::runtime_error("rank 2's all_to_all_single completed");
    } catch (const chorus::Timeout&) {  // expected: the check's first round
    }
    require(chorus::all_reduce(one, "sum", h).to_vector<float>()[0] == 2.0f, "all_reduce on h");
    // Waits, with no deadline of its own, until rank 0's MPI_Abort ends the job. Not in a second
    // collective: its Timeout (T2 after the first ended, T + 1 s after rank 0 issued) would abort
    // the job before a Timeout of rank 0's that came more than 1 s late, whatever slack rank 0
    // allows. Not by returning either: that left it in MPI_Finalize, where it kept mpirun from
    // ending after rank 0's MPI_Abort (a minute, until `timeout` killed it).
    std::promise<void> never;
    never.get_future().wait();
    throw std::runtime_error("rank 2's wait for the job's end returned");
  }
  if (chorus::rank() == 1) {
    // Waits (its longer timeout) for rank 2's Timeout, then issues the operation.
    require(chorus::all_reduce(one, "sum", h).to_vector<float>()[0] == 2.0f, "all_reduce on h");
    all_to_all();  // the check's second round waits for rank 2 until after rank 0's Timeout
    throw std::runtime_error("rank 1's all_to_all_single completed");
  }
  const auto issued = std::chrono::steady_clock::now();
  try {
    all_to_all();
  } catch (const chorus::Timeout& error) {
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - issued);
    const auto deadline = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
    // 1.5 s of slack for a loaded machine (a sanitizer build beside other jobs); the rounds' own
    // deadlines took T + rank 2's T, 2 s more than T here.
    const bool within = took <= deadline + std::chrono::milliseconds(1500);
    std::printf(
        "mpi_job check_deadline: rank 0's Timeout came %lld ms after it issued the "
        "operation, %s its %lld ms deadline: %s\n",
        static_cast<long long>(took.count()), within ? "within" : "past",
        static_cast<long long>(deadline.count()), error.what());
    std::fflush(stdout);
    throw;
  }
  throw std::runtime_error("rank 0's all_to_all_single completed");
}

void setup_retry() {
  const chorus::ProcessGroup g = chorus::new_group({0, 1}, "g");
  const chorus::Tensor one = chorus::Tensor::from_vector(std::vector<float>{1.0f});
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 2.0f,
          "first world all_reduce");  // the world's set-up, before g's
  if (chorus::rank() == 0) {
    bool timed_out = false;
    try {
      (void)chorus::all_reduce(one, "sum", g).to_vector<float>();  // rank 1 is not there yet
    } catch (const chorus::Timeout&) {
      timed_out = true;
    }
    require(timed_out, "rank 0's first set-up of g did not time out");
  }
  // Rank 1 gets here at once and waits (its long timeout) for rank 0's Timeout.
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 2.0f,
          "second world all_reduce");
  const float sum = chorus::all_reduce(one, "sum", g).to_vector<float>()[0];
  require(sum == 2.0f, "all_reduce on g after the retried set-up is " + std::to_string(sum));
  // Rank 1 paired g with rank 0's first message; the retry's sits at rank 1 and must not be
  // taken for the next set-up (a false CollectiveMismatch there, rank 0 alone in
  // MPI_Comm_create_group).
  const chorus::ProcessGroup h = chorus::new_group({0, 1}, "h");
  require(chorus::all_reduce(one, "sum", h).to_vector<float>()[0] == 2.0f, "all_reduce on h");
  // A set-up of another group while rank 1 still holds a timed-out set-up's message is refused
  // on rank 0 (rank 1 would pair with the leftover); retrying the timed-out group first works.
  const chorus::ProcessGroup g2 = chorus::new_group({0, 1}, "g2");
  const chorus::ProcessGroup h2 = chorus::new_group({0, 1}, "h2");
  if (chorus::rank() == 0) {
    bool timed_out = false;
    try {
      (void)chorus::all_reduce(one, "sum", g2).to_vector<float>();
    } catch (const chorus::Timeout&) {
      timed_out = true;
    }
    require(timed_out, "rank 0's first set-up of g2 did not time out");
    std::string refusal;
    try {
      (void)chorus::all_reduce(one, "sum", h2).to_vector<float>();
    } catch (const chorus::TransportError& error) {
      refusal = error.what();
    }
    require(refusal.find("an earlier set-up of group 'g2' [0, 1] timed out waiting for rank 1") !=
                std::string::npos,
            "rank 0's set-up of h2 was not refused: '" + refusal + "'");
  }
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 2.0f,
          "third world all_reduce");
  require(chorus::all_reduce(one, "sum", g2).to_vector<float>()[0] == 2.0f, "all_reduce on g2");
  require(chorus::all_reduce(one, "sum", h2).to_vector<float>()[0] == 2.0f, "all_reduce on h2");
  if (chorus::rank() == 0) {
    std::printf("mpi_job setup_retry: all checks passed\n");
  }
}

void busy_leftover() {
  const chorus::Tensor one = chorus::Tensor::from_vector(std::vector<float>{1.0f});
  const auto world_sum = [&one](const char* what) {
    require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 3.0f, what);
  };
  world_sum("first world all_reduce");  // the world's set-up, before the others
  const chorus::ProcessGroup g = chorus::new_group({0, 1}, "g");
  const chorus::ProcessGroup a = chorus::new_group({0, 1}, "a");
  const chorus::ProcessGroup b = chorus::new_group({1, 2}, "b");
  const chorus::ProcessGroup c = chorus::new_group({0, 2}, "c");
  const int rank = chorus::rank();
  const auto timeout_text = [&one](const chorus::ProcessGroup& group) {
    try {
      (void)chorus::all_reduce(one, "sum", group).to_vector<float>();
    } catch (const chorus::Timeout& error) {
      return std::string(error.what());
    }
    return std::string("no Timeout");
  };
  if (rank == 0) {
    const std::string text = timeout_text(g);  // rank 1 is not there yet
    require(text != "no Timeout", "rank 0's first set-up of g did not time out");
  }
  world_sum("second world all_reduce");  // rank 1 waits here for rank 0's Timeout
  if (rank != 2) {
    // Rank 1 pairs with rank 0's first message of g; the retry's stays at rank 1, stale.
    require(chorus::all_reduce(one, "sum", g).to_vector<float>()[0] == 2.0f, "all_reduce on g");
  }
  if (rank == 0) {
    const std::string text = timeout_text(a);  // rank 1 sets up b meanwhile
    require(text.find("ranks [1] of group 'a' [0, 1] did not reach its set-up within the timeout: "
                      "rank 1 is still setting up group 'b' [1, 2]") != std::string::npos,
            "rank 0's Timeout on a does not say what rank 1 is doing: " + text);
    require(chorus::all_reduce(one, "sum", c).to_vector<float>()[0] == 2.0f, "all_reduce on c");
  } else if (rank == 1) {
    require(chorus::all_reduce(one, "sum", b).to_vector<float>()[0] == 2.0f, "all_reduce on b");
  } else {
    // After rank 0's Timeout (c waits for it), so rank 1 is busy with b throughout.
    require(chorus::all_reduce(one, "sum", c).to_vector<float>()[0] == 2.0f, "all_reduce on c");
    require(chorus::all_reduce(one, "sum", b).to_vector<float>()[0] == 2.0f, "all_reduce on b");
  }
  if (rank != 2) {
    // Rank 0 retries a; rank 1 pairs with its first message, taken while it was busy with b.
    require(chorus::all_reduce(one, "sum", a).to_vector<float>()[0] == 2.0f, "all_reduce on a");
  }
  world_sum("last world all_reduce");
  if (rank == 0) {
    std::printf("mpi_job busy_leftover: all checks passed\n");
  }
}

void setup_counts() {
  const chorus::Tensor one = chorus::Tensor::from_vector(std::vector<float>{1.0f});
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 3.0f,
          "first world all_reduce");  // the world's set-up, before the others
  const chorus::ProcessGroup g = chorus::new_group({0, 1, 2}, "g");
  const chorus::ProcessGroup h = chorus::new_group({0, 2}, "h");
  const chorus::ProcessGroup j = chorus::new_group({0, 1}, "j");
  std::string outcome = "completed";
  try {
    (void)chorus::all_reduce(one, "sum", chorus::rank() == 2 ? h : g).to_vector<float>();
  } catch (const chorus::CollectiveMismatch&) {
    outcome = "CollectiveMismatch";
  } catch (const chorus::Timeout&) {
    outcome = "Timeout";
  }
  // Rank 0 has both peers' messages (g from rank 1, h from rank 2); rank 2 has rank 0's g; rank
  // 1 waits for rank 2, which never sends to it, until its short timeout.
  const char* expected = chorus::rank() == 1 ? "Timeout" : "CollectiveMismatch";
  require(outcome == expected, "rank " + std::to_string(chorus::rank()) +
                                   "'s first set-up: " + outcome + ", expected " + expected);
  if (chorus::rank() != 2) {
    const float sum = chorus::all_reduce(one, "sum", j).to_vector<float>()[0];
    require(sum == 2.0f, "all_reduce on j is " + std::to_string(sum));
  }
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 3.0f,
          "last world all_reduce");
  if (chorus::rank() == 0) {
    std::printf("mpi_job setup_counts: all checks passed\n");
  }
}

void setup_retry_late() {
  const chorus::Tensor one = chorus::Tensor::from_vector(std::vector<float>{1.0f});
  const int rank = chorus::rank();
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 3.0f,
          "first world all_reduce");  // the world's set-up, before the others
  const chorus::ProcessGroup g = chorus::new_group({0, 1, 2}, "g");
  const chorus::ProcessGroup h = chorus::new_group({0, 2}, "h");
  const chorus::ProcessGroup k = chorus::new_group({0, 1, 2}, "k");
  if (rank != 1) {
    require(chorus::all_reduce(one, "sum", h).to_vector<float>()[0] == 2.0f, "first on h");
  }
  if (rank == 0) {
    std::string text = "no Timeout";
    try {
      (void)chorus::all_reduce(one, "sum", g).to_vector<float>();  // rank 2 waits on h
    } catch (const chorus::Timeout& error) {
      text = error.what();
    }
    // Rank 1 went straight to g (its long timeout), so this set-up paired with it.
    require(
        text.find("ranks [2] of group 'g' [0, 1, 2] did not reach its set-up") != std::string::npos,
        "rank 0's first set-up of g did not time out on rank 2 alone: " + text);
    text = "no Timeout";
    try {
      (void)chorus::all_reduce(one, "sum", g).to_vector<float>();  // rank 2 still waits on h
    } catch (const chorus::Timeout& error) {
      text = error.what();
    }
    require(
        text.find("ranks [2] of group 'g' [0, 1, 2] did not reach its set-up") != std::string::npos,
        "rank 0's second set-up of g did not time out on rank 2 alone: " + text);
    require(chorus::all_reduce(one, "sum", h).to_vector<float>()[0] == 2.0f, "second on h");
  } else if (rank == 2) {
    require(chorus::all_reduce(one, "sum", h).to_vector<float>()[0] == 2.0f, "second on h");
  }
  // Rank 0's retry: ranks 1 and 2 are in MPI_Comm_create_group, and rank 1 sends nothing more.
  const float sum = chorus::all_reduce(one, "sum", g).to_vector<float>()[0];
  require(sum == 3.0f, "all_reduce on g after the retried set-up is " + std::to_string(sum));
  // The retry's message to rank 2 is stale there; a new group's set-up pairs past it.
  require(chorus::all_reduce(one, "sum", k).to_vector<float>()[0] == 3.0f, "all_reduce on k");
  if (rank == 0) {
    std::printf("mpi_job setup_retry_late: all checks passed\n");
  }
}

void setup_retry_both() {
  const chorus::Tensor one = chorus::Tensor::from_vector(std::vector<float>{1.0f});
  const int rank = chorus::rank();
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 3.0f,
          "first world all_reduce");  // the world's set-up, before the others
  const chorus::ProcessGroup g = chorus::new_group({0, 1, 2}, "g");
  const chorus::ProcessGroup h0 = chorus::new_group({0, 2}, "h0");
  const chorus::ProcessGroup h1 = chorus::new_group({1, 2}, "h1");
  const auto on = [&one](const chorus::ProcessGroup& group, const char* what) {
    require(chorus::all_reduce(one, "sum", group).to_vector<float>()[0] == 2.0f, what);
  };
  if (rank == 2) {
    on(h0, "first on h0");
    on(h1, "first on h1");
    on(h0, "second on h0");  // after rank 0's Timeout
    on(h1, "second on h1");  // after rank 1's Timeout
  } else {
    const chorus::ProcessGroup& mine = rank == 0 ? h0 : h1;
    on(mine, "first on h0 or h1");
    std::string text = "no Timeout";
    try {
      (void)chorus::all_reduce(one, "sum", g).to_vector<float>();  // rank 2 waits on h0, h1
    } catch (const chorus::Timeout& error) {
      text = error.what();
    }
    require(
        text.find("ranks [2] of group 'g' [0, 1, 2] did not reach its set-up") != std::string::npos,
        "rank " + std::to_string(rank) + "'s first set-up of g did not time out on rank 2 " +
            "alone: " + text);
    on(mine, "second on h0 or h1");
  }
  // Neither retry sends to or waits for the other: they paired for g already.
  const float sum = chorus::all_reduce(one, "sum", g).to_vector<float>()[0];
  require(sum == 3.0f, "all_reduce on g after the retried set-ups is " + std::to_string(sum));
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 3.0f,
          "last world all_reduce");
  if (rank == 0) {
    std::printf("mpi_job setup_retry_both: all checks passed\n");
  }
}

void setup_moved_on() {
  const chorus::Tensor one = chorus::Tensor::from_vector(std::vector<float>{1.0f});
  const int rank = chorus::rank();
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 3.0f,
          "first world all_reduce");  // the world's set-up, before the others
  const chorus::ProcessGroup g = chorus::new_group({0, 1, 2}, "g");
  const chorus::ProcessGroup y = chorus::new_group({0, 1}, "y");
  const auto failure = [&one](const chorus::ProcessGroup& group) {
    try {
      (void)chorus::all_reduce(one, "sum", group).to_vector<float>();
    } catch (const chorus::Timeout& error) {
      return "Timeout: " + std::string(error.what());
    } catch (const chorus::CollectiveMismatch& error) {
      return "CollectiveMismatch: " + std::string(error.what());
    }
    return std::string("completed");
  };
  if (rank != 2) {
    const std::string first = failure(g);  // rank 2 never issues g
    require(first.find("Timeout: ") == 0 &&
                first.find("ranks [2] of group 'g' [0, 1, 2] did not reach its set-up") !=
                    std::string::npos,
            "rank " + std::to_string(rank) + "'s set-up of g: " + first);
    if (rank == 0) {
      const std::string retry = failure(g);  // rank 1 sets up y meanwhile
      require(retry.find("CollectiveMismatch: ") == 0 &&
                  retry.find("rank 1 is setting up another group instead of this retry") !=
                      std::string::npos,
              "rank 0's retry of g: " + retry);
    }
    // Rank 1 waits here for rank 0, which took its message during the retry.
    require(chorus::all_reduce(one, "sum", y).to_vector<float>()[0] == 2.0f, "all_reduce on y");
  }
  require(chorus::all_reduce(one, "sum", chorus::world()).to_vector<float>()[0] == 3.0f,
          "last world all_reduce");
  if (rank == 0) {
    std::printf("mpi_job setup_moved_on: all checks passed\n");
  }
}

void sigkill() {
  (void)chorus::all_reduce(chorus::Tensor::from_vector(std::vector<float>{1.0f}), "sum",
                           chorus::world())
      .to_vector<float>();
  if (chorus::rank() == 1) {
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  (void)chorus::all_reduce(chorus::Tensor::from_vector(std::vector<float>{1.0f}), "sum",
                           chorus::world())
      .to_vector<float>();
}

}  // namespace

int main(int argc, char** argv) {
  chorus::RunOptions options = chorus::RunOptions::from_args(argc, argv);
  std::string mode = "ops";
  bool kernel_order = false;
  for (const std::string& arg : options.args) {
    if (arg.rfind("--mode=", 0) == 0) {
      mode = arg.substr(7);
    }
    kernel_order = kernel_order || arg == "--kernel-order";
  }
  if (mode == "ops") {
    return chorus::run(options, ops);
  }
  if (mode == "throw") {
    return chorus::run(options, throwing);
  }
  if (mode == "timeout") {
    return chorus::run(options, timeout);
  }
  if (mode == "timeout_op") {
    return chorus::run(options, timeout_op);
  }
  if (mode == "late_rank") {
    options.timeout = std::chrono::nanoseconds::max();  // "never" (transport::Deadline::after)
    return chorus::run(options, late_rank);
  }
  if (mode == "mismatch") {
    return chorus::run(options, mismatch);
  }
  if (mode == "splits") {
    return chorus::run(options, splits);
  }
  if (mode == "short_splits") {
    return chorus::run(options, short_splits);
  }
  if (mode == "ring_sizes") {
    return chorus::run(options, ring_sizes);
  }
  if (mode == "small_factor_mismatch") {
    return chorus::run(options, small_factor_mismatch);
  }
  if (mode == "small_kind_mismatch") {
    return chorus::run(options, small_kind_mismatch);
  }
  if (mode == "dtype_mismatch") {
    return chorus::run(options, dtype_mismatch);
  }
  if (mode == "shape_mismatch") {
    return chorus::run(options, shape_mismatch);
  }
  if (mode == "group_order") {
    return chorus::run(options, group_order);
  }
  if (mode == "group_cycle") {
    return chorus::run(options, group_cycle);
  }
  if (mode == "check_deadline") {
    return chorus::run(options, [&options] { check_deadline(options.timeout); });
  }
  if (mode == "setup_retry") {
    return chorus::run(options, setup_retry);
  }
  if (mode == "busy_leftover") {
    return chorus::run(options, busy_leftover);
  }
  if (mode == "setup_counts") {
    return chorus::run(options, setup_counts);
  }
  if (mode == "setup_retry_late") {
    return chorus::run(options, setup_retry_late);
  }
  if (mode == "setup_retry_both") {
    return chorus::run(options, setup_retry_both);
  }
  if (mode == "setup_moved_on") {
    return chorus::run(options, setup_moved_on);
  }
  if (mode == "sigkill") {
    return chorus::run(options, sigkill);
  }
  if (mode == "big_all_to_all") {
    return chorus::run(options, big_all_to_all);
  }
  if (mode == "self_split") {
    return chorus::run(options, self_split);
  }
  if (mode == "rings") {
    return chorus::run(options, rings);
  }
  if (mode == "rounding") {
    return chorus::run(options, rounding);
  }
  if (mode == "small") {
    return chorus::run(options, [kernel_order] { small(kernel_order); });
  }
  std::fprintf(stderr, "mpi_job: unknown --mode=%s\n", mode.c_str());
  return 2;
}
