// What --resume accepts. A checkpoint replays its run exactly only under the configuration that
// wrote it; a resumed run whose data order, batch, sequence length, learning-rate schedule,
// optimizer values, step guard, precision (mxfp8's variants included), router-loss settings,
// training files or their documents (element type, document masking, EOS) differ silently becomes
// another run (after a seq_len change the data cursor indexes other instances). Such changes are
// refused unless the user says --allow-config-change, and then each one is logged. The
// architecture ([model] keys other than the router-loss settings) is not negotiable: the weights
// would not fit (checked by load_checkpoint). Settings that do not touch the weights (logging,
// evaluation, saving, threads, out_dir, the validation files, the parallel layout, which
// checkpoints are independent of) may change freely.
#pragma once

#include <string>
#include <vector>

#include "train/run_config.h"

namespace moecore {

struct ConfigChange {
  std::string key;     // "optim.lr"
  std::string before;  // TOML text of the checkpoint's value
  std::string after;   // TOML text of the new value
};

// The replay-relevant keys on which `saved` (the checkpoint's config.toml) and `now` differ, in
// table order.
std::vector<ConfigChange> replay_config_changes(const RunConfig& saved, const RunConfig& now);

// Whether the resume of a checkpoint written under `saved` starts the Adam moments from zero:
// the resume that turns optim.reset_optimizer_moments_on_load on. (OLMo-core resets at every load
// while its flag is set, so a run preempted after the reset would lose its moments again at each
// restart; here later resumes read them as any resume does.)
bool resets_moments(const RunConfig& saved, const RunConfig& now);

// The run's length (train.max_steps, max_tokens or max_epochs) is the one schedule value that may
// change without the flag: extending a run (train N steps, then resume to 2N) is everyday use.
// Where the schedule depends on it (cosine, linear) the change is logged with this line ("" when
// there is nothing to say). `saved_origin` and `now_origin` are where each run's current batch
// took over: under train.max_tokens they set its length in updates.
std::string horizon_note(const RunConfig& saved, const RunConfig& now,
                         TokenOrigin saved_origin = {}, TokenOrigin now_origin = {});

// "optim.lr: 0.001 -> 0.002"
std::string describe(const ConfigChange& change);

}  // namespace moecore
