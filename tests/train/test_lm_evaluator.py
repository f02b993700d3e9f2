"""Labelled validation sets ([[data.lm_eval]]) in the loop and `moecore eval-lm`, as OLMo-core's
LMEvaluatorCallback scores its NumpyPaddedFSLDataset with its LMEvaluator. The oracle is OLMo-core
itself (ai2-olmo-core, pinned): its padded dataset finds the documents in the same token files,
its NumpyFSLDataLoader picks and orders them (seed 0, epoch 1, whole global batches), its
get_labels and LMEvaluator.update_metrics / compute_metrics turn per-token losses into each
label's CE loss and PPL; the per-token losses are torch's cross-entropy of transformers'
OlmoeForCausalLM logits of the run's checkpoint. Shown:

- both labels' CE loss and PPL at the run's last evaluation in metrics.jsonl equal OLMo-core's,
  over sets that reach every rule (documents cut at seq_len, a one-token document, a file's tail
  after its last EOS, a tail of documents that fills no batch) and train.lm_eval_every;
- `moecore eval-lm` on the same checkpoint prints the in-loop values, and with --batches (OLMo-
  core's eval_duration in steps) scores OLMo-core's first batches alone;
- sets with label masks (OLMo-core's label_mask_paths) count what its LMEvaluator counts: the
  positions whose mask is 1, unshifted, each with its loss where its next token is a label too;
- data-, pipeline- and expert-parallel runs score their weights as the single process does;
- a merged evaluation is logged as OLMo-core's eval/merged/lm/...;
- bad sets and configs are one-line errors.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from test_training_job import assert_one_line_error, metrics_rows, run, train, write_config
from test_parallel import mpirun

# The oracles are pinned (tests/reference/requirements.txt): a missing one is a failure, not a skip.
import transformers  # noqa: E402
from olmo_core.data import DataCollator, NumpyPaddedFSLDataset  # noqa: E402
from olmo_core.data.utils import get_labels  # noqa: E402
from olmo_core.eval.lm_evaluator import LMEvaluator  # noqa: E402
from olmo_core.train.common import Duration  # noqa: E402

SEQ_LEN = 32
# OLMo-core's global evaluation batch in documents: the training micro-batch (train.batch_size 8 in
# 2 micro-batches) over the data-parallel ranks, its train module's rank_microbatch_size x dp.
BATCH = 4
# moecore's forward and transformers' (same fp32 weights) agree per logit to a few ulp of the
# logits' magnitude; a per-token loss then differs by ~1e-6 relative at most (torch's log-softmax
# in fp32, moecore's in fp32 over its own reduction order), and a label's mean averages hundreds
# of them. Measured here ~1e-7 relative; 2e-5 leaves two orders of magnitude for other CPUs' GEMM
# kernels (the downstream evaluator's LOGPROB_TOL, derived the same way).
LOSS_TOL = 2e-5
# The same weights through moecore's forward in two layouts (the pipeline's stages, the experts
# over ranks, data-parallel shares of the passes, other batch shapes): a few fp32 ulp per logit;
# measured ~1e-7 relative on the means.
SAME_WEIGHTS_TOL = 2e-6


def second_slice(job, path: Path) -> Path:
    """More of the training text's documents, headerless: a second file for the label "val"."""
    tokens = np.asarray(job.read_part(sorted(job.train.glob("*.npy"))[0])[1600:2400])
    tokens = tokens[: int(np.nonzero(tokens == job.eos_id)[0][-1]) + 1]
    tokens.astype("<u2").tofile(path)
    return path


def made_set(job, path: Path) -> Path:
    """A headerless uint16 file of the job's dtype built to reach the padded dataset's rules: a
    document longer than seq_len (cut), a one-token document (EOS after EOS), the training text's
    documents, and tokens after the last EOS (no document)."""
    tokens = np.asarray(job.read_part(sorted(job.train.glob("*.npy"))[0])[:1600])
    eos = job.eos_id
    tokens = tokens[: int(np.nonzero(tokens == eos)[0][-1]) + 1]  # end at an EOS
    long_doc = np.array([(7 + 3 * i) % 200 + 10 for i in range(SEQ_LEN + 9)] + [eos])
    tail = np.array([11, 12, 13])
    out = np.concatenate([long_doc, [eos], tokens, tail]).astype("<u2")
    assert (out[:-3] != eos).sum() > 0 and out[-1] != eos
    out.tofile(path)
    return path


