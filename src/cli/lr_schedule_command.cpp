#include "cli/lr_schedule_command.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/check.h"
#include "optim/lr_schedule.h"
#include "train/batch_size_schedule.h"
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
  // error (the data, which this reads only for train.max_epochs's count and train.batch_sizes'
  // changes under OLMo-core's order, is training's to check). A resumed run's length depends on
  // its checkpoint: checked once that is read, as the trainer does.
  const bool resumed = !args.resume.empty();
  const RunConfig config = load_run_config(
      args.config, args.overrides, {}, resumed ? ScheduleLength::kResumed : ScheduleLength::kFresh);
  const TrainConfig& given = config.train;
  const bool scheduled = given.has_batch_size_schedule();
  std::optional<data::TokenDataset> dataset;
  if (given.max_epochs > 0 || (scheduled && (config.data.order == data::OrderRule::kOlmoCore ||
                                             given.batch_size_units == BatchSizeUnits::kEpochs)))
    dataset = open_training_set(config);
  // The batch in force where the listing starts (a resume's: the checkpoint's), the sizes in
  // force before it, and where it took over (train/batch_size_schedule.h).
  RunConfig in_force = config;
  std::vector<int64_t> history{given.batch_size};
  ReplayOrigin replay;
  // The run's updates: train.max_steps, or those until train.max_tokens or train.max_epochs
  // (from the resume's origin with --resume, as the trainer counts them).
  int64_t max_steps = given.max_steps;
  if (given.max_epochs > 0 && !resumed) {
    // A length in epochs needs the training set's instances: checked once it is read.
    max_steps = max_steps_for_epochs(config, *dataset);
    validate_lr_schedule(config.optim, max_steps, given.batch_size * given.seq_len, {}, 0,
                         given.max_epochs);
  }
  int64_t first = 1;
  TokenOrigin origin;
  if (resumed) {
    const SavedRun saved = load_saved_run(args.resume, "[lr-schedule]");
    const TrainerState& state = saved.state;
    const bool changed = !replay_config_changes(saved.config, config).empty();
    ResumedBatch batch = resumed_batch(saved.config, state, config);
    history = batch.history;
    in_force = batch.in_force;
    // The trainer's count and position (the training set is read only where they need it).
    ResumePosition position{.cursor = state.data_cursor};
    if (dataset)
      position = resume_position(batch.saved_in_force, state, args.resume, in_force,
                                 dataset->num_instances());
    replay = resumed_replay_origin(state, changed, position);
    origin = token_origin(replay);  // schedule_origin(state, changed)
    max_steps = resumed_max_steps(batch.saved_in_force, state, args.resume, in_force, changed,
                                  dataset ? &*dataset : nullptr, position, "[lr-schedule]");
    MOE_CHECK(state.step <= max_steps,
              "[lr-schedule] --resume: {} is at step {}, past train.max_steps={}", args.resume,
              state.step, max_steps);
    const TrainConfig& t = in_force.train;
    validate_lr_schedule(config.optim, max_steps, t.batch_size * t.seq_len, origin, t.max_tokens,
                         t.max_epochs, scheduled_initial_lr(config.optim.lr, history));
    first = state.step + 1;
    int64_t last = 0;  // the tokens seen after the last update
    MOE_CHECK(!__builtin_mul_overflow(max_steps - origin.step, t.batch_size * t.seq_len, &last) &&
                  !__builtin_add_overflow(last, origin.tokens, &last),
              "[lr-schedule] --resume: the {} tokens seen by step {} and (train.max_steps={} - {}) "
              "x {} tokens overflow a 64-bit token count",
              origin.tokens, origin.step, max_steps, origin.step, t.batch_size * t.seq_len);
  }
  in_force.train.max_steps = max_steps;
  MOE_CHECK(max_steps <= std::numeric_limits<int64_t>::max() /
                             (in_force.train.batch_size * in_force.train.seq_len),
            "[config] train.max_steps={} x {} tokens an update overflows a 64-bit token count",
            max_steps, in_force.train.batch_size * in_force.train.seq_len);
  // The schedule's and the units' names as the config writer spells them (one table of names).
  const toml::table written = toml::parse(run_config_to_toml(config));
  const std::string schedule = written["optim"]["schedule"].value_or(std::string());
  const std::string units = written["optim"]["units"].value_or(std::string());
  // Each group override's rate too (train/lr_override{k}): the schedule at its own lr.
  const size_t overrides = config.optim.group_overrides.size();
  auto override_lr = [&](size_t k) {
    return config.optim.group_overrides[k].lr.value_or(config.optim.lr);
  };
  std::string override_columns;
  for (size_t k = 0; k < overrides; ++k) override_columns += fmt::format(" lr_override{}", k);
  // Under train.batch_sizes every update from `first` on, walked as the trainer makes them, each
  // change of the batch before the update it names (scheduled_batch_changes; the run's length
  // moves with them): `visit(step, tokens seen after it, batch, the run's length, rates)`, the
  // rates a callable (most updates are not printed) giving train/lr's and the overrides'.
  auto walk = [&](auto visit) {
    RunConfig current = in_force;
    ReplayOrigin from = replay;
    std::vector<int64_t> sizes = history;
    double initial_lr = scheduled_initial_lr(config.optim.lr, sizes);
    for (int64_t step = first - 1;; ++step) {
      // As the trainer's loop: a run in epochs checks once more at its last epoch's end.
      if (step < current.train.max_steps || current.train.max_epochs > 0) {
        std::vector<BatchSizeChange> changes =
            scheduled_batch_changes(current, step, from, sizes, dataset ? &*dataset : nullptr,
                                    step >= current.train.max_steps);
        for (BatchSizeChange& change : changes) {
          sizes.push_back(change.to);
          current = std::move(change.config);
          from = change.origin;
        }
        if (!changes.empty()) initial_lr = scheduled_initial_lr(config.optim.lr, sizes);
      }
      if (step >= current.train.max_steps) break;
      const TrainConfig& t = current.train;
      const int64_t per_step = t.batch_size * t.seq_len;
      const TokenOrigin counted = token_origin(from);
      visit(step + 1, counted.tokens + (step + 1 - counted.step) * per_step, t.batch_size,
            t.max_steps, [&, step] {
              std::vector<double> rates{learning_rate(current.optim, step, t.max_steps, per_step,
                                                      counted, t.max_tokens, initial_lr)};
              for (size_t k = 0; k < overrides; ++k)
                rates.push_back(learning_rate(current.optim, step, t.max_steps, per_step, counted,
                                              t.max_tokens,
                                              scheduled_initial_lr(override_lr(k), sizes)));
              return rates;
            });
    }
  };
  const int64_t tokens_per_step = in_force.train.batch_size * in_force.train.seq_len;
  // The tokens seen after update `step` without a batch size schedule (the origin's and then
  // tokens_per_step an update).
  auto tokens_seen = [&](int64_t step) {
    return origin.tokens + (step - origin.step) * tokens_per_step;
  };
  const std::string length =
      given.max_tokens > 0   ? fmt::format(" (train.max_tokens={})", given.max_tokens)
      : given.max_epochs > 0 ? fmt::format(" (train.max_epochs={})", given.max_epochs)
                             : std::string();
  if (!scheduled) {
    auto rate = [&](int64_t step) {
      std::vector<double> rates{learning_rate(config.optim, step - 1, max_steps, tokens_per_step,
                                              origin, given.max_tokens)};
      for (size_t k = 0; k < overrides; ++k)
        rates.push_back(learning_rate(config.optim, step - 1, max_steps, tokens_per_step, origin,
                                      given.max_tokens, override_lr(k)));
      return rates;
    };
    // A row's rates: train/lr's, then each override's.
    auto text_of = [](const std::vector<double>& rates) {
      std::string text;
      for (const double lr : rates) text += fmt::format(" {}", lr);
      return text;
    };
    if (args.json) {
      const int64_t printed = printed_count(first, max_steps, args.every);
      MOE_CHECK(printed <= kMaxJsonUpdates,
                "[lr-schedule] --json would hold {} updates (at most {}): pass a larger --every",
                printed, kMaxJsonUpdates);
      std::vector<int64_t> steps, tokens;
      std::vector<std::vector<double>> rates(1 + overrides);
      for_each_printed(first, max_steps, args.every, [&](int64_t step) {
        steps.push_back(step);
        tokens.push_back(tokens_seen(step));
        const std::vector<double> row = rate(step);
        for (size_t g = 0; g < row.size(); ++g) rates[g].push_back(row[g]);
      });
      nlohmann::json out{{"schedule", schedule},   {"units", units},
                         {"max_steps", max_steps}, {"tokens_per_step", tokens_per_step},
                         {"step", steps},          {"tokens_seen", tokens},
                         {"lr", rates[0]}};
      for (size_t k = 0; k < overrides; ++k) out[fmt::format("lr_override{}", k)] = rates[k + 1];
      fmt::print("{}\n", out.dump());
      return;
    }
    fmt::print("# optim.schedule = \"{}\", optim.units = \"{}\": {} updates of {} tokens{}{}\n",
               schedule, units, max_steps, tokens_per_step, length,
               resumed ? fmt::format(", resumed from {} after update {} ({} tokens seen)",
                                     args.resume, first - 1, tokens_seen(first - 1))
                       : std::string());
    fmt::print("step tokens_seen lr{}\n", override_columns);
    // {} prints a double's shortest form that reads back to the same bits, as metrics.jsonl does.
    for_each_printed(first, max_steps, args.every, [&](int64_t step) {
      fmt::print("{} {}{}\n", step, tokens_seen(step), text_of(rate(step)));
    });
    return;
  }
  // Printed: the first, every N-th, the last (1-based, as metrics.jsonl's "step"); the last is
  // known once the walk gets there (the batch's changes move it).
  auto printed = [&](int64_t step, int64_t last) {
    return step == first || step % args.every == 0 || step == last;
  };
  // A first walk for the run's length and the printed count.
  int64_t end = max_steps, count = 0;
  walk([&](int64_t step, int64_t, int64_t, int64_t last, auto&&) {
    end = last;
    if (printed(step, last)) ++count;
  });
  if (args.json) {
    MOE_CHECK(count <= kMaxJsonUpdates,
              "[lr-schedule] --json would hold {} updates (at most {}): pass a larger --every",
              count, kMaxJsonUpdates);
    std::vector<int64_t> steps, tokens, batches;
    std::vector<std::vector<double>> rates(1 + overrides);
    walk([&](int64_t step, int64_t seen, int64_t batch, int64_t last, auto&& rate) {
      if (!printed(step, last)) return;
      steps.push_back(step);
      tokens.push_back(seen);
      batches.push_back(batch);
      const std::vector<double> row = rate();
      for (size_t g = 0; g < row.size(); ++g) rates[g].push_back(row[g]);
    });
    nlohmann::json out{{"schedule", schedule}, {"units", units},        {"max_steps", end},
                       {"step", steps},        {"tokens_seen", tokens}, {"batch_size", batches},
                       {"lr", rates[0]}};
    for (size_t k = 0; k < overrides; ++k) out[fmt::format("lr_override{}", k)] = rates[k + 1];
    fmt::print("{}\n", out.dump());
    return;
  }
  fmt::print(
      "# optim.schedule = \"{}\", optim.units = \"{}\": {} updates of train.batch_sizes x {} "
      "tokens{}{}\n",
      schedule, units, end, in_force.train.seq_len, length,
      resumed
          ? fmt::format(", resumed from {} after update {} ({} tokens seen)", args.resume,
                        first - 1, replay.tokens_seen + (first - 1 - replay.step) * tokens_per_step)
          : std::string());
  fmt::print("step tokens_seen lr batch_size{}\n", override_columns);
  walk([&](int64_t step, int64_t seen, int64_t batch, int64_t last, auto&& rate) {
    if (!printed(step, last)) return;
    const std::vector<double> rates = rate();
    std::string text;
    for (size_t k = 1; k < rates.size(); ++k) text += fmt::format(" {}", rates[k]);
    fmt::print("{} {} {} {}{}\n", step, seen, rates[0], batch, text);
  });
}

}  // namespace moecore::cli
