#include "io/hf_weights_reader.h"

#include <fmt/ranges.h>

#include <filesystem>

#include "core/check.h"
#include "io/model_weights.h"
#include "io/tensor_parts.h"

namespace moecore::io {

namespace {

// Every check against `layout` first, then (params given) the data of read_layout's tensors,
// each of them one of layout's.
HfWeightsRead check_and_read(const ParamLayout& layout, const std::string& dir,
                             const ParamLayout& read_layout, ParamBuffers* params) {
  const std::string single = dir + "/model.safetensors";
  MOE_CHECK(std::filesystem::exists(single) || std::filesystem::exists(single + ".index.json"),
            "[import] {} has neither model.safetensors nor model.safetensors.index.json", dir);
  const TensorParts tensors = TensorParts::open(dir, "model", "[import]");
  // Used: every tensor in the files is a parameter of the configuration (an expert or a layer
  // that a wrong config would leave out is named, not dropped).
  for (const std::string& name : tensors.names())
    MOE_CHECK(layout.find(name) != nullptr,
              "[import] {}: tensor '{}' is not a parameter of this model (unused)",
              tensors.file_of(name), name);
  HfWeightsRead read;
  std::set<std::string> files;
  for (const ParamSpec& spec : layout.specs()) {
    MOE_CHECK(tensors.has(spec.name), "[import] {}: missing tensor '{}' (shape {})",
              tensors.origin(), spec.name, spec.shape);
    const TensorInfo& info = tensors.info(spec.name);
    MOE_CHECK(info.dtype == "F32" || info.dtype == "BF16",
              "[import] {}: tensor '{}' has dtype {}, expected F32 or BF16",
              tensors.file_of(spec.name), spec.name, info.dtype);
    MOE_CHECK(info.shape == spec.shape, "[import] {}: tensor '{}' has shape {}, expected {}",
              tensors.file_of(spec.name), spec.name, info.shape, spec.shape);
    read.dtypes.insert(info.dtype);
    files.insert(tensors.file_of(spec.name));
  }
  read.tensors = static_cast<int64_t>(layout.specs().size());
  read.files = static_cast<int64_t>(files.size());
  if (params != nullptr) {
    for (const ParamSpec& spec : read_layout.specs()) {
      const ParamSpec* whole = layout.find(spec.name);
      MOE_CHECK(whole != nullptr && whole->shape == spec.shape,
                "[import] tensor '{}' of shape {} is not one of the model's", spec.name,
                spec.shape);
      tensors.read_f32(spec.name, spec.shape, params->at(spec));
    }
    // A NaN the self-check's batch does not reach would be imported, or trained on until the
    // first save refuses it.
    require_finite_weights(
        read_layout, *params, [&tensors](const std::string& name) { return tensors.file_of(name); },
        "[import]");
  }
  return read;
}

}  // namespace

HfWeightsRead read_hf_weights(const ParamLayout& layout, const std::string& dir,
                              ParamBuffers& params) {
  return check_and_read(layout, dir, layout, &params);
}

HfWeightsRead read_hf_weights_share(const ParamLayout& full, const std::string& dir,
                                    const ParamLayout& share, ParamBuffers& share_params) {
  return check_and_read(full, dir, share, &share_params);
}

HfWeightsRead check_hf_weights(const ParamLayout& layout, const std::string& dir) {
  return check_and_read(layout, dir, layout, nullptr);
}

}  // namespace moecore::io
