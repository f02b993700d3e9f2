"""Bad input to the `moecore` CLI (issue 2, item 9).

Every bad-input case runs the binary under a timeout (a hang is a failure) and asserts:
  * the exit code is non-zero and not a signal;
  * stderr, stripped, is exactly one non-empty line;
  * that line names the problem (a distinctive substring: the tensor, the key, the id, the file);
  * no crash signs (terminate called, Segmentation, AddressSanitizer, UBSan "runtime error:");
  * the --out file is not created, or, when it existed before, is byte-identical afterwards, and no
    temporary file is left next to it.

Positive controls run the same commands on valid inputs (exit 0, output written, nothing on
stderr), so the suite cannot pass vacuously, e.g. because every run fails for one shared reason.

Run: /opt/moecore/venv/bin/python -m pytest -q tests/cli
Binary: $MOECORE_BIN, default <repo>/build/bin/moecore. A missing binary is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("MOECORE_BIN", str(REPO / "build" / "bin" / "moecore")))
TIMEOUT_S = 15
CRASH_SIGNS = ("terminate called", "Segmentation", "AddressSanitizer", "runtime error:",
               "core dumped", "Aborted", "what():")

# A tiny model: d 16, 2 layers (layer 0 dense, layer 1 MoE), V 32, 4 experts top-2.
VOCAB = 32
BASE_MODEL: dict[str, object] = {
    "vocab_size": VOCAB,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 8,
    "intermediate_size": 24,
    "first_k_dense_replace": 1,
    "shared_expert_intermediate_size": 0,
    "norm_topk_prob": False,
    "router_aux_loss_coef": 0.01,
    "router_z_loss_coef": 0.001,
    "qk_norm": "full",
    "router_score": "softmax",
    "lb_loss_style": "olmo-core",
}
BATCH, SEQ = 2, 8


# ------------------------------------------------------------------------------------------------
# helpers


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, float):
        return repr(v)
    return str(v)


def render_toml(tables: dict[str, dict[str, object]], raw_values: dict[str, str] | None = None) -> str:
    """tables: {section: {key: value}}; raw_values: {"section.key": literal TOML text}."""
    raw_values = raw_values or {}
    lines = []
    for section, kv in tables.items():
        lines.append(f"[{section}]")
        for k, v in kv.items():
            lines.append(f"{k} = {raw_values.get(f'{section}.{k}', toml_value(v))}")
        for full, literal in raw_values.items():
            s, k = full.split(".", 1)
            if s == section and k not in kv:
                lines.append(f"{k} = {literal}")
        lines.append("")
    return "\n".join(lines)


def model_toml(**changes: object) -> str:
    """The base [model] table with keys changed; a value of None deletes the key."""
    model = dict(BASE_MODEL)
    for k, v in changes.items():
        if v is None:
            model.pop(k, None)
        else:
            model[k] = v
    return render_toml({"model": model})


def _limit_memory() -> None:
    # Only for cases whose configs ask for absurd sizes: a missing size check must not take the
    # test machine down with it.
    limit = 8 << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_bin(args: list[str], *, cwd: Path, limit_memory: bool = False,
            timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([str(BIN), *map(str, args)], cwd=cwd, capture_output=True,
                              text=True, errors="replace", timeout=timeout,
                              preexec_fn=_limit_memory if limit_memory else None)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"moecore {' '.join(map(str, args))} hung: no exit within {timeout} s "
                    f"(stderr so far: {e.stderr!r})")


def write_npy_bytes(path: Path, arr: np.ndarray) -> Path:
    np.save(path, arr, allow_pickle=arr.dtype == object)
    return path


def write_raw_safetensors(path: Path, header: dict | bytes, data: bytes) -> Path:
    import json
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def tmp_files_next_to(out: Path) -> list[str]:
    if not out.parent.is_dir():
        return []
    return sorted(p.name for p in out.parent.iterdir()
                  if p.name.startswith(out.name + ".tmp") or p.name.startswith(out.name + "."))


# ------------------------------------------------------------------------------------------------
# the valid world every bad case is derived from


@dataclass(frozen=True)
class JobData:
    """A tiny corpus prepared with the CLI: tokenizer.json and OLMo-core token files."""
    corpus: Path
    tokenizer: Path
    train: Path  # directory of .npy token files
    val: Path
    vocab_size: int  # the tokenizer's (the model's vocab_size must be at least this)

    def data_toml(self, **changes: object) -> str:
        """A [data] table pointing at the prepared files; a value of None deletes the key."""
        data: dict[str, object] = {"train": [str(self.train)], "val": [str(self.val)],
                                   "tokenizer": str(self.tokenizer)}
        for k, v in changes.items():
            if v is None:
                data.pop(k, None)
            else:
                data[k] = v
        lines = ["[data]"] + [f"{k} = {json.dumps(v)}" for k, v in data.items()]
        return "\n".join(lines) + "\n"


def write_corpus(path: Path, n_bytes: int = 60_000) -> Path:
    """Deterministic English-like text, one document per line."""
    rng = random.Random(0)
    words = ("in the beginning god created heaven and earth was without form void darkness upon "
             "face of deep spirit moved waters said let there be light it good divided from day "
             "night evening morning were first").split()
    lines, size = [], 0
    while size < n_bytes:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(5, 25))).capitalize() + "."
        lines.append(line)
        size += len(line) + 1
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Env:
    root: Path
    config: Path
    weights: Path
    tokens: Path
    targets: Path
    good_state: Path  # a valid debug-state output, used as a pre-existing --out
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    counter: int = 0
    job: JobData | None = None  # set by the job_data fixture (train cases)

    def path(self, name: str) -> Path:
        self.counter += 1
        d = self.root / f"case{self.counter:04d}"
        d.mkdir()
        return d / name

    def cfg(self, text: str, name: str = "config.toml") -> Path:
        p = self.path(name)
        p.write_text(text)
        return p

    def weights_with(self, tensors: dict[str, np.ndarray], name: str = "w.safetensors") -> Path:
        p = self.path(name)
        save_file(tensors, str(p))
        return p

    def npy(self, arr: np.ndarray, name: str = "ids.npy") -> Path:
        return write_npy_bytes(self.path(name), arr)

    def out(self, name: str = "out.safetensors") -> Path:
        return self.path(name)

    def state_args(self, *, config=None, weights=None, tokens=None, targets=None, out=None,
                   cmd: str = "debug-state") -> list:
        return [cmd, "--config", config or self.config, "--weights", weights or self.weights,
                "--tokens", tokens or self.tokens, "--targets", targets or self.targets,
                "--out", out]


@pytest.fixture(scope="session")
def env(tmp_path_factory) -> Env:
    if not (BIN.is_file() and os.access(BIN, os.X_OK)):
        pytest.fail(f"moecore binary not found or not executable at {BIN} "
                    "(build with `cmake --build build` or set MOECORE_BIN)")
    root = tmp_path_factory.mktemp("moecore_cli")
    config = root / "tiny.toml"
    config.write_text(model_toml())
    weights = root / "w.safetensors"
    r = run_bin(["init", "--config", config, "--seed", "7", "--out", weights], cwd=root)
    assert r.returncode == 0 and weights.is_file(), f"init of the base config failed: {r.stderr}"
    rng = np.random.default_rng(0)
    tokens = write_npy_bytes(root / "tokens.npy",
                             rng.integers(0, VOCAB, size=(BATCH, SEQ), dtype=np.int64))
    tgt = rng.integers(0, VOCAB, size=(BATCH, SEQ), dtype=np.int64)
    tgt[0, 0] = -100
    targets = write_npy_bytes(root / "targets.npy", tgt)
    good_state = root / "good_state.safetensors"
    r = run_bin(["debug-state", "--config", config, "--weights", weights, "--tokens", tokens,
                 "--targets", targets, "--out", good_state], cwd=root)
    assert r.returncode == 0 and good_state.is_file(), f"debug-state on valid input failed: {r.stderr}"
    return Env(root, config, weights, tokens, targets, good_state, load_file(str(weights)))


@pytest.fixture(scope="session")
def job_data(env: Env) -> JobData:
    """Corpus -> `moecore tokenizer train` (vocab 320) -> `moecore prepare`; attached to env.job."""
    root = env.root / "job_data"
    root.mkdir()
    corpus = write_corpus(root / "corpus.txt")
    tokenizer = root / "tokenizer.json"
    r = run_bin(["tokenizer", "train", "--input", corpus, "--vocab-size", "320", "--out", tokenizer],
                cwd=root)
    assert r.returncode == 0 and tokenizer.is_file(), f"tokenizer train failed: {r.stderr}"
    tokens = root / "tokens"
    r = run_bin(["prepare", "--tokenizer", tokenizer, "--input", corpus, "--out", tokens,
                 "--val-fraction", "0.1"], cwd=root)
    assert r.returncode == 0, f"prepare failed: {r.stderr}"
    meta = json.loads((tokens / "meta.json").read_text())
    assert meta["train"]["tokens"] > 0 and meta["val"]["tokens"] > 0, meta
    env.job = JobData(corpus, tokenizer, tokens / "train", tokens / "val", int(meta["vocab_size"]))
    return env.job


# ------------------------------------------------------------------------------------------------
# bad-input cases: each builds its inputs and returns a Case


@dataclass
class Case:
    args: list
    needles: tuple  # each must appear in the error line; a tuple entry: any one of its strings
    out: Path | None = None
    existing_out: bytes | None = None  # pre-populate --out with these bytes
    limit_memory: bool = False


CASES: dict[str, Callable[[Env], Case]] = {}


def case(name: str):
    def deco(fn):
        assert name not in CASES
        CASES[name] = fn
        return fn
    return deco


def drop(t: dict, name: str) -> dict:
    assert name in t, name
    return {k: v for k, v in t.items() if k != name}


GATE = "model.layers.1.mlp.gate.weight"
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
EMBED = "model.embed_tokens.weight"


def _weights_case(e: Env, weights: Path, *needles: str) -> Case:
    out = e.out()
    return Case(e.state_args(weights=weights, out=out), needles, out)


# --- weights ---

@case("weights/missing_tensor")
def _(e):
    return _weights_case(e, e.weights_with(drop(e.tensors, GATE)), GATE)


@case("weights/missing_expert_tensor")
def _(e):
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    return _weights_case(e, e.weights_with(drop(e.tensors, name)), name)


@case("weights/mistyped_name")
def _(e):
    t = drop(e.tensors, GATE)
    t["model.layers.1.mlp.gate.weigth"] = e.tensors[GATE]
    return _weights_case(e, e.weights_with(t), "model.layers.1.mlp.gate.weigth")


@case("weights/extra_tensor")
def _(e):
    t = dict(e.tensors)
    t["model.layers.1.mlp.experts.4.up_proj.weight"] = e.tensors["model.layers.1.mlp.experts.0.up_proj.weight"]
    return _weights_case(e, e.weights_with(t), "model.layers.1.mlp.experts.4.up_proj.weight")


@case("weights/from_a_deeper_model")
def _(e):
    cfg = e.cfg(model_toml(num_hidden_layers=3))
    w = e.path("w3.safetensors")
    r = run_bin(["init", "--config", cfg, "--seed", "1", "--out", w], cwd=e.root)
    assert r.returncode == 0, r.stderr
    return _weights_case(e, w, "model.layers.2.")


@case("weights/wrong_shape")
def _(e):
    t = dict(e.tensors)
    t[Q_PROJ] = np.ascontiguousarray(np.zeros((8, 32), np.float32))  # same numel, wrong shape
    return _weights_case(e, e.weights_with(t), Q_PROJ, "shape")


@case("weights/transposed")
def _(e):
    name = "model.layers.0.mlp.up_proj.weight"  # [24, 16]
    t = dict(e.tensors)
    t[name] = np.ascontiguousarray(e.tensors[name].T)
    return _weights_case(e, e.weights_with(t), name, "shape")


@case("weights/int32_dtype")
def _(e):
    t = dict(e.tensors)
    t[EMBED] = np.zeros(e.tensors[EMBED].shape, np.int32)
    return _weights_case(e, e.weights_with(t), EMBED, "I32")


@case("weights/int64_dtype")
def _(e):
    t = dict(e.tensors)
    t[GATE] = np.zeros(e.tensors[GATE].shape, np.int64)
    return _weights_case(e, e.weights_with(t), GATE, "I64")


@case("weights/f64_dtype")
def _(e):
    t = dict(e.tensors)
    t[EMBED] = e.tensors[EMBED].astype(np.float64)
    return _weights_case(e, e.weights_with(t), EMBED, "F64")


@case("weights/truncated")
def _(e):
    p = e.path("trunc.safetensors")
    data = e.weights.read_bytes()
    p.write_bytes(data[: len(data) - 100])
    return _weights_case(e, p, "trunc.safetensors")


@case("weights/truncated_in_header")
def _(e):
    p = e.path("trunc_header.safetensors")
    p.write_bytes(e.weights.read_bytes()[:40])
    return _weights_case(e, p, "trunc_header.safetensors")


@case("weights/corrupt_header_json")
def _(e):
    p = e.path("corrupt.safetensors")
    data = bytearray(e.weights.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    data[8:8 + n] = b'{"model.embed_tokens.weight": {"dtype": "F32", "shape": [32,' + b"@" * (n - 60)
    p.write_bytes(bytes(data))
    return _weights_case(e, p, "corrupt.safetensors", "JSON")


@case("weights/header_not_object")
def _(e):
    return _weights_case(e, write_raw_safetensors(e.path("list.safetensors"), b"[1, 2, 3]", b""),
                         "list.safetensors")


@case("weights/header_length_past_eof")
def _(e):
    p = e.path("hlen.safetensors")
    p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    return _weights_case(e, p, "hlen.safetensors")


@case("weights/data_offsets_past_eof")
def _(e):
    hdr = {EMBED: {"dtype": "F32", "shape": [VOCAB, 16], "data_offsets": [0, VOCAB * 16 * 4]}}
    return _weights_case(e, write_raw_safetensors(e.path("offs.safetensors"), hdr, b"\0" * 64),
                         "offs.safetensors")


@case("weights/data_offsets_wrong_size")
def _(e):
    hdr = {EMBED: {"dtype": "F32", "shape": [VOCAB, 16], "data_offsets": [0, 64]}}
    return _weights_case(e, write_raw_safetensors(e.path("size.safetensors"), hdr, b"\0" * 64),
                         "size.safetensors", EMBED)


@case("weights/unknown_dtype")
def _(e):
    hdr = {EMBED: {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}
    return _weights_case(e, write_raw_safetensors(e.path("q4.safetensors"), hdr, b"\0\0"),
                         "q4.safetensors", "Q4")


@case("weights/empty_file")
def _(e):
    p = e.path("empty.safetensors")
    p.write_bytes(b"")
    return _weights_case(e, p, "empty.safetensors")


@case("weights/nonexistent")
def _(e):
    return _weights_case(e, e.root / "no_such_dir" / "nope.safetensors", "nope.safetensors")


@case("weights/is_a_directory")
def _(e):
    d = e.path("wdir.safetensors")
    d.mkdir()
    return _weights_case(e, d, "wdir.safetensors")


@case("weights/npy_instead_of_safetensors")
def _(e):
    return _weights_case(e, e.tokens, "tokens.npy")


# --- tokens / targets ---

def _ids_case(e: Env, *, tokens=None, targets=None, needles=(), cmd="debug-state") -> Case:
    out = e.out()
    args = e.state_args(tokens=tokens, targets=targets, out=out, cmd=cmd)
    if cmd == "debug-steps":
        args += ["--steps", "2"]
    return Case(args, tuple(needles), out)


def good_ids(dtype=np.int64) -> np.ndarray:
    return (np.arange(BATCH * SEQ).reshape(BATCH, SEQ) % VOCAB).astype(dtype)


@case("tokens/id_equals_vocab")
def _(e):
    a = good_ids()
    a[1, 3] = VOCAB
    return _ids_case(e, tokens=e.npy(a), needles=("token id 32", "vocab_size=32"))


@case("tokens/id_far_above_vocab_int32")
def _(e):
    a = good_ids(np.int32)
    a[0, 5] = 1_000_000
    return _ids_case(e, tokens=e.npy(a), needles=("token id 1000000",))


@case("tokens/negative")
def _(e):
    a = good_ids()
    a[0, 1] = -1
    return _ids_case(e, tokens=e.npy(a), needles=("token id -1",))


@case("tokens/minus_100_is_not_a_token")
def _(e):
    a = good_ids()
    a[0, 0] = -100
    return _ids_case(e, tokens=e.npy(a), needles=("token id -100",))


@case("tokens/does_not_fit_int32")
def _(e):
    a = good_ids()
    a[0, 0] = 1 << 40
    return _ids_case(e, tokens=e.npy(a, "big.npy"), needles=("big.npy", str(1 << 40)))


@case("tokens/bad_id_in_debug_steps")
def _(e):
    a = good_ids()
    a[1, 7] = VOCAB + 5
    return _ids_case(e, tokens=e.npy(a), needles=("token id 37",), cmd="debug-steps")


@case("targets/id_equals_vocab")
def _(e):
    a = good_ids()
    a[0, 2] = VOCAB
    return _ids_case(e, targets=e.npy(a), needles=("target id 32", "vocab_size=32"))


@case("targets/negative_not_ignore_index")
def _(e):
    a = good_ids()
    a[1, 1] = -1
    return _ids_case(e, targets=e.npy(a), needles=("target id -1",))


@case("targets/minus_99")
def _(e):
    a = good_ids()
    a[1, 1] = -99
    return _ids_case(e, targets=e.npy(a), needles=("target id -99",))


@case("tokens/float32")
def _(e):
    return _ids_case(e, tokens=e.npy(good_ids(np.float32), "f32.npy"), needles=("f32.npy", "<f4"))


@case("targets/float64")
def _(e):
    return _ids_case(e, targets=e.npy(good_ids(np.float64), "f64.npy"), needles=("f64.npy", "<f8"))


@case("tokens/uint8")
def _(e):
    return _ids_case(e, tokens=e.npy(good_ids(np.uint8), "u8.npy"), needles=("u8.npy", "u1"))


@case("tokens/bool")
def _(e):
    return _ids_case(e, tokens=e.npy(np.ones((BATCH, SEQ), bool), "b.npy"), needles=("b.npy", "b1"))


@case("tokens/big_endian")
def _(e):
    return _ids_case(e, tokens=e.npy(good_ids(np.dtype(">i4")), "be.npy"), needles=("be.npy", ">i4"))


@case("tokens/object_pickle")
def _(e):
    a = np.empty((BATCH, SEQ), dtype=object)
    a[:] = 1
    return _ids_case(e, tokens=e.npy(a, "obj.npy"), needles=("obj.npy",))


@case("tokens/fortran_order")
def _(e):
    a = np.asfortranarray(good_ids())  # [B, T], column-major: np.save writes fortran_order True
    assert a.flags.f_contiguous and not a.flags.c_contiguous
    return _ids_case(e, tokens=e.npy(a, "fort.npy"), needles=("fort.npy", "fortran"))


@case("tokens/one_dim")
def _(e):
    return _ids_case(e, tokens=e.npy(good_ids().reshape(-1), "flat.npy"), needles=("flat.npy", "1 dims"))


@case("tokens/three_dim")
def _(e):
    return _ids_case(e, tokens=e.npy(good_ids().reshape(BATCH, SEQ, 1), "cube.npy"),
                     needles=("cube.npy", "3 dims"))


@case("tokens/zero_dim_scalar")
def _(e):
    return _ids_case(e, tokens=e.npy(np.array(3, np.int64), "scalar.npy"), needles=("scalar.npy",))


@case("tokens/empty_batch")
def _(e):
    z = np.zeros((0, SEQ), np.int64)
    return _ids_case(e, tokens=e.npy(z), targets=e.npy(z), needles=("batch=0",))


@case("tokens/mismatched_shapes")
def _(e):
    return _ids_case(e, targets=e.npy(good_ids()[:, :SEQ - 1], "short_targets.npy"),
                     needles=("short_targets.npy", f"[{BATCH}, {SEQ - 1}]"))


@case("tokens/mismatched_batch")
def _(e):
    return _ids_case(e, tokens=e.npy(np.concatenate([good_ids(), good_ids()]), "tall.npy"),
                     needles=("tall.npy", f"[{2 * BATCH}, {SEQ}]"))


@case("tokens/truncated")
def _(e):
    p = e.npy(good_ids(), "cut.npy")
    data = p.read_bytes()
    p.write_bytes(data[:-5])
    return _ids_case(e, tokens=p, needles=("cut.npy", "truncated"))


@case("targets/truncated_header")
def _(e):
    p = e.npy(good_ids(), "cuthdr.npy")
    p.write_bytes(p.read_bytes()[:30])
    return _ids_case(e, targets=p, needles=("cuthdr.npy",))


@case("tokens/not_npy")
def _(e):
    p = e.path("text.npy")
    p.write_text("1 2 3 4\n5 6 7 8\n")
    return _ids_case(e, tokens=p, needles=("text.npy",))


@case("tokens/empty_file")
def _(e):
    p = e.path("zero.npy")
    p.write_bytes(b"")
    return _ids_case(e, tokens=p, needles=("zero.npy",))


@case("tokens/nonexistent")
def _(e):
    return _ids_case(e, tokens=e.root / "missing_tokens.npy", needles=("missing_tokens.npy",))


@case("targets/nonexistent")
def _(e):
    return _ids_case(e, targets=e.root / "missing_targets.npy", needles=("missing_targets.npy",))


# --- config (through `init`, which reads nothing else) ---

def _init_case(e: Env, cfg: Path, *needles: str, limit_memory: bool = False) -> Case:
    out = e.out("init.safetensors")
    return Case(["init", "--config", cfg, "--seed", "1", "--out", out], needles, out,
                limit_memory=limit_memory)


def _model_case(*needles: str, limit_memory: bool = False, **changes):
    def build(e):
        return _init_case(e, e.cfg(model_toml(**changes)), *needles, limit_memory=limit_memory)
    return build


@case("config/malformed_toml")
def _(e):
    return _init_case(e, e.cfg(model_toml() + "\n[optim\nlr = 1\n", "broken.toml"),
                      "broken.toml", "malformed TOML")


@case("config/malformed_value")
def _(e):
    return _init_case(e, e.cfg(model_toml().replace("hidden_size = 16", "hidden_size = 16 16"),
                               "badval.toml"), "badval.toml", "malformed TOML")


@case("config/duplicate_key")
def _(e):
    return _init_case(e, e.cfg(model_toml().replace("[model]", "[model]\nvocab_size = 64"), "dup.toml"),
                      "dup.toml", "vocab_size")


@case("config/not_utf8")
def _(e):
    p = e.path("latin1.toml")
    p.write_bytes(model_toml().encode() + b'\n[data]\ntokenizer = "caf\xe9"\n')
    return _init_case(e, p, "latin1.toml")


CASES["config/unknown_model_key"] = _model_case("model.num_expert", num_expert=4)
CASES["config/unknown_model_key_hf_alias"] = _model_case("model.n_routed_experts", n_routed_experts=4)


@case("config/unknown_table")
def _(e):
    return _init_case(e, e.cfg(model_toml() + "\n[modle]\nhidden_size = 16\n"), "modle")


@case("config/unknown_optim_key")
def _(e):
    return _init_case(e, e.cfg(model_toml() + "\n[optim]\nlearning_rate = 0.1\n"), "optim.learning_rate")


@case("config/top_level_scalar")
def _(e):
    return _init_case(e, e.cfg("seed = 3\n" + model_toml()), "seed")


@case("config/nested_table_in_model")
def _(e):
    return _init_case(e, e.cfg(model_toml() + "\n[model.rope_scaling]\nfactor = 2.0\n"),
                      "model.rope_scaling")


CASES["config/string_for_int"] = _model_case("model.hidden_size", hidden_size="16")
CASES["config/float_for_int"] = _model_case("model.num_experts", num_experts=4.0)
CASES["config/bool_for_int"] = _model_case("model.num_hidden_layers", num_hidden_layers=True)
CASES["config/int_for_bool"] = _model_case("model.tie_word_embeddings", tie_word_embeddings=1)
CASES["config/string_for_float"] = _model_case("model.rope_theta", rope_theta="10000")
CASES["config/int_for_string"] = _model_case("model.qk_norm", qk_norm=1)
CASES["config/heads_do_not_divide_hidden"] = _model_case("num_attention_heads=3", num_attention_heads=3,
                                                         num_key_value_heads=1)
CASES["config/kv_heads_do_not_divide_heads"] = _model_case("num_key_value_heads=3", num_attention_heads=4,
                                                           num_key_value_heads=3)
CASES["config/kv_heads_exceed_heads"] = _model_case("num_key_value_heads=4", num_key_value_heads=4)
CASES["config/top_k_exceeds_experts"] = _model_case("num_experts_per_tok=5", num_experts_per_tok=5)
CASES["config/odd_head_dim_implicit"] = _model_case("head_dim=3", hidden_size=24, num_attention_heads=8,
                                                    num_key_value_heads=8)
CASES["config/odd_head_dim_explicit"] = _model_case("head_dim=5", head_dim=5)
CASES["config/qk_norm_bogus"] = _model_case("qk_norm", "bogus", qk_norm="bogus")
CASES["config/router_score_bogus"] = _model_case("router_score", "relu", router_score="relu")
CASES["config/lb_loss_style_bogus"] = _model_case("lb_loss_style", "olmo_core", lb_loss_style="olmo_core")
CASES["config/block_norm_bogus"] = _model_case("block_norm", "post", block_norm="post")
CASES["config/loss_normalizer_bogus"] = _model_case("loss_normalizer", "batch", loss_normalizer="batch")
CASES["config/n_group_does_not_divide_experts"] = _model_case("n_group=3", n_group=3)
CASES["config/topk_group_exceeds_n_group"] = _model_case("topk_group=3", n_group=2, topk_group=3)
CASES["config/top_k_exceeds_kept_groups"] = _model_case("num_experts_per_tok=2", "topk_group=1", n_group=4)
CASES["config/zero_routed_scaling_factor"] = _model_case("routed_scaling_factor=0", routed_scaling_factor=0.0)
CASES["config/negative_router_bias_update_rate"] = _model_case("router_bias_update_rate",
                                                               router_bias_update_rate=-0.001)
CASES["config/virtual_stages_exceed_layers"] = lambda e: _init_case(
    e, e.cfg(model_toml() + "\n[parallel]\nvirtual_stages = 4611686018427387904\n"),
    "parallel.virtual_stages=4611686018427387904")
# optim.group_overrides (OLMo-core's OptimGroupOverride): its values are checked with the config,
# its patterns by the trainer against every tensor of the model, by moecore's name and
# OLMo-core's, before anything is written.
def _group_case(text: str, *needles: str):
    return lambda e: _init_case(e, e.cfg(model_toml() + "\n" + text), *needles)


def _group_train_case(text: str, *needles: str):
    return lambda e: _train_case(
        e, cfg=e.cfg(_train_toml(e, e.root / "train_never_written") + "\n" + text),
        needles=needles)


CASES["train/group_override_matches_nothing"] = _group_train_case(
    '[[optim.group_overrides]]\nparams = ["blocks.*.atention.*"]\n',
    "optim.group_overrides[0].params", '"blocks.*.atention.*" matches no trained parameter')
CASES["train/group_overrides_share_a_tensor"] = _group_train_case(
    '[[optim.group_overrides]]\nparams = ["blocks.0.*"]\nlr = 1e-4\n'
    '[[optim.group_overrides]]\nparams = ["model.layers.0.self_attn.q_proj.weight"]\n',
    "optim.group_overrides[0] and optim.group_overrides[1] both name "
    "model.layers.0.self_attn.q_proj.weight (OLMo-core's blocks.0.attention.w_q.weight)")
CASES["config/group_override_without_params"] = _group_case(
    "[[optim.group_overrides]]\nlr = 1e-4\n", "optim.group_overrides[0] names no parameters")
CASES["config/group_override_beta_of_one"] = _group_case(
    '[[optim.group_overrides]]\nparams = ["embeddings.weight"]\nbeta2 = 1.0\n',
    "optim.group_overrides[0].beta2=1 must be in [0, 1)")
CASES["config/group_override_negative_lr"] = _group_case(
    '[[optim.group_overrides]]\nparams = ["embeddings.weight"]\nlr = -1e-3\n',
    "optim.group_overrides[0].lr=-0.001 must be positive")
CASES["config/group_override_unknown_key"] = _group_case(
    '[[optim.group_overrides]]\nparams = ["embeddings.weight"]\nbetas = [0.9, 0.95]\n',
    "betas")
CASES["config/group_overrides_not_tables"] = _group_case(
    "[optim]\ngroup_overrides = 3\n", "optim.group_overrides must be an array of tables")
CASES["config/group_override_empty_pattern"] = _group_case(
    '[[optim.group_overrides]]\nparams = [""]\n', "optim.group_overrides[0].params holds an empty pattern")
CASES["config/hf_lb_with_router_bias"] = _model_case("lb_loss_style", "router_bias_update_rate",
                                                     lb_loss_style="hf", router_bias_update_rate=0.01)
CASES["config/hf_lb_with_group_limit"] = _model_case("lb_loss_style", "n_group", lb_loss_style="hf",
                                                     n_group=2, topk_group=2)
CASES["config/hf_lb_with_random_routing"] = _model_case("lb_loss_style", "model.routing",
                                                        lb_loss_style="hf", routing="random")
CASES["config/labels_normaliser_with_hf_lb"] = _model_case("loss_normalizer", "lb_loss_style",
                                                           loss_normalizer="labels", lb_loss_style="hf")
CASES["config/negative_hidden_size"] = _model_case("hidden_size=-16", hidden_size=-16)
CASES["config/zero_vocab"] = _model_case("vocab_size=0", vocab_size=0)
CASES["config/negative_vocab"] = _model_case("vocab_size=-32", vocab_size=-32)
CASES["config/negative_layers"] = _model_case("num_hidden_layers=-1", num_hidden_layers=-1)
CASES["config/negative_heads"] = _model_case("num_attention_heads=-2", num_attention_heads=-2)
CASES["config/negative_experts"] = _model_case("num_experts=-4", num_experts=-4)
CASES["config/zero_top_k"] = _model_case("num_experts_per_tok=0", num_experts_per_tok=0)
CASES["config/negative_moe_intermediate"] = _model_case("moe_intermediate_size=-8", moe_intermediate_size=-8)
CASES["config/negative_dense_intermediate"] = _model_case("intermediate_size=-1", intermediate_size=-1)
CASES["config/negative_head_dim"] = _model_case("head_dim=-2", head_dim=-2)
CASES["config/negative_shared_expert"] = _model_case("shared_expert_intermediate_size=-1",
                                                     shared_expert_intermediate_size=-1)
CASES["config/dense_layers_exceed_layers"] = _model_case("first_k_dense_replace=3", first_k_dense_replace=3)
CASES["config/zero_rms_norm_eps"] = _model_case("rms_norm_eps", rms_norm_eps=0.0)
CASES["config/negative_rope_theta"] = _model_case("rope_theta", rope_theta=-1.0)
CASES["config/negative_aux_coef"] = _model_case("router_aux_loss_coef", router_aux_loss_coef=-0.1)
# Absurd sizes must be rejected with a message that names the key, not "std::bad_alloc" or an
# overflowed shape found later (run under an 8 GiB address-space limit for safety).
CASES["config/absurd_vocab_size"] = _model_case(("vocab_size", "embed_tokens", "lm_head"),
                                                vocab_size=10**12, limit_memory=True)
CASES["config/overflowing_head_dim"] = _model_case(("head_dim", "overflow"), head_dim=1 << 62,
                                                   limit_memory=True)


@case("config/bad_optim_value")
def _(e):
    return _init_case(e, e.cfg(model_toml() + "\n[optim]\nlr = -0.1\n"), "optim.lr")


@case("config/bad_schedule")
def _(e):
    return _init_case(e, e.cfg(model_toml() + '\n[optim]\nschedule = "cosnie"\n'), "cosnie")


@case("config/nonexistent")
def _(e):
    return _init_case(e, e.root / "no_such_config.toml", "no_such_config.toml")


@case("config/is_a_directory")
def _(e):
    d = e.path("confdir.toml")
    d.mkdir()
    return _init_case(e, d, "confdir.toml")


@case("config/bad_config_in_debug_state")
def _(e):
    out = e.out()
    cfg = e.cfg(model_toml(num_experts_per_tok=9))
    return Case(e.state_args(config=cfg, out=out), ("num_experts_per_tok=9",), out)


# --- train: config file and --set overrides ---
# Every train case has valid data (the job_data fixture), so the named problem is the only one.


def _train_toml(e: Env, out_dir: Path, train_extra: str = "", **data_changes: object) -> str:
    assert e.job is not None, "train cases need the job_data fixture"
    return (model_toml(vocab_size=e.job.vocab_size) + f'\n[train]\nout_dir = "{out_dir}"\n'
            f'max_steps = 1\nbatch_size = 1\nseq_len = 16\nthreads = 1\nsample_tokens = 0\n'
            f'{train_extra}' + e.job.data_toml(**data_changes))


def _train_case(e: Env, *extra: str, needles=(), cfg: Path | None = None) -> Case:
    cfg = cfg or e.cfg(_train_toml(e, e.root / "train_never_written"))
    return Case(["train", cfg, *extra], tuple(needles))


CASES["train/set_without_equals"] = lambda e: _train_case(e, "--set", "train.max_steps",
                                                          needles=("train.max_steps",))
CASES["train/set_without_section"] = lambda e: _train_case(e, "--set", "max_steps=3",
                                                           needles=("max_steps=3",))
CASES["train/set_unknown_key"] = lambda e: _train_case(e, "--set", "train.max_stepz=3",
                                                       needles=("train.max_stepz",))
CASES["train/set_unknown_section"] = lambda e: _train_case(e, "--set", "trian.max_steps=3",
                                                           needles=("trian",))
CASES["train/set_wrong_type"] = lambda e: _train_case(e, "--set", "train.max_steps=many",
                                                      needles=("train.max_steps",))
CASES["train/set_invalid_model"] = lambda e: _train_case(e, "--set", "model.num_experts_per_tok=7",
                                                         needles=("num_experts_per_tok=7",))
CASES["train/set_empty_value"] = lambda e: _train_case(e, "--set", "train.batch_size=",
                                                       needles=("train.batch_size",))
CASES["train/nonexistent_config"] = lambda e: _train_case(e, cfg=e.root / "no_train.toml",
                                                          needles=("no_train.toml",))
CASES["train/malformed_config"] = lambda e: _train_case(e, cfg=e.cfg("[train\n", "tbroken.toml"),
                                                        needles=("tbroken.toml",))
CASES["train/zero_batch_size"] = lambda e: _train_case(e, "--set", "train.batch_size=0",
                                                       needles=("train.batch_size=0",))
CASES["train/bad_precision"] = lambda e: _train_case(e, "--set", "train.precision=fp16",
                                                   needles=("train.precision=\"fp16\"",))
CASES["train/missing_config_argument"] = lambda e: Case(["train"], ("config",))
CASES["train/pp_exceeds_ranks"] = lambda e: _train_case(e, "--set", "parallel.pp=2",
                                                       needles=("parallel.pp=2",))
CASES["train/unknown_schedule"] = lambda e: _train_case(e, "--set", "parallel.schedule=zigzag",
                                                        needles=("parallel.schedule",))
CASES["train/virtual_stages_without_pp"] = lambda e: _train_case(
    e, "--set", "parallel.virtual_stages=2", needles=("virtual_stages=2",))
CASES["train/stage_layers_wrong_sum"] = lambda e: _train_case(e, "--set", "parallel.stage_layers=[5]",
                                                              needles=("stage_layers",))
CASES["train/stage_layers_not_a_list"] = lambda e: _train_case(e, "--set", "parallel.stage_layers=3",
                                                               needles=("stage_layers",))
CASES["train/padded_transport_without_rowwise"] = lambda e: _train_case(
    e, "--set", "parallel.rowwise_transport=padded",
    needles=('parallel.rowwise_transport="padded" needs parallel.dispatch="rowwise"',))
CASES["train/window_transport_on_a_device"] = lambda e: _train_case(
    e, "--set", "parallel.dispatch=rowwise", "--set", "parallel.rowwise_transport=window", "--set",
    "train.device=cuda", needles=('parallel.rowwise_transport="window" needs train.device="cpu"',))
CASES["train/symmetric_transport_on_the_cpu"] = lambda e: _train_case(
    e, "--set", "parallel.dispatch=rowwise", "--set", "parallel.rowwise_transport=symmetric",
    needles=('parallel.rowwise_transport="symmetric" needs train.device="cuda"',))
CASES["train/unknown_rowwise_transport"] = lambda e: _train_case(
    e, "--set", "parallel.rowwise_transport=nvshmem", needles=("parallel.rowwise_transport",))
# train.cuda_graph: a graph captures a device's work, and replays only what reaches its kernels
# through device memory.
CASES["train/cuda_graph_on_the_cpu"] = lambda e: _train_case(
    e, "--set", "train.cuda_graph=true",
    needles=('train.cuda_graph=true needs train.device="cuda"',))
CASES["train/cuda_graph_with_random_routing"] = lambda e: _train_case(
    e, "--set", "train.cuda_graph=true", "--set", "train.device=cuda", "--set",
    "model.routing=random", needles=('train.cuda_graph=true cannot replay model.routing="random"',))
CASES["train/cuda_graph_with_mxfp8_expert_wgrad"] = lambda e: _train_case(
    e, "--set", "train.cuda_graph=true", "--set", "train.device=cuda", "--set",
    "train.precision=mxfp8", "--set", "train.mxfp8_expert_wgrad=true",
    needles=("train.cuda_graph=true cannot capture train.mxfp8_expert_wgrad=true",))
CASES["train/cuda_graph_with_pipeline_stages"] = lambda e: _train_case(
    e, "--set", "train.cuda_graph=true", "--set", "train.device=cuda", "--set", "parallel.pp=2",
    needles=("train.cuda_graph=true cannot capture parallel.pp=2",))
CASES["train/cuda_graph_with_the_sync_dispatch"] = lambda e: _train_case(
    e, "--set", "train.cuda_graph=true", "--set", "train.device=cuda", "--set", "parallel.ep=2",
    needles=('train.cuda_graph=true with parallel.ep=2 needs parallel.dispatch="rowwise" and '
             'parallel.rowwise_transport="padded"',))
# train.cuda_grouped_gemm chooses the CUDA backend's expert kernels, which multiply bf16.
CASES["train/one_launch_experts_on_the_cpu"] = lambda e: _train_case(
    e, "--set", "train.cuda_grouped_gemm=one_launch", "--set", "train.precision=bf16",
    needles=('train.cuda_grouped_gemm="one_launch" needs train.device="cuda"',))
CASES["train/one_launch_experts_in_fp32"] = lambda e: _train_case(
    e, "--set", "train.cuda_grouped_gemm=one_launch", "--set", "train.device=cuda",
    needles=('train.cuda_grouped_gemm="one_launch" needs train.precision "bf16" or "mxfp8"',))
CASES["train/unknown_cuda_grouped_gemm"] = lambda e: _train_case(
    e, "--set", "train.cuda_grouped_gemm=cutlass", needles=("train.cuda_grouped_gemm",))


@case("train/missing_train_tokens")
def _(e):
    cfg = e.cfg(_train_toml(e, e.path("run"), train=["/nonexistent/tokens.npy"]))
    return Case(["train", cfg], ("/nonexistent/tokens.npy",))


@case("train/missing_val_tokens")
def _(e):
    cfg = e.cfg(_train_toml(e, e.path("run"), val=["/nonexistent/val_dir"]))
    return Case(["train", cfg], ("/nonexistent/val_dir",))


@case("train/missing_tokenizer")
def _(e):
    cfg = e.cfg(_train_toml(e, e.path("run"), tokenizer="/nonexistent/tokenizer.json"))
    return Case(["train", cfg], ("/nonexistent/tokenizer.json",))


@case("train/eval_batches_zero")
def _(e):
    cfg = e.cfg(_train_toml(e, e.path("run"), train_extra="eval_every = 1\neval_batches = 0\nlog_every = 1\n"))
    return Case(["train", cfg], ("eval_batches",))


# --- issue 13: every float finite and in range, threads bounded ---

for _key, _value in [("optim.lr", "inf"), ("optim.max_grad_norm", "nan"), ("train.skip_sigma", "nan"),
                     ("model.rms_norm_eps", "inf"), ("model.router_aux_loss_coef", "inf"),
                     ("model.rope_theta", "inf"), ("parallel.capacity_factor", "inf"),
                     ("optim.eps", "-inf")]:
    CASES[f"train/{_key}_{_value}"] = (lambda k, v: lambda e: _train_case(
        e, "--set", f"{k}={v}", needles=(f"{k}={v}", "finite")))(_key, _value)
CASES["train/threads_65536"] = lambda e: _train_case(e, "--set", "train.threads=65536",
                                                     needles=("train.threads=65536",))
CASES["train/threads_typo_100000"] = lambda e: _train_case(e, "--set", "train.threads=100000",
                                                           needles=("train.threads=100000",))
_CORES = len(os.sched_getaffinity(0))
if 4 * _CORES + 1 <= 1024:  # within the config's cap, beyond the machine's 4 per core
    CASES["train/threads_above_4_per_core"] = lambda e: _train_case(
        e, "--set", f"train.threads={4 * _CORES + 1}",
        needles=(f"train.threads={4 * _CORES + 1} is more than 4 x the {_CORES} cores",))
CASES["train/negative_seed"] = lambda e: _train_case(e, "--set", "train.seed=-1",
                                                     needles=("train.seed=-1",))


# --- issue 13: control characters from every reader come back escaped, on one line ---

@case("escape/config_key")
def _(e):
    cfg = e.cfg(model_toml().replace("[model]", '[model]\n"hid\\nden\\u0007" = 3'), "ctrl.toml")
    return _init_case(e, cfg, "unknown key model.hid\\nden\\x07")


@case("escape/config_value")
def _(e):
    return _init_case(e, e.cfg(model_toml(qk_norm="fu\\r\\nll")), 'qk_norm="fu\\r\\nll"')


@case("escape/safetensors_tensor_name")
def _(e):
    t = drop(e.tensors, GATE)
    t["model.layers.1.mlp.gate.weigth\r\n\x1b[2K"] = e.tensors[GATE]
    return _weights_case(e, e.weights_with(t), "weigth\\r\\n\\x1B[2K")


@case("escape/safetensors_dtype")
def _(e):
    w = write_raw_safetensors(e.path("dtype.safetensors"),
                              {"x": {"dtype": "F3\n2", "shape": [1], "data_offsets": [0, 4]}},
                              b"\0" * 4)
    return _weights_case(e, w, "'F3\\n2'")


@case("escape/npy_header_key")
def _(e):
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 8), 'ke\ny\x1b': 1, }"
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    p = e.path("ctrl.npy")
    p.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()
                  + good_ids().tobytes())
    return _ids_case(e, tokens=p, needles=("'ke\\ny\\x1B'",))


@case("escape/tokenizer_vocab_entry")
def _(e):
    tok = json.loads(e.job.tokenizer.read_text()) if e.job else None
    assert tok is not None
    tok["model"]["vocab"]["bad\n\x01"] = "x"
    p = e.path("tokenizer.json")
    p.write_text(json.dumps(tok))
    out = e.path("ids.npy")
    return Case(["tokenizer", "encode", "--tokenizer", p, "--input", e.job.corpus, "--out", out],
                ("vocab entry 'bad\\n\\x01'",), out)


# --- issue 13: tokenizer.json ids dense, unique, byte vocabulary complete ---

def _tokenizer_case(edit, *needles, limit_memory=False):
    def build(e):
        tok = json.loads(e.job.tokenizer.read_text())
        edit(tok)
        p = e.path("tokenizer.json")
        p.write_text(json.dumps(tok))
        out = e.path("ids.npy")
        return Case(["tokenizer", "encode", "--tokenizer", p, "--input", e.job.corpus,
                     "--out", out], needles, out, limit_memory=limit_memory)
    return build


def _set_vocab(token, id_):
    return lambda t: t["model"]["vocab"].__setitem__(token, id_)


# Memory-limited: before the check, this id made `tokenizer encode` allocate 6.3 GB.
CASES["tokenizer/huge_id"] = _tokenizer_case(_set_vocab("zzz", 100_000_063), "id 100000063",
                                             "dense", limit_memory=True)
CASES["tokenizer/duplicate_id"] = _tokenizer_case(_set_vocab("zzz", 5), "id 5 names both")
CASES["tokenizer/empty_vocab"] = _tokenizer_case(
    lambda t: (t["model"].__setitem__("vocab", {}), t["model"].__setitem__("merges", []),
               t.__setitem__("added_tokens", [])), "no symbol")


def _drop_byte_symbol(t):
    # "Ċ" stands for "\n"; its id goes to a new token so that the ids stay dense.
    t["model"]["vocab"]["zzz"] = t["model"]["vocab"].pop("Ċ")
    t["model"]["merges"] = [m for m in t["model"]["merges"]
                            if "Ċ" not in (m if isinstance(m, str) else " ".join(m))]


CASES["tokenizer/missing_byte_symbol"] = _tokenizer_case(_drop_byte_symbol, "byte 0x0A")


# --- data: token file element type and document masking (issue 12) ---

def _orphan_part(e: Env) -> Path:
    """A headerless part copied away from the meta.json that says its element type."""
    assert e.job is not None
    part = sorted(e.job.train.glob("*.npy"))[0]
    p = e.path("orphan.npy")
    p.write_bytes(part.read_bytes())
    return p


@case("train/headerless_without_dtype")
def _(e):
    p = _orphan_part(e)
    cfg = e.cfg(_train_toml(e, e.path("run"), train=[str(p)], val=None))
    return Case(["train", cfg], (p.name, "data.dtype"))


@case("train/checkpoints_is_a_file")
def _(e):
    # Said before the first step, not at the first save after the steps were spent.
    run = e.path("run")
    run.mkdir()
    (run / "checkpoints").write_text("not a directory")
    cfg = e.cfg(_train_toml(e, run, train_extra="save_every = 1\n"))
    return Case(["train", cfg], (f"{run}/checkpoints", "not a directory"),
                out=run / "checkpoints", existing_out=b"not a directory")


CASES["train/set_value_half_toml"] = lambda e: _train_case(
    e, "--set", 'train.sample_prompt="a" "b"', needles=("is not a TOML value", "train.sample_prompt"))
CASES["train/set_array_unterminated"] = lambda e: _train_case(
    e, "--set", "data.train=[/p", needles=("data.train: [/p is not a TOML value",))
CASES["train/set_value_not_utf8"] = lambda e: _train_case(
    e, "--set", "train.out_dir=tok\udcffdir", needles=("is not a TOML value",))
CASES["train/batch_size_beyond_any_machine"] = lambda e: _train_case(
    e, "--set", "train.batch_size=1152921504606846976",
    needles=("train.batch_size=1152921504606846976 must be in [1, 4294967296]",))
CASES["train/tokens_per_step_beyond_any_machine"] = lambda e: _train_case(
    e, "--set", "train.batch_size=65536", "--set", "train.seq_len=131072",
    needles=("train.batch_size=65536 x train.seq_len=131072",))


# An output that names one of the command's inputs would destroy it; two outputs at one path keep
# one. Each input stays byte for byte (existing_out: the file's own bytes, written back first).
def _self_overwrite(args_of, name: str, content: bytes | None = None):
    def build(e: Env) -> Case:
        p = e.path(name)
        p.write_bytes(content if content is not None else p.name.encode() * 8)
        return Case(args_of(e, p), ("would destroy that input",), out=p,
                    existing_out=p.read_bytes())
    return build


CASES["cli/init_out_is_its_config"] = lambda e: _self_overwrite(
    lambda e, p: ["init", "--config", p, "--seed", "1", "--out", p], "c.toml",
    e.config.read_bytes())(e)
CASES["cli/debug_state_out_is_its_weights"] = lambda e: _self_overwrite(
    lambda e, p: e.state_args(weights=p, out=p), "w.safetensors", e.weights.read_bytes())(e)
CASES["cli/tokenizer_train_out_is_its_input"] = _self_overwrite(
    lambda e, p: ["tokenizer", "train", "--input", p, "--vocab-size", "300", "--out", p],
    "corpus.txt")
CASES["cli/plan_html_is_its_config"] = lambda e: _self_overwrite(
    lambda e, p: ["plan", p, "--html", p], "c.toml", e.config.read_bytes())(e)
CASES["cli/mx_encode_out_is_its_input"] = _self_overwrite(
    lambda e, p: ["mx", "encode", "--input", p, "--out", p], "x.npy")


@case("cli/plan_hardware_profile_key_misspelt")
def _(e):
    # Planned with a default in its place, silently: the peak dropped from 24.4 to 0.4 MiB.
    profile = e.path("profile.json")
    profile.write_text(json.dumps({"memory_gib": 16, "runtime_overhead_mb": 300}))
    return Case(["plan", e.config, "--hardware", profile],
                ("unknown key \"runtime_overhead_mb\"", "runtime_overhead_mib"))


@case("cli/mx_quantize_codes_and_scales_at_one_path")
def _(e):
    x = e.npy(np.zeros((1, 32), dtype=np.float32), "x.npy")
    both = x.with_name("both.npy")
    return Case(["mx", "quantize", "--input", x, "--codes", both, "--scales", both],
                ("--codes and --scales both name",), out=both)


CASES["train/data_dtype_unknown"] = lambda e: _train_case(e, "--set", "data.dtype=float16",
                                                          needles=("data.dtype", "float16"))
CASES["train/data_dtype_contradicts_meta"] = lambda e: _train_case(
    e, "--set", "data.dtype=uint32", needles=("data.dtype=uint32", "meta.json"))
CASES["train/data_eos_id_outside_vocab"] = lambda e: _train_case(
    e, "--set", "data.eos_id=100000", needles=("data.eos_id=100000",))
CASES["train/data_bos_id_outside_vocab"] = lambda e: _train_case(
    e, "--set", "data.bos_id=100000", "--set", "data.document_masking=true",
    needles=("data.bos_id=100000",))
CASES["train/data_bos_id_without_document_masking"] = lambda e: _train_case(
    e, "--set", "data.bos_id=1", needles=("data.bos_id=1", "data.document_masking"))
CASES["train/document_masking_not_bool"] = lambda e: _train_case(
    e, "--set", "data.document_masking=1", needles=("data.document_masking",))
CASES["train/val_label_mask_without_val"] = lambda e: _train_case(
    e, "--set", "data.val=[]", "--set", "data.val_label_mask=[\"m.bin\"]",
    needles=("data.val_label_mask", "data.val"))
CASES["train/label_masks_not_one_per_token_file"] = lambda e: _train_case(
    e, "--set", "data.label_mask=[\"a.bin\", \"b.bin\", \"c.bin\", \"d.bin\", \"e.bin\"]",
    needles=("5 label mask file(s)", "one per token file"))
CASES["train/repetition_keys_without_instance_filter"] = lambda e: _train_case(
    e, "--set", "data.repetition_max_count=4",
    needles=("data.repetition_max_period", "data.instance_filter = false"))
CASES["train/repetition_min_period_zero"] = lambda e: _train_case(
    e, "--set", "data.instance_filter=true", "--set", "data.repetition_min_period=0",
    needles=("data.repetition_min_period=0",))
CASES["train/repetition_max_below_min"] = lambda e: _train_case(
    e, "--set", "data.instance_filter=true", "--set", "data.repetition_min_period=5", "--set",
    "data.repetition_max_period=4", needles=("data.repetition_max_period=4",
                                             "data.repetition_min_period=5"))
CASES["train/repetition_max_count_zero"] = lambda e: _train_case(
    e, "--set", "data.instance_filter=true", "--set", "data.repetition_max_count=0",
    needles=("data.repetition_max_count=0",))


@case("train/document_masking_without_eos")
def _(e):
    p = _orphan_part(e)
    cfg = e.cfg(_train_toml(e, e.path("run"), train=[str(p)], val=None, dtype="uint16",
                            document_masking=True))
    return Case(["train", cfg], ("data.document_masking", "data.eos_id"))


@case("data/instances_headerless_without_dtype")
def _(e):
    p = _orphan_part(e)
    return Case(["data", "instances", "--data", p, "--seq-len", "8", "--vocab-size", "320"],
                (p.name, "--dtype"))


@case("data/instances_eos_outside_the_vocabulary")
def _(e):
    p = _orphan_part(e)
    return Case(["data", "instances", "--data", p, "--seq-len", "8", "--vocab-size", "320",
                 "--dtype", "uint16", "--eos-id", "5000"], ("--eos-id=5000", "--vocab-size=320"))


@case("data/meta_json_is_a_directory")
def _(e):
    # The metadata lost to a directory of its name: said so, not "unknown element type".
    p = _orphan_part(e)
    (p.parent / "meta.json").mkdir()
    return Case(["data", "instances", "--data", p, "--seq-len", "8", "--vocab-size", "320"],
                ("meta.json: not a regular file", p.name))


# --- CLI ---

def _cli(*args, needles=()):
    return lambda e: Case(list(args), tuple(needles))


CASES["cli/generate_top_p_zero"] = _cli("generate", "--checkpoint", "ckpt", "--prompt", "a",
                                        "--top-p", "0", needles=("--top-p=0 is not a number in (0, 1]",))
CASES["cli/allow_config_change_without_resume"] = _cli(
    "train", "c.toml", "--allow-config-change", needles=("--allow-config-change", "--resume"))


CASES["cli/unknown_subcommand"] = _cli("frobnicate", needles=("frobnicate",))
CASES["cli/no_subcommand"] = _cli(needles=("subcommand",))
CASES["cli/unknown_option"] = lambda e: Case(
    ["init", "--config", e.config, "--seed", "1", "--out", e.out(), "--bogus"], ("--bogus",))


@case("cli/missing_required_out")
def _(e):
    return Case(["init", "--config", e.config, "--seed", "1"], ("--out",))


@case("cli/missing_required_weights")
def _(e):
    out = e.out()
    return Case(["debug-state", "--config", e.config, "--tokens", e.tokens, "--targets", e.targets,
                 "--out", out], ("--weights",), out)


@case("cli/missing_steps")
def _(e):
    out = e.out()
    return Case(e.state_args(out=out, cmd="debug-steps"), ("--steps",), out)


@case("cli/seed_not_a_number")
def _(e):
    out = e.out()
    return Case(["init", "--config", e.config, "--seed", "abc", "--out", out], ("--seed", "abc"), out)


@case("cli/seed_negative")
def _(e):
    out = e.out()
    return Case(["init", "--config", e.config, "--seed", "-1", "--out", out],
                ("--seed=-1 is not an integer in [0, 2^64)",), out)


@case("cli/seed_overflows_uint64")
def _(e):
    out = e.out()
    return Case(["init", "--config", e.config, "--seed", str(1 << 64), "--out", out], ("--seed",), out)


@case("cli/steps_zero")
def _(e):
    out = e.out()
    return Case(e.state_args(out=out, cmd="debug-steps") + ["--steps", "0"], ("--steps=0",), out)


@case("cli/steps_negative")
def _(e):
    out = e.out()
    return Case(e.state_args(out=out, cmd="debug-steps") + ["--steps", "-3"], ("--steps",), out)


@case("cli/steps_not_a_number")
def _(e):
    out = e.out()
    return Case(e.state_args(out=out, cmd="debug-steps") + ["--steps", "two"], ("--steps",), out)


# issue 13: integers beyond int64 are errors, not saturated; negative counts are not "all".
@case("cli/steps_beyond_int64")
def _(e):
    out = e.out()
    return Case(e.state_args(out=out, cmd="debug-steps") + ["--steps", "99999999999999999999"],
                ("--steps=99999999999999999999",), out)


@case("cli/steps_above_maximum")
def _(e):
    out = e.out()
    return Case(e.state_args(out=out, cmd="debug-steps") + ["--steps", "9000000000000000000"],
                ("--steps=9000000000000000000",), out)


CASES["cli/eval_negative_max_instances"] = lambda e: Case(
    ["eval", "--checkpoint", e.root, "--data", e.tokens, "--max-instances", "-5"],
    ("--max-instances=-5",))
CASES["cli/generate_top_p_nan"] = lambda e: Case(
    ["generate", "--checkpoint", e.root, "--prompt", "x", "--top-p", "nan"], ("--top-p=nan",))
CASES["cli/generate_negative_seed"] = lambda e: Case(
    ["generate", "--checkpoint", e.root, "--prompt", "x", "--seed", "-1"],
    ("--seed=-1 is not an integer in [0, 2^64)",))
# An empty value names nothing: taken as "not given" it fell back to a default (the checkpoint's
# tokenizer, the CPU's hardware profile) the user did not ask for.
CASES["cli/generate_empty_tokenizer"] = lambda e: Case(
    ["generate", "--checkpoint", e.root, "--prompt", "x", "--tokenizer", ""],
    ("--tokenizer: an empty value names nothing",))
# A prompt that is not UTF-8 (os.fsencode turns the lone surrogate into the byte 0xFF): named
# before the model is read, not as an error of the tokenizer's.
CASES["cli/generate_prompt_not_utf8"] = lambda e: Case(
    ["generate", "--checkpoint", e.root, "--prompt", "a\udcffb"], ("--prompt is not UTF-8 at byte 1",))
CASES["cli/plan_empty_hardware"] = lambda e: Case(
    ["plan", e.root / "c.toml", "--hardware", ""], ("--hardware: an empty value names nothing",))
# A validation split of every document leaves nothing to train on: the option's range says so.
CASES["cli/prepare_val_fraction_one"] = lambda e: Case(
    ["prepare", "--tokenizer", e.root / "t.json", "--input", e.root / "c.txt", "--out",
     e.root / "val_one", "--val-fraction", "1"],
    ("--val-fraction=1 is not a number in [0, 1)",), e.root / "val_one")
CASES["cli/bench_threads_65536"] = lambda e: Case(["bench", "gemm", "--threads", "65536"],
                                                  ("--threads=65536",))
# 3 x 4 TiB of fp32 operands: refused before the allocation the kernel would kill it for (run
# under the 8 GiB address-space limit, which a missing check meets as bad_alloc, not this line).
CASES["cli/bench_gemm_beyond_memory"] = lambda e: Case(
    ["bench", "gemm", "--m", "1048576", "--n", "1048576", "--k", "1048576"],
    ("gemm m=1048576 n=1048576 k=1048576 (fp32) needs 12288.0 GiB of buffers",
     "GiB of memory this process may use"), limit_memory=True)
# 3 x 1 TiB arrays, as above.
CASES["cli/bench_stream_beyond_memory"] = lambda e: Case(
    ["bench", "stream", "--megabytes", "1048576"],
    ("stream --megabytes 1048576 (three arrays) needs 3072.0 GiB of buffers",
     "GiB of memory this process may use"), limit_memory=True)
# 0 is not a silent "default": an explicit count must be one.
CASES["cli/plan_zero_ranks"] = lambda e: Case(["plan", e.config, "--ranks", "0"],
                                              ("--ranks=0",))
CASES["cli/dump_zero_batch_size"] = lambda e: Case(
    ["dump", e.config, "--out", e.root / "zero_batch_dump", "--batch-size", "0"],
    ("--batch-size=0",), e.root / "zero_batch_dump")
CASES["cli/newline_in_unknown_command"] = lambda e: Case(["fro\nb"], ("fro\\nb",))


# --- output ---

@case("out/nonexistent_directory")
def _(e):
    out = e.root / "no_such_out_dir" / "s.safetensors"
    return Case(e.state_args(out=out), ("no_such_out_dir/s.safetensors",), out)


@case("out/init_into_nonexistent_directory")
def _(e):
    out = e.root / "no_such_init_dir" / "w.safetensors"
    return Case(["init", "--config", e.config, "--seed", "1", "--out", out],
                ("no_such_init_dir/w.safetensors",), out)


@case("out/is_a_directory")
def _(e):
    out = e.path("outdir.safetensors")
    out.mkdir()
    return Case(e.state_args(out=out), ("outdir.safetensors",), out)


# Existing, good --out files must survive a failed run byte for byte: failures at every stage.

def _keep(build: Callable[[Env], Case], source: str = "state") -> Callable[[Env], Case]:
    def wrapped(e):
        c = build(e)
        assert c.out is not None
        c.existing_out = (e.good_state if source == "state" else e.weights).read_bytes()
        return c
    return wrapped


CASES["keep_out/bad_tokens_file"] = _keep(CASES["tokens/float32"])
CASES["keep_out/token_out_of_range"] = _keep(CASES["tokens/id_equals_vocab"])
CASES["keep_out/target_out_of_range"] = _keep(CASES["targets/id_equals_vocab"])
CASES["keep_out/missing_tensor"] = _keep(CASES["weights/missing_tensor"])
CASES["keep_out/bad_config"] = _keep(CASES["config/bad_config_in_debug_state"])
CASES["keep_out/init_bad_config"] = _keep(CASES["config/top_k_exceeds_experts"], source="weights")
CASES["keep_out/steps_zero"] = _keep(CASES["cli/steps_zero"], source="weights")
CASES["keep_out/seed_not_a_number"] = _keep(CASES["cli/seed_not_a_number"], source="weights")


@case("keep_out/debug_steps_out_is_weights_tokens_bad")
def _(e):
    # --out names the weights file itself (and the tokens are bad): refused before anything is
    # read, for the output would replace its own input; the weights survive.
    w = e.path("w_inplace.safetensors")
    shutil.copyfile(e.weights, w)
    a = good_ids()
    a[0, 0] = VOCAB
    args = e.state_args(weights=w, tokens=e.npy(a), out=w, cmd="debug-steps") + ["--steps", "2"]
    return Case(args, ("--out", "is the input --weights", "would destroy that input"), w,
                existing_out=w.read_bytes())


# ------------------------------------------------------------------------------------------------
# the bad-input test


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(env: Env, name: str, request):
    if name.startswith(("train/", "data/", "tokenizer/", "escape/tokenizer")):
        request.getfixturevalue("job_data")  # valid data, so that only the named problem remains
    c = CASES[name](env)
    if c.out is not None and c.existing_out is not None:
        c.out.write_bytes(c.existing_out)
    before = tmp_files_next_to(c.out) if c.out is not None else []
    out_was_dir = c.out is not None and c.out.is_dir()

    r = run_bin(c.args, cwd=env.root, limit_memory=c.limit_memory)
    cmd = "moecore " + " ".join(map(str, c.args))
    err = r.stderr.strip()
    diag = f"\n  command: {cmd}\n  exit: {r.returncode}\n  stderr: {r.stderr!r}\n  stdout: {r.stdout[-400:]!r}"

    for sign in CRASH_SIGNS:
        assert sign not in r.stderr and sign not in r.stdout, f"crash sign {sign!r}{diag}"
    assert r.returncode > 0, f"expected a non-zero exit code (and no signal){diag}"
    assert err, f"expected an error message on stderr{diag}"
    assert len(err.splitlines()) == 1, f"expected exactly one line on stderr{diag}"
    for needle in c.needles:
        options = needle if isinstance(needle, tuple) else (needle,)
        assert any(o in err for o in options), (
            f"error does not name the problem: none of {options!r} in it{diag}")

    if c.out is not None:
        if out_was_dir:
            assert c.out.is_dir(), f"--out directory was replaced{diag}"
        elif c.existing_out is None:
            assert not c.out.exists(), f"--out {c.out} was created by a failed run{diag}"
        else:
            assert c.out.read_bytes() == c.existing_out, f"existing --out {c.out} was modified{diag}"
        assert tmp_files_next_to(c.out) == before, (
            f"temporary files left next to --out: {tmp_files_next_to(c.out)}{diag}")


def test_every_bad_case_is_distinct():
    # Guards against a copy-paste case list: case names are unique by construction; make sure a
    # reasonable number exists per category.
    cats = {}
    for n in CASES:
        cats.setdefault(n.split("/")[0], 0)
        cats[n.split("/")[0]] += 1
    for cat in ("weights", "tokens", "targets", "config", "train", "cli", "out", "keep_out"):
        assert cats.get(cat, 0) >= 2, cats


# ------------------------------------------------------------------------------------------------
# train: a failed run must not clobber the output directory of an earlier run


def test_train_failure_keeps_existing_run_dir(env: Env, job_data: JobData):
    run_dir = env.path("existing_run")
    run_dir.mkdir()
    (run_dir / "config.toml").write_text("# config of an earlier, good run\n")
    (run_dir / "model.safetensors").write_bytes(env.weights.read_bytes())
    snapshot = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    cfg = env.cfg(_train_toml(env, run_dir, train=["/nonexistent/tokens.npy"]))
    r = run_bin(["train", cfg], cwd=env.root)
    diag = f"\n  command: moecore train {cfg}\n  exit: {r.returncode}\n  stderr: {r.stderr!r}"
    assert r.returncode > 0, diag
    assert len(r.stderr.strip().splitlines()) == 1 and "/nonexistent/tokens.npy" in r.stderr, diag
    after = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    changed = sorted(n for n in snapshot if after.get(n) != snapshot[n])
    assert not changed and set(after) == set(snapshot), (
        f"failed train run modified its out_dir: changed {changed}, "
        f"new {sorted(set(after) - set(snapshot))}{diag}")


# ------------------------------------------------------------------------------------------------
# positive controls: the same commands on valid inputs succeed


def expected_param_names() -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(BASE_MODEL["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names |= {p + f"self_attn.{x}_proj.weight" for x in "qkvo"}
        names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight",
                  p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        if i < BASE_MODEL["first_k_dense_replace"]:
            names |= {p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
        else:
            names.add(p + "mlp.gate.weight")
            names |= {p + f"mlp.experts.{e}.{x}_proj.weight"
                      for e in range(BASE_MODEL["num_experts"]) for x in ("gate", "up", "down")}
    return names


def ok_run(args: list, cwd: Path) -> subprocess.CompletedProcess:
    r = run_bin(args, cwd=cwd)
    assert r.returncode == 0, f"valid input rejected: moecore {' '.join(map(str, args))}\n{r.stderr}"
    assert r.stderr.strip() == "", r.stderr
    return r


def test_control_help(env: Env):
    # Whatever the fix for CLI11's two-line parse errors, --help must still work.
    r = run_bin(["--help"], cwd=env.root)
    assert r.returncode == 0 and "init" in r.stdout and "debug-state" in r.stdout, r


def test_option_errors_share_the_parsers_exit_code(env: Env):
    # A bad option value is a command-line error whichever option it is: the seed, checked when
    # the command line is read like the other numbers, exits as --steps 0 does (it was 1, an
    # error of the command's run, after the parser had accepted "-1").
    codes = {}
    for name in ("cli/seed_negative", "cli/steps_zero", "cli/prepare_val_fraction_one",
                 "cli/generate_negative_seed", "cli/generate_empty_tokenizer"):
        r = run_bin(CASES[name](env).args, cwd=env.root)
        codes[name] = r.returncode
    assert len(set(codes.values())) == 1 and codes["cli/steps_zero"] > 1, codes


def test_out_that_is_not_a_regular_file_is_left_alone(env: Env):
    # The atomic writer renames its temporary over --out: over a symbolic link it would leave the
    # link's target stale, over a device (as root, /dev/null) or a FIFO it would put a plain file
    # in its place. Each is refused in one line and left as it was.
    target = env.out("target.safetensors")
    target.write_bytes(b"old")
    link = target.with_name("link.safetensors")
    link.symlink_to(target)
    fifo = target.with_name("fifo.safetensors")
    os.mkfifo(fifo)
    outs = {link: "symbolic link", fifo: "not a regular file"}
    if os.geteuid() == 0:  # a character device of its own: /dev/full's numbers
        device = target.with_name("device.safetensors")
        os.mknod(device, 0o666 | 0o020000, os.makedev(1, 7))
        outs[device] = "not a regular file"
    for out, needle in outs.items():
        r = run_bin(["init", "--config", env.config, "--seed", "7", "--out", out], cwd=env.root)
        err = r.stderr.strip()
        assert r.returncode == 1 and len(err.splitlines()) == 1, (out, r)
        assert str(out) in err and needle in err, (out, err)
    assert link.is_symlink() and target.read_bytes() == b"old"
    assert fifo.is_fifo()
    if os.geteuid() == 0:
        assert device.is_char_device()
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(
        [target.name] + [out.name for out in outs]), "a temporary was left"


def test_output_that_cannot_reach_stdout_is_an_error(env: Env):
    # `moecore plan C > report.txt` on a full disk: exit 0 with an empty report was the failure.
    if not Path("/dev/full").is_char_device():
        pytest.skip("this machine has no /dev/full")
    with open("/dev/full", "w") as full:
        r = subprocess.run([str(BIN), "plan", str(env.config)], cwd=env.root, stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=TIMEOUT_S)
    err = r.stderr.strip()
    assert r.returncode == 1 and len(err.splitlines()) == 1, r
    assert "cannot write standard output: No space left on device" in err, err


def test_set_trims_spaces_around_key_and_value(env: Env):
    # `--set "train.seq_len = 64"` as a TOML file would write it: the key had a trailing space
    # and was unknown.
    r = run_bin(["plan", env.config, "--set", "train.seq_len = 64", "--json"], cwd=env.root)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["layout"]["seq_len"] == 64


def test_control_init(env: Env):
    t = load_file(str(env.weights))
    assert set(t) == expected_param_names()
    assert t[EMBED].shape == (VOCAB, 16) and t[EMBED].dtype == np.float32
    assert t[GATE].shape == (BASE_MODEL["num_experts"], 16)
    again = env.out("again.safetensors")
    ok_run(["init", "--config", env.config, "--seed", "7", "--out", again], env.root)
    assert again.read_bytes() == env.weights.read_bytes(), "init is not deterministic for a seed"
    assert tmp_files_next_to(again) == []


def test_control_init_overwrites_existing_out(env: Env):
    out = env.out()
    out.write_bytes(b"old")
    ok_run(["init", "--config", env.config, "--seed", "7", "--out", out], env.root)
    assert out.read_bytes() == env.weights.read_bytes()


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_control_debug_state(env: Env, dtype):
    tok = env.npy(np.load(env.tokens).astype(dtype), "tok.npy")
    tgt = env.npy(np.load(env.targets).astype(dtype), "tgt.npy")
    out = env.out()
    ok_run(env.state_args(tokens=tok, targets=tgt, out=out), env.root)
    s = load_file(str(out))
    assert s["logits"].shape == (BATCH, SEQ, VOCAB)
    for k in ("loss.ce", "loss.lb", "loss.z", "loss.total"):
        assert s[k].shape == () and np.isfinite(s[k]), k
    assert {k[5:] for k in s if k.startswith("grad.")} == expected_param_names()


def test_control_debug_state_boundary_ids(env: Env):
    # Largest valid token id, all-ignored row, python-re-saved weights (the bad weights cases are
    # written the same way, so this shows the writer itself is accepted).
    a = good_ids()
    a[:, -1] = VOCAB - 1
    t = a.copy()
    t[1, :] = -100
    out = env.out()
    ok_run(env.state_args(weights=env.weights_with(dict(env.tensors)), tokens=env.npy(a),
                          targets=env.npy(t), out=out), env.root)
    assert np.isfinite(load_file(str(out))["loss.total"])


def test_control_debug_steps(env: Env):
    out = env.out()
    ok_run(env.state_args(out=out, cmd="debug-steps") + ["--steps", "2"], env.root)
    s = load_file(str(out))
    assert s["loss.total"].shape == (2,) and np.all(np.isfinite(s["loss.total"]))
    assert expected_param_names() <= set(s)


def test_control_train(env: Env, job_data: JobData):
    run_dir = env.path("run")
    cfg = env.cfg(_train_toml(env, run_dir, train_extra="eval_every = 0\nlog_every = 1\n"))
    ok_run(["train", cfg, "--set", "train.max_steps=2"], env.root)
    ckpt = run_dir / "checkpoints" / "step_00000002"
    assert (ckpt / "model.safetensors").is_file() and (run_dir / "config.toml").is_file()
    assert set(load_file(str(ckpt / "model.safetensors"))) == expected_param_names()
    # The same config with a train case's one problem fails (the train cases are not vacuous).
    r = run_bin(["train", cfg, "--set", "train.out_dir=" + str(env.path("run2")),
                 "--set", "train.batch_size=0"], cwd=env.root)
    assert r.returncode > 0 and "train.batch_size=0" in r.stderr, r.stderr
