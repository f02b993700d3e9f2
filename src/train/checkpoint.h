// Checkpoints that never lose a run. One directory per save, <run>/checkpoints/step_<8 digits>/:
//   model.safetensors  fp32 master weights under Hugging Face names (or, from a multi-rank run, one
//                      part per rank with a model.safetensors.index.json, as transformers shards)
//   config.json        Hugging Face config (transformers loads the directory where a class fits)
//   optim.safetensors  AdamW moments exp_avg.<name>, exp_avg_sq.<name> (+ step count in metadata;
//                      parts alike, ZeRO-1 shards as slices exp_avg.<name>[begin:end])
//   trainer_state.json step, tokens seen, data cursor, seed, step-guard window, schedule position
//   config.toml        the effective run configuration
//   tokenizer.json     the run's tokenizer, when it has one (so the directory is self-contained)
//   generation_config.json, tokenizer_config.json, ...  those of the model an --init-from run
//                      started from, when its tokenizer is the run's (io/hf_side_files.h)
//   checksums.json     every other file's size and CRC-32C (io/file_checksums.h), written last:
//                      --resume skips a checkpoint whose files changed after they were written
// A save is written into a temporary sibling directory, every file fsynced, the directory renamed
// into place and its parent fsynced: a crash at any moment leaves either the previous set of
// checkpoints or the previous set plus the complete new one. Older saves beyond keep_last are
// removed only after the new one is in place. Checkpoints do not depend on how the run was laid
// out.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/tensor_parts.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/state_piece.h"
#include "train/run_config.h"

namespace moecore {

struct CheckpointContents {
  const RunConfig* config;
  const ParamLayout* layout;
  const ParamBuffers* params;
  AdamW* optimizer;  // nullptr: weights only (loadable, not resumable)
  nlohmann::json trainer_state;
  nlohmann::json hf_config;
  std::string tokenizer_json;                        // written as tokenizer.json when not empty
  std::map<std::string, std::string> hf_side_files;  // io/hf_side_files.h
};

// Writes step_<step> under <run_dir>/checkpoints and prunes to keep_last; returns its path.
std::string save_checkpoint(const std::string& run_dir, int64_t step,
                            const CheckpointContents& contents, int64_t keep_last);

// Multi-rank saves, where every rank writes its part: rank 0 calls begin_checkpoint (the staging
// directory), every rank write_checkpoint_part, and, once all parts are on disk (a barrier), rank
// 0 commit_checkpoint, which indexes the parts it finds. Parts are Hugging Face style shards
// (model-0000i-of-0000n.safetensors + model.safetensors.index.json; optim-... alike, where a
// ZeRO-1 shard may hold a slice of a tensor's moments, see optim/state_piece.h).
struct CheckpointPart {
  int64_t index = 0;
  int64_t count = 1;
  const ParamBuffers* params = nullptr;
  std::vector<const ParamSpec*> weights;  // whole tensors of params
  std::vector<StatePiece> state;          // Adam moments
  std::optional<int64_t> steps_taken;     // nullopt: weights only (no optimizer part)
  // Where weights[i]'s values are instead (empty: params): a merged checkpoint's averages.
  std::vector<const float*> weight_data;
};
// The staging directory of a save of `step` by the run whose writing process (rank 0) has id
// `owner_pid`: every rank of that run finds it by name, and no other process's name collides with
// it (a second trainer on the directory is refused by its lock, io/run_dir_lock.h; the name is
// the second line of defence).
std::string checkpoint_staging_dir(const std::string& run_dir, int64_t step, int64_t owner_pid);
std::string begin_checkpoint(const std::string& run_dir, int64_t step, int64_t owner_pid);
void write_checkpoint_part(const std::string& staging_dir, const CheckpointPart& part);
void discard_checkpoint(const std::string& staging_dir);  // a save that failed
std::string commit_checkpoint(const std::string& run_dir, int64_t step,
                              const std::string& staging_dir, const CheckpointContents& contents,
                              int64_t parts, int64_t keep_last);

// Removes the oldest checkpoints so that `newest` (a checkpoint directory) and at most
// keep_last - 1 older ones remain (keep_last 0: all); newer ones are left alone. Run after every
// save, and when a run resumes (a save whose process died before it pruned).
void prune_checkpoints(const std::string& run_dir, const std::string& newest, int64_t keep_last);

// Complete checkpoints of a run, oldest first (temporary directories of interrupted saves are
// ignored).
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// A checkpoint the resume could not use, and why (the first check it failed).
struct DamagedCheckpoint {
  std::string dir;
  std::string reason;
};

// How the processes of a job share the reading of a candidate checkpoint: each reads the files
// and tensors at its positions (i % count == index) and `combine` turns every process's verdict
// into one (collective: given this process's reason, "" when its share passed, it returns the
// first failure of any process, the same in every process). Alone: everything, as it is.
struct VerificationShare {
  int64_t index = 0;
  int64_t count = 1;
  std::function<std::string(const std::string&)> combine = [](const std::string& r) { return r; };
};

// The newest resumable checkpoint of a model `expected` whose tensors are `full`: every file
// present and passing the checks its resume makes (CheckpointReader::open with the optimizer
// state, the trainer state's), every file's bytes those it was written with (checksums.json; a
// checkpoint written before moecore wrote checksums is checked without), every weight and moment
// finite. nullopt when there is none. Newer checkpoints that were skipped are appended to
// `damaged` when given. Every byte of a candidate is read once, by the processes of `share`
// together (collective when they are several: each calls it with its share).
std::optional<std::string> latest_valid_checkpoint(
    const std::string& run_dir, const ModelConfig& expected, const ParamLayout& full,
    std::vector<DamagedCheckpoint>* damaged = nullptr, const VerificationShare& share = {});

// Renames a damaged checkpoint directory `dir` (checkpoints/step_N) to checkpoints/damaged-step_N
// (damaged-step_N.2, .3, ... if taken) and returns the new path. The resumed run will save step N
// again, which would otherwise replace it: what is left of it (weights whose file is whole, say)
// stays for the user to inspect or salvage. No listing of checkpoints sees it again.
std::string set_aside_damaged_checkpoint(const std::string& dir);

// A checkpoint opened for reading, where a resumed rank reads only what it holds (its experts,
// its pipeline stage's layers, its ZeRO-1 shard of the moments). open() checks the checkpoint as
// a whole from the file headers alone: its model configuration equals `expected`, every tensor of
// the whole model `full` is present with its shape and no other tensor is, and (with_optimizer)
// every tensor's moments are present whole or as slices that tile it, with the step count. The
// reads then touch only the bytes asked for (the files are memory-mapped).
class CheckpointReader {
 public:
  static CheckpointReader open(const std::string& dir, const ModelConfig& expected,
                               const ParamLayout& full, bool with_optimizer);

