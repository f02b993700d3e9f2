"""Downstream (in-context) evaluation: train.downstream_tasks in the loop and `moecore
eval-downstream`, as OLMo-core's DownstreamEvaluatorCallback scores olmo_eval's OEEvalTask with its
ICLMetric. The oracle is olmo_eval itself (ai2-olmo-eval, pinned) fed the logits of transformers'
OlmoeForCausalLM loaded from the run's checkpoint: its own sample building (tokenization, BOS,
query cut to the context length, gold-only samples for bpb / ce_loss, unconditional requests
skipped), its own metric code. Shown:

- every metric of six tasks (len_norm, acc, pmi_dc, f1, ce_loss, bpb; labels of every kind: an
  integer, a list, a gzip file of two members) at the run's last step in metrics.jsonl equals
  olmo_eval's: the accuracies and F1 exactly (each document's decision has a margin far above the
  forwards' difference, checked), the rest within LOGPROB_TOL;
- `moecore eval-downstream` on the same checkpoint prints the in-loop values, and its per-sample
  log-likelihoods equal olmo_eval's samples scored with transformers' logits (with a BOS token,
  --bos-id);
- olmo_eval's task and metric given moecore's per-sample log-likelihoods (its cross-entropy
  replaced by them) build the same samples and compute every metric to the bit, for the six metric
  types, on a task made to reach each branch;
- pipeline- and expert-parallel runs score their own weights as the single process does, and a
  run with document masking scores its tasks with plain causal attention, as the command does;
- bad request files, tasks and configs are one-line errors.
"""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from test_training_job import assert_one_line_error, metrics_rows, run, train, write_config
from test_parallel import mpirun

# The oracles are pinned (tests/reference/requirements.txt): a missing one is a failure, not a skip.
import olmo_eval  # noqa: E402
import tbparse  # noqa: E402
import transformers  # noqa: E402
from olmo_eval import HFTokenizer, ICLMetric  # noqa: E402
from olmo_eval.tasks import OEEvalTask  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

OE_TASKS = Path(olmo_eval.__file__).parent / "oe_eval_tasks"
SEQ_LEN = 64
# olmo_eval's METRIC_FROM_OE_EVAL: what a task's config.json primary_metric means.
METRIC_FROM_OE_EVAL = {"acc_raw": "acc", "acc_per_char": "len_norm", "acc_uncond": "pmi_dc",
                       "logits_per_byte": "bpb"}
# OLMo-core's DownstreamEvaluator.metric_type_to_label: the names the metrics are logged under.
LABELS = {"f1_v1": "F1 score", "acc_v1": "accuracy", "len_norm_v1": "length-normalized accuracy",
          "pmi_dc_v1": "PMI-DC accuracy", "ce_loss_v1": "CE loss", "bpb_v1": "BPB",
          "soft_v1": "soft loss", "soft_log_v1": "log soft loss", "f1_v2": "F1 score v2",
          "acc_v2": "accuracy v2", "len_norm_v2": "length-normalized accuracy v2",
          "pmi_dc_v2": "PMI-DC accuracy v2", "ce_loss_v2": "CE loss v2", "bpb_v2": "BPB v2",
          "soft_v2": "soft loss v2", "soft_log_v2": "log soft loss v2"}
# Two fp32 forwards of the same weights (moecore's and transformers'; moecore's log-softmax in
# double, torch's in fp32) agree per logit to a few ulp of the logits' magnitude; a sample's
# log-likelihood sums up to ~40 such terms. Measured here: ~1e-6 relative at most. 2e-5 relative
# leaves an order of magnitude for other CPUs' GEMM kernels.
LOGPROB_TOL = 2e-5
# The same weights through moecore's forward in two layouts (the pipeline's stages, the experts over
# ranks, other thread counts): the GEMMs sum in other blocks, a few fp32 ulps per logit; measured
# ~1e-7 relative on the metrics.
SAME_WEIGHTS_TOL = 2e-6


