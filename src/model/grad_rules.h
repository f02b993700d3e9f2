// The one rule for gradients in moecore (llm.c's convention, written down once):
//   * parameter gradients ACCUMULATE (+=): the trainer zeroes them once per optimizer step, and
//     micro-batches, tied weights and shared inputs add into them;
//   * activation gradients OVERWRITE (=) unless a function's comment says it accumulates (for
//     example into the residual stream, where several branches add up).
#pragma once
