// The four example programs' code as properties (docs/properties.md, "Your own properties"):
// for generated shapes, data and world sizes, under generated schedules, what every rank holds
// equals the single-rank reference bitwise, and (schedule_independent) every rank's results are
// the same under other schedules and reduction orders. The compute and the references are the
// programs' own (examples/*.hpp); docs/examples.md.
//
//   examples_property                         # 8 simulated ranks, 100 cases per property
//   examples_property --ranks=3 --seed=4 --cases=40
//   examples_property --property=example.moe*     # (or --properties=)
//   examples_property --runner=lockstep       # the real-transport runner, on simulated ranks
//   examples_property --bug=unpermuted        # a planted bug (as in the programs): fails, shrunk
//   examples_property --bug=unpermuted --replay-case <token>   # rerun the minimal case
//
// Bugs: local-dx (tensor_parallel_mlp), local-gradient (sharded_optimizer), wait-in-backward
// (ddp_buckets), unpermuted (moe_dispatch).

#include <chorus/chorus.hpp>
#include <chorus/props/runner.hpp>
#include <cstdint>
#include <iostream>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ddp_buckets.hpp"
#include "moe_dispatch.hpp"
#include "sharded_optimizer.hpp"
#include "tensor_parallel_mlp.hpp"

namespace {

using chorus::props::Env;
using chorus::props::Property;
using chorus::props::World;

// The planted bugs the properties' cases carry (every case, so that the failure shrinks).
struct Bugs {
  bool local_dx = false;
  bool local_gradient = false;
  bool wait_in_backward = false;
  bool unpermuted = false;
};

// Compares every result with the reference (bitwise, naming the first differing element) and
// mixes it into the rank's digest, which the schedule-independence runs compare.
void require_reference(Env& env, const examples::Results& actual,
                       const examples::Results& expected) {
  CHORUS_CHECK_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    env.require_bitwise_equal(actual[i].tensor, expected[i].tensor, actual[i].name);
    env.record(actual[i].tensor);
  }
}

constexpr chorus::props::Needs kEveryScheduleSameResult{.schedule_independent = true};

// ---- tensor_parallel_mlp

rc::Gen<examples::MlpCase> gen_mlp_case(const World&, Bugs bugs) {
  return rc::gen::build<examples::MlpCase>(
      rc::gen::set(&examples::MlpCase::tokens_per_rank, rc::gen::inRange<std::int64_t>(1, 4)),
      rc::gen::set(&examples::MlpCase::model, rc::gen::inRange<std::int64_t>(1, 7)),
      rc::gen::set(&examples::MlpCase::hidden_per_rank, rc::gen::inRange<std::int64_t>(1, 4)),
      rc::gen::set(&examples::MlpCase::data_seed, rc::gen::arbitrary<std::uint64_t>()),
      rc::gen::set(&examples::MlpCase::bug_local_dx, rc::gen::just(bugs.local_dx)));
}

Property mlp_property(examples::MlpVariant variant, Bugs bugs) {
  const bool sequence = variant == examples::MlpVariant::SequenceParallel;
  return chorus::props::make_property<examples::MlpCase>(
      sequence ? "example.sequence_parallel_mlp" : "example.tensor_parallel_mlp",
      sequence ? "sequence-parallel MLP (all_gather + reduce_scatter) forward and backward "
                 "equals the single-rank block"
               : "tensor-parallel MLP (all_reduce) forward and backward equals the single-rank "
                 "block",
      [bugs](World world) { return gen_mlp_case(world, bugs); },
      [variant](const examples::MlpCase& c, Env& env) {
        require_reference(
            env, examples::run_mlp(c, variant),
            examples::reference_mlp(c, variant, chorus::world_size(), chorus::rank()));
      },
      kEveryScheduleSameResult);
}

// ---- sharded_optimizer

