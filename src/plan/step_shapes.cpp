#include "plan/step_shapes.h"

#include <fmt/format.h>

#include <algorithm>

#include "train/seq_len_warmup.h"

namespace moecore::plan {

namespace {

// Whether the batch schedule's size i may be in force during the warm-up (updates 1 to W): due
// after s updates (s <= W - 1) only where its start is reached by then, in steps s >= start, in
// tokens tokens_seen >= start, of at most s x the largest batch's tokens (an increase that waits
// for OLMo-core's loader comes later still, never earlier). A start in epochs depends on the
// data's length, which the planner does not read: such a size is counted as if it met the
// warm-up.
bool may_meet_warmup(const TrainConfig& tc, size_t i) {
  if (i == 0) return true;
  const int64_t start = tc.batch_size_starts[i];
  const int64_t last_step = tc.seq_len_warmup_steps - 1;
  switch (tc.batch_size_units) {
    case BatchSizeUnits::kSteps:
      return start <= last_step;
    case BatchSizeUnits::kTokens: {
      const int64_t largest = *std::max_element(tc.batch_sizes.begin(), tc.batch_sizes.end());
      return static_cast<double>(start) <=
             static_cast<double>(last_step) * static_cast<double>(largest * tc.seq_len);
    }
    case BatchSizeUnits::kEpochs:
      return true;
  }
  return true;
}

}  // namespace

std::vector<StepShape> run_step_shapes(const TrainConfig& tc, const ResolvedLayout& layout) {
  std::vector<StepShape> shapes;
  auto add = [&](StepShape shape) {
    if (std::find(shapes.begin(), shapes.end(), shape) == shapes.end())
      shapes.push_back(std::move(shape));
  };
  const bool warmup = tc.seq_len_warmup_steps > 0;
  const std::string after_warmup =
      warmup ? fmt::format("update {} on", tc.seq_len_warmup_steps + 1) : std::string();
  std::vector<int64_t> sizes = tc.batch_sizes;  // the first is train.batch_size
  if (sizes.empty()) sizes.push_back(tc.batch_size);
  for (const int64_t size : sizes)
    add({tc.has_batch_size_schedule()
             ? fmt::format("batch size {}{}", size, warmup ? ", " + after_warmup : "")
             : (warmup ? after_warmup : std::string("every update")),
         tc.seq_len, size / layout.micro_rows, layout.local_rows, false});
  for (const WarmupSpan& span : warmup_spans(tc))
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (!may_meet_warmup(tc, i)) continue;
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
