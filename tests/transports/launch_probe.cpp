// A rank program for the launcher's tests (launcher_test.cpp, the launch.cli.* ctests):
//
//   launch_probe ok               two stdout lines, one stderr line, a last line without '\n'
//   launch_probe env              prints its launch environment, then meets the other ranks at
//                                 the launcher's store (set/get, an allgather)
//   launch_probe exit R CODE      every rank meets at a store barrier; then rank R exits CODE and
//                                 the others wait in pause() until the launcher stops them
//   launch_probe sigkill R        the same, but rank R SIGKILLs itself
//   launch_probe stubborn R       the same as `exit R 1`, but the others ignore SIGTERM
//   launch_probe interrupt        rank 0 does what a terminal's Ctrl-C does: SIGINT to the
//                                 launcher, then to itself (which ends it); the others wait in
//                                 pause() until the launcher stops them
//   launch_probe interrupt_exit   the same, but rank 0 exits 130 as a program catching SIGINT
//                                 does (Python's KeyboardInterrupt)
//   launch_probe flood BYTES exit|wait
//                                 writes BYTES (rounded up to whole lines) in lines of 4087
//                                 bytes, 4096 with the launcher's "[rank R] " for R < 10; then
//                                 exits 0, or waits in pause() until the launcher stops it
//   launch_probe flood_and_say BYTES exit|wait
//                                 the same as `flood`, then "flood done" on stderr (after the
//                                 last stdout line was written to the pipe) before it exits or
//                                 waits
//   launch_probe flood_split OUT ERR
//                                 rank 0 writes OUT bytes to stdout and waits in pause(); rank 1
//                                 writes ERR bytes to stderr and exits 0 (lines as `flood`)
//
// Ranks meet at a barrier before one fails, so the failure always finds the others running.

#include <signal.h>
#include <unistd.h>

#include <chorus/launch_environment.hpp>
#include <chorus/store/store.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;

const char* variable(const char* name) {
  const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): one thread
  return value == nullptr ? "<unset>" : value;
}

chorus::store::ClientOptions client_options(const chorus::LaunchEnvironment& environment) {
  chorus::store::ClientOptions options;
  options.host = environment.master_addr.value_or("127.0.0.1");
  options.port = environment.master_port.value_or(0);
  return options;  // the token: $CHORUS_STORE_TOKEN
}

int print_environment() {
  const chorus::LaunchEnvironment environment = chorus::launch_environment();
  const std::string token = variable("CHORUS_STORE_TOKEN");
  std::printf(
      "env RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s "
      "token_chars=%zu\n",
      variable("RANK"), variable("WORLD_SIZE"), variable("LOCAL_RANK"),
      variable("LOCAL_WORLD_SIZE"), variable("MASTER_ADDR"), token.size());
  std::printf(
      "parsed source=%s rank=%d world_size=%d local_rank=%d port_matches=%d\n",
      std::string(chorus::name(environment.source)).c_str(), environment.rank,
      environment.world_size, environment.local_rank,
      environment.master_port && std::to_string(*environment.master_port) == variable("MASTER_PORT")
          ? 1
          : 0);
  chorus::store::Client client(client_options(environment), 30s);
  const int rank = environment.rank;
  const int world_size = environment.world_size;
  client.set("probe/" + std::to_string(rank), "value of " + std::to_string(rank), 30s);
  const int next = (rank + 1) % world_size;
  std::printf("get probe/%d = %s\n", next,
              client.get("probe/" + std::to_string(next), 30s).c_str());
  chorus::store::PrefixStore group("probe", client);
  chorus::store::Rendezvous rendezvous(group, rank, world_size);
  std::string gathered;
  for (const std::string& blob : rendezvous.allgather_bytes("r" + std::to_string(rank), 30s)) {
    gathered += (gathered.empty() ? "" : ",") + blob;
  }
  std::printf("allgather %s\n", gathered.c_str());
  std::fflush(stdout);
  return 0;
}