Property sharded_optimizer_property(Bugs bugs) {
  return chorus::props::make_property<examples::ShardedCase>(
      "example.sharded_optimizer",
      "FSDP-style all_gather / reduce_scatter / shard SGD equals single-rank training",
      [bugs](World) {
        using examples::ShardedCase;
        return rc::gen::build<ShardedCase>(
            rc::gen::set(&ShardedCase::inputs, rc::gen::inRange<std::int64_t>(1, 7)),
            rc::gen::set(&ShardedCase::outputs, rc::gen::inRange<std::int64_t>(1, 5)),
            rc::gen::set(&ShardedCase::batch_per_rank, rc::gen::inRange<std::int64_t>(1, 5)),
            rc::gen::set(&ShardedCase::steps, rc::gen::inRange<std::int64_t>(0, 5)),
            rc::gen::set(&ShardedCase::data_seed, rc::gen::arbitrary<std::uint64_t>()),
            rc::gen::set(&ShardedCase::bug_local_gradient, rc::gen::just(bugs.local_gradient)));
      },
      [](const examples::ShardedCase& c, Env& env) {
        require_reference(
            env, examples::run_sharded_optimizer(c),
            examples::reference_sharded_optimizer(c, chorus::world_size(), chorus::rank()));
      },
      kEveryScheduleSameResult);
}

// ---- ddp_buckets

Property ddp_buckets_property(Bugs bugs) {
  return chorus::props::make_property<examples::DdpCase>(
      "example.ddp_buckets",
      "bucketed all_reduce_coalesced overlapping backward, waited when consumed, equals "
      "single-rank training",
      [bugs](World) {
        using examples::DdpCase;
        return rc::gen::build<DdpCase>(
            rc::gen::set(&DdpCase::layers, rc::gen::inRange<std::int64_t>(1, 4)),
            rc::gen::set(&DdpCase::width, rc::gen::inRange<std::int64_t>(1, 5)),
            rc::gen::set(&DdpCase::batch_per_rank, rc::gen::inRange<std::int64_t>(1, 4)),
            rc::gen::set(&DdpCase::bucket_elements, rc::gen::inRange<std::int64_t>(1, 41)),
            rc::gen::set(&DdpCase::steps, rc::gen::inRange<std::int64_t>(1, 3)),
            rc::gen::set(&DdpCase::data_seed, rc::gen::arbitrary<std::uint64_t>()),
            rc::gen::set(&DdpCase::bug_wait_in_backward, rc::gen::just(bugs.wait_in_backward)));
      },
      [](const examples::DdpCase& c, Env& env) {
        require_reference(env, examples::run_ddp_buckets(c),
                          examples::reference_ddp_buckets(c, chorus::world_size()));
      },
      kEveryScheduleSameResult);
}

// ---- moe_dispatch

Property moe_dispatch_property(Bugs bugs) {
  return chorus::props::make_property<examples::MoeCase>(
      "example.moe_dispatch",
      "MoE dispatch and combine with uneven all_to_all_single equal the single-rank routing",
      [bugs](World) {
        using examples::MoeCase;
        return rc::gen::build<MoeCase>(
            rc::gen::set(&MoeCase::max_tokens, rc::gen::inRange<std::int64_t>(0, 7)),
            rc::gen::set(&MoeCase::features, rc::gen::inRange<std::int64_t>(1, 5)),
            rc::gen::set(&MoeCase::experts_per_rank, rc::gen::inRange<std::int64_t>(1, 4)),
            rc::gen::set(&MoeCase::top_k, rc::gen::inRange<std::int64_t>(1, 4)),
            rc::gen::set(&MoeCase::data_seed, rc::gen::arbitrary<std::uint64_t>()),
            rc::gen::set(&MoeCase::bug_unpermuted_combine, rc::gen::just(bugs.unpermuted)));
      },
      [](const examples::MoeCase& c, Env& env) {
        require_reference(
            env, examples::run_moe_dispatch(c),
            examples::reference_moe_dispatch(c, chorus::world_size(), chorus::rank()));
      },
      kEveryScheduleSameResult);
}

std::vector<Property> all_properties(Bugs bugs) {
  return {mlp_property(examples::MlpVariant::TensorParallel, bugs),
          mlp_property(examples::MlpVariant::SequenceParallel, bugs),
          sharded_optimizer_property(bugs), ddp_buckets_property(bugs),
          moe_dispatch_property(bugs)};
}

}  // namespace

