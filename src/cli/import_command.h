// `moecore import HF_DIR --out DIR`: a published Hugging Face model directory
// (io/hf_config_reader.h, io/hf_weights_reader.h) as a moecore model directory, the files of a
// checkpoint without the optimizer and trainer state:
//   model.safetensors  fp32 weights under Hugging Face names
//   config.json        moecore's Hugging Face config of the imported architecture
//   config.toml        a run configuration whose [model] is the import (other tables: defaults)
//   tokenizer.json     HF_DIR's, when it has one
// so that `eval`, `generate` and `debug-state` read it like a checkpoint, transformers loads it,
// and `train --init-from DIR` starts from it. The directory is written into a staging sibling,
// self-checked there (train/round_trip_check.h: read back as a run reads it, its logits on a fixed
// batch must equal the imported model's bit for bit) and only then renamed into place: a failed
// check leaves nothing.
#pragma once

#include <string>

namespace moecore::cli {

void run_import(const std::string& hf_dir, const std::string& out_dir);

}  // namespace moecore::cli
