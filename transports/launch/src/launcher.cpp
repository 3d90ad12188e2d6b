#include "chorus/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/check.hpp"
#include "chorus/error.hpp"
#include "chorus/store/store.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX, not in unistd.h

namespace chorus::launcher {
namespace {

// Note [Launcher events]
// One thread, one poll(): the signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP, blocked for the
// duration so they arrive only there; a stop signal the caller ignores is left out and stays
// ignored) and the read end of every rank's stdout and stderr pipe.
// The poll timeout is the SIGTERM grace deadline while stopping, else infinite: no sleeps. A
// SIGCHLD reaps with waitpid(pid, WNOHANG) on our own pids only (the caller may have other
// children), then drains what the dead rank left in its pipes, so its last lines come out
// before the message about its death. The loop ends when every rank is reaped; pipes a
// grandchild still holds are drained once more without blocking and closed. Output is queued,
// never written blocking (Note [Launcher output]).

// Note [Launcher output]
// The event loop must never block in write(): a reader that stalls (`chorus launch ... | less`
// left on its first page) would keep it from the signalfd, so a supervisor's SIGTERM, the grace
// deadline's SIGKILL and a dead rank would all wait for the reader. The ranks' lines and the
// launcher's messages are queued (Output) and written when poll() says the descriptor takes
// more, at most PIPE_BUF bytes a write: a pipe that polls writable has a free page, so such a
// write cannot block. The descriptors are left as the caller gave them: O_NONBLOCK belongs to
// the open file, shared with the shell and whatever else writes to it. (A socket gets
// MSG_DONTWAIT; a terminal that polls writable may still make a write wait until it takes the
// rest of one chunk, which a live terminal does at once.) Lines that fit in PIPE_BUF go whole
// in one write, as before, so a line of another writer to the same pipe cannot split ours.
// One queue per output file: a stdout and stderr that are one file (a terminal, 2>&1) share it,
// so every write keeps its order (a dead rank's last lines before the message about its death);
// two files do not hold each other up. While a queue holds kOutputBytesMax the loop stops
// reading the ranks' pipes bound for it (backpressure: the ranks block in write; pipes bound
// for the other file go on) but keeps reading the
// signalfd and keeping its deadlines. Once the ranks are gone it waits for the reader as long
// as the reader takes something at least every kOutputStallMax (the grace period after a stop
// signal; a stop signal while it waits ends the wait), then drops the rest and says so.
// A reader that went away (`chorus launch ... | head -1`) must not end the job either: a write to
// such a pipe raises SIGPIPE, whose default action would kill the launcher before write()
// returned EPIPE, and its ranks with it (PR_SET_PDEATHSIG), the job's status lost. The caller's
// disposition is the caller's (launch() is a library function, the caller may handle SIGPIPE), so
// write_some blocks SIGPIPE in this thread only while it writes, and takes (sigtimedwait, no wait)
// the one a failed write raised before unblocking it; the kernel sends it to the writing thread,
// and takes a thread's own pending signal before one sent to the process. When one is pending
// before the writes (sent by someone else, or left by the caller, who blocks SIGPIPE), none is
// taken: it is not ours to take, and ours is then left pending too (if the caller blocks SIGPIPE
// and the pending one was sent to the process, the caller sees a second one when it unblocks it,
// as it would without the launcher). A socket gets MSG_NOSIGNAL, raises none, and none is taken.
// The descriptor is then given up: the ranks' lines for it are read as usual (they never block) and
// dropped, stdout's loss is said once on stderr, and the job ends with its own status. Under a
// caller's SIG_IGN nothing changes: the write fails with EPIPE as well.
// If the launch throws (a fork or a poll fails), the ranks are killed and what they left in their
// pipes and what was queued goes out as at a normal end, before the exception goes on.

const ErrorContext kContext{-1, "chorus launch", -1, ""};

[[noreturn]] void system_error(const std::string& what) {
  const int error = errno;
  throw TransportError(kContext, what + ": " + std::strerror(error));
}

std::string signal_name(int signal_number) {
  const char* abbreviation = ::sigabbrev_np(signal_number);
  return abbreviation == nullptr ? "an unknown signal" : std::string("SIG") + abbreviation;
}

// "exited with code 3", "was killed by signal 9 (SIGKILL)".
std::string describe_status(int status) {
  if (WIFEXITED(status)) {
    return "exited with code " + std::to_string(WEXITSTATUS(status));
  }
  const int signal_number = WTERMSIG(status);
  return "was killed by signal " + std::to_string(signal_number) + " (" +
         signal_name(signal_number) + ")" + (WCOREDUMP(status) ? ", core dumped" : "");
}

// The shell's convention: the code, or 128 + the signal.
int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string random_token() {
  std::random_device device;
  std::string token;
  constexpr char kHex[] = "0123456789abcdef";
  for (int word = 0; word < 4; ++word) {
    std::uint32_t bits = device();
    for (int nibble = 0; nibble < 8; ++nibble) {
      token += kHex[bits & 0xFU];
      bits >>= 4U;
    }
  }
  return token;
}

// Whether `path` names a regular file (access(X_OK) alone passes directories).
bool regular_file(const std::string& path) {
  struct stat status {};
  return ::stat(path.c_str(), &status) == 0 && S_ISREG(status.st_mode);
}

// The program's path: as given when it holds a '/', else the first executable match on PATH.
std::string resolve_program(const std::string& program) {
  if (program.empty()) {
    throw InvalidArgument(kContext, "no program to run");
  }
  if (program.find('/') != std::string::npos) {
    if (::access(program.c_str(), X_OK) != 0) {
      throw InvalidArgument(kContext, "cannot execute '" + program + "': " + std::strerror(errno));
    }
    if (!regular_file(program)) {
      throw InvalidArgument(kContext, "cannot execute '" + program + "': not a regular file");
    }
    return program;
  }
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): reading only
  const std::string directories = path == nullptr ? "/usr/local/bin:/usr/bin:/bin" : path;
  std::size_t start = 0;
  while (start <= directories.size()) {
    std::size_t end = directories.find(':', start);
    if (end == std::string::npos) {
      end = directories.size();
    }
    const std::string directory = directories.substr(start, end - start);
    std::string candidate = (directory.empty() ? "." : directory) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0 && regular_file(candidate)) {
      return candidate;
    }
    start = end + 1;
  }
  throw InvalidArgument(kContext, "cannot find program '" + program + "' on PATH");
}