  // The weights of every tensor of `local` (a layout of the same model: global names).
  void read_weights(const ParamLayout& local, ParamBuffers& params) const;
  // Elements [first, first + count) of tensor `name`'s Adam moments (with_optimizer only).
  void read_moments(const std::string& name, size_t first, size_t count, float* exp_avg,
                    float* exp_avg_sq) const;
  int64_t steps_taken() const { return steps_taken_; }
  // Throws a one-line moecore::Error naming the first NaN or infinity among the weights and (with
  // the optimizer) the moments: what a run saves is finite (SafetensorsWriter::require_finite).
  // With a share, only the tensors at its positions of each file set's sorted names.
  void check_finite(int64_t share_index = 0, int64_t share_count = 1) const;

 private:
  struct Slice {  // "<moment>.<name>[begin:end]"
    size_t begin, end;
    std::string tensor;
  };
  CheckpointReader(io::TensorParts model, std::optional<io::TensorParts> optim)
      : model_(std::move(model)), optim_(std::move(optim)) {}
  void read_moment(const std::string& moment, const std::string& name, size_t first, size_t count,
                   float* dst) const;

  io::TensorParts model_;
  std::optional<io::TensorParts> optim_;
  // Moments stored as slices, by "<moment>.<name>", in order; they tile the tensor.
  std::map<std::string, std::vector<Slice>> slices_;
  int64_t steps_taken_ = 0;
};

// Loads a checkpoint directory into params (and optimizer, if given) after checking that its model
// configuration equals `expected`; returns the trainer state.
nlohmann::json load_checkpoint(const std::string& dir, const ModelConfig& expected,
                               const ParamLayout& layout, ParamBuffers& params, AdamW* optimizer);

// Throws a one-line moecore::Error when `<run_dir>/checkpoints` exists and is not a directory (or
// a link to one): said at start-up, before the steps that the first save would lose.
void check_checkpoints_dir(const std::string& run_dir);

// Removes temporary directories left by saves that were interrupted, and puts back a checkpoint
// that was moved aside for a re-save that never completed (called at start-up, under the run's
// lock). Entries that are not directories are left alone: moecore never writes files there.
void remove_interrupted_saves(const std::string& run_dir);

}  // namespace moecore
