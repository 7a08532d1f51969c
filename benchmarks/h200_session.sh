#!/usr/bin/env bash
# One GPU session: the test suite on CUDA, then every benchmark, then PPO with thousands of environments with each
# estimator. Run from the repository root on the GPU machine (see ../shared/device/README.md for the wheels);
# everything lands in $OUT/results.tgz (logs, JSON, markdown, CSV, PNG).
set -uo pipefail
OUT=${OUT:-/tmp/out}
R=$OUT/r
mkdir -p "$R/h200" "$R/examples"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt"
timeout 110 python -m pytest tests -q -n 8 -p no:cacheprovider > "$R/pytest_cuda.log" 2>&1
tail -2 "$R/pytest_cuda.log"
cd benchmarks
timeout 140 python bench_kernels.py --algos gae,td_lambda,vtrace,retrace,discounted_return,eligibility_traces,episodic_prefix_sum \
  --out "$R/h200" > "$R/bench_kernels.log" 2>&1; tail -1 "$R/bench_kernels.log"
timeout 60 python bench_estimators.py --B 4096 --T 128 --out "$R/h200" > "$R/bench_estimators.log" 2>&1; tail -1 "$R/bench_estimators.log"
timeout 60 python bench_sb3.py --device cuda --out "$R/h200" > "$R/bench_sb3.log" 2>&1; tail -1 "$R/bench_sb3.log"
timeout 30 python host_overhead.py --B 4096 --T 128 > "$R/h200/host_overhead.json" 2> "$R/host_overhead.err"; cat "$R/h200/host_overhead.json"
cd ..
for est in triton torchrl; do
  timeout 60 python examples/ppo_gymnasium.py --estimator "$est" --device cuda --num-envs 1024 --rollout-len 64 \
    --total-frames 524288 --minibatch-size 16384 --epochs 4 --lr 1e-3 --no-progress \
    --out "$R/examples/ppo_cuda_1024envs_$est" > "$R/examples/ppo_cuda_$est.log" 2>&1
  tail -3 "$R/examples/ppo_cuda_$est.log"
done
tar czf "$OUT/results.tgz" -C "$R" .
ls -la "$OUT"