// Blocks `signals` in this thread for its lifetime (threads started meanwhile inherit that).
class SignalBlock {
 public:
  explicit SignalBlock(const sigset_t& signals) {
    if (::pthread_sigmask(SIG_BLOCK, &signals, &previous_) != 0) {
      system_error("pthread_sigmask");
    }
  }
  ~SignalBlock() { ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;
  const sigset_t& previous() const { return previous_; }

 private:
  sigset_t previous_{};
};

sigset_t pipe_signal_set() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGPIPE);
  return signals;
}

// Whether a SIGPIPE is pending, for this thread or the process.
bool pipe_signal_pending() {
  sigset_t pending;
  sigemptyset(&pending);
  return ::sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
}

// Takes the pending SIGPIPE that a failed write to a pipe raised in this thread (blocked: see
// write_some), so that it is never delivered. A signal pending for the thread is taken before one
// pending for the process.
void take_pipe_signal() {
  const sigset_t signals = pipe_signal_set();
  const timespec now{0, 0};
  while (::sigtimedwait(&signals, nullptr, &now) < 0 && errno == EINTR) {
  }
}

// The queued output (Note [Launcher output]): one queue per output file, written without
// blocking.
class Output {
 public:
  Output(int stdout_fd, int stderr_fd) : fds_{stdout_fd, stderr_fd} {
    struct stat out_status {};
    struct stat err_status {};
    const bool one_file =
        stdout_fd == stderr_fd ||
        (::fstat(stdout_fd, &out_status) == 0 && ::fstat(stderr_fd, &err_status) == 0 &&
         out_status.st_dev == err_status.st_dev && out_status.st_ino == err_status.st_ino);
    queue_of_stderr_ = one_file ? 0 : 1;
    for (std::size_t index = 0; index < fds_.size(); ++index) {
      struct stat status {};
      sockets_[index] = ::fstat(fds_[index], &status) == 0 && S_ISSOCK(status.st_mode);
    }
    failed_.reserve(fds_.size());  // give_up marks a descriptor without allocating
  }

  // Queues `text` for `fd` (stdout_fd or stderr_fd), unless writing to it failed before.
  void write(int fd, std::string text) {
    CHORUS_CHECK(fd == fds_[0] || fd == fds_[1]);
    if (text.empty() || std::find(failed_.begin(), failed_.end(), fd) != failed_.end()) {
      return;
    }
    bytes_ += text.size();
    Queue& queue = queues_[queue_of(fd)];
    queue.bytes += text.size();
    queue.pieces.push_back({fd, std::move(text)});
  }
  bool empty() const { return bytes_ == 0; }
  // Whether the queue `fd` writes to holds kOutputBytesMax: the loop stops reading the ranks'
  // pipes bound for it meanwhile (those bound for another file go on).
  bool full(int fd) const { return queues_[queue_of(fd)].bytes >= kOutputBytesMax; }

  // A POLLOUT entry for the descriptor at the head of each queue that has one.
  void add_polls(std::vector<pollfd>& fds) const {
    for (const Queue& queue : queues_) {
      if (!queue.pieces.empty()) {
        fds.push_back({queue.pieces.front().fd, POLLOUT, 0});
      }
    }
  }

