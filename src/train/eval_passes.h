// How a process runs its share of an evaluation's forward passes (the labelled sets' and the
// downstream tasks'), built alike on every process: pass p holds rows(p) sequences of at most
// seq(p) tokens.
//
// Spread (without expert parallelism): pass p runs whole on shard p % shards, alone.
// Lockstep (expert parallelism, whose exchange is collective: every process must make the same
// forwards with the same shape): round k holds passes k * shards .. k * shards + shards - 1, one a
// shard; every shard runs the round's forwards of [fit, seq] tokens, seq the round's longest and
// fit = batch_tokens / seq rows (at least one), each its own pass's next rows padded to fit rows,
// or rows of padding alone once its pass is done (or it has none), so that no forward holds more
// than the batch's tokens (or one row).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace moecore {

struct EvalPass {
  int64_t rows = 0;
  int64_t seq = 0;
};

// The forward to make: rows [first_row, first_row + rows) of pass `pass` (-1: padding alone), as
// the first `rows` of padded_rows rows of seq tokens.
struct EvalForwardShape {
  int64_t pass = -1;
  int64_t first_row = 0;
  int64_t rows = 0;
  int64_t padded_rows = 0;
  int64_t seq = 0;
};

// A process's share of an evaluation: passes of at most batch_tokens tokens (one row at least),
// this process the shard-th of shards, in lockstep under expert parallelism.
struct EvalShare {
  int64_t batch_tokens = 1;
  int64_t shard = 0;
  int64_t shards = 1;
  bool lockstep = false;
};

// Calls run for each forward this process makes, in order (every process of a lockstep group
// the same number of times, with the same shapes).
void run_eval_passes(const std::vector<EvalPass>& passes, const EvalShare& share,
                     const std::function<void(const EvalForwardShape&)>& run);

}  // namespace moecore
