// The tensor dump of one batch's forward and backward (`moecore dump`, read by `moecore diff`): a
// format another build (the GPU backend, another machine) can write too. A directory holding
//   tensors.safetensors  every tensor under its name, F32 (a reader also takes BF16 and F16);
//   manifest.json        {"format": "moecore-tensor-dump", "version": 1,
//                         "run": {...what produced it: precision, backend, config, hashes...},
//                         "tensors": [{"name", "phase": "forward" | "backward",
//                                      "kind": "value" | "index", "shape": [...]}, ...]}
// with "tensors" in execution order (safetensors sorts its names, so the order lives here).
// "index" tensors hold integers (top-k expert ids) stored as F32, exact below 2^24. The manifest
// is written last: a directory with one is complete.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moecore::io {

struct DumpedTensor {
  std::string name;
  std::string phase;  // "forward" | "backward"
  bool index = false;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

struct TensorDump {
  nlohmann::json run = nlohmann::json::object();  // identity of the run that produced it
  std::vector<DumpedTensor> tensors;              // execution order
};

// `dir` must not exist or be empty. The files are written into a sibling directory renamed to
// `dir` at the end: a write that fails leaves `dir` as it was. Duplicate names are an error.
void write_tensor_dump(const TensorDump& dump, const std::string& dir);
// What write_tensor_dump checks of `dir` before it writes (a new or empty directory), so that a
// command can refuse a bad --out before its pass; returns the directory's normal form.
std::string check_new_dump_dir(const std::string& dir);
// Every inconsistency (no manifest, another format or version, a tensor listed but absent, present
// but unlisted, or of another shape) is a one-line error naming the directory and the tensor.
TensorDump read_tensor_dump(const std::string& dir);

}  // namespace moecore::io