  // Writes what the descriptors take now without blocking, up to a bound per queue (so the loop
  // gets back to its signals); returns the bytes written. Gives up on a descriptor whose write
  // fails (a closed terminal, a pipe whose reader went away, must not stop the launcher from
  // running and stopping its ranks): what is queued for it is dropped, and so is whatever comes
  // later; for stdout, one line on stderr says so. SIGPIPE is blocked in this thread meanwhile,
  // and one that a write raised is taken before it is unblocked (Note [Launcher output]).
  std::size_t write_some() {
    constexpr std::size_t kTurnBytesMax = std::size_t{256} << 10;
    const SignalBlock block(pipe_signal_set());
    // One pending already (sent by someone else, or raised while the caller blocks SIGPIPE) is
    // not ours to take: it stays, and so does ours, merged with it.
    const bool pipe_signal_was_pending = pipe_signal_pending();
    std::size_t total = 0;
    for (Queue& queue : queues_) {
      std::size_t turn = 0;
      while (!queue.pieces.empty() && turn < kTurnBytesMax) {
        const int fd = queue.pieces.front().fd;
        pollfd writable{fd, POLLOUT, 0};
        if (::poll(&writable, 1, 0) != 1) {
          break;  // full (or EINTR: next turn)
        }
        // Whole pieces (lines) while they fit in PIPE_BUF, else PIPE_BUF bytes of the first.
        std::array<iovec, 64> chunk{};
        std::size_t count = 0;
        std::size_t size = 0;
        for (std::size_t index = 0; index < queue.pieces.size() && count < chunk.size(); ++index) {
          Piece& piece = queue.pieces[index];
          const std::size_t skip = index == 0 ? queue.head_written : 0;
          CHORUS_CHECK(skip < piece.text.size());
          const std::size_t left = piece.text.size() - skip;
          if (piece.fd != fd || (count > 0 && size + left > PIPE_BUF)) {
            break;
          }
          chunk[count++] = {piece.text.data() + skip, std::min<std::size_t>(left, PIPE_BUF)};
          size += chunk[count - 1].iov_len;
        }
        CHORUS_CHECK(count > 0 && size > 0);
        CHORUS_CHECK(size <= PIPE_BUF);  // one page at most: a pipe that polled writable takes it
        ssize_t written = -1;
        if (sockets_[fd == fds_[0] ? 0 : 1]) {
          msghdr header{};
          header.msg_iov = chunk.data();
          header.msg_iovlen = count;
          written = ::sendmsg(fd, &header, MSG_DONTWAIT | MSG_NOSIGNAL);
        } else {
          written = ::writev(fd, chunk.data(), static_cast<int>(count));
        }
        if (written < 0) {
          if (errno == EINTR) {
            continue;
          }
          if (errno == EAGAIN || errno == EWOULDBLOCK) {
            break;  // a descriptor the caller made non-blocking: wait for POLLOUT
          }
          const int error = errno;
          // A pipe without a reader raised SIGPIPE for this thread; a socket did not
          // (MSG_NOSIGNAL), and one pending now is someone else's.
          if (error == EPIPE && !is_socket(fd) && !pipe_signal_was_pending) {
            take_pipe_signal();
          }
          give_up(fd, error);
          continue;
        }
        CHORUS_CHECK(static_cast<std::size_t>(written) <= size);
        consume(queue, static_cast<std::size_t>(written));
        turn += static_cast<std::size_t>(written);
      }
      total += turn;
    }
    return total;
  }

  // Drops everything queued; returns how many bytes that was.
  std::size_t drop() {
    const std::size_t dropped = bytes_;
    for (Queue& queue : queues_) {
      queue.pieces.clear();
      queue.head_written = 0;
      queue.bytes = 0;
    }
    bytes_ = 0;
    return dropped;
  }

 private:
  struct Piece {
    int fd = -1;
    std::string text;
  };
  struct Queue {
    std::deque<Piece> pieces;
    std::size_t head_written = 0;  // of pieces.front()
    std::size_t bytes = 0;         // not yet written
  };

  std::size_t queue_of(int fd) const { return fd == fds_[0] ? 0 : queue_of_stderr_; }
  bool is_socket(int fd) const { return sockets_[fd == fds_[0] ? 0 : 1]; }

  // `written` bytes from the head of `queue` are out.
  void consume(Queue& queue, std::size_t written) {
    CHORUS_CHECK(written <= queue.bytes && queue.bytes <= bytes_);
    bytes_ -= written;
    queue.bytes -= written;
    while (written > 0) {
      CHORUS_CHECK(!queue.pieces.empty());
      const std::size_t left = queue.pieces.front().text.size() - queue.head_written;
      const std::size_t taken = std::min(left, written);
      queue.head_written += taken;
      written -= taken;
      if (queue.head_written == queue.pieces.front().text.size()) {
        queue.pieces.pop_front();
        queue.head_written = 0;
      }
    }
  }

