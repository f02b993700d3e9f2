// Model weights <-> safetensors with Hugging Face names. Loading is strict: every parameter of the
// configured architecture must be present with exactly its shape, and no other tensor may be in the
// file, so a checkpoint of another architecture fails with a message naming the tensor.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "model/params.h"

namespace moecore::io {

void save_weights(const ParamLayout& layout, const ParamBuffers& params, const std::string& path,
                  const std::map<std::string, std::string>& metadata = {});
void load_weights(const ParamLayout& layout, const std::string& path, ParamBuffers& params);
// The same from a checkpoint directory: model.safetensors, or the parts listed by
// model.safetensors.index.json (expert-parallel checkpoints).
void load_weights_from_dir(const ParamLayout& layout, const std::string& dir, ParamBuffers& params);

// For what computes with the weights it reads (import, --init-from, eval, generate): a NaN or Inf
// where no check batch reaches it would pass a self-check and surface later as a NaN loss or a
// refused save. Fails naming the tensor, where it came from (`origin_of(name)`), the element and
// the value. The debugging commands (debug-state, dump) read such weights as they are.
void require_finite_weights(const ParamLayout& layout, const ParamBuffers& params,
                            const std::function<std::string(const std::string&)>& origin_of,
                            const char* tag);

}  // namespace moecore::io
