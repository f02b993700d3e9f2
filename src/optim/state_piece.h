// A contiguous run of one tensor's Adam moments, as a rank writes it into its checkpoint part.
// Under ZeRO-1 a rank holds the moments of an equal flat slice of the parameters, which may begin
// or end inside a tensor; the pieces of all ranks tile every tensor exactly once, and the loader
// reassembles them, so a checkpoint resumes under any layout.
#pragma once

#include <cstddef>
#include <string>

#include "model/params.h"

namespace moecore {

struct StatePiece {
  const ParamSpec* spec = nullptr;
  size_t offset = 0;  // first element within the tensor
  size_t count = 0;   // elements
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
  bool whole() const { return offset == 0 && count == spec->numel; }
};

// Name of a piece's tensor in an optimizer part: "exp_avg.<name>" when it covers the whole tensor,
// else "exp_avg.<name>[begin:end]" (a 1-D slice of the flattened tensor).
std::string state_piece_name(const std::string& moment, const StatePiece& piece);

}  // namespace moecore
