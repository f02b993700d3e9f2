#include "cli/lr_schedule_command.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <nlohmann/json.hpp>

#include "optim/lr_schedule.h"
#include "train/run_config.h"

namespace moecore::cli {

void run_lr_schedule(const LrScheduleArgs& args) {
  // load_run_config applies the schedule's checks over the run's length (validate_lr_schedule),
  // so a schedule training would refuse is refused here with the same one-line error.
  const RunConfig config = load_run_config(args.config, args.overrides);
  const TrainConfig& tc = config.train;
  const int64_t tokens_per_step = tc.batch_size * tc.seq_len;
  std::vector<int64_t> updates, tokens_seen;
  std::vector<double> rates;
  for (int64_t step = 0; step < tc.max_steps; ++step) {
    const int64_t update = step + 1;  // as metrics.jsonl numbers them
    if (update != 1 && update != tc.max_steps && update % args.every != 0) continue;
    updates.push_back(update);
    tokens_seen.push_back(update * tokens_per_step);
    rates.push_back(learning_rate(config.optim, step, tc.max_steps, tokens_per_step));
  }
  // The schedule's and the units' names as the config spells them.
  const toml::table written = toml::parse(run_config_to_toml(config));
  const std::string schedule = written["optim"]["schedule"].value_or(std::string());
  const std::string units = written["optim"]["units"].value_or(std::string());
  if (args.json) {
    fmt::print("{}\n", nlohmann::json{{"schedule", schedule},
                                      {"units", units},
                                      {"max_steps", tc.max_steps},
                                      {"tokens_per_update", tokens_per_step},
                                      {"update", updates},
                                      {"tokens_seen", tokens_seen},
                                      {"lr", rates}}
                           .dump());
    return;
  }
  fmt::print("# optim.schedule = \"{}\", optim.units = \"{}\": {} updates of {} tokens\n", schedule,
             units, tc.max_steps, tokens_per_step);
  fmt::print("update tokens_seen lr\n");
  // {} prints a double's shortest form that reads back to the same bits, as metrics.jsonl does.
  for (size_t i = 0; i < updates.size(); ++i)
    fmt::print("{} {} {}\n", updates[i], tokens_seen[i], rates[i]);
}

}  // namespace moecore::cli