  // Drops what is queued for `fd`, whose write failed with `error`, and whatever comes for it
  // later. For stdout, says so on stderr (unless stderr is the same descriptor, failed too; if it
  // is another descriptor of the same closed pipe, that write fails in turn, silently).
  // Only the head's unwritten part is copied, before anything changes; the rest moves in place
  // (noexcept). So if that copy runs out of memory the exception leaves with the state as it
  // was, and a later write_some (the flush when the launch throws) meets the same failure and
  // gives up again.
  void give_up(int fd, int error) {
    CHORUS_CHECK(std::find(failed_.begin(), failed_.end(), fd) == failed_.end());
    Queue& queue = queues_[queue_of(fd)];
    const bool head_kept_in_part = queue.head_written > 0 && queue.pieces.front().fd != fd;
    std::string head_rest =
        head_kept_in_part ? queue.pieces.front().text.substr(queue.head_written) : std::string();
    std::size_t dropped = 0;
    for (std::size_t index = 0; index < queue.pieces.size(); ++index) {
      const Piece& piece = queue.pieces[index];
      if (piece.fd == fd) {
        dropped += piece.text.size() - (index == 0 ? queue.head_written : 0);
      }
    }
    // From here nothing allocates.
    failed_.push_back(fd);  // reserved by the constructor
    bytes_ -= dropped;
    queue.bytes -= dropped;
    if (head_kept_in_part) {
      queue.pieces.front().text = std::move(head_rest);
    }
    queue.pieces.erase(std::remove_if(queue.pieces.begin(), queue.pieces.end(),
                                      [fd](const Piece& piece) { return piece.fd == fd; }),
                       queue.pieces.end());
    queue.head_written = 0;
    if (fd == fds_[0]) {
      const std::string reason =
          error == EPIPE ? "the reader of stdout went away"
                         : std::string("cannot write to stdout (") + std::strerror(error) + ")";
      write(fds_[1],
            "chorus launch: " + reason + "; the job goes on, its output to stdout is discarded\n");
    }
  }

  std::array<int, 2> fds_;
  std::array<bool, 2> sockets_{};
  std::size_t queue_of_stderr_ = 1;
  std::array<Queue, 2> queues_;
  std::vector<int> failed_;  // descriptors whose write failed
  std::size_t bytes_ = 0;
};

// One direction of one rank's output: the pipe and the partial line read so far.
struct Stream {
  int fd = -1;
  int out_fd = -1;
  std::string prefix;
  std::string pending;
  Output* output = nullptr;

  // Writes every complete line of `pending` (and a too-long partial one), prefixed.
  void emit_lines() {
    std::size_t start = 0;
    for (std::size_t newline = pending.find('\n'); newline != std::string::npos;
         newline = pending.find('\n', start)) {
      output->write(out_fd, prefix + pending.substr(start, newline + 1 - start));
      start = newline + 1;
    }
    pending.erase(0, start);
    // Only a partial line longer than the limit: one of exactly kLineBytesMax bytes may end
    // with the next byte read, and is then written whole by the loop above.
    while (pending.size() > kLineBytesMax) {
      output->write(out_fd, prefix + pending.substr(0, kLineBytesMax) + "\n");
      pending.erase(0, kLineBytesMax);
    }
  }
  // The last partial line, with a newline added.
  void flush() {
    if (!pending.empty()) {
      output->write(out_fd, prefix + pending + "\n");
      pending.clear();
    }
  }
  // Reads once (or, with `drain`, until nothing is left now, up to a bound); closes the pipe
  // and flushes at end of file.
  void read_available(bool drain) {
    constexpr std::size_t kDrainBytesMax = std::size_t{4} << 20;
    std::size_t total = 0;
    char buffer[16384];
    while (fd >= 0) {
      const ssize_t count = ::read(fd, buffer, sizeof buffer);
      if (count < 0 && errno == EINTR) {
        continue;
      }
      if (count < 0 && errno == EAGAIN) {
        return;
      }
      if (count <= 0) {  // end of file, or an error: either way nothing more will come
        ::close(fd);
        fd = -1;
        flush();
        return;
      }
      pending.append(buffer, static_cast<std::size_t>(count));
      emit_lines();
      total += static_cast<std::size_t>(count);
      if (!drain || total >= kDrainBytesMax) {
        return;
      }
    }
  }
  void close_now() {
    if (fd >= 0) {
      read_available(/*drain=*/true);
    }
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
    }
    flush();
  }
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  Stream out;
  Stream err;
};

class Launch {
 public:
  Launch(const LaunchOptions& options, const sigset_t& child_mask, const rlimit& child_files,
         int signal_fd)
      : options_(options),
        child_mask_(child_mask),
        child_files_(child_files),
        signal_fd_(signal_fd),
        output_(options.stdout_fd, options.stderr_fd) {}