// Every rank meets the others, then `failing` fails as `fail` says and the others wait (with
// `failing` -1, every rank waits). `deaf`: the ranks ignore SIGTERM and SIGINT.
template <class Fail>
int fail_one(int failing, bool deaf, Fail fail) {
  if (deaf) {
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGINT, SIG_IGN);
  }
  const chorus::LaunchEnvironment environment = chorus::launch_environment();
  chorus::store::Client client(client_options(environment), 30s);
  chorus::store::Rendezvous rendezvous(client, environment.rank, environment.world_size);
  if (environment.rank != failing) {
    // Before the barrier, so that it is out before the failure.
    std::printf("rank %d waits\n", environment.rank);
    std::fflush(stdout);
  }
  rendezvous.barrier(30s);
  if (environment.rank == failing) {
    std::printf("rank %d fails now\n", environment.rank);
    std::fflush(stdout);
    fail();
  }
  for (;;) {
    ::pause();
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() == 1 && args[0] == "ok") {
      std::printf("first line\nsecond line\n");
      std::fflush(stdout);
      std::fprintf(stderr, "a line on stderr\n");
      std::printf("no newline at the end");
      return 0;
    }
    if (args.size() == 2 && args[0] == "line") {
      // One line of N 'a's, written before its newline, then another line.
      const std::string line(static_cast<std::size_t>(std::stoul(args[1])), 'a');
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fflush(stdout);
      std::printf("\nnext\n");
      return 0;
    }
    if (args.size() == 3 && args[0] == "flood_split") {
      const bool first = std::string(variable("RANK")) == "0";
      const std::size_t total = std::stoul(args[first ? 1 : 2]);
      FILE* out = first ? stdout : stderr;
      const std::string line = std::string(4086, 'x') + "\n";
      for (std::size_t sent = 0; sent < total; sent += line.size()) {
        std::fwrite(line.data(), 1, line.size(), out);
      }
      std::fflush(out);
      if (!first) {
        return 0;
      }
      for (;;) {
        ::pause();
      }
    }
    if (args.size() == 3 && (args[0] == "flood" || args[0] == "flood_and_say") &&
        (args[2] == "exit" || args[2] == "wait")) {
      const std::size_t total = std::stoul(args[1]);
      const std::string line = std::string(4086, 'x') + "\n";
      for (std::size_t sent = 0; sent < total; sent += line.size()) {
        std::fwrite(line.data(), 1, line.size(), stdout);
      }
      std::fflush(stdout);
      if (args[0] == "flood_and_say") {
        std::fprintf(stderr, "flood done\n");
        std::fflush(stderr);
      }
      if (args[2] == "exit") {
        return 0;
      }
      for (;;) {
        ::pause();
      }
    }
    if (args.size() == 1 && args[0] == "env") {
      return print_environment();
    }
    if (args.size() == 3 && args[0] == "exit") {
      const int code = std::stoi(args[2]);
      return fail_one(std::stoi(args[1]), false, [code] { std::exit(code); });
    }
    if (args.size() == 2 && args[0] == "sigkill") {
      return fail_one(std::stoi(args[1]), false, [] { ::raise(SIGKILL); });
    }
    if (args.size() == 2 && args[0] == "stubborn") {
      return fail_one(std::stoi(args[1]), true, [] { std::exit(1); });
    }
    if (args.size() == 1 && (args[0] == "interrupt" || args[0] == "interrupt_exit")) {
      if (std::string(variable("RANK")) == "0") {
        ::kill(::getppid(), SIGINT);
        if (args[0] == "interrupt_exit") {
          std::_Exit(130);
        }
        ::raise(SIGINT);
      }
      for (;;) {
        ::pause();
      }
    }
    if (args.size() == 1 && args[0] == "deaf") {
      return fail_one(-1, true, [] {});
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "launch_probe: %s\n", error.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: launch_probe ok|line N|env|exit R CODE|sigkill R|stubborn R|deaf|flood N "
               "exit|wait|flood_and_say N exit|wait|flood_split OUT ERR\n");
  return 2;
}
