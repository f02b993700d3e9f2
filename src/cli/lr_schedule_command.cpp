#include "cli/lr_schedule_command.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "optim/lr_schedule.h"
#include "train/run_config.h"

namespace moecore::cli {

namespace {

// --json holds its arrays in memory: at most this many updates (text streams any number).
constexpr int64_t kMaxJsonUpdates = 10'000'000;

// The updates printed, in order: the first, every N-th, the last (1-based, as metrics.jsonl's
// "step"); visited without walking the ones in between.
template <typename Visit>
void for_each_printed(int64_t max_steps, int64_t every, Visit visit) {
  if (max_steps < 1) return;
  visit(1);
  // Multiples of `every` below max_steps; the step past the last is never formed (no overflow).
  for (int64_t step = every; step < max_steps; step += every) {
    if (step > 1) visit(step);
    if (max_steps - step <= every) break;
  }
  if (max_steps > 1) visit(max_steps);
}

}  // namespace

void run_lr_schedule(const LrScheduleArgs& args) {
  // load_run_config applies the schedule's checks over the run's length (validate_lr_schedule),
  // so a schedule or config that training would refuse is refused here with the same one-line
  // error (the data and the checkpoints, which this does not read, are training's to check).
  const RunConfig config = load_run_config(args.config, args.overrides);
  const TrainConfig& tc = config.train;
  const int64_t tokens_per_step = tc.batch_size * tc.seq_len;
  MOE_CHECK(tc.max_steps <= std::numeric_limits<int64_t>::max() / tokens_per_step,
            "[config] train.max_steps={} x {} tokens an update overflows a 64-bit token count",
            tc.max_steps, tokens_per_step);
  // The schedule's and the units' names as the config writer spells them (one table of names).
  const toml::table written = toml::parse(run_config_to_toml(config));
  const std::string schedule = written["optim"]["schedule"].value_or(std::string());
  const std::string units = written["optim"]["units"].value_or(std::string());
  auto rate = [&](int64_t step) {
    return learning_rate(config.optim, step - 1, tc.max_steps, tokens_per_step);
  };
  if (args.json) {
    const int64_t printed = tc.max_steps < 1 ? 0 : (tc.max_steps - 1) / args.every + 2;
    MOE_CHECK(printed <= kMaxJsonUpdates,
              "[lr-schedule] --json would hold {} updates (at most {}): pass a larger --every",
              printed, kMaxJsonUpdates);
    std::vector<int64_t> steps, tokens_seen;
    std::vector<double> rates;
    for_each_printed(tc.max_steps, args.every, [&](int64_t step) {
      steps.push_back(step);
      tokens_seen.push_back(step * tokens_per_step);
      rates.push_back(rate(step));
    });
    fmt::print("{}\n", nlohmann::json{{"schedule", schedule},
                                      {"units", units},
                                      {"max_steps", tc.max_steps},
                                      {"tokens_per_step", tokens_per_step},
                                      {"step", steps},
                                      {"tokens_seen", tokens_seen},
                                      {"lr", rates}}
                           .dump());
    return;
  }
  fmt::print("# optim.schedule = \"{}\", optim.units = \"{}\": {} updates of {} tokens\n", schedule,
             units, tc.max_steps, tokens_per_step);
  fmt::print("step tokens_seen lr\n");
  // {} prints a double's shortest form that reads back to the same bits, as metrics.jsonl does.
  for_each_printed(tc.max_steps, args.every, [&](int64_t step) {
    fmt::print("{} {} {}\n", step, step * tokens_per_step, rate(step));
  });
}

}  // namespace moecore::cli