constexpr std::string_view kSynopsis =
    "examples_property [chorus flags] [--cases=N] [--property=GLOB[,GLOB...]] "
    "[--runner=simulator|lockstep] [--bug=local-dx|local-gradient|wait-in-backward|unpermuted] "
    "[--replay-case TOKEN]";

int main(int argc, char** argv) {
  try {
    const chorus::RunOptions run_options = chorus::RunOptions::from_args(argc, argv);
    std::string runner = "simulator";
    std::string replay_case;
    std::string selection;
    std::string bug_flag;
    Bugs bugs;
    chorus::props::CheckOptions options;
    options.ranks = run_options.ranks;
    options.seed = run_options.seed;
    if (examples::help_asked(run_options.args, kSynopsis)) {
      return 0;
    }
    for (const std::string& arg : examples::joined_flags(
             run_options.args,
             {"--bug", "--runner", "--property", "--properties", "--replay-case", "--cases"})) {
      if (arg == "--bug=local-dx") {
        bugs.local_dx = true;
      } else if (arg == "--bug=local-gradient") {
        bugs.local_gradient = true;
      } else if (arg == "--bug=wait-in-backward") {
        bugs.wait_in_backward = true;
      } else if (arg == "--bug=unpermuted") {
        bugs.unpermuted = true;
      } else if (arg.rfind("--runner=", 0) == 0) {
        runner = arg.substr(9);
      } else if (arg.rfind("--property=", 0) == 0) {  // as chorus check names it
        selection = arg.substr(11);
      } else if (arg.rfind("--properties=", 0) == 0) {
        selection = arg.substr(13);
      } else if (arg.rfind("--replay-case=", 0) == 0) {
        replay_case = arg.substr(14);
      } else if (arg.rfind("--cases=", 0) == 0) {
        // 0 and up: props::check_options refuses 0 below, as chorus check does.
        options.cases =
            static_cast<int>(examples::flag_at_least(arg, 8, 0, std::numeric_limits<int>::max()));
      } else {
        throw examples::unknown_argument(arg, kSynopsis);
      }
      if (arg.rfind("--bug=", 0) == 0) {
        bug_flag += " " + arg;
      }
    }
    if (runner != "simulator" && runner != "lockstep") {
      std::cerr << "examples_property: --runner must be simulator or lockstep\n";
      return 2;
    }
    // Out-of-range options are refused here, once, before any rank starts (exit 2).
    chorus::props::check_options(options);
    std::vector<Property> properties = all_properties(bugs);
    if (!selection.empty()) {
      properties = chorus::props::select(properties, selection);
    }
    if (!replay_case.empty()) {
      const chorus::props::Replay replayed = chorus::props::replay(properties, replay_case);
      std::cout << chorus::props::replay_text(replayed, replay_case);
      return replayed.result.verdict == chorus::props::Verdict::Failed ? 1 : 0;
    }
    chorus::props::CheckReport report;
    bool prints = true;  // whether this process prints the report
    if (run_options.transport == "sim" && runner == "simulator") {
      report = chorus::props::check_on_simulator(properties, options);
    } else {
      // The lockstep runner: the same properties on any transport, every rank in step. Every
      // rank returns the same, agreed, report: each process keeps one of its ranks' (under
      // mpirun its only rank's) for its exit status, and the process of rank 0 prints it.
      std::mutex mutex;
      bool kept = false;
      prints = false;
      const int status = chorus::run(run_options, [&] {
        chorus::props::CheckReport mine = chorus::props::check_in_lockstep(properties, options);
        const std::lock_guard<std::mutex> lock(mutex);
        if (!kept) {
          report = std::move(mine);
          kept = true;
        }
        prints = prints || chorus::rank() == 0;
      });
      if (status != 0) {
        return status;
      }
    }
    if (prints) {
      for (const chorus::props::PropertyResult& result : report.results) {
        if (result.verdict == chorus::props::Verdict::Failed) {
          std::cout << chorus::props::failure_report(
                           result, std::string(argv[0]) + bug_flag + " --replay-case")
                    << "\n";
        }
      }
      std::cout << chorus::props::summary_table(report);
    }
    return report.passed() ? 0 : 1;
  } catch (const std::exception& error) {
    std::cerr << "examples_property: " << error.what() << "\n";
    return 2;
  }
}