  // Runs the job. If that throws (a fork or a poll fails), the ranks still running are killed
  // and what they and the launcher left is written as at a normal end (finish_output) before the
  // exception goes on.
  int run() {
    try {
      return run_job();
    } catch (...) {
      write_what_is_left();
      throw;
    }
  }

  // Kills whatever is still running (an exception is unwinding): a launch never leaves orphans.
  ~Launch() {
    kill_all();
    for (Rank& rank : ranks_) {
      for (Stream* stream : {&rank.out, &rank.err}) {
        if (stream->fd >= 0) {
          ::close(stream->fd);
        }
      }
    }
  }
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

 private:
  int run_job() {
    const std::string program = resolve_program(options_.command.front());
    store::ServerOptions server_options;
    server_options.host = "127.0.0.1";
    server_options.port = 0;
    server_options.token = options_.token ? *options_.token : random_token();
    store::Server server(server_options);
    ranks_.resize(static_cast<std::size_t>(options_.ranks));
    for (int rank = 0; rank < options_.ranks && !stopping_; ++rank) {
      start(rank, program, server.port(), *server_options.token);
      // A rank that died already (the program fails at once) stops the launch early.
      reap();
    }
    while (running_ > 0) {
      wait_for_events();
    }
    for (Rank& rank : ranks_) {
      rank.out.close_now();
      rank.err.close_now();
    }
    // A stop signal still pending (one that came as the last rank ended) is the launch's: taken
    // here, it never reaches the caller once the signals are unblocked.
    take_signals();
    finish_output();
    if (failed_status_) {
      return exit_code(*failed_status_);
    }
    return received_signal_ != 0 ? 128 + received_signal_ : 0;
  }

  // SIGKILLs and reaps every rank still running.
  void kill_all() noexcept {
    for (Rank& rank : ranks_) {
      if (rank.running) {
        ::kill(rank.pid, SIGKILL);
        int status = 0;
        while (::waitpid(rank.pid, &status, 0) < 0 && errno == EINTR) {
        }
        rank.running = false;
        --running_;
      }
    }
  }

  // After run_job threw: kills the ranks still running, then writes what they left in their
  // pipes and what was queued, as a normal end does (so within kOutputStallMax of no progress).
  // Anything this throws in turn is dropped: the first exception is the one to report.
  void write_what_is_left() noexcept {
    kill_all();
    try {
      for (Rank& rank : ranks_) {
        rank.out.close_now();
        rank.err.close_now();
      }
      finish_output();
    } catch (...) {  // NOLINT(bugprone-empty-catch): see above
    }
  }

  void message(const std::string& text) {
    output_.write(options_.stderr_fd, "chorus launch: " + text + "\n");
  }