@pytest.fixture(scope="module")
def sets(job_data, tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("lm_eval_sets")
    made = made_set(job_data, root / "made.npy")
    more = second_slice(job_data, root / "more.npy")
    # Labels A, B, A: OLMo-core's metadata labels each path; documents numbered in path order.
    return [{"label": "val", "paths": [str(job_data.val)]},
            {"label": "made", "paths": [str(made)]},
            {"label": "val", "paths": [str(more)]}]


def config(tmp_path: Path, job, name: str, sets: list[dict], train_changes=None,
           data_changes=None) -> Path:
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name,
                        train={"max_steps": 6, "seq_len": SEQ_LEN, "batch_size": 2 * BATCH,
                               "microbatches": 2,
                               "eval_every": 2, "lm_eval_every": 4, "threads": 1,
                               **(train_changes or {})},
                        data={"lm_eval": sets, "dtype": job.dtype, **(data_changes or {})})


@pytest.fixture(scope="module")
def whole(moecore_bin, job_data, sets, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm_eval")
    r = train(moecore_bin, config(tmp, job_data, "run", sets))
    assert "eval  step      4  eval/lm/val/CE loss" in r.stdout, r.stdout
    return tmp / "run"


def lm_rows(out_dir: Path, prefix: str = "eval/lm/") -> dict[int, dict]:
    return {row["step"]: {k[len(prefix):]: v for k, v in row.items() if k.startswith(prefix)}
            for row in metrics_rows(out_dir) if any(k.startswith(prefix) for k in row)}


def final_checkpoint(out_dir: Path) -> Path:
    return sorted((out_dir / "checkpoints").glob("step_*"))[-1]


def set_files(sets: list[dict]) -> tuple[list[str], list[dict], list[str] | None]:
    """The sets' files in order with their metadata and label masks (None: no set has any), as
    OLMo-core's dataset config lists them."""
    paths, metadata, masks = [], [], []
    for s in sets:
        for p in s["paths"]:
            files = sorted(Path(p).glob("*.npy")) if Path(p).is_dir() else [Path(p)]
            paths += [str(f) for f in files]
            metadata += [{"label": s["label"]}] * len(files)
        masks += s.get("label_mask", [])
    assert not masks or len(masks) == len(paths), "OLMo-core takes masks for every file or none"
    return paths, metadata, masks or None


def set_args(sets: list[dict]) -> list[str]:
    """The sets as `moecore eval-lm --set LABEL=PATH [--label-mask LABEL=PATH]` arguments."""
    return [x for s in sets for option, key in (("--set", "paths"), ("--label-mask", "label_mask"))
            for p in s.get(key, []) for x in (option, f"{s['label']}={p}")]


class Oracle:
    """OLMo-core's padded dataset, loader and LMEvaluator over transformers' per-token losses of
    a checkpoint."""

    def __init__(self, checkpoint: Path, job, work_dir: Path):
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(checkpoint), dtype=torch.float32).eval()
        self.job = job
        self.work_dir = work_dir

    def evaluator(self, sets: list[dict]) -> LMEvaluator:
        paths, metadata, masks = set_files(sets)
        dataset = NumpyPaddedFSLDataset(
            *paths, sequence_length=SEQ_LEN, pad_token_id=self.job.eos_id,
            eos_token_id=self.job.eos_id, vocab_size=self.job.vocab_size, dtype=np.uint16,
            metadata=metadata, label_mask_paths=masks)
        dataset.work_dir = self.work_dir
        return LMEvaluator.from_numpy_dataset(
            dataset, name="lm", global_batch_size=BATCH * SEQ_LEN,
            collator=DataCollator(pad_token_id=self.job.eos_id), device=torch.device("cpu"))

    def metrics(self, sets: list[dict], batches: int = 0) -> tuple[dict, dict]:
        """Each label's metrics as OLMo-core logs them (under eval/lm/), and how many documents
        of each label it scored."""
        ev = self.evaluator(sets)
        ev.reset_metrics()
        duration = Duration.steps(batches) if batches else Duration.epochs(1)
        documents: dict[str, int] = {}
        step = 0
        for batch in ev:
            step += 1
            labels = get_labels(batch)
            with torch.no_grad():
                logits = self.model(batch["input_ids"]).logits.float()
            ce = torch.nn.functional.cross_entropy(
                logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100,
                reduction="none").view(labels.shape)
            ev.update_metrics(batch, ce, logits)
            for m in batch["metadata"]:
                documents[m["label"]] = documents.get(m["label"], 0) + 1
            # The callback's own test (EvaluatorCallback.perform_eval).
            if duration.due(step=step, tokens=0, epoch=1):
                break
        return {k: v.item() for k, v in ev.compute_metrics().items()}, documents