def read_requests(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def trimmed_task(root: Path, task: str, split: str, docs: int, tokenizer: Tokenizer,
                 members: int = 1) -> Path:
    """The first `docs` documents of a packaged oe-eval task whose continuations all fit the
    context (a longer one is an error, tested below), as a task directory of its own: config.json
    copied, requests.jsonl.gz written as `members` gzip members."""
    src = OE_TASKS / task / split
    by_doc: dict[int, list[dict]] = {}
    for r in read_requests(src / "requests.jsonl.gz"):
        by_doc.setdefault(r["doc_id"], []).append(r)
    kept = []
    for doc_id, requests in by_doc.items():
        if all(len(tokenizer.encode(r["request"]["continuation"], add_special_tokens=False).ids)
               <= SEQ_LEN // 2 for r in requests):
            kept += requests
        if len({r["doc_id"] for r in kept}) == docs:
            break
    out = root / task / split
    out.mkdir(parents=True)
    (out / "config.json").write_bytes((src / "config.json").read_bytes())
    lines = [json.dumps(r) + "\n" for r in kept]
    with open(out / "requests.jsonl.gz", "wb") as f:
        step = math.ceil(len(lines) / members)
        for i in range(0, len(lines), step):
            f.write(gzip.compress("".join(lines[i:i + step]).encode()))
    return out


def one_token_words(tokenizer: Tokenizer, count: int) -> list[str]:
    """Words with a leading space that the job's tokenizer keeps as one token each."""
    words = [w for w in (" the", " and", " of", " he", " said", " god", " lord", " land", " unto",
                         " they", " was", " came")
             if len(tokenizer.encode(w, add_special_tokens=False).ids) == 1]
    assert len(words) >= count, words
    return words[:count]


def fast_task(root: Path, tokenizer: Tokenizer, bos_text: str = "") -> Path:
    """A multiple-choice task of one-token continuations (olmo_eval's fast_mc: one query a
    document, each continuation a choice after it): sparse doc_ids out of order (olmo_eval visits
    them in its set's order: 64, 33, 3, 1000, 10, 18), each document's idx out of order (the
    choices are sorted by it), four or three choices, gold labels on every one; document 10's
    later continuations have another context (every choice is scored after the first one's)."""
    out = root / "fast" / "mc"
    out.mkdir(parents=True)
    words = one_token_words(tokenizer, 4)
    contexts = {3: "And the lord said unto", 10: "Then they went into", 18: "God saw that the",
                1000: "The people came to", 64: "And he said to", 33: bos_text + "Upon the land"}
    lines = []
    for doc_id in (18, 3, 1000, 10, 64, 33):
        choices = words if doc_id % 2 == 0 else words[:3]
        for idx in reversed(range(len(choices))):
            context = contexts[doc_id] if doc_id != 10 or idx == 0 else "Another context"
            lines.append({"request_type": "loglikelihood", "doc": {}, "doc_id": doc_id,
                          "idx": idx, "label": doc_id % len(choices),
                          "request": {"context": context, "continuation": choices[idx]}})
    (out / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out


@pytest.fixture(scope="module")
def tasks(job_data, tmp_path_factory) -> list[dict]:
    """Seven tasks, each a spec for the config and the metric olmo_eval scores it with (the last
    one as fast multiple choice)."""
    root = tmp_path_factory.mktemp("oe_eval_tasks")
    tok = Tokenizer.from_file(str(job_data.tokenizer))
    arc = trimmed_task(root, "arc_easy", "val_rc_5shot", 12, tok, members=2)
    boolq = trimmed_task(root, "boolq", "rc_5shot", 10, tok)
    lambada = trimmed_task(root, "lambada", "bpb_0shot", 12, tok)
    primary = {p: METRIC_FROM_OE_EVAL[json.loads((p / "config.json").read_text())["task_config"]
                                      ["primary_metric"]] for p in (arc, boolq, lambada)}
    assert primary == {arc: "len_norm", boolq: "acc", lambada: "bpb"}
    return [
        {"spec": {"path": str(arc)}, "label": "arc_easy_val_rc_5shot", "metric": "len_norm"},
        {"spec": {"path": str(arc), "label": "arc_pmi", "metric": "pmi_dc"}, "label": "arc_pmi",
         "metric": "pmi_dc"},
        {"spec": {"path": str(arc), "label": "arc_ce", "metric": "ce_loss"}, "label": "arc_ce",
         "metric": "ce_loss"},
        {"spec": {"path": str(boolq)}, "label": "boolq_rc_5shot", "metric": "acc"},
        {"spec": {"path": str(boolq), "label": "boolq_f1", "metric": "f1"}, "label": "boolq_f1",
         "metric": "f1"},
        {"spec": {"path": str(lambada)}, "label": "lambada_bpb_0shot", "metric": "bpb"},
        {"spec": {"path": str(fast_task(root, tok)), "metric": "acc", "fast_mc": True},
         "label": "fast_mc_fast",
         "metric": "acc", "fast_mc": True},
    ]


def config(tmp_path: Path, job, name: str, tasks: list[dict], **train_changes) -> Path:
    return write_config(tmp_path / f"{name}.toml", job, tmp_path / name,
                        train={"max_steps": 6, "seq_len": SEQ_LEN, "eval_every": 3,
                               "threads": 1, "downstream_tasks": [t["spec"] for t in tasks],
                               **train_changes})


@pytest.fixture(scope="module")
def whole(moecore_bin, job_data, tasks, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("downstream")
    r = train(moecore_bin, config(tmp, job_data, "run", tasks))
    assert "eval  step      3  arc_easy_val_rc_5shot (length-normalized accuracy)" in r.stdout
    return tmp / "run"


def downstream_rows(out_dir: Path) -> dict[int, dict]:
    return {row["step"]: {k[len("eval/downstream/"):]: v for k, v in row.items()
                          if k.startswith("eval/downstream/")}
            for row in metrics_rows(out_dir) if any(k.startswith("eval/downstream/") for k in row)}


def final_checkpoint(out_dir: Path) -> Path:
    return sorted((out_dir / "checkpoints").glob("step_*"))[-1]


class Oracle:
    """olmo_eval's task and metric over transformers' logits of a checkpoint."""

    def __init__(self, checkpoint: Path, job, bos: int | None = None):
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(checkpoint), dtype=torch.float32).eval()
        self.tokenizer = HFTokenizer(str(job.tokenizer), pad_token_id=job.eos_id,
                                     eos_token_id=job.eos_id, bos_token_id=bos)

    def task(self, path: str, metric: str, fast_mc: bool = False) -> OEEvalTask:
        p = Path(path)
        # An absolute dataset_path: olmo_eval joins it under its package, which it then replaces.
        return OEEvalTask(self.tokenizer, dataset_path=str(p.parent), dataset_name=p.name,
                          model_ctx_len=SEQ_LEN, metric_type=metric, fast_mc=fast_mc)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.model(ids).logits.float()

    def metrics(self, label: str, path: str, metric: str,
                fast_mc: bool = False) -> tuple[dict, list[float]]:
        """The metrics as OLMo-core logs them, and each document's decision margin (the best
        continuation's score over the runner-up's, in the metric's own scores)."""
        task = self.task(path, metric, fast_mc)
        m = ICLMetric(metric_type=task.metric_type)
        for batch in DataLoader(task, batch_size=8, collate_fn=task.collate_fn):
            dc = self.logits(batch["dc_input_ids"]) if metric == "pmi_dc" else None
            m.update(batch, self.logits(batch["input_ids"]), dc)
        margins = []
        per_doc: dict[int, list[float]] = {}
        for doc_id, _, ll in m.loglikelihoods:
            per_doc.setdefault(doc_id, []).append(ll)
        for lls in per_doc.values():
            if len(lls) > 1:
                best = sorted(lls, reverse=True)
                margins.append(abs(best[0] - best[1]) / max(abs(best[0]), 1e-30))
        return {f"{label} ({LABELS[k]})": v.item() for k, v in m.compute().items()}, margins

    def sample_logprobs(self, path: str, metric: str) -> list[tuple[int, float]]:
        """Each sample's query length and continuation log-likelihood, from olmo_eval's samples."""
        out = []
        for s in self.task(path, metric).samples:
            logits = self.logits(torch.tensor([s["query"]]))[0]
            cont = torch.tensor(s["continuation"])
            window = logits[s["ctx_len"] - 1: s["ctx_len"] - 1 + len(cont)]
            out.append((len(s["query"]),
                        -torch.nn.functional.cross_entropy(window, cont, reduction="sum").item()))
        return out


def is_decision(key: str) -> bool:
    return "accuracy" in key or "F1" in key


def assert_metrics_match(ours: dict, ref: dict, margins: list[float], what: str):
    assert set(ours) == set(ref), (what, sorted(set(ours) ^ set(ref)))
    for key, value in ref.items():
        if is_decision(key):
            # An accuracy is a count of argmax decisions: equal, unless a document's best two
            # continuations are closer than the forwards differ. Each score is off by at most
            # 2 x LOGPROB_TOL relative (pmi_dc's ratio adds two errors), so a relative margin
            # over 4 x LOGPROB_TOL cannot flip.
            assert min(margins) > 4 * LOGPROB_TOL, (what, key, min(margins))
            assert ours[key] == value, (what, key, ours[key], value)
        else:
            assert ours[key] == pytest.approx(value, rel=LOGPROB_TOL, abs=1e-6), (what, key)


def test_in_loop_metrics_are_olmo_evals(whole, job_data, tasks):
    rows = downstream_rows(whole)
    assert sorted(rows) == [3, 6], sorted(rows)
    oracle = Oracle(final_checkpoint(whole), job_data)
    for t in tasks:
        ref, margins = oracle.metrics(t["label"], t["spec"]["path"], t["metric"],
                                      t.get("fast_mc", False))
        ours = {k: v for k, v in rows[6].items() if k.startswith(t["label"] + " (")}
        assert_metrics_match(ours, ref, margins, t["label"])
    # The metrics moved between the evaluations (the model trained).
    assert rows[3]["arc_ce (CE loss)"] != rows[6]["arc_ce (CE loss)"]


def test_eval_downstream_prints_the_in_loop_values(moecore_bin, whole, tasks, tmp_path):
    ckpt = final_checkpoint(whole)
    args = ["eval-downstream", "--checkpoint", ckpt, "--out", tmp_path / "report.json"]
    for t in tasks[:2]:
        args += ["--task", t["spec"]["path"], "--label", t["label"]]
    r = run(moecore_bin, *args, "--metric", "pmi_dc")  # both as pmi_dc: one --metric for all
    report = json.loads((tmp_path / "report.json").read_text())
    assert [t["label"] for t in report] == ["arc_easy_val_rc_5shot", "arc_pmi"]
    in_loop = downstream_rows(whole)[6]
    for key, value in report[1]["metrics"].items():
        assert value == pytest.approx(in_loop[key], rel=SAME_WEIGHTS_TOL, abs=1e-9), key
        assert f"{key:<48} {value:.6f}" in r.stdout
    # The first task under its own label, scored as pmi_dc too.
    assert report[0]["metrics"]["arc_easy_val_rc_5shot (PMI-DC accuracy)"] == \
        report[1]["metrics"]["arc_pmi (PMI-DC accuracy)"]


def short_task(root: Path) -> Path:
    """A task of our own, short enough that no query is cut: a plain requests.jsonl (no gzip, no
    config.json), an unconditional request (doc_id >= 1000000, skipped) among them."""
    out = root / "short" / "rc"
    out.mkdir(parents=True)
    docs = [("The lord", [" said", " came", " went"], 1), ("And god", [" saw", " made"], 0),
            ("Upon the land there", [" was", " came"], 1)]
    lines = []
    for doc_id, (context, conts, gold) in enumerate(docs):
        for idx, cont in enumerate(conts):
            lines.append({"request_type": "loglikelihood", "doc": {}, "doc_id": doc_id,
                          "idx": idx, "label": gold,
                          "request": {"context": context, "continuation": cont}})
    lines.append({"request_type": "loglikelihood", "doc": {}, "doc_id": 1000000, "idx": 0,
                  "label": 0, "request": {"context": "", "continuation": " x"}})
    (out / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out


def test_per_sample_log_likelihoods_with_a_bos_token(moecore_bin, whole, job_data, tasks,
                                                     tmp_path):
    ckpt = final_checkpoint(whole)
    oracle = Oracle(ckpt, job_data, bos=job_data.eos_id)
    short = short_task(tmp_path)
    for path, metric in ((tasks[0]["spec"]["path"], "len_norm"), (str(short), "acc"),
                         (tasks[5]["spec"]["path"], "bpb")):
        out = tmp_path / "report.json"
        run(moecore_bin, "eval-downstream", "--checkpoint", ckpt, "--task", path,
            "--metric", metric, "--bos-id", job_data.eos_id, "--out", out)
        ours = json.loads(out.read_text())[0]["samples"]
        ref = oracle.sample_logprobs(path, metric)
        assert len(ours) == len(ref), path
        for s, (query_len, logprob) in zip(ours, ref):
            assert s["query_tokens"] == query_len
            assert s["logprob"] == pytest.approx(logprob, rel=LOGPROB_TOL), (path, s)
    # And the BOS moved them: without it (the run's own data.bos_id, none) each query is a token
    # shorter and scores otherwise.
    for name, bos in (("plain.json", []), ("bos.json", ["--bos-id", job_data.eos_id])):
        run(moecore_bin, "eval-downstream", "--checkpoint", ckpt, "--task", short, "--metric",
            "acc", *bos, "--out", tmp_path / name)
    without, with_bos = (json.loads((tmp_path / f).read_text())[0]
                         for f in ("plain.json", "bos.json"))
    assert len(without["samples"]) == 7 and without["documents"] == 3
    for a, b in zip(without["samples"], with_bos["samples"]):
        assert a["query_tokens"] == b["query_tokens"] - 1 and a["logprob"] != b["logprob"]


@pytest.mark.parametrize("layout,ranks,sets", [("pp2", 2, ["parallel.pp=2"]),
                                                 ("ep2", 2, ["parallel.ep=2"]),
                                                 ("dp2", 2, []),
                                                 ("dp2_pp2", 4, ["parallel.pp=2"]),
                                                 ("pp2_labels", 2, ["parallel.pp=2",
                                                  'model.loss_normalizer="labels"'])])
def test_parallel_runs_score_as_the_single_process(moecore_bin, job_data, tasks, tmp_path, layout,
                                                   ranks, sets):
    """The pipeline's last stage (which alone holds the logits), the expert-parallel ranks
    (which evaluate together) and the data-parallel ranks (each its share of the queries) score
    the run's weights as the single process scores its checkpoint; a stage before the head runs
    its MoE layers without targets, also when the router losses divide by the labels."""
    scored = tasks[:2] + [tasks[-1]]  # the last: fast multiple choice (choices share a query)
    cfg = config(tmp_path, job_data, layout, scored, max_steps=3)
    mpirun(moecore_bin, ranks, cfg, *sets)
    in_loop = downstream_rows(tmp_path / layout)[3]
    ckpt = final_checkpoint(tmp_path / layout)
    single = {}
    for t in scored:
        out = tmp_path / f"{t['label']}.json"
        run(moecore_bin, "eval-downstream", "--checkpoint", ckpt, "--task", t["spec"]["path"],
            "--label", t["label"], "--metric", t["metric"], "--out", out,
            *(["--fast-mc"] if t.get("fast_mc") else []))
        single.update(json.loads(out.read_text())[0]["metrics"])
    assert set(single) == set(in_loop)
    for key, value in single.items():
        if is_decision(key):
            assert in_loop[key] == value, key
        else:
            assert in_loop[key] == pytest.approx(value, rel=SAME_WEIGHTS_TOL, abs=1e-9), key


def request(doc_id=0, idx=0, label=0, context="The lord", continuation=" said", **changes):
    r = {"request_type": "loglikelihood", "doc": {}, "doc_id": doc_id, "idx": idx, "label": label,
         "request": {"context": context, "continuation": continuation}}
    r.update(changes)
    return json.dumps(r)


def gzipped(*lines: str) -> bytes:
    return gzip.compress("".join(line + "\n" for line in lines).encode())


GOOD = [request(idx=0), request(idx=1, continuation=" came")]
# name -> (files of the task directory, extra arguments, the error's distinctive part)
BAD_TASKS = {
    "missing": (None, [], "task directory"),
    "no_requests": ({"config.json": "{}"}, [], "holds neither requests.jsonl.gz nor requests.jsonl"),
    "bad_json": ({"requests.jsonl": GOOD[0] + "\n{oops\n"}, ["--metric", "acc"],
                 "requests.jsonl line 2: not a JSON request"),
    "not_loglikelihood": ({"requests.jsonl": request(request_type="generate_until") + "\n"},
                          ["--metric", "acc"], "request_type 'generate_until' is not a loglikelihood"),
    "string_label": ({"requests.jsonl": request(label="said") + "\n"}, ["--metric", "acc"],
                     "metric acc needs an integer 'label'"),
    "no_idx": ({"requests.jsonl": request(idx="0") + "\n"}, ["--metric", "acc"],
               "'idx' is missing or not an integer"),
    "empty_context": ({"requests.jsonl": request(context="") + "\n"}, ["--metric", "acc"],
                      "the context tokenizes to nothing"),
    "long_continuation": ({"requests.jsonl": request(continuation=" the lord " * 10) + "\n"},
                          ["--metric", "acc", "--seq-len", "8"], "more than the context length 8"),
    "label_outside": ({"requests.jsonl": "\n".join(GOOD).replace('"label": 0', '"label": 5') + "\n"},
                      ["--metric", "acc"], "document 0's label 5 is not among its 2 continuations"),
    "only_unconditional": ({"requests.jsonl": request(doc_id=1000000) + "\n"}, ["--metric", "acc"],
                           "holds no request to score"),
    "unmapped_primary_metric": ({"requests.jsonl": "\n".join(GOOD) + "\n",
                                 "config.json": json.dumps(
                                     {"task_config": {"primary_metric": "acc_per_token"}})},
                                [], "primary_metric 'acc_per_token' has no olmo_eval metric type"),
    "no_config_no_metric": ({"requests.jsonl": "\n".join(GOOD) + "\n"}, [],
                            "no metric given and"),
    "truncated_gzip": ({"requests.jsonl.gz": gzipped(*GOOD)[:-12]}, ["--metric", "acc"],
                       "requests.jsonl.gz: the gzip stream ends early"),
    "corrupt_gzip": ({"requests.jsonl.gz": gzipped(*GOOD)[:12] + b"\xff" * 40},
                     ["--metric", "acc"], "not a valid gzip file"),
    "bad_crc": ({"requests.jsonl.gz": gzipped(*GOOD)[:-8] + b"\0\0\0\0" + gzipped(*GOOD)[-4:]},
                ["--metric", "acc"], "a wrong CRC-32 or length"),
    "labels_per_task": ({"requests.jsonl": "\n".join(GOOD) + "\n"},
                        ["--metric", "acc", "--label", "a", "--label", "b"],
                        "2 --label for 1 --task"),
}


@pytest.mark.parametrize("name", sorted(BAD_TASKS))
def test_bad_tasks_are_one_line_errors(moecore_bin, whole, tmp_path, name):
    files, extra, needle = BAD_TASKS[name]
    task = tmp_path / "task"
    if files is not None:
        task.mkdir()
        for file, content in files.items():
            (task / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "report.json"
    r = run(moecore_bin, "eval-downstream", "--checkpoint", final_checkpoint(whole), "--task",
            task, *extra, "--out", out, check=False)
    assert_one_line_error(r, needle)
    assert not out.exists()


def test_the_good_control_and_gzip_members(moecore_bin, whole, tmp_path):
    """The bad cases' own good task, as plain JSON lines and as a gzip of two members with zero
    padding after them (as gzip(1) allows): the same scores."""
    reports = []
    for name, content in (("requests.jsonl", ("\n".join(GOOD) + "\n").encode()),
                          ("requests.jsonl.gz", gzipped(GOOD[0]) + gzipped(GOOD[1]) + b"\0" * 9)):
        task = tmp_path / name.replace(".", "_")
        task.mkdir()
        (task / name).write_bytes(content)
        out = tmp_path / f"{name}.json"
        r = run(moecore_bin, "eval-downstream", "--checkpoint", final_checkpoint(whole), "--task",
                task, "--metric", "acc", "--out", out)
        assert r.stderr == ""
        reports.append(json.loads(out.read_text())[0])
    assert reports[0]["samples"] == reports[1]["samples"]
    assert len(reports[0]["samples"]) == 2 and reports[0]["documents"] == 1


@pytest.mark.parametrize("changes,needle", [
    ({"downstream_tasks": [{"path": "x", "metric": "accuracy"}]},
     "train.downstream_tasks[0].metric 'accuracy' is not one of"),
    ({"downstream_tasks": [{"path": "a/t/s"}, {"path": "b/t/s"}]},
     "train.downstream_tasks[1] is labelled 't_s' as an earlier task"),
    ({"downstream_tasks": [{"path": ""}]}, "train.downstream_tasks[0].path is empty"),
    ({"downstream_tasks": [{"label": "x"}]}, "train.downstream_tasks[0] names no task directory"),
    ({"downstream_tasks": [{"path": "x", "metrics": "acc"}]}, "metrics"),
    ({"downstream_tasks": ["x"]}, "train.downstream_tasks must be an array of tables"),
])
def test_config_errors(moecore_bin, job_data, tmp_path, changes, needle):
    r = train(moecore_bin, write_config(tmp_path / "bad.toml", job_data, tmp_path / "out",
                                        train=changes), check=False)
    assert_one_line_error(r, needle)
    assert not (tmp_path / "out").exists()


def test_downstream_tasks_need_a_tokenizer(moecore_bin, job_data, tasks, tmp_path):
    cfg = write_config(tmp_path / "bad.toml", job_data, tmp_path / "out",
                       train={"downstream_tasks": [tasks[0]["spec"]]}, data={"tokenizer": None})
    r = train(moecore_bin, cfg, check=False)
    assert_one_line_error(r, "train.downstream_tasks need data.tokenizer")
    assert not (tmp_path / "out").exists()


def crafted_task(root: Path, bos_text: str) -> Path:
    """Requests that reach every branch of olmo_eval's sample building and metric: continuations
    of several code points per byte count (é, —, an emoji), a document with a gap in its idx
    (olmo_eval skips it), a duplicated request (its first value counts), documents out of order, a
    context cut by the context length, one that starts with the BOS, labels None, int, str and
    list (gold-only metrics), an unconditional request."""
    out = root / "crafted" / "rc"
    out.mkdir(parents=True)
    long_context = "And the lord said unto the people of the land " * 8
    rows = [
        (3, 0, 1, "The lord", " said"), (3, 1, 1, "The lord", " caf\u00e9 \u2014 x"),
        (3, 2, 1, "The lord", " \U0001F600 came"),
        (0, 0, 0, long_context, " amen"), (0, 1, 0, long_context, " and the land"),
        (1, 0, 1, bos_text + "Upon the land", " was"), (1, 1, 1, bos_text + "Upon the land", " w"),
        (1, 1, 1, bos_text + "Upon the land", " w"),  # the same request again
        (2, 0, 0, "God saw", " it"), (2, 2, 0, "God saw", " them"),  # idx 1 missing
        (4, 0, None, "Then", " he went"), (4, 1, None, "Then", " she"),
        (5, 0, "went", "They", " went"), (6, 0, ["came", "come"], "They all", " came"),
        (1000000, 0, 0, "", " x"),
    ]
    lines = [json.dumps({"request_type": "loglikelihood", "doc": {}, "doc_id": d, "idx": i,
                         "label": label, "request": {"context": c, "continuation": cont}})
             for d, i, label, c, cont in rows]
    (out / "requests.jsonl").write_text("\n".join(lines) + "\n")
    return out


def integer_labels_only(task: Path) -> Path:
    """The crafted task without its documents of non-integer labels (acc, len_norm, pmi_dc and f1
    need integer labels)."""
    out = task.parent.parent / "crafted_int" / "rc"
    out.mkdir(parents=True)
    kept = [line for line in (task / "requests.jsonl").read_text().splitlines()
            if isinstance(json.loads(line)["label"], int)]
    (out / "requests.jsonl").write_text("\n".join(kept) + "\n")
    return out


def assert_olmo_eval_metrics_bit_for_bit(report: dict, ref_task: OEEvalTask, metric: str,
                                         monkeypatch):
    """olmo_eval's ICLMetric over `ref_task` given the report's per-sample log-likelihoods (its
    F.cross_entropy replaced by a queue of them, as fp32 tensors, which is what it computes from
    logits, in the order it asks: each sample or choice, then its domain-conditional one) computes
    the report's metrics to the bit, in the same order under the same names."""
    queue = []
    for s in report["samples"]:
        queue.append(torch.tensor(-s["logprob"], dtype=torch.float32))
        if metric == "pmi_dc":
            queue.append(torch.tensor(-s["dc_logprob"], dtype=torch.float32))
    monkeypatch.setattr(olmo_eval.metrics.F, "cross_entropy", lambda *a, **k: queue.pop(0))
    m = ICLMetric(metric_type=metric)
    for batch in DataLoader(ref_task, batch_size=3, collate_fn=ref_task.collate_fn):
        m.update(batch, torch.zeros(3, 32, 1), torch.zeros(3, 32, 1))
    assert not queue
    ref = [(f"{report['label']} ({LABELS[k]})", v.item()) for k, v in m.compute().items()]
    assert list(report["metrics"]) == [key for key, _ in ref]
    for key, value in ref:
        # The soft scores' softmax: torch's vectorised exp is within an ulp of the correctly
        # rounded one moecore uses (equal here; an ulp of a document's fp32 score moves the mean
        # by at most 2^-24 of it).
        tol = 2.0 ** -23 if "soft" in key else 0.0
        assert report["metrics"][key] == pytest.approx(value, rel=tol, abs=0.0), key


@pytest.mark.parametrize("metric", ["acc", "len_norm", "pmi_dc", "f1", "ce_loss", "bpb"])
def test_metrics_are_olmo_evals_bit_for_bit(moecore_bin, whole, job_data, tmp_path, monkeypatch,
                                            metric):
    """olmo_eval's OEEvalTask and ICLMetric given moecore's own per-sample log-likelihoods (its
    F.cross_entropy replaced by a queue of them, as fp32 tensors, which is what it computes from
    logits): the same samples, and every metric equal to the bit, in the same order under the
    same names."""
    crafted = crafted_task(tmp_path, "<|endoftext|>")
    task = crafted if metric in ("ce_loss", "bpb") else integer_labels_only(crafted)
    out = tmp_path / "report.json"
    run(moecore_bin, "eval-downstream", "--checkpoint", final_checkpoint(whole), "--task", task,
        "--metric", metric, "--bos-id", job_data.eos_id, "--seq-len", 24, "--out", out)
    report = json.loads(out.read_text())[0]
    tokenizer = HFTokenizer(str(job_data.tokenizer), pad_token_id=job_data.eos_id,
                            eos_token_id=job_data.eos_id, bos_token_id=job_data.eos_id)
    ref_task = OEEvalTask(tokenizer, dataset_path=str(task.parent), dataset_name=task.name,
                          model_ctx_len=24, metric_type=metric)
    assert [(s["doc_id"], s["cont_id"], len(s["query"])) for s in ref_task.samples] == \
        [(s["doc_id"], s["cont_id"], s["query_tokens"]) for s in report["samples"]]
    assert any(len(s["query"]) == 24 for s in ref_task.samples)  # one was cut
    assert_olmo_eval_metrics_bit_for_bit(report, ref_task, metric, monkeypatch)


def test_in_loop_queries_ignore_document_masking(moecore_bin, job_data, tmp_path):
    """A run with data.document_masking scores its tasks with plain causal attention, as
    `eval-downstream` and OLMo-core's downstream batches do: a context holding the EOS the run
    cuts its documents at scores in the loop as the command scores it from the checkpoint."""
    task = tmp_path / "eos" / "rc"
    task.mkdir(parents=True)
    lines = [{"request_type": "loglikelihood", "doc": {}, "doc_id": d, "idx": i, "label": 0,
              "request": {"context": f"The lord said<|endoftext|>And god {d}",
                          "continuation": cont}}
             for d in range(3) for i, cont in enumerate([" saw", " came upon"])]
    (task / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    spec = {"path": str(task), "metric": "len_norm"}
    cfg = write_config(tmp_path / "run.toml", job_data, tmp_path / "run",
                       train={"max_steps": 3, "seq_len": SEQ_LEN, "eval_every": 0,
                              "threads": 1, "downstream_tasks": [spec]},
                       data={"document_masking": True})
    train(moecore_bin, cfg)
    in_loop = downstream_rows(tmp_path / "run")[3]
    out = tmp_path / "report.json"
    run(moecore_bin, "eval-downstream", "--checkpoint", final_checkpoint(tmp_path / "run"),
        "--task", task, "--metric", "len_norm", "--out", out)
    single = json.loads(out.read_text())[0]["metrics"]
    assert set(single) == set(in_loop)
    for key, value in single.items():
        assert in_loop[key] == pytest.approx(value, rel=SAME_WEIGHTS_TOL, abs=1e-9), key


def test_in_loop_logits_in_head_chunks_are_olmo_evals(moecore_bin, job_data, tasks, tmp_path):
    """With train.lm_head_chunk_tokens the head computes a pass's scored rows in groups of at
    most that many (train/downstream_eval.h; 16 here: a pass's 4 queries share a group, each
    continuation's rows after the ones before it); the metrics are still olmo_eval's over
    transformers' logits of the checkpoint, and `eval-downstream` of it reads the same. (Groups
    cut at every size, and a continuation longer than a group, are tests/cpp's
    DownstreamScoring.)"""
    chosen = [tasks[0], tasks[2], tasks[5]]  # arc len_norm, arc ce_loss, lambada bpb
    train(moecore_bin, config(tmp_path, job_data, "chunked", chosen, lm_head_chunk_tokens=16,
                              max_steps=3))
    in_loop = downstream_rows(tmp_path / "chunked")[3]
    ckpt = final_checkpoint(tmp_path / "chunked")
    oracle = Oracle(ckpt, job_data)
    for t in chosen:
        ref, margins = oracle.metrics(t["label"], t["spec"]["path"], t["metric"])
        ours = {k: v for k, v in in_loop.items() if k.startswith(t["label"] + " (")}
        assert_metrics_match(ours, ref, margins, t["label"])
    out = tmp_path / "report.json"
    run(moecore_bin, "eval-downstream", "--checkpoint", ckpt, "--task", chosen[2]["spec"]["path"],
        "--label", chosen[2]["label"], "--metric", "bpb", "--out", out)
    for key, value in json.loads(out.read_text())[0]["metrics"].items():
        assert value == pytest.approx(in_loop[key], rel=SAME_WEIGHTS_TOL, abs=1e-9), key


@pytest.mark.parametrize("metric", ["acc", "len_norm", "pmi_dc", "bpb"])
def test_fast_mc_metrics_are_olmo_evals_bit_for_bit(moecore_bin, whole, job_data, tmp_path,
                                                    monkeypatch, metric):
    """olmo_eval's fast multiple choice (OEEvalTask(fast_mc=True): one query a document, its
    one-token continuations scored as choices after it, every choice divided by the first one's
    lengths) given moecore's per-choice log-likelihoods: the same samples and every metric to the
    bit. And each choice's log-likelihood, read from its document's one query, equals the same
    continuation's scored as a request of its own (the plain task)."""
    tok = Tokenizer.from_file(str(job_data.tokenizer))
    task = fast_task(tmp_path, tok, "<|endoftext|>")
    out = tmp_path / "report.json"
    run(moecore_bin, "eval-downstream", "--checkpoint", final_checkpoint(whole), "--task", task,
        "--metric", metric, "--fast-mc", "--bos-id", job_data.eos_id, "--out", out)
    report = json.loads(out.read_text())[0]
    assert report["label"] == "fast_mc_fast"
    tokenizer = HFTokenizer(str(job_data.tokenizer), pad_token_id=job_data.eos_id,
                            eos_token_id=job_data.eos_id, bos_token_id=job_data.eos_id)
    ref_task = OEEvalTask(tokenizer, dataset_path=str(task.parent), dataset_name=task.name,
                          model_ctx_len=SEQ_LEN, metric_type=metric, fast_mc=True)
    expanded = [(s["doc_id"], c, len(s["query"])) for s in ref_task.samples
                for c in range(len(s["choices"]))]
    assert expanded == [(s["doc_id"], s["cont_id"], s["query_tokens"]) for s in report["samples"]]
    # olmo_eval's set order, neither the file's nor ascending (bpb's fp32 mean sums in it).
    order = [s["doc_id"] for s in ref_task.samples]
    assert order != sorted(order) and order != [18, 3, 1000, 10, 64, 33], order
    assert_olmo_eval_metrics_bit_for_bit(report, ref_task, metric, monkeypatch)
    # The plain task: each continuation its own request and query (the same tokens).
    plain = tmp_path / "plain.json"
    run(moecore_bin, "eval-downstream", "--checkpoint", final_checkpoint(whole), "--task", task,
        "--metric", metric, "--bos-id", job_data.eos_id, "--out", plain)
    own = {(s["doc_id"], s["cont_id"]): s["logprob"]
           for s in json.loads(plain.read_text())[0]["samples"]}
    assert len(own) == len(report["samples"])
    for s in report["samples"]:
        if s["doc_id"] == 10 and s["cont_id"] > 0 and metric not in ("ce_loss", "bpb"):
            # Its own request has another context; the choice is scored after the first one's.
            assert s["logprob"] != pytest.approx(own[(10, s["cont_id"])], rel=1e-3)
        else:
            assert s["logprob"] == pytest.approx(own[(s["doc_id"], s["cont_id"])],
                                                 rel=SAME_WEIGHTS_TOL)


def test_fast_mc_needs_one_token_continuations(moecore_bin, whole, tasks, tmp_path):
    r = run(moecore_bin, "eval-downstream", "--checkpoint", final_checkpoint(whole), "--task",
            tasks[0]["spec"]["path"], "--fast-mc", check=False)
    assert_one_line_error(r, "fast_mc scores one-token continuations, but document")


def test_olmo_core_labels_to_config_entries(moecore_bin, whole, tmp_path):
    """scripts/olmo_core_downstream_tasks.py turns OLMo-core's task labels into config entries
    (the installed olmo_eval's request directory and the label's metric type), which a run and
    `eval-downstream` take as they are; labels moecore does not score are refused."""
    import subprocess
    import sys
    import tomllib

    script = Path(__file__).resolve().parents[2] / "scripts" / "olmo_core_downstream_tasks.py"
    r = subprocess.run([sys.executable, script, "arc_easy_val_rc_5shot", "lambada_bpb_0shot"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    entries = tomllib.loads(r.stdout)["train"]["downstream_tasks"]
    assert [(e["label"], e["metric"]) for e in entries] == [("arc_easy_val_rc_5shot", "len_norm"),
                                                             ("lambada_bpb_0shot", "bpb")]
    assert entries[0]["path"] == str(OE_TASKS / "arc_easy" / "val_rc_5shot")
    # The whole packaged task, as the entry names it (570 documents).
    out = run(moecore_bin, "eval-downstream", "--checkpoint", final_checkpoint(whole), "--task",
              entries[0]["path"], "--label", entries[0]["label"], "--metric", entries[0]["metric"])
    assert "arc_easy_val_rc_5shot (570 documents, 2281 samples, metric len_norm)" in out.stdout
    # A "_fast" label: the same request directory, fast_mc set, its own label.
    r = subprocess.run([sys.executable, script, "arc_easy_val_mc_5shot_fast"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    fast = tomllib.loads(r.stdout)["train"]["downstream_tasks"]
    assert fast == [{"path": str(OE_TASKS / "arc_easy" / "val_mc_5shot"),
                     "label": "arc_easy_val_mc_5shot_fast", "metric": "acc", "fast_mc": True}]
    r = subprocess.run([sys.executable, script, "piqa", "no_such_task"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    for needle in ("piqa: a PIQA task", "no_such_task: not an olmo_eval task label"):
        assert needle in r.stderr


def test_tasks_without_validation_data(moecore_bin, job_data, tasks, tmp_path):
    """A run with downstream tasks and no validation set evaluates the tasks alone: their metrics
    in metrics.jsonl and TensorBoard under OLMo-core's names, no val/loss, no final val loss."""
    cfg = write_config(tmp_path / "run.toml", job_data, tmp_path / "run",
                       train={"max_steps": 4, "seq_len": SEQ_LEN, "eval_every": 2, "threads": 1,
                              "downstream_tasks": [tasks[5]["spec"]]},
                       data={"val": None})
    r = train(moecore_bin, cfg)
    assert "val loss" not in r.stdout.splitlines()[-1] and "val_loss" not in r.stdout
    rows = [row for row in metrics_rows(tmp_path / "run") if "val/loss" in row]
    assert rows == []
    ours = downstream_rows(tmp_path / "run")
    assert sorted(ours) == [2, 4]
    scalars = tbparse.SummaryReader(str(tmp_path / "run")).scalars
    tag = "eval/downstream/lambada_bpb_0shot (BPB)"
    logged = scalars[scalars.tag == tag].sort_values("step")
    assert list(logged.step) == [2, 4]
    np.testing.assert_allclose(logged.value, [ours[2]["lambada_bpb_0shot (BPB)"],
                                              ours[4]["lambada_bpb_0shot (BPB)"]], rtol=1e-6)


def test_downstream_eval_every(moecore_bin, job_data, tasks, tmp_path):
    """train.downstream_eval_every (OLMo-core's downstream callback has an eval_interval of its
    own): the tasks at the evaluations of its multiples and at the end, the validation loss at
    every evaluation."""
    cfg = write_config(tmp_path / "run.toml", job_data, tmp_path / "run",
                       train={"max_steps": 7, "seq_len": SEQ_LEN, "eval_every": 2,
                              "downstream_eval_every": 4, "threads": 1,
                              "downstream_tasks": [tasks[5]["spec"]]})
    train(moecore_bin, cfg)
    assert sorted(downstream_rows(tmp_path / "run")) == [4, 7]
    val_steps = [row["step"] for row in metrics_rows(tmp_path / "run") if "val/loss" in row]
    assert val_steps == [2, 4, 6, 7]
    bad = write_config(tmp_path / "bad.toml", job_data, tmp_path / "bad",
                       train={"eval_every": 2, "downstream_eval_every": 3,
                              "downstream_tasks": [tasks[5]["spec"]]})
    assert_one_line_error(train(moecore_bin, bad, check=False),
                          "train.downstream_eval_every=3 must be 0 (every evaluation) or a "
                          "positive multiple of train.eval_every=2")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_merged_weights_are_evaluated(moecore_bin, job_data, tasks, tmp_path, precision):
    """OLMo-core's ModelMergeCallback runs the evaluators on the merged weights ("eval/merged"):
    at a merge step the average is swapped in, scored (val/merged/loss, eval/merged/downstream/...:
    what `moecore eval` and `eval-downstream` give for the merged checkpoint) and swapped out again,
    so that the run trains on exactly as one that merges nothing. The merge step is an evaluation
    step too (the trained weights scored just before): in bf16 the weight copies must be remade
    for the average and again for the trained weights."""
    spec = tasks[0]["spec"]
    base = {"max_steps": 6, "seq_len": SEQ_LEN, "eval_every": 2, "threads": 1,
            "precision": precision, "downstream_tasks": [spec]}
    merging = write_config(tmp_path / "merge.toml", job_data, tmp_path / "merge",
                           train={**base, "merge_steps": [4], "merge_last_n_steps": 2})
    plain = write_config(tmp_path / "plain.toml", job_data, tmp_path / "plain", train=base)
    r = train(moecore_bin, merging)
    assert "eval  step      4  merged val_loss" in r.stdout
    train(moecore_bin, plain)

    def by_step(out_dir):  # each step's logged values, its training and evaluation lines merged
        merged_rows: dict[int, dict] = {}
        for row in metrics_rows(out_dir):
            merged_rows.setdefault(row["step"], {}).update(row)
        return merged_rows
    rows, plain_rows = by_step(tmp_path / "merge"), by_step(tmp_path / "plain")
    # The trained weights came back: every later loss and evaluation is the plain run's.
    for step in range(1, 7):
        assert rows[step]["train/loss"] == plain_rows[step]["train/loss"], step
    for step in (2, 4, 6):
        assert rows[step]["val/loss"] == plain_rows[step]["val/loss"], step
    merged_keys = [k for k in rows[4] if k.startswith("eval/merged/downstream/")]
    assert len(merged_keys) == 10 and "val/merged/loss" in rows[4]
    assert not any(k.startswith("eval/merged/") for s in (2, 3, 5, 6) for k in rows[s])
    # The average is not the step's own weights: its scores differ from the trained ones'.
    assert rows[4]["val/merged/loss"] != rows[4]["val/loss"]
    ckpt = tmp_path / "merge" / "merged" / "checkpoints" / f"step_{4:08d}"
    out = tmp_path / "merged.json"
    run(moecore_bin, "eval-downstream", "--checkpoint", ckpt, "--task", spec["path"], "--out", out)
    for key, value in json.loads(out.read_text())[0]["metrics"].items():
        assert rows[4]["eval/merged/downstream/" + key] == \
            pytest.approx(value, rel=SAME_WEIGHTS_TOL, abs=1e-9), key
    e = run(moecore_bin, "eval", "--checkpoint", ckpt, "--data", job_data.val, "--max-instances",
            2 * 4)  # eval_batches x the micro-batch's rows
    loss = float(e.stdout.split("loss ")[1].split()[0])
    assert rows[4]["val/merged/loss"] == pytest.approx(loss, abs=6e-5)
