// The rendezvous store at scale (issue 6 item 2): K clients on loopback, each connects, sets its
// own key, then reads everyone's — the NCCL bootstrap pattern (every rank publishes its address,
// then gathers all of them). Prints the time to completion (the median of --runs) and the rates.
//
//   bench_store [--clients=256,1024,4096] [--runs=5] [--mode=multi_get|get] [--value-bytes=8]
//
// Every client is a thread with a blocking chorus::store::Client; the server is one
// chorus::store::Server (one thread) in the same process. Threads are created and waiting before
// the clock starts; the clock stops when the last client has every value. Each client checks the
// values it read, after its clock reading. Every client asks for the same key list, in the same
// order: the server's best case, where it can answer every multi_get after the first from the
// same encoded answer. The process needs two descriptors per client (its socket and the server's
// end), so the bench raises its soft RLIMIT_NOFILE to the hard limit and says so; a count the
// limit cannot hold is refused up front.

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chorus/store/store.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Descriptors besides the clients' (stdio, the listening socket, the test harness's).
constexpr rlim_t kSpareDescriptors = 64;

struct Options {
  std::vector<int> clients{256, 1024, 4096};
  int runs = 5;
  bool multi_get = true;
  std::size_t value_bytes = 8;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_store: %s\nusage: bench_store [--clients=256,1024,4096] [--runs=5] "
               "[--mode=multi_get|get] [--value-bytes=8]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::string_view name) -> std::optional<std::string> {
      if (arg.substr(0, name.size()) == name && arg.size() > name.size() &&
          arg[name.size()] == '=') {
        return std::string(arg.substr(name.size() + 1));
      }
      return std::nullopt;
    };
    if (auto list = value("--clients")) {
      options.clients.clear();
      std::size_t start = 0;
      while (start <= list->size()) {
        const std::size_t comma = std::min(list->find(',', start), list->size());
        const int k = std::atoi(list->substr(start, comma - start).c_str());
        if (k < 1) {
          usage("bad --clients");
        }
        options.clients.push_back(k);
        start = comma + 1;
      }
    } else if (auto runs = value("--runs")) {
      options.runs = std::atoi(runs->c_str());
      if (options.runs < 1) {
        usage("bad --runs");
      }
    } else if (auto mode = value("--mode")) {
      if (*mode != "multi_get" && *mode != "get") {
        usage("bad --mode");
      }
      options.multi_get = *mode == "multi_get";
    } else if (auto bytes = value("--value-bytes")) {
      options.value_bytes = static_cast<std::size_t>(std::atoll(bytes->c_str()));
    } else {
      usage("unknown argument " + std::string(arg));
    }
  }
  return options;
}

// Raises the soft descriptor limit to the hard one; returns the limit now in force.
rlim_t raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return 0;
  }
  const rlim_t before = limit.rlim_cur;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      limit.rlim_cur = before;
    }
  }
  std::printf("bench_store: RLIMIT_NOFILE soft limit %llu -> %llu (hard %llu)\n",
              static_cast<unsigned long long>(before),
              static_cast<unsigned long long>(limit.rlim_cur),
              static_cast<unsigned long long>(limit.rlim_max));
  return limit.rlim_cur;
}

std::string value_of(int rank, std::size_t bytes) {
  std::string value = std::to_string(rank);
  value.resize(std::max(bytes, value.size()), '.');
  return value;
}