def assert_close(ours: dict, ref: dict, rel: float, what: str):
    assert set(ours) == set(ref), (what, sorted(set(ours) ^ set(ref)))
    for key, value in ref.items():
        assert ours[key] == pytest.approx(value, rel=rel), (what, key, ours[key], value)


def test_in_loop_metrics_are_olmo_cores(whole, job_data, sets, tmp_path):
    rows = lm_rows(whole)
    # train.lm_eval_every = 4 of eval_every = 2: step 4 and the end, not step 2.
    assert sorted(rows) == [4, 6], sorted(rows)
    oracle = Oracle(final_checkpoint(whole), job_data, tmp_path)
    ref, documents = oracle.metrics(sets)
    assert_close(rows[6], ref, LOSS_TOL, "in-loop")
    # Both labels scored, a tail that fills no batch dropped, and the metrics moved between the
    # evaluations.
    assert set(documents) == {"val", "made"}
    assert len(oracle.evaluator(sets).batches.dataset) % BATCH != 0
    assert rows[4]["val/CE loss"] != rows[6]["val/CE loss"]


def test_in_loop_evaluations_log_their_cost(whole, job_data):
    """Each evaluation logs OLMo-core's throughput/in-loop eval time (s) and eval batches:
    rank 0's forward passes, at step 2 the validation loss's alone (train.eval_batches passes of
    the micro-batch, or fewer where the validation files hold fewer instances), at steps 4 and 6
    the labelled sets' passes too (the same documents each time)."""
    rows = {row["step"]: row for row in metrics_rows(whole)
            if "throughput/in-loop eval batches" in row}
    assert sorted(rows) == [2, 4, 6], sorted(rows)
    files = sorted(job_data.val.glob("*.npy")) if job_data.val.is_dir() else [job_data.val]
    instances = sum(f.stat().st_size // 2 // SEQ_LEN for f in files)  # uint16, cut per file
    eval_batches = tomllib.loads((whole.parent / "run.toml").read_text())["train"]["eval_batches"]
    val_passes = min(eval_batches, -(-instances // BATCH))  # micro-batches of BATCH rows
    assert rows[2]["throughput/in-loop eval batches"] == val_passes
    lm_passes = rows[4]["throughput/in-loop eval batches"] - val_passes
    assert lm_passes > 0 and rows[6]["throughput/in-loop eval batches"] == val_passes + lm_passes
    for step, row in rows.items():
        assert 0 < row["throughput/in-loop eval time (s)"] < 600, step


def test_eval_lm_prints_the_in_loop_values(moecore_bin, whole, job_data, sets, tmp_path):
    ckpt = final_checkpoint(whole)
    args = ["eval-lm", "--checkpoint", ckpt, *set_args(sets)]
    r = run(moecore_bin, *args, "--out", tmp_path / "report.json")
    report = json.loads((tmp_path / "report.json").read_text())
    assert [e["label"] for e in report] == ["val", "made"]  # each label once
    in_loop = lm_rows(whole)[6]
    oracle = Oracle(ckpt, job_data, tmp_path)
    _, documents = oracle.metrics(sets)
    for e in report:
        assert e["documents"] == documents[e["label"]], e
        for key in ("CE loss", "PPL"):
            assert e[key] == pytest.approx(in_loop[f"{e['label']}/{key}"], rel=SAME_WEIGHTS_TOL)
        assert f"lm: {e['label']}  CE loss {e['CE loss']:.6f}" in r.stdout
    # --batches: OLMo-core's eval_duration in steps, its first batches only.
    run(moecore_bin, *args, "--out", tmp_path / "two.json", "--batches", 2)
    two = {e["label"]: e for e in json.loads((tmp_path / "two.json").read_text())}
    ref, documents = oracle.metrics(sets, batches=2)
    assert sum(e["documents"] for e in two.values()) == 2 * BATCH
    assert {k: e["documents"] for k, e in two.items() if e["documents"]} == documents
    ours = {f"{k}/{m}": e[m] for k, e in two.items() if e["documents"] for m in ("CE loss", "PPL")}
    assert_close(ours, ref if len(documents) == 2 else
                 {k: v for k, v in ref.items() if k.split("/")[0] in documents}, LOSS_TOL, "two")


def masks_for(sets: list[dict], root: Path) -> list[dict]:
    """The sets with a label mask per token file (headerless np.bool_ bytes, as OLMo-core writes
    them), 70 % ones at random: a position and its next token disagree often."""
    rng = np.random.default_rng(0)
    out = []
    for k, s in enumerate(sets):
        paths, _, _ = set_files([s])
        masks = []
        for i, p in enumerate(paths):
            n = len(np.memmap(p, dtype="<u2", mode="r"))
            mask = rng.random(n) < 0.7
            path = root / f"set{k}_{i}.mask"
            mask.astype(np.bool_).tofile(path)
            masks.append(str(path))
        out.append({**s, "paths": paths, "label_mask": masks})
    return out


def test_label_masks_count_as_olmo_cores(moecore_bin, job_data, sets, tmp_path):
    masked = masks_for(sets, tmp_path)
    train(moecore_bin, config(tmp_path, job_data, "masked", masked,
                              {"max_steps": 2, "eval_every": 0, "lm_eval_every": 0}))
    in_loop = lm_rows(tmp_path / "masked")[2]
    ckpt = final_checkpoint(tmp_path / "masked")
    ref, _ = Oracle(ckpt, job_data, tmp_path).metrics(masked)
    assert_close(in_loop, ref, LOSS_TOL, "masked")
    # The masks moved the means (a position without a label counts, with a loss of 0 where its
    # next token is none).
    unmasked, _ = Oracle(ckpt, job_data, tmp_path).metrics(sets)
    assert abs(unmasked["made/CE loss"] - ref["made/CE loss"]) > 0.05 * ref["made/CE loss"]
    run(moecore_bin, "eval-lm", "--checkpoint", ckpt, *set_args(masked),
        "--out", tmp_path / "masked.json")
    single = {f"{e['label']}/{m}": e[m] for e in json.loads((tmp_path / "masked.json").read_text())
              for m in ("CE loss", "PPL")}
    assert_close(single, in_loop, SAME_WEIGHTS_TOL, "eval-lm masked")


@pytest.mark.parametrize("layout,ranks,settings", [("dp2", 2, []),
                                                    ("pp2", 2, ["parallel.pp=2"]),
                                                    ("ep2", 2, ["parallel.ep=2"]),
                                                    ("ep2_dp2", 4, ["parallel.ep=2"])])
def test_parallel_runs_score_as_the_single_process(moecore_bin, job_data, sets, tmp_path, layout,
                                                   ranks, settings):
    """Each data-parallel rank scores its share of the passes (summed), the pipeline's last stage
    alone sees the losses (broadcast), the expert-parallel ranks their shares in lockstep (the
    same forwards' shapes, padded)."""
    cfg = config(tmp_path, job_data, layout, sets, {"max_steps": 2, "lm_eval_every": 0})
    r = mpirun(moecore_bin, ranks, cfg, *settings)
    assert r.returncode == 0, r.stderr[-3000:]
    in_loop = lm_rows(tmp_path / layout)[2]
    run(moecore_bin, "eval-lm", "--checkpoint", final_checkpoint(tmp_path / layout),
        *set_args(sets), "--out", tmp_path / "single.json")
    single = {f"{e['label']}/{m}": e[m] for e in json.loads((tmp_path / "single.json").read_text())
              for m in ("CE loss", "PPL")}
    assert_close(in_loop, single, SAME_WEIGHTS_TOL, layout)


@pytest.mark.parametrize("ranks", [1, 2])
def test_merged_weights_are_evaluated_as_olmo_core_names_them(moecore_bin, job_data, sets,
                                                              tmp_path, ranks):
    """The average of the merge window is swapped in and scored (eval/merged/lm/...) as
    `moecore eval-lm` scores the merged checkpoint; with two data-parallel ranks each scores its
    share of the passes with the whole average."""
    cfg = config(tmp_path, job_data, "merge", sets,
                 {"max_steps": 4, "eval_every": 4, "lm_eval_every": 0, "merge_steps": [4],
                  "merge_last_n_steps": 2})
    if ranks == 1:
        train(moecore_bin, cfg)
    else:
        r = mpirun(moecore_bin, ranks, cfg)
        assert r.returncode == 0, r.stderr[-3000:]
    merged = lm_rows(tmp_path / "merge", "eval/merged/lm/")
    plain = lm_rows(tmp_path / "merge")
    assert sorted(merged) == [4] and sorted(plain) == [4]
    assert set(merged[4]) == set(plain[4]) == {"val/CE loss", "val/PPL", "made/CE loss",
                                               "made/PPL"}
    assert merged[4]["val/CE loss"] != plain[4]["val/CE loss"]
    run(moecore_bin, "eval-lm", "--checkpoint",
        tmp_path / "merge" / "merged" / "checkpoints" / f"step_{4:08d}", *set_args(sets),
        "--out", tmp_path / "merged.json")
    single = {f"{e['label']}/{m}": e[m] for e in json.loads((tmp_path / "merged.json").read_text())
              for m in ("CE loss", "PPL")}
    assert_close(merged[4], single, SAME_WEIGHTS_TOL, f"merged, {ranks} rank(s)")


def bad_config(tmp_path, job, sets, **train_changes) -> Path:
    return config(tmp_path, job, "bad", sets, train_changes)


@pytest.mark.parametrize("case,sets_of,train_changes,expect", [
    ("no label", lambda s: [{"paths": s[0]["paths"]}], {}, "data.lm_eval[0] has no label"),
    ("no paths", lambda s: [{"label": "x"}], {}, "lists no token files"),
    ("unknown key", lambda s: [{**s[0], "metric": "x"}], {}, "metric"),
    ("every", lambda s: s, {"lm_eval_every": 3}, "train.lm_eval_every=3 must be 0"),
    ("batches", lambda s: s, {"lm_eval_batches": -1}, "train.lm_eval_batches=-1"),
    ("fewer than a batch", lambda s: s, {"batch_size": 4096, "eval_every": 0, "lm_eval_every": 0},
     "fewer than one evaluation batch"),
])
def test_bad_configs_are_one_line_errors(moecore_bin, job_data, sets, tmp_path, case, sets_of,
                                         train_changes, expect):
    cfg = bad_config(tmp_path, job_data, sets_of(sets), **train_changes)
    r = run(moecore_bin, "train", cfg, check=False)
    assert_one_line_error(r, expect)


def test_bad_sets_are_one_line_errors(moecore_bin, whole, job_data, tmp_path):
    job = job_data
    ckpt = final_checkpoint(whole)
    no_eos = tmp_path / "no_eos.npy"
    np.array([5, 6, 7, 8], dtype="<u2").tofile(no_eos)
    cases = [
        # The run resolved its EOS into the checkpoint's data.eos_id: the command ends documents
        # there.
        (["--set", f"x={no_eos}", "--dtype", "uint16"],
         f"no document in {no_eos} (a document ends at the EOS id {job.eos_id}"),
        (["--set", f"x={no_eos}", "--dtype", "uint16", "--eos-id", -1],
         "documents end at an EOS: set data.eos_id"),
        (["--set", f"={no_eos}"], "is not LABEL=PATH"),
        (["--set", f"x={no_eos}", "--label-mask", f"y={no_eos}"],
         "no --set y=... left without one"),
        (["--set", f"x={tmp_path / 'missing.npy'}"], "missing.npy"),
        (["--set", f"x={no_eos}", "--dtype", "uint8"], "--dtype 'uint8' is not one of"),
        (["--set", f"x={no_eos}", "--set", "y"], "--set 'y' is not LABEL=PATH"),
    ]
    for extra, expect in cases:
        r = run(moecore_bin, "eval-lm", "--checkpoint", ckpt, *extra, check=False)
        assert_one_line_error(r, expect)
