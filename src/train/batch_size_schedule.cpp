#include "train/batch_size_schedule.h"

#include <fmt/format.h>

#include <cmath>

#include "core/check.h"

namespace moecore {

namespace {

// The index of the schedule's latest start reached (OLMo-core's Duration.due), or none.
std::optional<size_t> latest_start_reached(const TrainConfig& t, int64_t step, int64_t tokens_seen,
                                           uint64_t epoch) {
  std::optional<size_t> latest;
  for (size_t i = 0; i < t.batch_sizes.size(); ++i) {
    const int64_t start = t.batch_size_starts[i];
    const bool due = t.batch_size_units == BatchSizeUnits::kTokens ? tokens_seen >= start
                     : t.batch_size_units == BatchSizeUnits::kEpochs
                         ? epoch > static_cast<uint64_t>(start)
                         : step >= start;
    if (due) latest = i;
  }
  return latest;
}

}  // namespace

int64_t scheduled_batch_size(const TrainConfig& t, int64_t step, int64_t tokens_seen,
                             uint64_t epoch) {
  const std::optional<size_t> latest = latest_start_reached(t, step, tokens_seen, epoch);
  return latest ? t.batch_sizes[*latest] : t.batch_size;
}

RunConfig with_batch_size(const RunConfig& config, int64_t batch_size) {
  RunConfig out = config;
  const TrainConfig& t = config.train;
  const int64_t rows = t.batch_size / t.microbatches;
  MOE_CHECK(batch_size % rows == 0,
            "[train] a batch of {} sequences is no whole number of micro-batches of {}", batch_size,
            rows);
  out.train.batch_size = batch_size;
  out.train.microbatches = batch_size / rows;
  return out;
}

bool batch_keys_changed(const TrainConfig& saved, const TrainConfig& now) {
  return saved.batch_size != now.batch_size || saved.microbatches != now.microbatches ||
         saved.batch_sizes != now.batch_sizes || saved.batch_size_starts != now.batch_size_starts ||
         saved.batch_size_units != now.batch_size_units;
}

ResumedBatch resumed_batch(const RunConfig& saved, const TrainerState& state,
                           const RunConfig& config) {
  std::vector<int64_t> history{config.train.batch_size};
  if (!batch_keys_changed(saved.train, config.train))
    history = state.batch_size_history.empty() ? std::vector<int64_t>{saved.train.batch_size}
                                               : state.batch_size_history;
  RunConfig saved_in_force = with_batch_size(saved, state.batch_size_in_force(saved.train));
  RunConfig in_force = with_batch_size(config, history.back());
  return {std::move(history), std::move(saved_in_force), std::move(in_force)};
}

double scheduled_initial_lr(double lr, std::span<const int64_t> history) {
  for (size_t i = 1; i < history.size(); ++i)
    lr *= std::sqrt(static_cast<double>(history[i]) / static_cast<double>(history[i - 1]));
  return lr;
}

namespace {

// Whether an increase of `config`'s batch by `ratio` can be made at `here`: OLMo-core waits until
// its loader's batches of the epoch are a multiple of the ratio (or the epoch is read: its next
// check, at the next epoch's batch 0, makes it before the same batch; not where the run ends
// with the epoch, whose trainer asks no more).
bool increase_lies_on_grid(const RunConfig& config, const TrainerState& here, int64_t ratio,
                           const data::TokenDataset* dataset, bool run_ends_here) {
  if (config.data.order != data::OrderRule::kOlmoCore) return true;
  MOE_CHECK(dataset != nullptr,
            "[train] train.batch_sizes under data.order = \"olmo-core\" "
            "needs the training set");
  const OlmoCoreEpochPosition at = olmo_core_epoch_position(config, here, dataset->num_instances());
  return (at.epoch_done && !run_ends_here) || at.batches % ratio == 0;
}

}  // namespace

std::optional<BatchSizeChange> scheduled_batch_change(const RunConfig& config, int64_t step,
                                                      const ReplayOrigin& origin,
                                                      std::span<const int64_t> history,
                                                      const data::TokenDataset* dataset,
                                                      bool run_ends_here) {
  const TrainConfig& t = config.train;
  if (!t.has_batch_size_schedule()) return std::nullopt;
  // Every update since the origin read a batch of the size in force.
  TrainerState here;
  here.step = step;
  here.seed = t.seed;
  here.origin = origin;
  here.tokens_seen = origin.tokens_seen + (step - origin.step) * t.batch_size * t.seq_len;
  here.data_cursor = origin.data_cursor + static_cast<uint64_t>(step - origin.step) *
                                              static_cast<uint64_t>(t.batch_size);
  // The trainer's epoch (in epochs' units): of the next batch's first instance. At an epoch's end
  // OLMo-core asks twice: in the epoch that ended (its loader read to its end: a change then is
  // made there, a decrease reading that epoch's tail) and, nothing changed, in the next one after
  // its loader's reset (a change then starts that epoch, batches_processed 0).
  uint64_t epoch = 1;
  bool next_epoch_start = false;  // the change is made after the reset
  if (t.batch_size_units == BatchSizeUnits::kEpochs) {
    MOE_CHECK(dataset != nullptr,
              "[train] train.batch_size_units = \"epochs\" needs the training set");
    const auto length = static_cast<uint64_t>(epoch_length(config, dataset->num_instances()));
    // At an epoch's end, unless the loader has been reset into the next one there (a change
    // made after the reset started the batch in force: its origin's epoch is the next).
    const bool reset_here = origin.epoch > 0 && here.data_cursor == origin.data_cursor &&
                            origin.epoch == here.data_cursor / length + 1;
    const bool at_end = config.data.order == data::OrderRule::kOlmoCore && here.data_cursor > 0 &&
                        here.data_cursor % length == 0 && !reset_here;
    epoch = here.data_cursor / length + (at_end ? 0 : 1);
    // The second ask, after the reset, only where the run goes on.
    if (at_end && !run_ends_here &&
        scheduled_batch_size(t, step, here.tokens_seen, epoch) == t.batch_size) {
      ++epoch;
      next_epoch_start = true;
    }
  }
  const int64_t target = scheduled_batch_size(t, step, here.tokens_seen, epoch);
  if (target == t.batch_size) return std::nullopt;
  if (target > t.batch_size && !next_epoch_start &&
      !increase_lies_on_grid(config, here, target / t.batch_size, dataset, run_ends_here))
    return std::nullopt;
  BatchSizeChange change;
  change.from = t.batch_size;
  change.to = target;
  change.epoch = epoch;
  change.config = with_batch_size(config, target);
  const TrainConfig& now = change.config.train;
  // OLMo-core's loader moves as its global_batch_size setter moves it, which is where a resume
  // with the new size would go on: on the epoch's grid, nothing read again.
  const int64_t instances = dataset != nullptr ? dataset->num_instances() : 0;
  if (next_epoch_start) {
    // OLMo-core's loader reset for the next epoch, batches_processed 0 in the new batches.
    const auto length = static_cast<uint64_t>(epoch_length(change.config, instances));
    MOE_CHECK(!__builtin_mul_overflow(epoch - 1, length, &change.position.cursor),
              "[train] epoch {} of {} instances does not fit a data position", epoch, length);
    change.position.epoch = epoch;
    change.position.epoch_length = static_cast<int64_t>(length);
    change.position.moved = true;
  } else if (config.data.order == data::OrderRule::kOlmoCore) {
    change.position =
        resume_position(config, here, "the batch size schedule", change.config, instances);
  } else {
    change.position.cursor = here.data_cursor;
  }
  MOE_CHECK(change.position.read_again == 0,
            "[train] step {}: the batch size schedule's change {} -> {} would read {} instance(s) "
            "again",
            step, change.from, change.to, change.position.read_again);
  change.origin = {step, change.position.cursor, here.tokens_seen, change.position.epoch,
                   change.position.tokens_read};
  const TokenOrigin tokens_origin{step, here.tokens_seen};
  if (now.max_tokens > 0) {
    change.config.train.max_steps = max_steps_for_tokens(now, tokens_origin);
  } else if (now.max_epochs > 0) {
    MOE_CHECK(dataset != nullptr, "[train] train.max_epochs needs the training set");
    change.config.train.max_steps =
        max_steps_for_epochs(change.config, *dataset, step, change.position.cursor);
  }
  // The new length's schedule, at the new initial_lr (OLMo-core meets what this refuses as an
  // assertion or a division by zero at the update that gets there).
  std::vector<int64_t> after(history.begin(), history.end());
  after.push_back(target);
  validate_lr_schedule(change.config.optim, now.max_steps, now.batch_size * now.seq_len,
                       tokens_origin, now.max_tokens, now.max_epochs,
                       scheduled_initial_lr(config.optim.lr, after));
  return change;
}

std::vector<BatchSizeChange> scheduled_batch_changes(const RunConfig& config, int64_t step,
                                                     const ReplayOrigin& origin,
                                                     std::span<const int64_t> history,
                                                     const data::TokenDataset* dataset,
                                                     bool run_ends_here) {
  // OLMo-core asks once a batch, twice at an epoch's end: at most one change an ask, the second
  // asked of the state the first left.
  std::vector<BatchSizeChange> changes;
  std::optional<BatchSizeChange> first =
      scheduled_batch_change(config, step, origin, history, dataset, run_ends_here);
  if (!first) return changes;
  changes.push_back(std::move(*first));
  std::vector<int64_t> sizes(history.begin(), history.end());
  sizes.push_back(changes.front().to);
  std::optional<BatchSizeChange> second = scheduled_batch_change(
      changes.front().config, step, changes.front().origin, sizes, dataset, run_ends_here);
  if (second) changes.push_back(std::move(*second));
  return changes;
}

std::string describe_batch_size_change(const RunConfig& config, int64_t step,
                                       const BatchSizeChange& change,
                                       std::span<const int64_t> history_after) {
  const TrainConfig& t = change.config.train;
  // The latest start reached: the one that names the new size.
  const size_t entry =
      latest_start_reached(t, step, change.origin.tokens_seen, change.epoch).value_or(0);
  const double before =
      scheduled_initial_lr(config.optim.lr, history_after.subspan(0, history_after.size() - 1));
  const double after = scheduled_initial_lr(config.optim.lr, history_after);
  return fmt::format(
      "batch size: {} -> {} sequences ({} micro-batch(es) of {}) before update {} "
      "(train.batch_size_starts[{}]={} {}); the schedule's initial_lr {} -> {} (x sqrt({}/{})); "
      "the run ends at step {}",
      change.from, change.to, t.microbatches, t.batch_size / t.microbatches, step + 1, entry,
      t.batch_size_starts[entry], batch_size_units_name(t.batch_size_units), before, after,
      change.to, change.from, t.max_steps);
}

}  // namespace moecore
