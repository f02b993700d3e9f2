#include "plan/step_shapes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <limits>

#include "train/seq_len_warmup.h"

namespace moecore::plan {

namespace {

// Whether the batch schedule's size i may be in force at update `update` (1-based): it is asked
// for after update - 1 updates, and due only once its start is reached by then: in steps
// update - 1 >= start; in tokens the tokens seen, at most update - 1 updates of the largest size
// before it (the sizes change in their order), >= start. An increase that waits for OLMo-core's
// loader comes later still, never earlier. A start in epochs depends on the data's length, which
// the planner does not read: such a size is counted as if reached.
bool may_be_in_force(const TrainConfig& tc, size_t i, int64_t update) {
  if (i == 0) return true;
  const int64_t start = tc.batch_size_starts[i];
  const int64_t done = update - 1;
  switch (tc.batch_size_units) {
    case BatchSizeUnits::kSteps:
      return start <= done;
    case BatchSizeUnits::kTokens: {
      const auto before = tc.batch_sizes.begin() + static_cast<std::ptrdiff_t>(i);
      const int64_t largest = *std::max_element(tc.batch_sizes.begin(), before);
      return static_cast<double>(start) <=
             static_cast<double>(done) * static_cast<double>(largest * tc.seq_len);
    }
    case BatchSizeUnits::kEpochs:
      return true;
  }
  return true;
}

// The run's last update as the planner knows it: train.max_steps (a length in tokens is counted
// in updates of the first batch size, which no later, larger one makes longer), or a hard stop
// in steps; none for a length in epochs (the data's).
int64_t last_update(const TrainConfig& tc) {
  if (tc.max_epochs > 0 || tc.max_steps <= 0) return std::numeric_limits<int64_t>::max();
  return tc.hard_stop_steps > 0 ? std::min(tc.max_steps, tc.hard_stop_steps) : tc.max_steps;
}

}  // namespace

std::vector<StepShape> run_step_shapes(const TrainConfig& tc, const ResolvedLayout& layout) {
  std::vector<StepShape> shapes;
  auto add = [&](StepShape shape) {
    if (std::find(shapes.begin(), shapes.end(), shape) == shapes.end())
      shapes.push_back(std::move(shape));
  };
  const std::vector<WarmupSpan> spans = warmup_spans(tc);
  // The first update not cut: melted, the warm-up's last update trains whole rows already.
  int64_t first_whole = tc.seq_len_warmup_steps + 1;
  if (!spans.empty() && spans.back().seq == tc.seq_len) first_whole = spans.back().first;
  const std::string after_warmup =
      spans.empty() ? std::string() : fmt::format("update {} on", first_whole);
  std::vector<int64_t> sizes = tc.batch_sizes;  // the first is train.batch_size
  if (sizes.empty()) sizes.push_back(tc.batch_size);
  const int64_t last = last_update(tc);
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!may_be_in_force(tc, i, last)) continue;  // the run ends first
    add({tc.has_batch_size_schedule()
             ? fmt::format("batch size {}{}", sizes[i], spans.empty() ? "" : ", " + after_warmup)
             : (spans.empty() ? std::string("every update") : after_warmup),
         tc.seq_len, sizes[i] / layout.micro_rows, layout.local_rows, false});
  }
  for (const WarmupSpan& span : spans)
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (!may_be_in_force(tc, i, std::min(span.last, last))) continue;
      const int64_t size = sizes[i];
      const WarmupShape cut =
          warmup_shape(tc, size / layout.micro_rows, layout.local_rows, span.first);
      add({fmt::format("warm-up update{} {}{}", span.first == span.last ? "" : "s",
                       span.first == span.last ? fmt::format("{}", span.first)
                                               : fmt::format("{}-{}", span.first, span.last),
                       tc.has_batch_size_schedule() ? fmt::format(" at batch size {}", size) : ""),
           cut.seq, cut.micro, cut.rows, cut.cut});
    }
  return shapes;
}

RunConfig shaped_config(const RunConfig& config, const StepShape& shape,
                        const ResolvedLayout& layout) {
  RunConfig c = config;
  c.train.seq_len = shape.seq_len;
  c.train.microbatches = shape.microbatches;
  c.train.batch_size = shape.microbatches * shape.local_rows * layout.dp;
  return c;
}

ResolvedLayout shaped_layout(const ResolvedLayout& layout, const StepShape& shape) {
  ResolvedLayout l = layout;
  l.local_rows = shape.local_rows;
  l.micro_rows = shape.local_rows * layout.dp;
  return l;
}

}  // namespace moecore::plan
