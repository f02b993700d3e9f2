#!/usr/bin/env bash
# The GPU check of the CUDA backend (issue 15), on a machine with an NVIDIA GPU and driver, CUDA 13's
# cuBLAS and cuBLASLt (the toolkit's or PyTorch's wheel) and python3; run from the repository root after
# scripts/gpu_bundle.sh made .gpu/bundle on the build machine. What it runs today:
#   1. the machine: nvidia-smi, and where the driver's, cuBLASLt's and NCCL's libraries were
#      found (NCCL's wheel version where it is a wheel's);
#   2. moecore_cuda_tests: the per-op harness's cases against the CUDA kernels (the plain-loop
#      oracle as reference, tolerances of tests/TOLERANCES.md) and the backend's own tests; its
#      start-up lines name the device and the NCCL library loaded beside the headers' version.
#      A fault of the device's work (an illegal address, a misaligned access) is sticky and names
#      no kernel, and every later test fails with it: the first test that met one runs again
#      alone with MOECORE_CUDA_SYNC_EACH_OP=1 (every operation waits for its work and names
#      itself: src/kernels/cuda/runtime.h), then under compute-sanitizer's memcheck where the
#      machine has it (which names the kernel and the access), 45 s and 90 s at most;
#   3. moecore_bench_cuda_gemm: cuBLASLt's bf16 peak and the engine's GEMM ops and flash
#      attention against it (bench/cuda/gemm.cpp), whatever step 2 gave;
#   4. `moecore train --device cuda`: 200 steps of the default run in fp32, in bf16, in bf16 with
#      every step one CUDA graph (train.cuda_graph) and in mxfp8 (OLMo-core's recipe; the start-up
#      line's device says which path its MX GEMMs take, issue 16 item 3), each loss
#      curve held against the CPU's (made by gpu_bundle.sh) by scripts/compare_loss_curves.py,
#      each profiled (train_<precision>_profile.json: the phases' times and the steps' host reads
#      of device memory, where they wait for the GPU); then `moecore diff` of one batch's pass on
#      the CPU and on the GPU, tensor by tensor;
#   5. bench/gpu_peer.py: moecore's training step (`moecore train --device cuda`, no
#      checkpoints) and transformers' OlmoeForCausalLM + AdamW (eager, then torch.compile where
#      Triton can build its kernels) on bench/configs/gpu.toml at 8 / 32 / 128 experts, each count's
#      pair first, where python3 has torch and transformers, 240 s at most, 30 s kept for:
#   6. 10 steps with the job's groups on NCCL's communicator (--set parallel.communicator=nccl:
#      its creation, splits, barriers and teardown on one rank), whose start-up line must name it.
# Two files go to $OUT when it is set (the device tool, which returns at most 8), else to
# .gpu/out: gpu_check.log, and gpu_results.tar.gz with everything else (gtest's XML, the GEMM
# bench's JSON, the runs' logs, metrics and profiles, the curves' and diffs' reports, gpu_peer's
# results), packed again after every step so that a run stopped at its limit still returns what
# it made. The whole check keeps to 470 s: each step gets at most its own limit and what is left
# (less the 5 s timeout(1) gives a step to end after its TERM, and 5 s for the last packing).
# It ends with a summary: the tests' exit, the NCCL library, the tests that skipped and why (a
# symmetric exchange skipped for a mismatched NCCL shows there), and the named fault if any.
# Exit status: that of the tests (0 all passed; 77 no usable GPU; 124 they ran out of time), or 1
# when they passed but a training run failed or left its margins.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=.gpu/bundle
out=${OUT:-.gpu/out}
results=.gpu/results
mkdir -p "$out"
rm -rf "$results"
mkdir -p "$results"
deadline=470
# gpu_bundle.sh packs the bundle; unpacked here once (python3's tarfile where tar lacks xz).
if [[ ! -d $bundle && -f .gpu/bundle.tar.xz ]]; then
  tar -C .gpu -xJf .gpu/bundle.tar.xz 2> /dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .gpu/bundle.tar.xz .gpu
fi
if [[ ! -x $bundle/bin/moecore_cuda_tests || ! -e $bundle/lib/ld-linux-x86-64.so.2 ]]; then
  echo "gpu_check: no bundle in $bundle: run scripts/gpu_bundle.sh on the build machine and carry .gpu" >&2
  exit 2
fi

