#include "cli/lr_schedule_command.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/check.h"
#include "optim/lr_schedule.h"
#include "train/resume_policy.h"
#include "train/run_config.h"
#include "train/trainer_state.h"
#include "train/training_data.h"

namespace moecore::cli {

namespace {

// --json holds its arrays in memory: at most this many updates (text streams any number).
constexpr int64_t kMaxJsonUpdates = 10'000'000;

// The updates printed from `first` on, in order: the first, every N-th, the last (1-based, as
// metrics.jsonl's "step"); visited without walking the ones in between.
template <typename Visit>
void for_each_printed(int64_t first, int64_t max_steps, int64_t every, Visit visit) {
  if (max_steps < first) return;
  visit(first);
  // Multiples of `every` after `first` and below max_steps; the step past the last is never
  // formed (no overflow).
  for (int64_t step = (first / every + 1) * every; step < max_steps; step += every) {
    visit(step);
    if (max_steps - step <= every) break;
  }
  if (max_steps > first) visit(max_steps);
}

// How many updates for_each_printed visits.
int64_t printed_count(int64_t first, int64_t max_steps, int64_t every) {
  if (max_steps < first) return 0;
  const int64_t multiples = (max_steps - 1) / every - first / every;  // in (first, max_steps)
  return 1 + std::max<int64_t>(multiples, 0) + (max_steps > first ? 1 : 0);
}

}  // namespace

void run_lr_schedule(const LrScheduleArgs& args) {
  // load_run_config applies the schedule's checks over the run's length (validate_lr_schedule),
  // so a schedule or config that training would refuse is refused here with the same one-line
  // error (the data, which this reads only for train.max_epochs's count, is training's to check).
  // A resumed run's length depends on its checkpoint: checked once that is read, as the trainer
  // does.
  const bool resumed = !args.resume.empty();
  const RunConfig config = load_run_config(
      args.config, args.overrides, {}, resumed ? ScheduleLength::kResumed : ScheduleLength::kFresh);
  const TrainConfig& tc = config.train;
  const int64_t tokens_per_step = tc.batch_size * tc.seq_len;
  // The run's updates: train.max_steps, or those until train.max_tokens or train.max_epochs
  // (from the resume's origin with --resume, as the trainer counts them).
  int64_t max_steps = tc.max_steps;
  if (tc.max_epochs > 0 && !resumed) {
    // A length in epochs needs the training set's instances: checked once it is read.
    max_steps = max_steps_for_epochs(config, open_training_set(config));
    validate_lr_schedule(config.optim, max_steps, tokens_per_step, {}, 0, tc.max_epochs);
  }
  MOE_CHECK(max_steps <= std::numeric_limits<int64_t>::max() / tokens_per_step,
            "[config] train.max_steps={} x {} tokens an update overflows a 64-bit token count",
            max_steps, tokens_per_step);
  int64_t first = 1;
  TokenOrigin origin;
  if (resumed) {
    const SavedRun saved = load_saved_run(args.resume, "[lr-schedule]");
    const TrainerState& state = saved.state;
    const bool changed = !replay_config_changes(saved.config, config).empty();
    origin = schedule_origin(state, changed);
    // The trainer's count (the training set is read only for train.max_epochs's).
    std::optional<data::TokenDataset> dataset;
    ResumePosition position;
    if (tc.max_epochs > 0) {
      dataset = open_training_set(config);
      position =
          resume_position(saved.config, state, args.resume, config, dataset->num_instances());
    }
    max_steps = resumed_max_steps(saved.config, state, args.resume, config, changed,
                                  dataset ? &*dataset : nullptr, position, "[lr-schedule]");
    MOE_CHECK(state.step <= max_steps,
              "[lr-schedule] --resume: {} is at step {}, past train.max_steps={}", args.resume,
              state.step, max_steps);
    validate_lr_schedule(config.optim, max_steps, tokens_per_step, origin, tc.max_tokens,
                         tc.max_epochs);
    first = state.step + 1;
    int64_t last = 0;  // the tokens seen after the last update
    MOE_CHECK(!__builtin_mul_overflow(max_steps - origin.step, tokens_per_step, &last) &&
                  !__builtin_add_overflow(last, origin.tokens, &last),
              "[lr-schedule] --resume: the {} tokens seen by step {} and (train.max_steps={} - {}) "
              "x {} tokens overflow a 64-bit token count",
              origin.tokens, origin.step, max_steps, origin.step, tokens_per_step);
  }
  // The tokens seen after update `step` (the origin's and then tokens_per_step an update).
  auto tokens_seen = [&](int64_t step) {
    return origin.tokens + (step - origin.step) * tokens_per_step;
  };
  // The schedule's and the units' names as the config writer spells them (one table of names).
  const toml::table written = toml::parse(run_config_to_toml(config));
  const std::string schedule = written["optim"]["schedule"].value_or(std::string());
  const std::string units = written["optim"]["units"].value_or(std::string());
  auto rate = [&](int64_t step) {
    return learning_rate(config.optim, step - 1, max_steps, tokens_per_step, origin, tc.max_tokens);
  };
  if (args.json) {
    const int64_t printed = printed_count(first, max_steps, args.every);
    MOE_CHECK(printed <= kMaxJsonUpdates,
              "[lr-schedule] --json would hold {} updates (at most {}): pass a larger --every",
              printed, kMaxJsonUpdates);
    std::vector<int64_t> steps, tokens;
    std::vector<double> rates;
    for_each_printed(first, max_steps, args.every, [&](int64_t step) {
      steps.push_back(step);
      tokens.push_back(tokens_seen(step));
      rates.push_back(rate(step));
    });
    fmt::print("{}\n", nlohmann::json{{"schedule", schedule},
                                      {"units", units},
                                      {"max_steps", max_steps},
                                      {"tokens_per_step", tokens_per_step},
                                      {"step", steps},
                                      {"tokens_seen", tokens},
                                      {"lr", rates}}
                           .dump());
    return;
  }
  fmt::print("# optim.schedule = \"{}\", optim.units = \"{}\": {} updates of {} tokens{}{}\n",
             schedule, units, max_steps, tokens_per_step,
             tc.max_tokens > 0   ? fmt::format(" (train.max_tokens={})", tc.max_tokens)
             : tc.max_epochs > 0 ? fmt::format(" (train.max_epochs={})", tc.max_epochs)
                                 : std::string(),
             resumed ? fmt::format(", resumed from {} after update {} ({} tokens seen)",
                                   args.resume, first - 1, tokens_seen(first - 1))
                     : std::string());
  fmt::print("step tokens_seen lr\n");
  // {} prints a double's shortest form that reads back to the same bits, as metrics.jsonl does.
  for_each_printed(first, max_steps, args.every, [&](int64_t step) {
    fmt::print("{} {} {}\n", step, tokens_seen(step), rate(step));
  });
}

}  // namespace moecore::cli
