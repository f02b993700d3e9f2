// The self-check of a model that comes from outside moecore (`moecore import HF_DIR`,
// `moecore train --init-from HF_DIR`): its weights are written as a moecore model directory, read
// back the way `train --resume`, `eval` and `generate` read a checkpoint (config.toml and the
// weights) and the way import and --init-from read a Hugging Face directory (config.json, the
// tensors' names, dtypes and shapes), and the reloaded model's logits on a fixed, tiny batch must
// equal the in-memory model's bit for bit (fp32 written and read back is the same bits, and the
// same forward of the same bits is too) and be finite. What it catches: a writer or reader that
// drops, reorders or rounds a tensor, a config that does not read back as the same architecture,
// and weights whose logits are Inf or NaN (a broken checkpoint no training step recovers from).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/communicator.h"
#include "model/params.h"
#include "train/run_config.h"

namespace moecore {

// A moecore model directory: the files of a checkpoint without the optimizer and trainer state.
struct ModelDirContents {
  const RunConfig* run = nullptr;                       // config.toml
  nlohmann::json hf_config;                             // config.json
  std::map<std::string, std::string> weights_metadata;  // model.safetensors' metadata
  std::string tokenizer_json;                           // tokenizer.json when not empty
  std::map<std::string, std::string> hf_side_files;     // io/hf_side_files.h
};
// Writes <dir>/model.safetensors (fp32, Hugging Face names), config.json, config.toml and
// tokenizer.json into an existing directory.
void write_model_dir(const std::string& dir, const ParamLayout& layout, const ParamBuffers& params,
                     const ModelDirContents& contents);

// The check's figures, for the line that says it passed.
struct RoundTripCheck {
  int64_t batch = 0, seq = 0;  // the fixed check batch
  double max_abs_diff = 0.0;   // of the reloaded logits from the in-memory ones: 0 when it passed
  double max_abs_logit = 0.0;  // of the in-memory model's logits
  double seconds = 0.0;        // round_trip_check_on_rank0: writing, reading and both forwards
};

// Reads <dir> (written by write_model_dir from `model`, `layout`, `params`) back and compares; a
// failure is a moecore::Error "<tag> self-check: ..." naming `name` (what the user calls <dir>).
RoundTripCheck check_model_dir(const std::string& dir, const std::string& name,
                               const ModelConfig& model, const ParamLayout& layout,
                               const ParamBuffers& params, const char* tag);

// write_model_dir into `scratch_dir` (made, and removed again whatever the outcome), then
// check_model_dir (errors name scratch_dir). Collective over `world`: rank 0 alone writes and
// checks the whole model (`rank0_params`, sized by `layout`; the other ranks, which hold only
// their share, pass nullptr), the other ranks wait for its verdict, and a failure is the same
// moecore::Error on every rank, so no rank is left waiting in a later collective.
RoundTripCheck round_trip_check_on_rank0(const dist::Communicator& world,
                                         const std::string& scratch_dir, const ParamLayout& layout,
                                         const ParamBuffers* rank0_params,
                                         const ModelDirContents& contents, const char* tag);

}  // namespace moecore
