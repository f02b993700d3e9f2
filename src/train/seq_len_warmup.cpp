#include "train/seq_len_warmup.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/ignore_index.h"

namespace moecore {

namespace {

// Python's float // float (CPython's float_floor_div), which OLMo-core's formulas use.
double python_floordiv(double x, double w) {
  const double mod = std::fmod(x, w);
  double div = (x - mod) / w;
  if (mod != 0.0 && ((w < 0.0) != (mod < 0.0))) div -= 1.0;
  if (div == 0.0) return std::copysign(0.0, x / w);
  double floordiv = std::floor(div);
  if (div - floordiv > 0.5) floordiv += 1.0;
  return floordiv;
}

// min + (seq_len - min) x min(step, warmup) / warmup, in OLMo-core's order of operations (the
// integer product exact, its true division rounded once).
double linear_seq_len(const TrainConfig& t, int64_t step) {
  const int64_t warmup = t.seq_len_warmup_steps;
  const int64_t min = t.seq_len_warmup_min;
  return static_cast<double>(min) +
         static_cast<double>((t.seq_len - min) * std::min(step, warmup)) /
             static_cast<double>(warmup);
}

}  // namespace

int64_t warmup_seq_len(const TrainConfig& t, int64_t step) {
  if (t.seq_len_warmup_steps == 0 || step > t.seq_len_warmup_steps) return t.seq_len;
  const double seq_len = linear_seq_len(t, step);
  if (t.seq_len_warmup_truncate) {
    // _get_truncated_sequence_length: keep_multiple_of x (seq_len // keep_multiple_of).
    const auto multiple = static_cast<double>(t.seq_len_warmup_multiple);
    return static_cast<int64_t>(multiple * python_floordiv(seq_len, multiple));
  }
  // _get_split_sequence_length: min x 2^floor(log2(seq_len // min)), math.log(x, 2) being
  // log(x) / log(2).
  const auto min = static_cast<double>(t.seq_len_warmup_min);
  const double n = std::floor(std::log(python_floordiv(seq_len, min)) / std::log(2.0));
  return t.seq_len_warmup_min << static_cast<int64_t>(n);
}

WarmupShape warmup_shape(const TrainConfig& t, int64_t microbatches, int64_t local_rows,
                         int64_t step) {
  WarmupShape shape{t.seq_len, 1, microbatches, local_rows, false};
  const int64_t seq = warmup_seq_len(t, step);
  if (seq >= t.seq_len) return shape;
  shape.seq = seq;
  shape.cut = true;
  shape.pieces = t.seq_len_warmup_truncate ? 1 : t.seq_len / seq;
  // OLMo-core's split of the rank's batch: micro-batches of rank_microbatch_size // seq rows,
  // its rank_microbatch_size (local_rows x seq_len tokens) multiplied by the pieces when melting.
  const int64_t rows = local_rows * t.seq_len * shape.pieces / seq;
  const int64_t total = microbatches * local_rows * shape.pieces;
  shape.rows = std::min(rows, total);
  shape.micro = (total + shape.rows - 1) / shape.rows;
  MOE_CHECK(total % shape.rows == 0,
            "[config] train.seq_len_warmup_steps={}: update {} cuts each rank's {} instances into "
            "{} rows of {} tokens, which OLMo-core's train module splits into micro-batches of {} "
            "rows, the last of {}; moecore's micro-batches are of one size: choose "
            "train.microbatches (or the warm-up's settings) so that they divide",
            t.seq_len_warmup_steps, step, microbatches * local_rows, total, seq, shape.rows,
            total % shape.rows);
  return shape;
}

std::vector<WarmupSpan> warmup_spans(const TrainConfig& t) {
  std::vector<WarmupSpan> spans;
  for (int64_t step = 1; step <= t.seq_len_warmup_steps;) {
    const int64_t seq = warmup_seq_len(t, step);
    int64_t last = step;  // the last update of this length
    for (int64_t high = t.seq_len_warmup_steps; last < high;) {
      const int64_t mid = last + (high - last + 1) / 2;
      if (warmup_seq_len(t, mid) == seq)
        last = mid;
      else
        high = mid - 1;
    }
    spans.push_back({step, last, seq});
    step = last + 1;
  }
  return spans;
}

std::vector<int64_t> check_warmup_shapes(const TrainConfig& t, int64_t dp) {
  std::vector<int64_t> counts;
  if (t.seq_len_warmup_steps == 0) return counts;
  MOE_CHECK(warmup_seq_len(t, 1) >= 1,
            "[config] train.seq_len_warmup_multiple={}: update 1 of the warm-up truncates its "
            "instances to 0 tokens (train.seq_len_warmup_min={} rounded down to a multiple)",
            t.seq_len_warmup_multiple, t.seq_len_warmup_min);
  const int64_t rows = t.batch_size / t.microbatches;  // a micro-batch's, all ranks
  std::vector<int64_t> sizes = t.batch_sizes;
  if (sizes.empty()) sizes.push_back(t.batch_size);
  for (const WarmupSpan& span : warmup_spans(t))
    for (const int64_t size : sizes) {
      const int64_t micro = warmup_shape(t, size / rows, rows / dp, span.first).micro;
      if (std::find(counts.begin(), counts.end(), micro) == counts.end()) counts.push_back(micro);
    }
  return counts;
}

void cut_for_warmup(const WarmupShape& shape, int64_t seq_len, const int32_t* tokens,
                    const int32_t* targets, int64_t instances, int32_t* out_tokens,
                    int32_t* out_targets) {
  for (int64_t i = 0; i < instances; ++i)
    for (int64_t piece = 0; piece < shape.pieces; ++piece) {
      const int64_t from = i * seq_len + piece * shape.seq;
      const int64_t to = (i * shape.pieces + piece) * shape.seq;
      std::copy_n(tokens + from, shape.seq, out_tokens + to);
      std::copy_n(targets + from, shape.seq, out_targets + to);
      // OLMo-core's labels: the row's tokens shifted, the last position ignored.
      out_targets[to + shape.seq - 1] = kIgnoreIndex;
    }
}

}  // namespace moecore
