"""transformers >= 5 runs OlmoeForCausalLM's experts through torch's grouped GEMM
(transformers.integrations.moe._grouped_mm), which autocast does not cover: it casts the input to
the weights' dtype, so with fp32 master weights under torch.autocast(dtype=bfloat16) the experts
run in fp32 (on CUDA a per-expert fallback that waits for the host; under torch.compile
transformers' own loop). A user of autocast means the experts' GEMMs in bf16, as every other
matmul of the model: `enable()` makes the grouped GEMM take both operands in autocast's dtype
while autocast is on (the fp32 master weights still get fp32 gradients through the cast), as
autocast itself does for torch.matmul. A separate module, so that torch.compile traces the
replacement as any library function. transformers 4.x has no such path (its experts are
nn.Linear modules, which autocast covers): nothing to do there."""
from __future__ import annotations


def enable() -> bool:
    """Patches transformers' grouped GEMM; False where this transformers has none."""
    try:
        from transformers.integrations import moe
    except ImportError:
        return False
    if not hasattr(moe, "_grouped_mm") or getattr(moe._grouped_mm, "_autocast_dtype", False):
        return hasattr(moe, "_grouped_mm")
    import torch

    original = moe._grouped_mm

    def grouped_mm_in_autocast_dtype(input, weight, offs):
        device = input.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            return original(input.to(dtype), weight.to(dtype), offs)
        return original(input, weight, offs)

    grouped_mm_in_autocast_dtype._autocast_dtype = True
    moe._grouped_mm = grouped_mm_in_autocast_dtype
    return True