  // Writes the output still queued while the reader takes some of it (Note [Launcher output]),
  // then drops the rest, saying so (if stderr still takes that).
  void finish_output() {
    const std::chrono::milliseconds patience =
        received_signal_ != 0 ? options_.grace : kOutputStallMax;
    auto progress = std::chrono::steady_clock::now();
    int interrupted_by = 0;
    while (!output_.empty() && interrupted_by == 0) {
      if (output_.write_some() > 0) {
        progress = std::chrono::steady_clock::now();
        continue;
      }
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          progress + patience - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        break;
      }
      std::vector<pollfd> fds;
      fds.push_back({signal_fd_, POLLIN, 0});
      output_.add_polls(fds);
      const int ready = ::poll(fds.data(), fds.size(),
                               static_cast<int>(std::min<std::int64_t>(left.count(), INT_MAX)));
      if (ready < 0 && errno != EINTR) {
        system_error("poll");
      }
      if (ready > 0 && (fds[0].revents & POLLIN) != 0) {
        signalfd_siginfo info{};
        while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
          if (info.ssi_signo != SIGCHLD) {  // every rank is reaped: only a stop signal matters
            interrupted_by = static_cast<int>(info.ssi_signo);
          }
        }
      }
    }
    if (output_.empty()) {
      return;
    }
    const std::size_t dropped = output_.drop();
    message(interrupted_by != 0
                ? "received " + signal_name(interrupted_by) + "; dropping the " +
                      std::to_string(dropped) + " bytes of output not written yet"
                : "nothing of the output was taken for " + std::to_string(patience.count()) +
                      " ms; dropping the " + std::to_string(dropped) + " bytes left");
    output_.write_some();
    output_.drop();
  }

  std::vector<std::string> environment(int rank, std::uint16_t port,
                                       const std::string& token) const {
    const std::vector<std::pair<std::string, std::string>> ours = {
        {"RANK", std::to_string(rank)},
        {"WORLD_SIZE", std::to_string(options_.ranks)},
        {"LOCAL_RANK", std::to_string(rank)},
        {"LOCAL_WORLD_SIZE", std::to_string(options_.ranks)},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(port)},
        {std::string(store::kTokenEnvironmentVariable), token},
    };
    std::vector<std::string> variables;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      const std::string_view variable = *entry;
      const std::string_view key = variable.substr(0, variable.find('='));
      bool replaced = false;
      for (const auto& [name, value] : ours) {
        replaced = replaced || key == name;
      }
      if (!replaced) {
        variables.emplace_back(variable);
      }
    }
    for (const auto& [name, value] : ours) {
      variables.push_back(name + "=" + value);
    }
    return variables;
  }

  // Forks rank `rank`. Everything the child needs is prepared before fork(): between fork and
  // exec the child (of a process with a store thread) may only make async-signal-safe calls.
  void start(int rank_index, const std::string& program, std::uint16_t port,
             const std::string& token) {
    Rank& rank = ranks_[static_cast<std::size_t>(rank_index)];
    CHORUS_CHECK(!rank.running && rank.pid == -1);  // each rank starts once
    std::vector<std::string> variables = environment(rank_index, port, token);
    std::vector<char*> envp;
    for (std::string& variable : variables) {
      envp.push_back(variable.data());
    }
    envp.push_back(nullptr);
    std::vector<std::string> words = options_.command;
    std::vector<char*> argv;
    for (std::string& word : words) {
      argv.push_back(word.data());
    }
    argv.push_back(nullptr);
    const std::string exec_failed = "chorus launch: cannot execute " + program + ": ";

    // Everything that allocates before the pipes: a std::bad_alloc after them would leak them.
    rank.out =
        Stream{-1, options_.stdout_fd, "[rank " + std::to_string(rank_index) + "] ", {}, &output_};
    rank.err = Stream{-1, options_.stderr_fd, rank.out.prefix, {}, &output_};
    int out_pipe[2];
    int err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
      system_error("pipe2");
    }
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
      const int error = errno;
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      errno = error;
      system_error("pipe2");
    }
    rank.out.fd = out_pipe[0];
    rank.err.fd = err_pipe[0];
    rlimit files{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    const int fd_end = files.rlim_cur == RLIM_INFINITY || files.rlim_cur > 65536
                           ? 65536
                           : static_cast<int>(files.rlim_cur);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int error = errno;
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      errno = error;
      system_error("fork");
    }
    if (pid == 0) {
      // The child. Async-signal-safe calls only.
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::dup2(err_pipe[1], STDERR_FILENO);
      // Die with the launcher, even when it is SIGKILLed (and if it died already, now).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) {
        ::_exit(127);
      }
      // No descriptor of the launcher (the store's sockets, other ranks' pipes) leaks in.
      if (::close_range(3, ~0U, 0) != 0) {
        for (int fd = 3; fd < fd_end; ++fd) {
          ::close(fd);
        }
      }
      ::pthread_sigmask(SIG_SETMASK, &child_mask_, nullptr);
      // The rank gets the caller's descriptor limit, not the one raised for the launcher.
      ::setrlimit(RLIMIT_NOFILE, &child_files_);
      ::execve(program.c_str(), argv.data(), envp.data());
      const char* reason = ::strerrordesc_np(errno);
      ::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
      ::write(STDERR_FILENO, reason, std::strlen(reason));
      ::write(STDERR_FILENO, "\n", 1);
      ::_exit(127);
    }
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    for (const int fd : {out_pipe[0], err_pipe[0]}) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    rank.pid = pid;
    rank.running = true;
    ++running_;
  }

  // Reaps every rank that has ended (ours only) and reacts to the first failure.
  void reap() {
    for (std::size_t index = 0; index < ranks_.size(); ++index) {
      Rank& rank = ranks_[index];
      if (!rank.running) {
        continue;
      }
      int status = 0;
      const pid_t done = ::waitpid(rank.pid, &status, WNOHANG);
      if (done == 0 || (done < 0 && errno == EINTR)) {
        continue;
      }
      // Only this object reaps its pids; anything else is a bug (or a caller reaping with -1).
      CHORUS_CHECK(done == rank.pid);
      rank.running = false;
      --running_;
      CHORUS_CHECK(running_ >= 0);
      rank.out.read_available(/*drain=*/true);
      rank.err.read_available(/*drain=*/true);
      const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
      if (failed && !stopping_) {
        // The rank may have ended by (or exited on catching) the launcher's stop signal too.
        take_pending_stop_signals();
      }
      if (failed && !stopping_) {
        failed_status_ = status;
        std::string text = "rank " + std::to_string(index) + " (pid " + std::to_string(rank.pid) +
                           ") " + describe_status(status);
        if (running_ > 0) {
          text += "; stopping the other " + std::to_string(running_) +
                  (running_ == 1 ? " rank" : " ranks");
        }
        message(text);
        stop(SIGTERM);
      }
    }
  }

  // Sends `signal_number` to every running rank and starts the grace period.
  void stop(int signal_number) {
    for (const Rank& rank : ranks_) {
      if (rank.running) {
        ::kill(rank.pid, signal_number);
      }
    }
    if (!stopping_) {
      stopping_ = true;
      stop_signal_ = signal_number;
      kill_at_ = std::chrono::steady_clock::now() + options_.grace;
    }
  }

  void kill_remaining() {
    for (std::size_t index = 0; index < ranks_.size(); ++index) {
      const Rank& rank = ranks_[index];
      if (rank.running) {
        // After a second interrupt the grace was cut short, which on_signal already said.
        if (!hurried_) {
          message("rank " + std::to_string(index) + " (pid " + std::to_string(rank.pid) +
                  ") did not exit within " + std::to_string(options_.grace.count()) + " ms of " +
                  signal_name(stop_signal_) + "; sending SIGKILL");
        }
        ::kill(rank.pid, SIGKILL);
      }
    }
    killed_ = true;
  }

  void on_signal(int signal_number) {
    if (signal_number == SIGCHLD) {
      reap();
      return;
    }
    if (received_signal_ != 0) {
      // A second interrupt: no more grace. (Stopping after a rank failed is not one: the first
      // interrupt then still forwards, below.)
      if (!killed_) {
        message("received " + signal_name(signal_number) + " again; sending SIGKILL to the " +
                std::to_string(running_) + " running " + (running_ == 1 ? "rank" : "ranks"));
        hurried_ = true;
        kill_at_ = std::chrono::steady_clock::now();
      }
      return;
    }
    received_signal_ = signal_number;
    message("received " + signal_name(signal_number) +
            (running_ == 0 ? std::string("; no rank is running")
                           : "; forwarding it to the " + std::to_string(running_) + " running " +
                                 (running_ == 1 ? "rank" : "ranks")));
    stop(signal_number);
  }

  void wait_for_events() {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    fds.push_back({signal_fd_, POLLIN, 0});
    // The pipes bound for an output file whose queue is over its bound are not watched: their
    // ranks wait in write() for that file's reader (Note [Launcher output]).
    for (Rank& rank : ranks_) {
      for (Stream* stream : {&rank.out, &rank.err}) {
        if (stream->fd >= 0 && !output_.full(stream->out_fd)) {
          fds.push_back({stream->fd, POLLIN, 0});
          streams.push_back(stream);
        }
      }
    }
    output_.add_polls(fds);
    int timeout_ms = -1;
    if (stopping_ && !killed_) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(kill_at_ - std::chrono::steady_clock::now());
      // poll() takes an int: a longer wait (kGraceMax is not) ends early and loops.
      timeout_ms = static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, INT_MAX));
    }
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      system_error("poll");
    }
    if (stopping_ && !killed_ && std::chrono::steady_clock::now() >= kill_at_) {
      kill_remaining();
    }
    if (ready <= 0) {
      return;
    }
    output_.write_some();
    for (std::size_t index = 0; index < streams.size(); ++index) {
      if ((fds[index + 1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        streams[index]->read_available(/*drain=*/false);
      }
    }
    if ((fds[0].revents & POLLIN) != 0) {
      take_signals();
    }
  }

  // A terminal's Ctrl-C (a hangup, a SIGTERM to the process group) reaches the ranks too. The
  // kernel queues it for every process of the group before any of them can end by it (or exit
  // on catching it), so once a rank is seen to have ended badly, a stop signal of the
  // launcher's is already pending: handled first, the rank's end is part of the stop, not a
  // failure. Takes only the stop signals the launch reads (not one the caller ignores, which a
  // blocked signal stays pending as), never SIGCHLD (reap() runs here).
  void take_pending_stop_signals() {
    sigset_t stops;
    sigemptyset(&stops);
    for (const int stop_signal : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction action {};
      ::sigaction(stop_signal, nullptr, &action);
      if (action.sa_handler != SIG_IGN) {  // NOLINT: a union member
        sigaddset(&stops, stop_signal);
      }
    }
    const timespec now{0, 0};
    for (int taken = ::sigtimedwait(&stops, nullptr, &now); taken > 0;
         taken = ::sigtimedwait(&stops, nullptr, &now)) {
      on_signal(taken);
    }
  }

  // Handles the signals pending on signal_fd_ (non-blocking), in the kernel's order: the lowest
  // number first, so a stop signal comes before the SIGCHLD of a rank it ended.
  void take_signals() {
    signalfd_siginfo info{};
    while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      on_signal(static_cast<int>(info.ssi_signo));
    }
  }

  const LaunchOptions& options_;
  sigset_t child_mask_;
  rlimit child_files_;
  int signal_fd_;
  std::vector<Rank> ranks_;
  int running_ = 0;
  bool stopping_ = false;
  bool killed_ = false;
  bool hurried_ = false;  // a second interrupt ended the grace period early
  int stop_signal_ = SIGTERM;
  int received_signal_ = 0;
  std::optional<int> failed_status_;
  std::chrono::steady_clock::time_point kill_at_;
  Output output_;
};

}  // namespace

