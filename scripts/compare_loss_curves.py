#!/usr/bin/env python3
"""The GPU check's loss-curve comparison (issue 15 item 5): a run's metrics.jsonl against the same
run's on the CPU (scripts/gpu_bundle.sh makes those), in one precision. Standard library only (the
GPU machine's python3 has nothing of moecore's).

Margins, each relative to the CPU run's value:
- step 1's training loss within FIRST_TOL[precision]: the same weights and batch, so only the
  kernels' summation order differs (fp32: 1e-5, the bound of the parallel tests' per-step losses,
  which measure 1.4e-8; bf16: 1e-3, where an operand rounded a bf16 step the other way moves a
  logit by up to 2^-8 relative; mxfp8: the same as bf16: its MX GEMMs' products are exact on both
  devices (E4M3 codes times power-of-two scales, through bf16 on Hopper) and only their sums'
  order differs, while every other GEMM is bf16's; an activation that the upstream sums' order
  moves across a rounding boundary takes the neighbouring E4M3 code, as bf16's operands do);
- every 20-step window's mean training loss within WINDOW_MARGIN, and every evaluation's
  validation loss within VAL_MARGIN: tests/train/test_precision.py's margins for bf16 against
  fp32, which measure 1.1e-3 and 3.2e-4 there; two devices in one precision part by less (their
  trajectories differ only by summation order, which grows chaotically as bf16 rounding does).
Prints a table; exits 1 when a margin is exceeded, 2 on unreadable input.

  compare_loss_curves.py CPU.jsonl GPU.jsonl --precision bf16 [--markdown out.md]
"""
from __future__ import annotations

import argparse
import json
import sys

FIRST_TOL = {"fp32": 1e-5, "bf16": 1e-3, "mxfp8": 1e-3}
WINDOW = 20
WINDOW_MARGIN = 1e-2
VAL_MARGIN = 1e-2


def read_run(path: str) -> tuple[dict[int, float], dict[int, float]]:
    train, val = {}, {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("train/loss") is not None:
                train[row["step"]] = float(row["train/loss"])
            if row.get("val/loss") is not None:
                val[row["step"]] = float(row["val/loss"])
    return train, val


def relative(a: float, b: float) -> float:
    return abs(a - b) / abs(a)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cpu")
    parser.add_argument("gpu")
    parser.add_argument("--precision", choices=sorted(FIRST_TOL), required=True)
    parser.add_argument("--markdown", help="also write the table here")
    args = parser.parse_args()
    try:
        cpu_train, cpu_val = read_run(args.cpu)
        gpu_train, gpu_val = read_run(args.gpu)
    except (OSError, ValueError, KeyError) as e:
        print(f"compare_loss_curves: cannot read the runs: {e}", file=sys.stderr)
        return 2
    if sorted(cpu_train) != sorted(gpu_train) or not cpu_train:
        print(f"compare_loss_curves: the runs logged different steps (cpu {len(cpu_train)}, gpu "
              f"{len(gpu_train)})", file=sys.stderr)
        return 2
    steps = sorted(cpu_train)
    rows, failed = [], False

    def check(what: str, cpu: float, gpu: float, margin: float) -> None:
        nonlocal failed
        gap = relative(cpu, gpu)
        ok = gap <= margin
        failed |= not ok
        rows.append(f"| {what} | {cpu:.6f} | {gpu:.6f} | {gap:.2e} | {margin:.0e} | "
                    f"{'ok' if ok else 'BEYOND'} |")

    check(f"train loss, step {steps[0]}", cpu_train[steps[0]], gpu_train[steps[0]],
          FIRST_TOL[args.precision])
    for begin in range(0, len(steps) - WINDOW + 1, WINDOW):
        window = steps[begin:begin + WINDOW]
        check(f"train loss, mean of steps {window[0]}-{window[-1]}",
              sum(cpu_train[s] for s in window) / WINDOW,
              sum(gpu_train[s] for s in window) / WINDOW, WINDOW_MARGIN)
    for step in sorted(set(cpu_val) & set(gpu_val)):
        check(f"val loss, step {step}", cpu_val[step], gpu_val[step], VAL_MARGIN)
    if set(cpu_val) != set(gpu_val):
        print("compare_loss_curves: the runs evaluated at different steps", file=sys.stderr)
        failed = True
    table = "\n".join([f"{args.precision}: GPU run against the CPU run ({len(steps)} steps)", "",
                       "| what | cpu | gpu | relative gap | margin | |",
                       "|---|---|---|---|---|---|", *rows])
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