# The first directory holding library $1: the loader's cache, then the CUDA toolkit's and the
# driver's usual places, then the NVIDIA wheels of python3's site-packages.
find_library() {
  local dir
  dir=$(ldconfig -p 2> /dev/null | awk -v lib="$1" '$1 == lib {print $NF; exit}')
  if [[ -n $dir ]]; then dirname "$dir"; return 0; fi
  local candidates=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib
                    /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu)
  local site
  for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2> /dev/null); do
    [[ -d $site/nvidia ]] && candidates+=($(find "$site/nvidia" -maxdepth 3 -type d -name lib))
  done
  for dir in "${candidates[@]}"; do
    [[ -e $dir/$1 ]] && { echo "$dir"; return 0; }
  done
  return 1
}

{
  echo "== gpu_check: bundle of $(tr '\n' ' ' < "$bundle/commit")"
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
  # Without the driver the tests still start, and say in one line that there is no usable GPU.
  driver_dir=$(find_library libcuda.so.1) || echo "gpu_check: libcuda.so.1 (the NVIDIA driver) not found"
  cublaslt_dir=$(find_library libcublasLt.so.13) || { echo "gpu_check: libcublasLt.so.13 not found (CUDA 13 toolkit or the nvidia-cublas wheel)"; exit 2; }
  cublas_dir=$(find_library libcublas.so.13) || { echo "gpu_check: libcublas.so.13 not found (CUDA 13 toolkit or the nvidia-cublas wheel)"; exit 2; }
  nccl_dir=$(find_library libnccl.so.2) || { echo "gpu_check: libnccl.so.2 not found (CUDA 13 toolkit or the nvidia-nccl-cu13 wheel)"; exit 2; }
  echo "driver: ${driver_dir:-none}; cuBLASLt: $cublaslt_dir; cuBLAS: $cublas_dir; NCCL: $nccl_dir"
  # Where NCCL is a wheel's, the wheel's version (moecore_cuda_tests' start-up line gives the one
  # the process loads, beside the headers' it was built against).
  nccl_wheel=$(python3 -c 'import importlib.metadata as m, sys
for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
    try: print(name, m.version(name), m.distribution(name).locate_file("")); break
    except m.PackageNotFoundError: pass' 2> /dev/null)
  echo "NCCL wheel: ${nccl_wheel:-none}"
  # Debian's loader and C library from the bundle, whatever the machine's: the programs were linked
  # against them. The driver's and cuBLAS's directories follow, for what the bundle leaves out.
  loader=("$bundle/lib/ld-linux-x86-64.so.2" --library-path "$bundle/lib:${driver_dir:+$driver_dir:}$cublaslt_dir:$cublas_dir:$nccl_dir")
  pack() {  # everything but the log, in one file for $OUT (python3's tarfile where tar fails)
    tar -C .gpu -czf "$out/gpu_results.tar.gz" results 2> /dev/null ||
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "w:gz").add(sys.argv[2], "results")' \
        "$out/gpu_results.tar.gz" "$results"
  }
  # Seconds a step may take: its own limit $1, or what is left before the deadline, whichever is
  # less; 0 when too little is left to start it. Kept back: the 5 s of timeout's -k after its TERM
  # and 5 s for packing.
  allowed() {
    local left=$((deadline - 10 - SECONDS))
    (( left > $1 )) && left=$1
    (( left < 10 )) && left=0
    echo "$left"
  }
  # Runs "${@:2}" (through the bundle's loader when $2 is `bundled`) for at most allowed($1)
  # seconds, where the machine has timeout(1); exit 124 when killed or not started for want of time.
  cap() {
    local seconds
    seconds=$(allowed "$1")
    shift
    if (( seconds == 0 )); then echo "gpu_check: no time left for: $*"; return 124; fi
    [[ $1 == bundled ]] && { shift; set -- "${loader[@]}" "$@"; }
    if command -v timeout > /dev/null; then timeout -k 5 "$seconds" "$@"; else "$@"; fi
  }
  echo "== moecore_cuda_tests"
  cap 150 bundled "$bundle/bin/moecore_cuda_tests" --gtest_output="xml:$results/cuda_tests.xml" |
    tee "$results/cuda_tests.log"
  status=${PIPESTATUS[0]}
  tests_status=$status
  echo "== gpu_check: moecore_cuda_tests exited $status"
  pack
  # The first test that met a fault of the device's work, by the CUDA runtime's words for one.
  fault_words='illegal memory access|illegal instruction|misaligned address|unspecified launch failure|device-side assert|hardware stack error|invalid program counter|not supported on global/shared address space'
  faulted_test=
  (( status != 0 )) && faulted_test=$(awk -v words="$fault_words" '/^\[ RUN      \] / {test = $4}
    test != "" && tolower($0) ~ words {print test; exit}' "$results/cuda_tests.log")
  if [[ -n $faulted_test ]]; then
    echo "== moecore_cuda_tests: $faulted_test met a fault of the device's work; again alone, every operation waiting for its work (MOECORE_CUDA_SYNC_EACH_OP=1)"
    MOECORE_CUDA_SYNC_EACH_OP=1 cap 45 bundled "$bundle/bin/moecore_cuda_tests" \
      --gtest_filter="$faulted_test" > "$results/cuda_tests_sync_each_op.log" 2>&1
    echo "== gpu_check: the rerun exited $? (its errors name the operation that faulted):"
    rerun_log=$results/cuda_tests_sync_each_op.log
    if grep -q -E "found by MOECORE_CUDA_SYNC_EACH_OP|$fault_words" "$rerun_log"; then
      grep -E "found by MOECORE_CUDA_SYNC_EACH_OP|$fault_words" "$rerun_log" | head -n 5
    else
      tail -n 20 "$rerun_log"
    fi
    pack
    sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null)
    if [[ -n $sanitizer ]]; then
      echo "== moecore_cuda_tests: $faulted_test under compute-sanitizer --tool memcheck"
      cap 90 "$sanitizer" --tool memcheck --print-limit 5 --target-processes all "${loader[@]}" \
        "$bundle/bin/moecore_cuda_tests" --gtest_filter="$faulted_test" \
        > "$results/cuda_tests_memcheck.log" 2>&1
      echo "== gpu_check: memcheck exited $?; its first reports:"
      grep -E -A 4 "^========= (Invalid|Misaligned|Out-of-range|Program hit|Error)" \
        "$results/cuda_tests_memcheck.log" | head -n 30
      pack
    else
      echo "gpu_check: no compute-sanitizer on this machine"
    fi
  fi
  echo "== moecore_bench_cuda_gemm"
  cap 60 bundled "$bundle/bin/moecore_bench_cuda_gemm" --json "$results/cuda_gemm.json"
  echo "== gpu_check: moecore_bench_cuda_gemm exited $?"
  pack
  # 4. The training job on the GPU, 75 s at most per run: its metrics and log into the results,
  # its checkpoints (0.2 GB) into .gpu/runs, not sent back.
  echo "== train --device cuda"
  [[ -d data/kjv ]] || { mkdir -p data && cp -r "$bundle/data/kjv" data/; }
  source scripts/gpu_train_args.sh
  train_status=0
  # bf16_graph: the bf16 run with every step one CUDA graph (train.cuda_graph, issue 15 item 3),
  # held against the same CPU curve; its last line counts the steps that replayed a graph.
  for run in fp32 bf16 bf16_graph mxfp8; do
    precision=${run%_graph}
    graph_args=()
    [[ $run == *_graph ]] && graph_args=(--set train.cuda_graph=true)
    run_dir=.gpu/runs/train_$run
    rm -rf "$run_dir"
    cap 75 bundled "$bundle/bin/moecore" train configs/default.toml --device cuda \
      $(gpu_train_args "$precision" "$run_dir") ${graph_args[@]+"${graph_args[@]}"} \
      > "$results/train_$run.log" 2>&1
    code=$?
    cat "$results/train_$run.log"
    echo "== gpu_check: train --device cuda ($run) exited $code"
    cp "$run_dir/metrics.jsonl" "$results/train_$run.jsonl" 2> /dev/null
    cp "$run_dir/profile.json" "$results/train_${run}_profile.json" 2> /dev/null
    python3 scripts/compare_loss_curves.py "$bundle/cpu_runs/$precision.jsonl" \
      "$results/train_$run.jsonl" --precision "$precision" \
      --markdown "$results/gpu_train_$run.md"
    curves=$?
    echo "== gpu_check: loss curves ($run) against the CPU's: exit $curves"
    (( code != 0 || curves != 0 )) && train_status=1
    pack
  done
  # The first batch's forward and backward on the CPU and on the GPU, every activation and
  # gradient compared (moecore diff: where they part, by normalised error); reported, not failed:
  # fp32 sums in another order may part past diff's default threshold (2^-18).
  for precision in fp32 bf16; do
    cap 40 bundled "$bundle/bin/moecore" diff configs/default.toml \
      --set "train.precision=$precision" --b-set train.device=cuda > "$results/gpu_diff_$precision.txt" 2>&1
    code=$?
    head -n 30 "$results/gpu_diff_$precision.txt"
    echo "== gpu_check: diff cpu vs cuda ($precision) exited $code (0 equal within the threshold, 1 parted)"
    pack
  done
  # 5. moecore against the transformers peer (bench/gpu_peer.py, issue 15 items 5-6), where
  # python3 has torch with a usable GPU and transformers: gpu.toml at 8, 128, 32 experts, at each
  # count moecore (its runs through the bundle's loader; its experts' GEMMs as step 3 timed them
  # faster at that count: gpu_peer --moecore-grouped-gemm auto) then transformers eager (experts in bf16
  # under autocast: bench/peer_autocast_experts.py), then torch.compile at each count as time
  # allows (each compile takes a minute or more). 240 s at most and what is left of the
  # check's time (timeout kills it and its runs; gpu_peer's own budget, 15 s less, stops starting
  # runs first); MFU against step 3's peak; gpu_peer.{json,md} into the results. Its exit status
  # is reported, not returned: the check's is the tests'.
  echo "== gpu_peer"
  # torch.compile's Triton kernels are built at run time with a C compiler and Python's headers.
  peer_modes=moecore,eager,compile
  python3 -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2> /dev/null &&
    command -v "${CC:-cc}" > /dev/null ||
    { peer_modes=moecore,eager; echo "gpu_check: torch.compile left out: no C compiler or no Python.h for Triton"; }
  if python3 -c 'import numpy, torch, transformers; assert torch.cuda.is_available()' 2> /dev/null; then
    peer_s=$(( $(allowed 270) - 30 ))  # after the check above (torch's import); 30 s kept for the NCCL run below
    if (( peer_s < 60 )); then
      echo "gpu_check: gpu_peer skipped: ${peer_s} s left of the check's ${deadline}"
    else
      cap "$peer_s" python3 bench/gpu_peer.py --out "$results" --gemm-json "$results/cuda_gemm.json" \
        --moecore-cmd "${loader[*]} $bundle/bin/moecore" \
        --experts 8,32,128 --order 8,128,32 --modes "$peer_modes" --steps 7 --warmup 2 \
        --budget-s $((peer_s - 15)) --min-run-s 40 --timeout 180
      echo "== gpu_check: gpu_peer exited $?"
    fi
  else
    echo "gpu_check: gpu_peer skipped: python3 lacks numpy, torch with a usable GPU or transformers"
  fi
  pack
  # 6. The job's groups on NCCL's communicator (issue 15 item 4), last (the peer's figures come
  # first; 30 s are kept for it), 30 s at most: one GPU, so one rank
  # (NCCL takes no two ranks on one device), whose collectives complete without reaching NCCL; what
  # runs on it is the world's creation over MPI's, the mesh's splits, the checkpoint's barriers and
  # the teardown.
  run_dir=.gpu/runs/train_nccl
  rm -rf "$run_dir"
  cap 30 bundled "$bundle/bin/moecore" train configs/default.toml --device cuda \
    $(gpu_train_args fp32 "$run_dir") --set train.max_steps=10 --set train.eval_every=0 \
    --set parallel.communicator=nccl > "$results/train_nccl.log" 2>&1
  code=$?
  cat "$results/train_nccl.log"
  if (( code == 0 )) && ! grep -q "parallel: 1 rank; communicator nccl" "$results/train_nccl.log"; then
    echo "gpu_check: the start-up lines do not name the communicator nccl"
    code=1
  fi
  echo "== gpu_check: train --device cuda (parallel.communicator=nccl) exited $code"
  (( code != 0 )) && train_status=1
  pack
  (( status == 0 && train_status != 0 )) && status=1
  echo "== gpu_check summary"
  echo "moecore_cuda_tests exited $tests_status"
  grep -m 1 "^moecore_cuda_tests: NCCL" "$results/cuda_tests.log" ||
    echo "moecore_cuda_tests named no NCCL library (built without NCCL, or it did not start)"
  # The skipped tests with gtest's reasons (its XML, written when the run ends; else the log's
  # list): a path that skips on this machine (the symmetric exchange on a mismatched NCCL, two-GPU
  # cases on one) passes silently otherwise.
  if ! python3 - "$results/cuda_tests.xml" 2> /dev/null << 'PYTHON'
import sys
import xml.etree.ElementTree as ET
skipped = [(case.get("classname") + "." + case.get("name"), s.get("message", "").strip())
           for case in ET.parse(sys.argv[1]).iter("testcase") for s in case.iter("skipped")]
print(f"skipped tests: {len(skipped)}")
for name, why in skipped:
    print(f"  {name}: {' '.join(why.split())[:300]}")
PYTHON
  then
    echo "skipped tests (the log's list; no XML):"
    grep "^\[  SKIPPED \] [^0-9]" "$results/cuda_tests.log" | grep -v " ms)$"
  fi
  [[ -n $faulted_test ]] && echo "fault of the device's work first met by: $faulted_test (cuda_tests_sync_each_op.log, cuda_tests_memcheck.log)"
  echo "== gpu_check: ${SECONDS} s; results in $out/gpu_results.tar.gz"
  exit "$status"
} 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