int launch(const LaunchOptions& options) {
  if (options.ranks < 1 || options.ranks > kRanksMax) {
    throw InvalidArgument(kContext, "-n " + std::to_string(options.ranks) +
                                        ": the number of ranks must be 1 to " +
                                        std::to_string(kRanksMax));
  }
  if (options.command.empty()) {
    throw InvalidArgument(kContext, "no program to run");
  }
  if (options.grace.count() < 0 || options.grace > kGraceMax) {
    throw InvalidArgument(
        kContext,
        "a grace period of " + std::to_string(options.grace.count()) + " ms: it must be 0 to " +
            std::to_string(std::chrono::milliseconds(kGraceMax).count()) + " ms (24 hours)");
  }
  // Each rank holds kDescriptorsPerRank of the launcher's descriptors; at the limit the store
  // could not accept a rank's connection and the job would hang until its rendezvous timeout.
  // The soft limit is raised as far as the hard one allows for the launch (the ranks get the
  // original back before exec), and a job that does not fit even then is refused here.
  rlimit original_files{};
  if (::getrlimit(RLIMIT_NOFILE, &original_files) != 0) {
    system_error("getrlimit(RLIMIT_NOFILE)");
  }
  rlimit raised_files = original_files;
  raised_files.rlim_cur = original_files.rlim_max;
  if (raised_files.rlim_cur != original_files.rlim_cur &&
      ::setrlimit(RLIMIT_NOFILE, &raised_files) != 0) {
    raised_files = original_files;  // e.g. an unlimited hard limit above the kernel's nr_open
  }
  struct RestoreFiles {
    rlimit original;
    rlimit raised;
    ~RestoreFiles() {
      if (raised.rlim_cur != original.rlim_cur) {
        ::setrlimit(RLIMIT_NOFILE, &original);
      }
    }
  } restore_files{original_files, raised_files};
  const std::uint64_t needed =
      std::uint64_t{kDescriptorsPerRank} * static_cast<std::uint64_t>(options.ranks) +
      kDescriptorsMargin;
  if (raised_files.rlim_cur != RLIM_INFINITY && needed > raised_files.rlim_cur) {
    throw InvalidArgument(
        kContext,
        "-n " + std::to_string(options.ranks) + " needs about " + std::to_string(needed) +
            " file descriptors (" + std::to_string(kDescriptorsPerRank) + " per rank and " +
            std::to_string(kDescriptorsMargin) + " for the launcher), but the limit " +
            "(RLIMIT_NOFILE, soft raised to hard) is " + std::to_string(raised_files.rlim_cur) +
            ": raise the hard limit (ulimit -Hn) or start fewer ranks");
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGCHLD);
  // A stop signal the caller ignores (nohup ignores SIGHUP; a shell ignores SIGINT in a
  // background job) stays ignored, for the launcher and, inherited across exec, for its ranks:
  // blocked and read from the signalfd it would stop the job the caller chose to protect.
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction action {};
    ::sigaction(signal_number, nullptr, &action);
    if (action.sa_handler != SIG_IGN) {  // NOLINT: a union member
      sigaddset(&signals, signal_number);
    }
  }
  // Blocked before the store's thread starts, so that it inherits the mask and these signals
  // reach the signalfd only (Note [Launcher events]).
  const SignalBlock block(signals);
  // With SIGCHLD ignored, or handled with SA_NOCLDWAIT, the kernel reaps children itself and
  // waitpid cannot report how a rank ended (ECHILD): the plain default disposition (which also
  // ignores the signal, but keeps zombies) for the launch, and the caller's own back after.
  struct sigaction child_action {};
  ::sigaction(SIGCHLD, nullptr, &child_action);
  struct sigaction child_default {};
  child_default.sa_handler = SIG_DFL;  // NOLINT: a union member
  sigemptyset(&child_default.sa_mask);
  child_default.sa_flags = 0;
  ::sigaction(SIGCHLD, &child_default, nullptr);
  struct RestoreChild {
    struct sigaction saved;
    ~RestoreChild() { ::sigaction(SIGCHLD, &saved, nullptr); }
  } restore_child{child_action};
  const int signal_fd = ::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) {
    system_error("signalfd");
  }
  int status = 0;
  try {
    Launch job(options, block.previous(), original_files, signal_fd);
    status = job.run();
  } catch (...) {
    ::close(signal_fd);
    throw;
  }
  ::close(signal_fd);
  return status;
}

}  // namespace chorus::launcher