// One run with k clients: seconds to completion, or a negative number when a client failed.
double run_once(int k, const Options& options) {
  chorus::store::Server server;
  std::vector<std::string> keys;
  std::vector<std::string> expected;
  keys.reserve(static_cast<std::size_t>(k));
  for (int rank = 0; rank < k; ++rank) {
    keys.push_back("addr/" + std::to_string(rank));
    expected.push_back(value_of(rank, options.value_bytes));
  }
  std::mutex mutex;
  // The start line: every thread is created and parked on `go` before the clock starts (an
  // atomic wait wakes them all without a mutex to fight over).
  std::atomic<int> ready = 0;
  std::atomic<bool> go = false;
  std::atomic<Clock::rep> last_done = 0;
  std::atomic<int> failures = 0;
  std::string first_failure;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(k));
  for (int rank = 0; rank < k; ++rank) {
    threads.emplace_back([&, rank] {
      ready.fetch_add(1);
      ready.notify_one();
      go.wait(false);
      try {
        chorus::store::ClientOptions client_options;
        client_options.port = server.port();
        chorus::store::Client client(client_options, std::chrono::seconds(60));
        client.set(keys[static_cast<std::size_t>(rank)], expected[static_cast<std::size_t>(rank)]);
        std::vector<std::string> values;
        if (options.multi_get) {
          values = client.multi_get(keys, std::chrono::seconds(60));
        } else {
          values.reserve(keys.size());
          for (const std::string& key : keys) {
            values.push_back(client.get(key, std::chrono::seconds(60)));
          }
        }
        // Completion is when the last client holds every value (not when its thread has exited:
        // unmapping thousands of thread stacks is not the store's time), taken before the check:
        // comparing K values in each of K clients is not the store's time either.
        const Clock::rep done = Clock::now().time_since_epoch().count();
        if (values != expected) {
          throw std::runtime_error("read wrong values");
        }
        Clock::rep seen = last_done.load();
        while (seen < done && !last_done.compare_exchange_weak(seen, done)) {
        }
      } catch (const std::exception& error) {
        if (failures.fetch_add(1) == 0) {
          const std::lock_guard lock(mutex);
          first_failure = "client " + std::to_string(rank) + ": " + error.what();
        }
      }
    });
  }
  for (int seen = ready.load(); seen != k; seen = ready.load()) {
    ready.wait(seen);
  }
  const Clock::time_point start = Clock::now();
  go = true;
  go.notify_all();
  for (auto& thread : threads) {
    thread.join();
  }
  const double seconds =
      std::chrono::duration<double>(Clock::time_point(Clock::duration(last_done.load())) - start)
          .count();
  if (failures.load() > 0) {
    std::fprintf(stderr, "bench_store: %d of %d clients failed; first: %s\n", failures.load(), k,
                 first_failure.c_str());
    return -1;
  }
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  const rlim_t descriptors = raise_descriptor_limit();
  std::printf(
      "bench_store: each client connects, sets its key, then %s; %d runs, median shown\n",
      options.multi_get ? "reads all K keys with one multi_get" : "reads all K keys with K gets",
      options.runs);
  std::printf("%8s %10s %10s %10s %14s %14s\n", "clients", "median_s", "min_s", "max_s",
              "requests/s", "keys_read/s");
  int status = 0;
  for (const int k : options.clients) {
    const auto needed = static_cast<rlim_t>(2 * k) + kSpareDescriptors;
    if (needed > descriptors) {
      std::printf("%8d  skipped: needs ~%llu descriptors, the limit is %llu\n", k,
                  static_cast<unsigned long long>(needed),
                  static_cast<unsigned long long>(descriptors));
      status = 1;
      continue;
    }
    std::vector<double> times;
    for (int run = 0; run < options.runs; ++run) {
      const double seconds = run_once(k, options);
      if (seconds < 0) {
        return 1;
      }
      times.push_back(seconds);
    }
    std::sort(times.begin(), times.end());
    const double median = times.size() % 2 == 1
                              ? times[times.size() / 2]
                              : (times[times.size() / 2 - 1] + times[times.size() / 2]) / 2;
    // Requests: hello, set, and one multi_get (or k gets) per client.
    const double requests =
        static_cast<double>(k) * (options.multi_get ? 3.0 : 2.0 + static_cast<double>(k));
    const double keys_read = static_cast<double>(k) * static_cast<double>(k);
    std::printf("%8d %10.3f %10.3f %10.3f %14.0f %14.0f\n", k, median, times.front(), times.back(),
                requests / median, keys_read / median);
    std::fflush(stdout);
  }
  return status;
}
