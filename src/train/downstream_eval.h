// Scoring a downstream task's samples (data/icl_task.h) with the model: each sample's query runs
// forward, without targets, and the log-probabilities of its continuation's tokens are summed
// from the logits at the positions before them (olmo_eval's lm_logits[ctx_len - 1 : ctx_len +
// cont_len - 1], in double here); for pmi_dc the domain-conditional query runs too; a fast_mc
// document's choices are read from its one query's logits. Then the task's metrics
// (train/icl_metric.h).
//
// Batching: queries are grouped by length (longest first) into batches of at most
// share.batch_tokens
// tokens (at least one query each), each padded on the right to its longest query with pad_id
// (in lockstep, to the round's shape: rows of padding are not read).
// Padding comes after every scored position, so under causal attention a query's logits are those
// of the query alone; with dropless, position-free routing its experts too (a capacity-limited
// dispatch may drop routes differently with other neighbours in the batch, as it would in
// OLMo-core; the random and balanced routing modes route by a token's place in the batch). The
// caller turns document masking off: OLMo-core's downstream batches have none.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "data/icl_task.h"
#include "model/transformer.h"
#include "train/eval_passes.h"
#include "train/icl_metric.h"

namespace moecore {

// Computes the logits of `count` rows of the last pass (each an index into its rows * seq
// tokens, in host memory) into host memory at `out` ([count, vocab] fp32), wherever the model is.
using LogitsAt = std::function<void(const int32_t* rows, int64_t count, float* out)>;
// One forward pass without targets over rows x seq tokens: on the process that holds the LM head,
// a reader of its logits (valid until the next pass); on the others (pipeline stages before the
// last) an empty one. Every process runs the same sequence of calls. Only the positions scored are
// computed: no pass holds the whole head's [rows * seq, vocab] logits.
using LogitsForward = std::function<LogitsAt(const int32_t* tokens, int64_t rows, int64_t seq)>;
// The reader of a chunk's logits after its last forward (the chunk with the LM head, whose forward
// ran after set_next_logits_on_demand(), with these weights): Transformer::logits_at.
LogitsAt head_logits_at(Transformer& chunk, const ParamBuffers& params);

// One IclScore per sample of `task` (valid where the forward returned a reader). With
// share.shards > 1
// this process runs only its share of the passes (train/eval_passes.h: spread, or in lockstep
// for expert parallelism) and leaves the others' scores 0: summed over the shards, the scores
// are whole.
// logit_rows: the most rows of logits one reader call computes (a pass's scored queries in groups
// of continuations up to that many rows, at least one query a group): what bounds the evaluation's
// logits in memory, [logit_rows, vocab] on the device and on the host.
std::vector<IclScore> score_icl_task(const data::IclTask& task, const LogitsForward& forward,
                                     int64_t vocab_size, const EvalShare& share, int64_t logit_rows,
                                     int32_t pad_id);

}  // namespace moecore
