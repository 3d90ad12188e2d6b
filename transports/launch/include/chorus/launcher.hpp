#pragma once

// chorus::launcher — `chorus launch -n N [--] program args...`: starts N local processes of one
// SPMD program with torchrun's environment (RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
// MASTER_ADDR MASTER_PORT) plus CHORUS_STORE_TOKEN, hosts the rendezvous store they meet at
// (chorus::store::Server on 127.0.0.1, a free port), streams their output prefixed by rank, and
// stops them all when one dies. See docs/launch.md.
//
//   chorus::launcher::LaunchOptions options;
//   options.ranks = 4;
//   options.command = {"build/dev/examples/data_parallel", "--transport=nccl"};
//   return chorus::launcher::launch(options);   // an exit status for the launcher's main

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace chorus::launcher {

// Limits: ranks per launch (each costs two pipes, a store connection and a process).
inline constexpr int kRanksMax = 1024;
// File descriptors the launcher holds per rank (the read ends of its stdout and stderr pipes and
// the store's end of its connection), and a margin for its own (standard streams, signalfd, the
// store's listener and event loop, a rank's pipe write ends while it starts, the caller's).
inline constexpr int kDescriptorsPerRank = 3;
inline constexpr int kDescriptorsMargin = 64;
// The longest grace period: a day is already far past any reasonable shutdown, and the bound
// keeps every deadline computed from it far from overflowing.
inline constexpr std::chrono::hours kGraceMax{24};
// A line longer than this is written out in pieces (each prefixed), so a child that never writes
// a newline cannot make the launcher buffer without bound.
inline constexpr std::size_t kLineBytesMax = std::size_t{64} << 10;
// Output the launcher holds for a reader that is slow or stalled (`chorus launch ... | less`,
// a paused terminal), per output file. At this much it stops reading the ranks' pipes bound for
// that file, so a rank that writes more there blocks in write() until the reader catches up,
// but the launcher still handles signals and deadlines. (A dead rank's pipes are drained whatever
// the queue holds, so its last lines come out before the message about its death: the queue may
// exceed this by what they held.)
inline constexpr std::size_t kOutputBytesMax = std::size_t{1} << 20;
// At the end of a launch, how long the launcher waits for a reader that takes nothing of the
// output still queued before it drops the rest and exits (after a stop signal: the grace period;
// a stop signal while it waits drops it at once).
inline constexpr std::chrono::milliseconds kOutputStallMax{5000};

struct LaunchOptions {
  // Processes to start, 1..kRanksMax.
  int ranks = 1;
  // The program (a path, or a name looked up on PATH) and its arguments.
  std::vector<std::string> command;
  // After SIGTERM, how long a rank has to exit before it gets SIGKILL: 0 to kGraceMax.
  std::chrono::milliseconds grace{2000};
  // Where the ranks' prefixed stdout lines go, and their stderr lines plus the launcher's own
  // messages ("chorus launch: ..."). The launcher does not close them.
  int stdout_fd = 1;
  int stderr_fd = 2;
  // The store's shared secret, passed to the ranks as CHORUS_STORE_TOKEN. nullopt: a fresh
  // random one (128 bits from std::random_device).
  std::optional<std::string> token;
};

// Runs the job and returns the launcher's exit status:
// - 0 when every rank exited 0;
// - when a rank exits non-zero or is killed by a signal: that rank's code (or 128 + the signal),
//   after the message "chorus launch: rank R (pid P) exited with code C" / "was killed by signal
//   S (SIGNAME)" and stopping the others (SIGTERM, then SIGKILL after `grace`);
// - when the launcher receives SIGINT, SIGTERM or SIGHUP: 128 + that signal, after forwarding it
//   to every rank (then SIGKILL after `grace`);
// - 127 when the program cannot be executed: the first rank whose exec fails (usually rank 0)
//   says why and exits 127, and is reported and the others stopped as above; ranks not started
//   yet are not started, and those already started may or may not say so too.
// Blocks until every rank has been reaped and their output written, or given up on (a reader
// that takes nothing for kOutputStallMax, or the grace period after a stop signal: the rest is
// lost, and said so on stderr). Writing never blocks the launcher: a stalled output delays
// the ranks (kOutputBytesMax), never its handling of signals and deadlines. While it runs, SIGINT,
// SIGTERM, SIGHUP and SIGCHLD are blocked in the calling thread (read through a signalfd) and
// restored afterwards (as is an ignored SIGCHLD, set to its default meanwhile so that waitpid sees
// the ranks end); call it from the main thread of a process with no other threads that leave those
// signals unblocked. SIGPIPE is blocked in the calling thread only while it writes (one a write
// raised is taken, never delivered, unless one was pending already: docs/launch.md); its
// disposition is never changed. A stdout whose reader went
// away (or whose write fails) is given up: the ranks' output to it is read and discarded, stderr
// says so once, and the job ends with its usual status. For the launch, the soft RLIMIT_NOFILE is
// raised to the hard limit (the ranks get the original one). Not re-entrant. Throws
// InvalidArgument for bad options, a program that cannot be found, or more ranks than the
// descriptor limit allows (kDescriptorsPerRank each plus kDescriptorsMargin, against the raised
// limit), TransportError when a system call fails or the store cannot start; ranks already
// started are then SIGKILLed and reaped, and the output queued is written (as at a normal end)
// before the exception leaves.
int launch(const LaunchOptions& options);

}  // namespace chorus::launcher
