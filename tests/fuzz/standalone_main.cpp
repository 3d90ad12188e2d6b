// A stand-in for libFuzzer's main() where libFuzzer is not linked (any compiler other than clang
// with CHORUS_LIBFUZZER=ON): runs LLVMFuzzerTestOneInput on every file given (a directory: every
// file in it, in name order), then on `-runs=N` inputs of up to `-max_len=M` bytes from a PRNG
// seeded with `-seed=S` (libFuzzer's spellings; `--runs=N` etc. work too): random bytes, and
// corpus inputs with a few random byte edits. It prints what it ran. It learns no coverage: it
// replays corpora and smoke-tests in CTest; scripts/fuzz runs libFuzzer for real fuzzing.
//
// When an input aborts (a violated invariant, a CHORUS_CHECK, a sanitizer report with
// abort_on_error=1), the input is written to `crash-standalone-<n>` in the working directory and
// its name printed, so it can be rerun alone: `<target> crash-standalone-<n>`.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

// The input running now, for the SIGABRT handler (which may only make async-signal-safe calls).
const std::uint8_t* running_input = nullptr;
std::size_t runninrunning_input_size = 0;
char crash_file_name[64] = "crash-standalone";

extern "C" void on_abort(int signal_number) {
  const int fd = ::open(crash_file_name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    std::size_t written = 0;
    while (written < runninrunning_input_size) {
      const ssize_t n = ::write(fd, running_input + written, runninrunning_input_size - written);
      if (n <= 0) {
        break;
      }
      written += static_cast<std::size_t>(n);
    }
    ::close(fd);
    const char prefix[] = "standalone fuzz driver: the input that aborted is in ";
    (void)!::write(STDERR_FILENO, prefix, sizeof(prefix) - 1);
    (void)!::write(STDERR_FILENO, crash_file_name, std::strlen(crash_file_name));
    (void)!::write(STDERR_FILENO, "\n", 1);
  }
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

void run_input(const std::vector<std::uint8_t>& input, std::size_t index) {
  std::snprintf(crash_file_name, sizeof(crash_file_name), "crash-standalone-%zu", index);
  running_input = input.data();
  runninrunning_input_size = input.size();
  (void)LLVMFuzzerTestOneInput(input.data(), input.size());
  running_input = nullptr;
  runninrunning_input_size = 0;
}

std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "standalone fuzz driver: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// splitmix64: enough to spread generated inputs; not the simulator's generator.
std::uint64_t next_random(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A generated input: a quarter are fresh random bytes, the others a corpus input (when there is
// one) with 1 to 8 random byte edits (overwrite, insert, erase, truncate).
std::vector<std::uint8_t> generate(const std::vector<std::vector<std::uint8_t>>& corpus,
                                   std::uint64_t max_len, std::uint64_t& state) {
  const auto below = [&state](std::uint64_t n) { return n == 0 ? 0 : next_random(state) % n; };
  std::vector<std::uint8_t> input;
  if (corpus.empty() || below(4) == 0) {
    const std::uint64_t length = below(max_len + 1);
    for (std::uint64_t i = 0; i < length; ++i) {
      input.push_back(static_cast<std::uint8_t>(next_random(state)));
    }
    return input;
  }
  input = corpus[below(corpus.size())];
  const std::uint64_t edits = 1 + below(8);
  for (std::uint64_t e = 0; e < edits; ++e) {
    const auto at = static_cast<std::ptrdiff_t>(below(input.size() + 1));
    const auto byte = static_cast<std::uint8_t>(next_random(state));
    switch (below(4)) {
      case 0:
        if (at < static_cast<std::ptrdiff_t>(input.size())) {
          input[static_cast<std::size_t>(at)] = byte;
        }
        break;
      case 1:
        if (input.size() < max_len) {
          input.insert(input.begin() + at, byte);
        }
        break;
      case 2:
        if (at < static_cast<std::ptrdiff_t>(input.size())) {
          input.erase(input.begin() + at);
        }
        break;
      default:
        input.resize(static_cast<std::size_t>(at));
        break;
    }
  }
  if (input.size() > max_len) {
    input.resize(max_len);
  }
  return input;
}

// The value of `-name=V` or `--name=V` in `arg`, or null.
const char* flag_value(std::string_view arg, std::string_view name) {
  while (!arg.empty() && arg.front() == '-') {
    arg.remove_prefix(1);
  }
  if (arg.size() > name.size() && arg.substr(0, name.size()) == name && arg[name.size()] == '=') {
    return arg.data() + name.size() + 1;
  }
  return nullptr;
}

std::uint64_t parse_number(const char* text, const char* what) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0') {
    std::fprintf(stderr, "standalone fuzz driver: %s wants a number, got '%s'\n", what, text);
    std::exit(2);
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t runs = 0;
  std::uint64_t seed = 1;
  std::uint64_t max_len = 256;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (const char* value = flag_value(arg, "runs")) {
      runs = parse_number(value, "-runs");
    } else if (const char* seed_value = flag_value(arg, "seed")) {
      seed = parse_number(seed_value, "-seed");
    } else if (const char* len_value = flag_value(arg, "max_len")) {
      max_len = parse_number(len_value, "-max_len");
    } else if (!arg.empty() && arg.front() == '-') {
      std::fprintf(stderr, "standalone fuzz driver: ignoring %s (a libFuzzer flag?)\n", argv[i]);
    } else if (std::filesystem::is_directory(arg)) {
      std::vector<std::filesystem::path> in_dir;
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file()) {
          in_dir.push_back(entry.path());
        }
      }
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.emplace_back(arg);
    }
  }
  std::signal(SIGABRT, on_abort);

  std::size_t index = 0;
  std::vector<std::vector<std::uint8_t>> corpus;
  for (const std::filesystem::path& path : files) {
    corpus.push_back(read_file(path));
    run_input(corpus.back(), index++);
  }
  std::uint64_t state = seed;
  for (std::uint64_t run = 0; run < runs; ++run) {
    run_input(generate(corpus, max_len, state), index++);
  }
  std::printf(
      "standalone fuzz driver: ran %zu corpus files and %llu generated inputs (seed %llu)\n",
      files.size(), static_cast<unsigned long long>(runs), static_cast<unsigned long long>(seed));
  return 0;
}
