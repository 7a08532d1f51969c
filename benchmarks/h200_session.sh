#!/usr/bin/env bash
# One GPU session: the test suite on CUDA, then every benchmark, then PPO with thousands of environments with each
# estimator. Run from the repository root on the GPU machine (see ../shared/device/README.md for the wheels);
# everything lands in $OUT/results.tgz (logs, JSON, markdown, CSV, PNG).
#
# STEPS picks steps (default: all, in this order): tests kernels estimators sb3 host ppo. All of them take about
# 14 minutes, the kernel benchmark about 6 of them (`python benchmarks/bench_kernels.py --plan` estimates it), so
# with a 10-minute limit per command run them in two calls, e.g.
#   STEPS=kernels OUT=$OUT bash benchmarks/h200_session.sh
#   STEPS="tests estimators sb3 host ppo" OUT=$OUT bash benchmarks/h200_session.sh
# QUICK=1 runs the kernel benchmark's --quick mode instead (about 2 minutes: five shapes, three algorithms, all
# implementations) and then estimates the full run from the times it measured.
set -uo pipefail
OUT=${OUT:-/tmp/out}
STEPS=${STEPS:-"tests kernels estimators sb3 host ppo"}
QUICK=${QUICK:-0}
R=$OUT/r
mkdir -p "$R/h200" "$R/examples"
export PYTHONUNBUFFERED=1
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt"
if has tests; then
  timeout 110 python -m pytest tests -q -n 8 -p no:cacheprovider > "$R/pytest_cuda.log" 2>&1
  tail -2 "$R/pytest_cuda.log"
fi
cd benchmarks
if has kernels; then
  if [[ "$QUICK" == 1 ]]; then
    timeout 240 python bench_kernels.py --quick --out "$R/h200" --name bench_kernels_quick \
      > "$R/bench_kernels_quick.log" 2>&1; tail -2 "$R/bench_kernels_quick.log"
    python bench_kernels.py --plan --calibrate "$R/h200/bench_kernels_quick.json" | tee "$R/bench_kernels_plan.txt"
  else
    # every algorithm, the full grid, float32 and bfloat16, with and without truncations; no cell starts after
    # 330 s (those left are recorded as not run); a SIGTERM from timeout still writes the JSON and the report
    timeout 420 python bench_kernels.py --budget-s 330 --out "$R/h200" > "$R/bench_kernels.log" 2>&1
    tail -2 "$R/bench_kernels.log"
  fi
fi
if has estimators; then
  timeout 60 python bench_estimators.py --B 4096 --T 128 --out "$R/h200" > "$R/bench_estimators.log" 2>&1
  tail -1 "$R/bench_estimators.log"
fi
if has sb3; then
  timeout 60 python bench_sb3.py --device cuda --out "$R/h200" > "$R/bench_sb3.log" 2>&1; tail -1 "$R/bench_sb3.log"
fi
if has host; then
  timeout 30 python host_overhead.py --B 4096 --T 128 > "$R/h200/host_overhead.json" 2> "$R/host_overhead.err"
  cat "$R/h200/host_overhead.json"
fi
cd ..
if has ppo; then
  for est in triton torchrl; do
    timeout 60 python examples/ppo_gymnasium.py --estimator "$est" --device cuda --num-envs 1024 --rollout-len 64 \
      --total-frames 524288 --minibatch-size 16384 --epochs 4 --lr 1e-3 --no-progress \
      --out "$R/examples/ppo_cuda_1024envs_$est" > "$R/examples/ppo_cuda_$est.log" 2>&1
    tail -3 "$R/examples/ppo_cuda_$est.log"
  done
fi
tar czf "$OUT/results.tgz" -C "$R" .
ls -la "$OUT"
