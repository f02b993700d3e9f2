// The contract between the MoE block and its dispatch strategies (local_dispatch.h,
// sync_dispatch.h, rowwise_dispatch.h): the block routes, a strategy brings each (token, slot)
// route's row to its expert and the expert's output back to the source, and the block combines.
// Each strategy keeps what its backward needs in a cache of its own.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device_memory.h"
#include "core/tensor_view.h"
#include "model/linear.h"
#include "model/mx_weight_caches.h"
#include "model/router.h"

namespace moecore {

// One MoE layer's weights as its GEMMs read them: the router's fp32 weights (routing stays
// exact), and the experts' and shared expert's fp32 master weights or, where the recipe multiplies
// them in bf16, their bf16 copies (model/bf16_weight_copies.h).
struct MoeWeights {
  const float* router;                 // [E, d] (every expert: routing is replicated)
  ConstTensorView experts_gate_up;     // [E_local, 2H, d] this rank's experts
  ConstTensorView experts_down;        // [E_local, d, H]
  LinearWeight shared_gate_up;         // [2Hs, d], or empty without a shared expert
  LinearWeight shared_down;            // [d, Hs], or empty
  const float* router_bias = nullptr;  // [E] selection bias (aux-loss-free balancing) or nullptr
  // The MXFP8 caches of the experts' weights where the recipe multiplies them in MXFP8
  // (model/mx_weight_caches.h), else nullptr.
  const MxWeight* experts_gate_up_mx = nullptr;
  const MxWeight* experts_down_mx = nullptr;
};

// The gradients (+=) of the trained tensors, fp32 (the selection bias gets none: it is not a
// function of the loss).
struct MoeGrads {
  float* router;
  float* experts_gate_up;
  float* experts_down;
  float* shared_gate_up;  // nullptr without a shared expert
  float* shared_down;
};

// This rank's experts: global ids [first, first + count); count * ranks == E.
struct ExpertShard {
  int64_t first = 0;
  int64_t count = 0;
};

// What a strategy hands back at the source: the row of route r = t * k + j in y_back is
// send_pos[r]; rows of dropped routes are zero.
struct RoutedRows {
  DeviceArray<int32_t> send_pos;  // [N * k]
  DeviceArray<float> y_back;      // [N * k, d] expert outputs back at the source
};

}  // namespace moecore
