"""Helpers shared by the reference tests: the moecore binary, config files, safetensors, HF configs,
and the error metric.

Error metric (issue 2, item 7): rel_err(a, b) = max|a - b| / max|b| per tensor, with b the reference.
When max|b| == 0 the reference is exactly zero and we require max|a| <= 1e-6 instead.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import ref_model

# fp32 parity tolerance: max|ours - ref| / max|ref| per tensor, for a whole model's forward and
# backward (or ten AdamW steps of it) computed by two fp32 programs with different summation orders
# (oneDNN's kernels in the engine, MKL / ATen's in torch; both change with the CPU). Empirical: each
# GEMM / reduction adds ~sqrt(k) u (u = 2^-24, k <= 100: ~1e-6) relative and a forward + backward
# chains a few dozen of them. Measured worst over four ISA settings (tests/TOLERANCES.md): 2.1e-6
# for a forward/backward (test_engine_parity, test_bf16_parity's fp32 check), 1.8e-5 after ten AdamW
# steps (test_adamw_steps, oneDNN and MKL on their AVX2 kernels): >= 5x headroom. A real bug (a
# missing loss term, a wrong gradient, a wrong index) is off by >= 1e-2.
TOL = 1e-4
ZERO_ABS_TOL = 1e-6  # when the reference is exactly zero (exact zeros stay exact up to ~u |terms|)
BIN_TIMEOUT_S = 300


# ----------------------------------------------------------------------------------------------
# Locations


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def binary_path() -> Path:
    """$MOECORE_BIN (relative paths are taken from the repo root), else build/bin/moecore."""
    env = os.environ.get("MOECORE_BIN")
    if env:
        p = Path(env)
        return p if p.is_absolute() else repo_root() / p
    return repo_root() / "build" / "bin" / "moecore"


def binary_missing_reason() -> str | None:
    p = binary_path()
    if not p.is_file():
        return f"moecore binary not found at {p} (build it with `make build`, or set MOECORE_BIN)"
    if not os.access(p, os.X_OK):
        return f"moecore binary at {p} is not executable"
    return None


# ----------------------------------------------------------------------------------------------
# Config files


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"non-finite config value {v}")
        r = repr(v)  # shortest round-trip form; always has '.' or 'e'
        return r
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in v) + "]"
    if isinstance(v, dict):  # an inline table (a list of them is an array of tables)
        return "{" + ", ".join(f"{k} = {_toml_value(item)}" for k, item in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} to TOML")


def toml_text(tables: dict[str, dict]) -> str:
    """{"model": {...}, "optim": {...}} -> TOML text (tables of scalars, lists and inline tables)."""
    lines = []
    for table, kv in tables.items():
        lines.append(f"[{table}]")
        for k, v in kv.items():
            if v is None:
                continue
            lines.append(f"{k} = {_toml_value(v)}")
        lines.append("")
    return "\n".join(lines)


OPTIM_DEFAULTS = {
    "lr": 1e-3,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-8,
    "weight_decay": 0.1,
    "max_grad_norm": 1.0,
    "warmup_steps": 0,
    "schedule": "cosine",
    "min_lr_ratio": 0.1,
}


def model_table(model: dict) -> dict:
    """Every [model] key written explicitly (no reliance on the engine's defaults)."""
    c = dict(ref_model.full_config(model))
    return c


def write_config(path: Path, model: dict, optim: dict | None = None, precision: str = "fp32",
                 data: dict | None = None, train: dict | None = None) -> Path:
    tables = {"model": model_table(model), "optim": {**OPTIM_DEFAULTS, **(optim or {})},
              "train": {"precision": precision, **(train or {})}}
    if data:
        tables["data"] = data
    Path(path).write_text(toml_text(tables))
    return Path(path)


# ----------------------------------------------------------------------------------------------
# Tensors on disk


def save_weights(path: Path, params: dict[str, torch.Tensor]) -> Path:
    save_file({k: v.detach().float().contiguous() for k, v in params.items()}, str(path), metadata={"format": "pt"})
    return Path(path)


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def save_tokens(path: Path, arr, dtype=np.int64) -> Path:
    np.save(str(path), np.asarray(arr, dtype=dtype))
    return Path(path)


# ----------------------------------------------------------------------------------------------
# Running the binary


def run_moecore(*args, timeout: int = BIN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run `moecore <args>`; raise AssertionError with the command, exit code and stderr on failure."""
    reason = binary_missing_reason()
    if reason:
        raise AssertionError(reason)
    cmd = [str(binary_path()), *map(str, args)]
    try:
        proc = subprocess.run(cmd, cwd=repo_root(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"timed out after {timeout}s: {shlex.join(cmd)}\nstderr:\n{exc.stderr}") from None
    if proc.returncode != 0:
        raise AssertionError(
            f"moecore failed (exit {proc.returncode}): {shlex.join(cmd)}\n"
            f"--- stderr ---\n{proc.stderr.strip()}\n--- stdout (tail) ---\n{proc.stdout[-2000:].strip()}"
        )
    return proc


def prepare_token_files(root: Path, seed: int, documents: int, vocab_size: int = 300,
                        repeated: float = 0.0) -> Path:
    """A random corpus of `documents` lines of small words, a byte-level BPE of vocab_size trained
    on it and `moecore prepare`'s token files of all of it (no validation part): the tokens'
    directory (train/ and meta.json). `repeated`: the share of lines that repeat one word 3 to 6
    times (what an instance filter masks)."""
    rng = np.random.default_rng(seed)
    words = "in the beginning god created heaven and earth light darkness waters day night".split()
    corpus = root / "corpus.txt"

    def line():
        if repeated and rng.random() < repeated:  # (no draw otherwise: the same corpus as before)
            return " ".join([str(rng.choice(words))] * int(rng.integers(3, 7)))
        return " ".join(rng.choice(words, size=rng.integers(3, 25)))

    corpus.write_text("\n".join(line() for _ in range(documents)) + "\n")
    tok = root / "tokenizer.json"
    run_moecore("tokenizer", "train", "--input", corpus, "--vocab-size", vocab_size, "--out", tok)
    run_moecore("prepare", "--tokenizer", tok, "--input", corpus, "--out", root / "tokens",
                "--val-fraction", "0")
    return root / "tokens"


# `mpirun` as root on an oversubscribed machine (CI's two cores), one OpenMP thread per rank.
MPI_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1",
           "OMP_WAIT_POLICY": "PASSIVE"}


def run_moecore_raw(*args, timeout: int = BIN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run `moecore <args>` and return the result whatever the exit code (for error cases)."""
    reason = binary_missing_reason()
    if reason:
        raise AssertionError(reason)
    cmd = [str(binary_path()), *map(str, args)]
    return subprocess.run(cmd, cwd=repo_root(), capture_output=True, text=True, timeout=timeout)


def moecore_init(workdir: Path, model: dict, seed: int, optim: dict | None = None, name: str = "init") -> dict[str, torch.Tensor]:
    cfg = write_config(workdir / f"{name}.toml", model, optim)
    out = workdir / f"{name}.safetensors"
    run_moecore("init", "--config", cfg, "--seed", seed, "--out", out)
    return load_tensors(out)


def moecore_debug_state(workdir: Path, model: dict, params: dict[str, torch.Tensor], tokens, targets,
                        token_dtype=np.int64, name: str = "state", precision: str = "fp32",
                        data: dict | None = None, train: dict | None = None) -> dict[str, torch.Tensor]:
    cfg = write_config(workdir / f"{name}.toml", model, precision=precision, data=data, train=train)
    w = save_weights(workdir / f"{name}.weights.safetensors", params)
    x = save_tokens(workdir / f"{name}.tokens.npy", tokens, token_dtype)
    y = save_tokens(workdir / f"{name}.targets.npy", targets, token_dtype)
    out = workdir / f"{name}.out.safetensors"
    run_moecore("debug-state", "--config", cfg, "--weights", w, "--tokens", x, "--targets", y, "--out", out)
    return load_tensors(out)


def moecore_debug_steps(workdir: Path, model: dict, optim: dict, params: dict[str, torch.Tensor], tokens, targets,
                        steps: int, token_dtype=np.int64, name: str = "steps", precision: str = "fp32") -> dict[str, torch.Tensor]:
    cfg = write_config(workdir / f"{name}.toml", model, optim, precision)
    w = save_weights(workdir / f"{name}.weights.safetensors", params)
    x = save_tokens(workdir / f"{name}.tokens.npy", tokens, token_dtype)
    y = save_tokens(workdir / f"{name}.targets.npy", targets, token_dtype)
    out = workdir / f"{name}.out.safetensors"
    run_moecore("debug-steps", "--config", cfg, "--weights", w, "--tokens", x, "--targets", y,
                "--steps", steps, "--out", out)
    return load_tensors(out)


# ----------------------------------------------------------------------------------------------
# Hugging Face configs


def _common_hf(c: dict) -> dict:
    return {
        "vocab_size": c["vocab_size"],
        "hidden_size": c["hidden_size"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "rope_theta": float(c["rope_theta"]),
        "rope_scaling": None,
        "rms_norm_eps": float(c["rms_norm_eps"]),
        "tie_word_embeddings": bool(c["tie_word_embeddings"]),
        "num_experts": c["num_experts"],
        "num_experts_per_tok": c["num_experts_per_tok"],
        "norm_topk_prob": bool(c["norm_topk_prob"]),
        "router_aux_loss_coef": float(c["router_aux_loss_coef"]),
        "output_router_logits": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "use_cache": False,
        # None: no padding row (nn.Embedding(padding_idx=...) zeroes that row's gradient, as
        # moecore's model.pad_token_id does: tests/train/test_hf_import.py).
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
    }


def _require(cond: bool, what: str, arch: str):
    if not cond:
        raise ValueError(f"{arch} cannot express this config: {what}")


def hf_config_dict(model: dict, arch: str | None = None) -> dict:
    """config.json for OlmoeForCausalLM (qk_norm "full") or Qwen3MoeForCausalLM (qk_norm "per_head").

    Raises ValueError when the [model] dict has a feature the HF class lacks.
    """
    c = ref_model.full_config(model)
    if arch is None:
        arch = {"full": "olmoe", "per_head": "qwen3_moe"}.get(c["qk_norm"], "none")
        if arch == "olmoe" and c["block_norm"] == "reordered":
            arch = "flex_olmo"
    common = [
        (c["router_score"] == "softmax", "router_score must be softmax"),
        (c["shared_expert_intermediate_size"] == 0, "no shared expert"),
        (c["router_z_loss_coef"] == 0.0, "router z-loss (HF has none) must have coefficient 0"),
        (c["lb_loss_style"] == "hf", 'lb_loss_style must be "hf"'),
        (c["n_group"] == 1 and c["routed_scaling_factor"] == 1.0 and c["router_bias_update_rate"] == 0.0,
         "no group limit, weight scale or selection bias"),
        (c["block_norm"] == ("reordered" if arch == "flex_olmo" else "pre"), "block_norm"),
    ]
    if arch == "flex_olmo":
        for cond, what in common:
            _require(cond, what, arch)
        _require(c["qk_norm"] == "full", 'qk_norm must be "full"', arch)
        _require(c["first_k_dense_replace"] == 0, "no dense layers", arch)
        _require(c["head_dim"] == c["hidden_size"] // c["num_attention_heads"], "head_dim must be hidden/heads", arch)
        d = _common_hf(c)
        d.update({
            "architectures": ["FlexOlmoForCausalLM"],
            "model_type": "flex_olmo",
            "intermediate_size": c["moe_intermediate_size"],  # like OLMoE: the experts' width
        })
        return d
    if arch == "dots1":
        # dots.llm1: Qwen3-style attention (per-head QK-norm) with DeepSeek-V3's MoE: sigmoid router,
        # e_score_correction_bias, group-limited top-k, routed_scaling_factor, a shared expert of
        # n_shared_experts x moe_intermediate_size (named mlp.shared_experts), no aux loss.
        Hs, H = c["shared_expert_intermediate_size"], c["moe_intermediate_size"]
        _require(c["router_score"] == "sigmoid", "router_score must be sigmoid", arch)
        _require(c["qk_norm"] == "per_head", 'qk_norm must be "per_head"', arch)
        _require(c["block_norm"] == "pre", "pre-norm", arch)
        _require(Hs > 0 and Hs % H == 0, "a shared expert of width n * moe_intermediate_size", arch)
        _require(c["router_bias_update_rate"] > 0, "a selection bias (e_score_correction_bias)", arch)
        d = _common_hf(c)
        for key in ("num_experts", "router_aux_loss_coef", "output_router_logits"):
            d.pop(key)
        d.update({
            "architectures": ["Dots1ForCausalLM"],
            "model_type": "dots1",
            "head_dim": c["head_dim"],
            "n_routed_experts": c["num_experts"],
            "n_shared_experts": Hs // H,
            "moe_intermediate_size": H,
            "intermediate_size": c["intermediate_size"],
            "first_k_dense_replace": c["first_k_dense_replace"],
            "n_group": c["n_group"],
            "topk_group": c["topk_group"],
            "routed_scaling_factor": float(c["routed_scaling_factor"]),
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": c["num_hidden_layers"],
        })
        return d
    if arch == "olmoe":
        for cond, what in common:
            _require(cond, what, arch)
        _require(c["qk_norm"] == "full", 'qk_norm must be "full"', arch)
        _require(c["first_k_dense_replace"] == 0, "no dense layers", arch)
        _require(c["head_dim"] == c["hidden_size"] // c["num_attention_heads"], "head_dim must be hidden/heads", arch)
        d = _common_hf(c)
        d.update({
            "architectures": ["OlmoeForCausalLM"],
            "model_type": "olmoe",
            "intermediate_size": c["moe_intermediate_size"],  # OLMoE's experts use intermediate_size
            "clip_qkv": None,
        })
        return d
    if arch == "qwen3_moe":
        for cond, what in common:
            _require(cond, what, arch)
        _require(c["qk_norm"] == "per_head", 'qk_norm must be "per_head"', arch)
        if c["first_k_dense_replace"] > 0:
            _require(c["intermediate_size"] > 0, "dense layers need intermediate_size", arch)
        d = _common_hf(c)
        d.update({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "head_dim": c["head_dim"],
            "moe_intermediate_size": c["moe_intermediate_size"],
            "intermediate_size": c["intermediate_size"],
            "decoder_sparse_step": 1,
            # moecore's dense first layers are Qwen3-MoE's mlp_only_layers ([] when there are none).
            "mlp_only_layers": list(range(c["first_k_dense_replace"])),
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": c["num_hidden_layers"],
        })
        return d
    raise ValueError(f"no transformers class covers qk_norm={c['qk_norm']!r}")


def hf_model(model: dict, weights: dict[str, torch.Tensor] | None = None, arch: str | None = None):
    """An eager float32 transformers model for `model`; if `weights` is given they are loaded with
    load_state_dict (strict apart from a tied lm_head.weight)."""
    import transformers

    d = hf_config_dict(model, arch)
    cls_name = d["architectures"][0]
    cfg_cls = {"OlmoeForCausalLM": transformers.OlmoeConfig, "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig,
               "FlexOlmoForCausalLM": transformers.FlexOlmoConfig, "Dots1ForCausalLM": transformers.Dots1Config}[cls_name]
    kw = {k: v for k, v in d.items() if k not in ("architectures", "model_type", "torch_dtype")}
    config = cfg_cls(**kw, attn_implementation="eager")
    torch.manual_seed(0)
    m = getattr(transformers, cls_name)(config).float()
    if weights is not None:
        if cls_name == "Dots1ForCausalLM":  # DeepSeek's plural name for the shared expert
            weights = {k.replace(".mlp.shared_expert.", ".mlp.shared_experts."): v for k, v in weights.items()}
        missing, unexpected = m.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
        allowed_missing = {"lm_head.weight"} if d["tie_word_embeddings"] else set()
        if set(missing) - allowed_missing or unexpected:
            raise AssertionError(f"HF load_state_dict: missing={sorted(set(missing) - allowed_missing)} unexpected={unexpected}")
        if d["tie_word_embeddings"]:
            assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr(), "lm_head not tied"
    m.train()  # dropout is 0 everywhere; train mode as in training
    return m


def hf_debug_state(m, model: dict, tokens, targets, attention_mask=None) -> dict[str, torch.Tensor]:
    """The debug-state tensors computed by a transformers model: logits, loss.ce (our no-shift CE on HF
    logits), loss.lb (outputs.aux_loss), loss.total = ce + coef * aux, grad.<name>; loss.lm_z, the
    LM-head z-loss, is ref_model's formula on transformers' logits (transformers has none, and it is
    not in the total here). No loss.z: HF has no router z-loss (configs compared with HF use
    coefficient 0). attention_mask: an optional 4-D
    additive float mask [B, 1, T, T] that transformers uses as given (eager attention)."""
    c = ref_model.full_config(model)
    m.zero_grad(set_to_none=True)
    if attention_mask is None:
        out = m(input_ids=torch.as_tensor(tokens).long(), output_router_logits=True, use_cache=False)
    else:
        # The CausalLM wrapper hands the mask to load_balancing_loss_func, which expects a 2-D
        # padding mask; so run the base model and take the head and the aux loss (over all tokens,
        # as without a mask) here.
        import sys
        from types import SimpleNamespace

        base = m.model(input_ids=torch.as_tensor(tokens).long(), attention_mask=attention_mask,
                       output_router_logits=True, use_cache=False)
        lb_func = sys.modules[type(m).__module__].load_balancing_loss_func
        out = SimpleNamespace(logits=m.lm_head(base.last_hidden_state),
                              aux_loss=lb_func(base.router_logits, m.num_experts,
                                               m.num_experts_per_tok, None))
    ce = ref_model.cross_entropy(out.logits, torch.as_tensor(targets))
    total = ce + c["router_aux_loss_coef"] * out.aux_loss
    total.backward()
    state = {
        "logits": out.logits.detach(),
        "loss.ce": ce.detach(),
        "loss.lb": out.aux_loss.detach(),
        "loss.lm_z": ref_model.lm_head_z_loss(out.logits.detach(), torch.as_tensor(targets)),
        "loss.total": total.detach(),
    }
    for n, p in m.named_parameters():
        state["grad." + n] = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
    return state


# ----------------------------------------------------------------------------------------------
# Comparison


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max|b|; when max|b| == 0 returns max|a| / ZERO_ABS_TOL * TOL so that
    `rel_err <= TOL` means max|a| <= ZERO_ABS_TOL."""
    a = torch.as_tensor(a).double()
    b = torch.as_tensor(b).double()
    if a.shape != b.shape:
        return float("inf")
    if not torch.isfinite(a).all():
        return float("inf")
    mb = b.abs().max().item() if b.numel() else 0.0
    if mb == 0.0:
        ma = a.abs().max().item() if a.numel() else 0.0
        return ma / ZERO_ABS_TOL * TOL
    return (a - b).abs().max().item() / mb


def compare(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], names=None, tol: float = TOL) -> list[str]:
    """Compare tensor by tensor; return one line per failure (empty list = all within tol)."""
    names = sorted(ref) if names is None else names
    bad = []
    for n in names:
        if n not in ours:
            bad.append(f"{n}: missing from ours")
            continue
        a, b = torch.as_tensor(ours[n]), torch.as_tensor(ref[n])
        if tuple(a.shape) != tuple(b.shape):
            bad.append(f"{n}: shape {tuple(a.shape)} != ref {tuple(b.shape)}")
            continue
        e = rel_err(a, b)
        if not e <= tol:
            mb = b.double().abs().max().item() if b.numel() else 0.0
            ma = a.double().abs().max().item() if a.numel() else 0.0
            bad.append(f"{n}: rel_err {e:.3e} (max|ref| {mb:.3e}, max|ours| {ma:.3e}, max|diff| "
                       f"{(a.double() - b.double()).abs().max().item():.3e})")
    return bad


def assert_all_close(ours: dict, ref: dict, names=None, tol: float = TOL, what: str = ""):
    bad = compare(ours, ref, names, tol)
    if bad:
        head = f"{what}: {len(bad)} tensor(s) outside max|a-b|/max|b| <= {tol:g}:\n  "
        raise AssertionError(head + "\n  ".join(bad))


def state_names(cfg: dict) -> list[str]:
    """Every tensor name a debug-state file must hold for this config."""
    return (["logits", "loss.ce", "loss.lb", "loss.z", "loss.lm_z", "loss.total"]
            + ["grad." + n for n in ref_model.param_shapes(cfg)])


# --- tokenizer parity -----------------------------------------------------------------------

def tokenizer_encode(moecore_bin: Path, tokenizer_json: Path, text_path: Path, out: Path) -> list[int]:
    """`moecore tokenizer encode` of a file: the whole text as one string, no special tokens added."""
    proc = subprocess.run(
        [str(moecore_bin), "tokenizer", "encode", "--tokenizer", str(tokenizer_json),
         "--input", str(text_path), "--out", str(out)],
        capture_output=True, text=True, timeout=BIN_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, f"moecore tokenizer encode failed:\n{proc.stdout}\n{proc.stderr}"
    ids = np.load(out)
    assert ids.dtype == np.uint32 and ids.ndim == 1, f"{out}: dtype {ids.dtype}, shape {ids.shape}"
    return ids.tolist()


def assert_same_ids(ours: list[int], ref: list[int], render, what: str) -> None:
    """Fails naming the first token where moecore's ids part from tokenizers', with the ids around
    it on both sides as `render` (a list of ids -> something readable) shows them."""
    if ours == ref:
        return
    n = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    lo = max(0, n - 5)
    raise AssertionError(
        f"{what}: encodings differ at token {n} (moecore {len(ours)} ids, tokenizers {len(ref)}); "
        f"moecore {render(ours[lo:n + 5])!r} vs tokenizers {render(ref[lo:n + 5])!r}"
    )
