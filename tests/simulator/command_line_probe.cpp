// Prints chorus::sim::command_line(): this process's arguments as a replay command repeats them,
// each quoted for the shell. SimFailure.TheReplayCommandQuotesEachArgumentForTheShell
// (failure_test.cpp) runs it with arguments that need quoting.

#include <chorus/sim/sim.hpp>
#include <cstdio>

int main() {
  std::fputs(chorus::sim::command_line().c_str(), stdout);
  return 0;
}
