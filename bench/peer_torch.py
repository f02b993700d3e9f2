#!/usr/bin/env python3
"""The PyTorch peer of `make bench` (bench/throughput.py): the model of a moecore config trained
with transformers' OlmoeForCausalLM and torch.optim.AdamW on the CPU, eager or torch.compile,
with the same threads, batch, data and precision. Prints one JSON line: steady tokens/s over
steps warmup+1..steps (the same definition as moecore's metrics.jsonl), per-step seconds, and for
torch.compile the time of the first (compiling) step. The line also carries the parameters a token
touches and the model FLOPs per token by moecore's count (model/flop_count.cpp), for MFU.

--device cuda (bench/gpu_peer.py): the model, its fp32 master weights, AdamW's states and the data
on the GPU, bf16 through torch.autocast("cuda"); each step is timed between two
torch.cuda.synchronize() calls (the GPU runs asynchronously, so the host's clock alone would time
the launches), and the line adds the peak memory torch allocated. --threads is ignored there (the
CPU only launches kernels). --synthetic-tokens draws uniform tokens from the config's seed instead
of reading data.train (the GPU machine has no corpus).

The config maps to OlmoeConfig through tests/reference/moecore_harness.py's hf_config_dict (the
mapping the parity tests check); attention is transformers' default ("sdpa", PyTorch's fused
scaled_dot_product_attention) unless --attn eager. The loss is transformers' own: shifted
cross-entropy plus router_aux_loss_coef x the load-balancing loss (output_router_logits=True),
which is the loss moecore computes with lb_loss_style = "hf" and no z-loss. AdamW: decay on
matrices only (norms and embeddings excluded, as moecore), gradient clipping with
clip_grad_norm_, the learning rate set per step (warm-up then cosine). bf16: torch.autocast on
the CPU with fp32 master weights. train.microbatches > 1: the batch in that many forward and
backward passes (gradients accumulated, each pass's loss divided by the count) before one
optimizer step, as moecore's gradient accumulation; the step's loss is the passes' mean.

Usage: bench/peer_torch.py --config bench/configs/bench.toml [--set model.num_experts=16]
       [--mode eager|compile] [--precision fp32|bf16] [--threads 2] [--steps 10] [--warmup 2]
       [--device cpu|cuda] [--synthetic-tokens] [--experts-impl NAME]
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's vendored copy of the same parser
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "reference"))


def load_config(path: str, overrides: list[str]) -> dict:
    cfg = tomllib.loads(Path(path).read_text())
    for o in overrides:
        key, value = o.split("=", 1)
        table, name = key.split(".", 1)
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = value  # a bare string, as moecore's --set accepts
        cfg.setdefault(table, {})[name] = parsed
    return cfg


def read_tokens(path: str):
    """A token file as moecore reads it: a NumPy file says its type; a headerless (OLMo-core) one
    takes it from the meta.json `moecore prepare` wrote in its directory or the one above."""
    import json

    import numpy as np
    with open(path, "rb") as f:
        if f.read(6) == b"\x93NUMPY":
            return np.load(path, mmap_mode="r")
    here = os.path.dirname(os.path.abspath(path))
    for meta_dir in (here, os.path.dirname(here)):
        meta_path = os.path.join(meta_dir, "meta.json")
        if os.path.isfile(meta_path):
            meta = json.load(open(meta_path))
            listed = {os.path.normpath(os.path.join(meta_dir, name))
                      for split in meta.values() if isinstance(split, dict)
                      for name in split.get("files", [])}
            if meta.get("format") == "moecore-tokens" and os.path.normpath(os.path.abspath(path)) in listed:
                return np.memmap(path, dtype=np.dtype(meta["dtype"]).newbyteorder("<"), mode="r")
    raise SystemExit(f"{path}: headerless token file without a meta.json that gives its dtype")


def token_batches(paths: list[str], batch: int, seq: int):
    import numpy as np
    files = []
    for p in paths:
        p = str(REPO / p) if not os.path.isabs(p) else p
        files += sorted(glob.glob(os.path.join(p, "*.npy"))) if os.path.isdir(p) else [p]
    tokens = np.concatenate([read_tokens(f).astype(np.int64) for f in files])
    per = seq + 1
    i = 0
    while True:
        rows = []
        for _ in range(batch):
            if (i + 1) * per > len(tokens):
                i = 0
            rows.append(tokens[i * per:(i + 1) * per])
            i += 1
        yield np.stack(rows)


def synthetic_batches(vocab: int, batch: int, seq: int, seed: int):
    """Uniform tokens from a fixed seed: the same batches on every run and machine, no corpus."""
    import numpy as np
    rng = np.random.default_rng(seed)
    while True:
        yield rng.integers(0, vocab, size=(batch, seq + 1), dtype=np.int64)


def moecore_flops_per_token(c: dict, seq_len: int) -> float:
    """model/flop_count.cpp's count (OLMo-core's; DESIGN.md, Measuring), term for term, so that
    the peer's MFU and moecore's share a numerator: 6 FLOPs per weight a token touches plus the
    causal attention scores; embeddings, norms, activations and the optimizer not counted."""
    d, layers = c["hidden_size"], c["num_hidden_layers"]
    dense_layers = c["first_k_dense_replace"]
    moe_layers = layers - dense_layers
    hd = c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    return (layers * 6.0 * d * (2.0 * q + 2.0 * kv)
            + layers * 12.0 * c["num_attention_heads"] * hd * (seq_len + 1.0) / 2.0
            + moe_layers * 6.0 * d * c["num_experts"]
            + moe_layers * 18.0 * d * c["moe_intermediate_size"] * c["num_experts_per_tok"]
            + moe_layers * 18.0 * d * c["shared_expert_intermediate_size"]
            + dense_layers * 18.0 * d * c["intermediate_size"]
            + 6.0 * d * c["vocab_size"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--synthetic-tokens", action="store_true",
                    help="uniform tokens from train.seed instead of data.train")
    ap.add_argument("--experts-impl", default=None,
                    help="transformers >= 5's experts backend (eager, grouped_mm, batched_mm); "
                         "default: transformers' own choice")
    args = ap.parse_args()

    # The config's errors first, before the seconds torch and transformers take to import.
    cfg = load_config(args.config, args.overrides)
    model_cfg, optim, train = cfg["model"], cfg.get("optim", {}), cfg["train"]
    if model_cfg.get("routing", "learned") != "learned":
        raise SystemExit(f"peer: transformers has no routing = {model_cfg['routing']!r}")
    batch, seq = int(train["batch_size"]), int(train["seq_len"])
    # train.microbatches as moecore reads it: the batch in that many passes whose gradients add
    # up before one optimizer step (each pass's loss, a mean over its own tokens, divided by the
    # count: the batch's mean when every pass has as many targets, as here).
    microbatches = int(train.get("microbatches", 1))
    if microbatches < 1 or batch % microbatches:
        raise SystemExit(f"peer: train.batch_size={batch} is not a multiple of "
                         f"train.microbatches={microbatches}")

    import torch
    import transformers
    import moecore_harness as H
    import peer_autocast_experts
    import ref_model

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("peer: --device cuda but torch sees no usable CUDA device")
    if not cuda:
        torch.set_num_threads(args.threads)
    hf = H.hf_config_dict({k: v for k, v in model_cfg.items() if k != "routing"}, "olmoe")
    kw = {k: v for k, v in hf.items() if k not in ("architectures", "model_type", "torch_dtype")}
    kw["max_position_embeddings"] = train["seq_len"]
    config = transformers.OlmoeConfig(**kw, attn_implementation=args.attn)
    torch.manual_seed(int(train.get("seed", 0)))
    if cuda:
        # Built on the GPU: initialising billions of parameters on the CPU and copying them over
        # would take longer than the timed steps.
        with torch.device("cuda"):
            model = transformers.OlmoeForCausalLM(config).float()
    else:
        model = transformers.OlmoeForCausalLM(config).float()
    model.train()
    if args.experts_impl is not None:
        # transformers 5 runs the experts through a selectable backend (its default grouped_mm
        # casts the input to the weights' dtype: fp32 here, whatever autocast says); 4.x has one.
        if not hasattr(model, "set_experts_implementation"):
            raise SystemExit(f"peer: transformers {transformers.__version__} has no experts "
                             f"backends (--experts-impl {args.experts_impl})")
        model.set_experts_implementation(args.experts_impl)
    experts_impl = getattr(model.config, "_experts_implementation", None) or "modules"
    if args.precision == "bf16" and peer_autocast_experts.enable():
        experts_impl += " (bf16 under autocast: bench/peer_autocast_experts.py)"

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in name else no_decay).append(p)
    lr = float(optim.get("lr", 1e-3))
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(optim.get("weight_decay", 0.1))},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(float(optim.get("beta1", 0.9)), float(optim.get("beta2", 0.95))),
        eps=float(optim.get("eps", 1e-8)),
        # PyTorch's fastest AdamW (one fused update over all parameters), as moecore's
        # multi-tensor update, on the GPU and the CPU alike: on the CPU torch's default is the
        # per-tensor loop (foreach kernels are GPU-only), about 5x slower on the bench model.
        fused=True)
    warmup_steps = int(optim.get("warmup_steps", 0))
    min_ratio = float(optim.get("min_lr_ratio", 0.1))
    max_grad_norm = float(optim.get("max_grad_norm", 1.0))

    def lr_at(step: int) -> float:
        """moecore's schedule (OLMo-core's CosWithWarmup at its step number step + 1)."""
        t = step + 1
        if t < warmup_steps:
            return lr * t / warmup_steps
        if t >= args.steps:
            return lr * min_ratio
        progress = (t - warmup_steps) / (args.steps - warmup_steps)
        return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    forward = torch.compile(model) if args.mode == "compile" else model
    rows = batch // microbatches
    if args.synthetic_tokens:
        data = synthetic_batches(int(model_cfg["vocab_size"]), batch, seq, int(train.get("seed", 0)))
    elif not cfg.get("data", {}).get("train"):
        raise SystemExit(f"peer: {args.config} has no data.train (use --synthetic-tokens)")
    else:
        data = token_batches(cfg["data"]["train"], batch, seq)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    step_s = []
    losses = []
    for step in range(args.steps):
        chunk = torch.from_numpy(next(data))
        if cuda:
            chunk = chunk.to("cuda")
            torch.cuda.synchronize()  # the copy and the previous step are outside the timer
        start = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        try:
            step_loss = torch.zeros((), device=chunk.device)
            for m in range(microbatches):
                with torch.autocast(args.device, dtype=torch.bfloat16,
                                    enabled=args.precision == "bf16"):
                    # transformers shifts the labels itself
                    ids = chunk[m * rows:(m + 1) * rows, :-1].contiguous()
                    out = forward(input_ids=ids, labels=ids,
                                  output_router_logits=True, use_cache=False)
                (out.loss / microbatches).backward()
                step_loss += out.loss.detach() / microbatches
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError as e:
            raise SystemExit(f"peer: out of GPU memory at step {step}: "
                             f"{str(e).strip().splitlines()[0][:200]}")
        step_s.append(time.perf_counter() - start)
        losses.append(float(step_loss))
    timed = step_s[args.warmup:]
    names = [n for n, _ in model.named_parameters()]
    numel = {n: p.numel() for n, p in model.named_parameters()}
    total = sum(numel.values())
    # moecore's "active" (plan/param_count.cpp): everything but the routed experts, plus k of the
    # E experts of each MoE layer; the router (mlp.gate) counts in full.
    routed = sum(numel[n] for n in names if ".mlp.experts." in n)
    router = sum(numel[n] for n in names if ".mlp.gate." in n)
    full = ref_model.full_config({k: v for k, v in model_cfg.items() if k != "routing"})
    result = {
        "mode": args.mode, "precision": args.precision, "attn": args.attn,
        "threads": None if cuda else args.threads,
        "tokens_per_s": len(timed) * batch * seq / sum(timed), "step_s": step_s,
        "first_step_s": step_s[0], "losses": losses, "torch": torch.__version__,
        "transformers": transformers.__version__,
        "parameters": total,
        "device": args.device, "tokens_per_step": batch * seq, "microbatches": microbatches,
        "data": "synthetic" if args.synthetic_tokens else "files",
        "experts_implementation": experts_impl,
        "parameters_active": total - routed + routed // full["num_experts"] * full["num_experts_per_tok"],
        "parameters_router": router,
        "flops_per_token": moecore_flops_per_token(full, seq),
    }
    if cuda:
        result.update(gpu=torch.cuda.get_device_name(),
                      peak_memory_allocated=torch.cuda.max_memory_allocated(),
                      peak_memory_reserved=torch.cuda.max_memory_reserved())
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
