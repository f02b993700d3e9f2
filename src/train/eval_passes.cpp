#include "train/eval_passes.h"

#include <algorithm>

#include "core/check.h"

namespace moecore {

void run_eval_passes(const std::vector<EvalPass>& passes, const EvalShare& share,
                     const std::function<void(const EvalForwardShape&)>& run) {
  const auto [batch_tokens, shard, shards, lockstep] = share;
  MOE_CHECK(batch_tokens >= 1, "[eval] batch of {} tokens", batch_tokens);
  MOE_CHECK(shards >= 1 && shard >= 0 && shard < shards, "[eval] shard {} of {}", shard, shards);
  const auto n = static_cast<int64_t>(passes.size());
  if (!lockstep) {
    for (int64_t p = shard; p < n; p += shards) {
      const EvalPass& pass = passes[static_cast<size_t>(p)];
      run({p, 0, pass.rows, pass.rows, pass.seq});
    }
    return;
  }
  for (int64_t round = 0; round * shards < n; ++round) {
    const int64_t first = round * shards, last = std::min(n, first + shards);
    int64_t seq = 1;
    for (int64_t p = first; p < last; ++p) seq = std::max(seq, passes[static_cast<size_t>(p)].seq);
    const int64_t fit = std::max<int64_t>(1, batch_tokens / seq);
    int64_t forwards = 0;
    for (int64_t p = first; p < last; ++p)
      forwards = std::max(forwards, (passes[static_cast<size_t>(p)].rows + fit - 1) / fit);
    const int64_t mine = first + shard;
    for (int64_t f = 0; f < forwards; ++f) {
      const int64_t row = f * fit;
      if (mine < last && row < passes[static_cast<size_t>(mine)].rows)
        run({mine, row, std::min(fit, passes[static_cast<size_t>(mine)].rows - row), fit, seq});
      else
        run({-1, 0, 0, fit, seq});
    }
  }
}

}  // namespace moecore
