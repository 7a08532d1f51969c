#!/usr/bin/env bash
# One GPU session: the test suite on CUDA, then every benchmark, then PPO with thousands of environments with each
# estimator. Run from the repository root on the GPU machine (see ../shared/device/README.md for the wheels);
# everything lands in $OUT/results.tgz (logs, JSON, markdown, CSV, PNG).
#
# STEPS picks steps (default: tests kernels estimators sb3 host ppo; also rddiag, kerneltests, kerneltests1,
# kerneltests2, lean0, rslrl_tests, scale, hypothesis, peers, peers_ab, firstcall, rslrl, rslrl_ppo, ppo_gpu,
# ppo_gpu_recompute, ppo_gpu_65536, ablate_offsets, proto_misaligned, ncu, sweep, sweep_stages, sweep_time_major, ddp1,
# ddp2), run in this order: rddiag tests kerneltests kerneltests1 kerneltests2 lean0 rslrl_tests scale hypothesis sweep
# sweep_stages sweep_time_major ablate_offsets proto_misaligned ncu kernels estimators sb3 host peers peers_ab firstcall
# rslrl rslrl_ppo ppo_gpu ppo_gpu_recompute ppo_gpu_65536 ppo ddp1 ddp2.
# All of them take about 14 minutes, the kernel benchmark about 6 of them (`python benchmarks/bench_kernels.py
# --plan` estimates it), so with a 10-minute limit per command run them in two calls, e.g.
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
# has STEP: whether STEP is to run; a step that runs is logged with its start time in $R/steps.txt
has() { [[ " $STEPS " == *" $1 "* ]] && echo "$1 starts at ${SECONDS} s" >> "$R/steps.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt"
# where retrace_discrete read wrong (3 x 1000 at af85518; fixed in a10070b and 374af2f), under each of RD_VARIANTS
if has rddiag; then
  for v in ${RD_VARIANTS:-base nogroup loop}; do
    timeout ${RD_TIMEOUT:-40} python tools/diag_retrace_discrete.py $v 2>&1 | grep -v -i warn | tee -a "$R/rd_diag.log"
  done
fi
if has tests; then
  # -v names every result as it comes: a run stopped by its time limit still says which tests failed
  # (each failure's traceback goes to pytest_failures.log as it happens: the limit may stop the run before pytest's
  # summary)
  PYTEST_FAILURE_LOG="$R/pytest_failures.log" timeout ${TESTS_TIMEOUT:-260} python -m pytest tests -v \
    -n ${TEST_WORKERS:-8} -m "not gpu_scale" -p no:cacheprovider > "$R/pytest_cuda.log" 2>&1
  grep -E " (FAILED|ERROR) " "$R/pytest_cuda.log" | head -20; tail -1 "$R/pytest_cuda.log"
fi
# the files that test the kernels, the look-back mode's concurrent chunks included; kerneltests runs them all (about
# 2500 tests: more than 265 s at 14 workers on the H200), kerneltests1 and kerneltests2 each about half of them
KTESTS_1="tests/test_launch_modes.py tests/test_algorithms.py tests/test_scan.py tests/test_autograd.py"
KTESTS_2="tests/test_vtrace_retrace.py tests/test_traces_prefix.py tests/test_nonfinite.py tests/test_determinism.py
  tests/test_normalize.py tests/test_shifted.py"
for step in kerneltests kerneltests1 kerneltests2; do
  if has $step; then
    case $step in kerneltests) files="$KTESTS_1 $KTESTS_2" ;; kerneltests1) files=$KTESTS_1 ;; *) files=$KTESTS_2 ;; esac
    # shellcheck disable=SC2086  # the file lists split into words on purpose
    timeout ${KTESTS_TIMEOUT:-240} python -m pytest $files -v -n 14 -p no:cacheprovider ${KTESTS_K:+-k "$KTESTS_K"} \
      > "$R/pytest_${step}_cuda.log" 2>&1
    grep -E " (FAILED|ERROR) " "$R/pytest_${step}_cuda.log" | head -20; tail -1 "$R/pytest_${step}_cuda.log"
  fi
done
if has lean0; then  # the kernel test files once more with the lean launcher and launch plans switched off
  RL_TRITON_TORCHRL_LEAN_LAUNCH=0 timeout ${LEAN0_TIMEOUT:-200} python -m pytest tests/test_algorithms.py \
    tests/test_vtrace_retrace.py tests/test_traces_prefix.py tests/test_scan.py tests/test_launch_modes.py \
    tests/test_launch_config.py tests/test_shifted.py tests/test_nonfinite.py -q -n 14 -p no:cacheprovider \
    > "$R/pytest_lean0_cuda.log" 2>&1
  grep -E "(FAILED|ERROR) " "$R/pytest_lean0_cuda.log" | head -20; tail -1 "$R/pytest_lean0_cuda.log"
fi
if has rslrl_tests; then  # needs rsl-rl-lib (carried as wheels)
  timeout 150 python -m pytest tests/test_rsl_rl.py tests/test_shifted.py tests/test_gpu_envs.py tests/test_normalize.py \
    -q -n 8 -p no:cacheprovider > "$R/pytest_rsl_rl_cuda.log" 2>&1
  grep -E "(FAILED|ERROR) " "$R/pytest_rsl_rl_cuda.log" | head -20; tail -1 "$R/pytest_rsl_rl_cuda.log"
fi
if has scale; then  # > 2^31 elements, 2^22 steps, peak memory (GPU-only tests, one process: they need the memory)
  timeout 150 python -m pytest tests/test_scale.py -m gpu_scale -q -s -p no:cacheprovider > "$R/pytest_scale.log" 2>&1
  tail -3 "$R/pytest_scale.log"
fi
if has hypothesis; then  # the property tests with many more examples, on the GPU kernels
  HYPOTHESIS_EXAMPLES=${HYPOTHESIS_EXAMPLES:-400} timeout 140 python -m pytest tests/test_properties.py -q -n 8 \
    -p no:cacheprovider > "$R/pytest_hypothesis.log" 2>&1
  tail -2 "$R/pytest_hypothesis.log"
fi
cd benchmarks
if has sweep; then  # launch configurations per shape (feeds scan.launch_config)
  timeout ${SWEEP_TIMEOUT:-330} python sweep_configs.py --preset ${SWEEP_PRESETS:-long,large,short} \
    --budget-s ${SWEEP_BUDGET:-280} --algorithms ${SWEEP_ALGORITHMS:-gae,vtrace,discounted_return} \
    --name ${SWEEP_NAME:-sweep_configs} ${SWEEP_ARGS:-} --out "$R/h200" > "$R/${SWEEP_NAME:-sweep_configs}.log" 2>&1
  tail -30 "$R/h200/${SWEEP_NAME:-sweep_configs}.md"
fi
if has sweep_stages; then  # software-pipelined chunk loops (NUM_STAGES) on the large rollouts' row tiles
  timeout ${SWEEP_ST_TIMEOUT:-240} python sweep_configs.py --preset stages \
    --algorithms ${SWEEP_ST_ALGORITHMS:-gae,vtrace,td_lambda,discounted_return} --budget-s ${SWEEP_ST_BUDGET:-200} \
    --name sweep_stages --out "$R/h200" > "$R/sweep_stages.log" 2>&1
  tail -20 "$R/h200/sweep_stages.md"
fi
if has sweep_time_major; then  # time-major storage (rsl_rl's [T, N, 1]): narrow time tiles against whole-T tiles
  timeout ${SWEEP_TM_TIMEOUT:-300} python sweep_configs.py --preset time_major \
    --algorithms ${SWEEP_TM_ALGORITHMS:-gae,vtrace} --budget-s ${SWEEP_TM_BUDGET:-240} \
    --name sweep_time_major --out "$R/h200" > "$R/sweep_time_major.log" 2>&1
  tail -20 "$R/h200/sweep_time_major.md"
fi
if has ablate_offsets; then  # each kernel with int32 and with int64 offsets (sets scan.INT32_KERNELS)
  timeout ${ABLATE_TIMEOUT:-500} python ablate_kernels.py --variants base,i32,i64 \
    --algorithms gae,td_lambda,vtrace,retrace,discounted_return,eligibility_traces,episodic_prefix_sum \
    ${ABLATE_ARGS:-} --out "$R/h200" > "$R/ablate_offsets.log" 2>&1
  tail -45 "$R/ablate_offsets.log"
fi
if has proto_misaligned; then  # misaligned rows (T no multiple of 4): three prototype kernels against ours
  timeout ${PROTO_TIMEOUT:-150} python proto_misaligned.py --out "$R/h200" > "$R/proto_misaligned.log" 2>&1
  tail -14 "$R/h200/proto_misaligned.md"
fi
if has ncu; then  # hardware counters of every kernel at NCU_SHAPE, float32 then bfloat16 (what bounds each)
  ncu_shapes=${NCU_SHAPE:-65536x512}
  ncu_algos=${NCU_ALGORITHMS:-gae,td_lambda,vtrace,retrace,discounted_return,eligibility_traces,episodic_prefix_sum}
  for dt in float32 bfloat16; do
    timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis -k regex:_fwd_kernel python ablate_kernels.py --worker base --once \
      --dtype $dt --shapes $ncu_shapes --algorithms $ncu_algos > "$R/h200/ncu_$dt.txt" 2>&1
    python ../tools/ncu_summary.py "$R/h200/ncu_$dt.txt" --shapes $ncu_shapes --algorithms $ncu_algos \
      | tee "$R/h200/ncu_${dt}_summary.md"
  done
fi
if has kernels; then
  if [[ "$QUICK" == 1 ]]; then
    timeout 240 python bench_kernels.py --quick --out "$R/h200" --name bench_kernels_quick \
      > "$R/bench_kernels_quick.log" 2>&1; tail -2 "$R/bench_kernels_quick.log"
    python bench_kernels.py --plan --calibrate "$R/h200/bench_kernels_quick.json" | tee "$R/bench_kernels_plan.txt"
  else
    # every algorithm, the full grid, float32 and bfloat16, with and without truncations; no cell starts after
    # 330 s (those left are recorded as not run); a SIGTERM from timeout still writes the JSON and the report
    timeout ${KERNELS_TIMEOUT:-420} python bench_kernels.py --budget-s ${KERNELS_BUDGET:-330} ${KERNELS_ARGS:-} --out "$R/h200" \
      > "$R/bench_kernels.log" 2>&1
    tail -2 "$R/bench_kernels.log"
  fi
fi
if has estimators; then  # eager, torch.compile and CudaGraphModule calls
  timeout 120 python bench_estimators.py --B 4096 --T 128 --modes eager,cudagraph --out "$R/h200" \
    > "$R/bench_estimators.log" 2>&1
  tail -1 "$R/bench_estimators.log"
  timeout 200 python bench_estimators.py --B 4096 --T 128 --modes compile --name bench_estimators_compile \
    --out "$R/h200" > "$R/bench_estimators_compile.log" 2>&1
  tail -1 "$R/bench_estimators_compile.log"
fi
if has sb3; then
  timeout 60 python bench_sb3.py --device cuda --out "$R/h200" > "$R/bench_sb3.log" 2>&1; tail -1 "$R/bench_sb3.log"
fi
if has host; then
  timeout 60 python host_overhead.py --B 4096 --T 128 > "$R/h200/host_overhead.json" 2> "$R/host_overhead.err"
  cat "$R/h200/host_overhead.json"
fi
if has peers; then  # ours vs rl-triton vs PufferLib (RL_TRITON_SRC, PUFFERLIB_EXT: folders carried in .peers/)
  RL_TRITON_SRC=${RL_TRITON_SRC:-$PWD/../.peers/rl_triton_src} PUFFERLIB_EXT=${PUFFERLIB_EXT:-$PWD/../.peers/pufferlib} \
    timeout ${PEERS_TIMEOUT:-540} python bench_peers.py --budget-s ${PEERS_BUDGET:-420} ${PEERS_ARGS:-} --out "$R/h200" \
    > "$R/bench_peers.log" 2>&1
  tail -40 "$R/bench_peers.log"
fi
if has peers_ab; then  # ours under each of AB_VARIANTS (ablate_kernels.py's) against the peers, base first, AB_ROUNDS
  # times (about 80 s a run); default: the one-row tiles (warpst_vtshift) and retrace_discrete's grouped reads (nogroup)
  i=0
  for _ in $(seq ${AB_ROUNDS:-1}); do
    for v in base ${AB_VARIANTS:-warpst_vtshift nogroup}; do
      i=$((i + 1))
      RL_TRITON_SRC=${RL_TRITON_SRC:-$PWD/../.peers/rl_triton_src} timeout ${AB_TIMEOUT:-100} python bench_peers.py \
        --parts release --variant $v --budget-s ${AB_BUDGET:-85} \
        --algorithms ${AB_ALGORITHMS:-gae,vtrace,retrace_discrete,eligibility_traces} \
        --release-shapes ${AB_SHAPES:-64x512,128x1024,256x1024,512x512,512x2048,4096x128,16384x512} \
        --name bench_peers_ab_${i}_$v --out "$R/h200" > "$R/bench_peers_ab_${i}_$v.log" 2>&1
      tail -1 "$R/bench_peers_ab_${i}_$v.log"
    done
  done
fi
if has firstcall; then  # a fresh process's first call, Triton's cache filled, with and without prewarm
  timeout 200 python first_call_host.py --setup-s 0,1 --repeats 3 --out "$R/h200" > "$R/first_call_host.log" 2>&1
  tail -6 "$R/first_call_host.log"
fi
if has rslrl; then  # rsl_rl's compute_returns against ours
  timeout 240 python bench_rsl_rl.py --device cuda --out "$R/h200" > "$R/bench_rsl_rl.log" 2>&1
  tail -12 "$R/bench_rsl_rl.log"
fi
cd ..
if has rslrl_ppo; then  # rsl_rl's OnPolicyRunner on the GPU CartPole, its PPO vs ours, over RSL_SEEDS seeds
  timeout 300 python examples/compare_curves.py --example rsl_rl --seeds ${RSL_SEEDS:-2} --device cuda \
    --out "$R/examples/compare_rsl_rl_cuda" ${RSL_ARGS:-} > "$R/examples/compare_rsl_rl_cuda.log" 2>&1
  tail -14 "$R/examples/compare_rsl_rl_cuda.log"
fi
if has ppo_gpu; then  # PPO with the environments on the GPU (TorchRL stack), both estimators, over PPO_GPU_SEEDS seeds
  timeout 300 python examples/compare_curves.py --example ppo_gpu --seeds ${PPO_GPU_SEEDS:-2} --device cuda \
    --out "$R/examples/compare_ppo_gpu_cuda" ${PPO_GPU_ARGS:-} > "$R/examples/compare_ppo_gpu_cuda.log" 2>&1
  tail -14 "$R/examples/compare_ppo_gpu_cuda.log"
fi
if has ppo_gpu_recompute; then  # the same with the advantages recomputed by the current critic before every epoch
  timeout 300 python examples/compare_curves.py --example ppo_gpu --seeds ${PPO_GPU_SEEDS:-2} --device cuda \
    --recompute-advantage --out "$R/examples/compare_ppo_gpu_recompute_cuda" ${PPO_GPU_ARGS:-} \
    > "$R/examples/compare_ppo_gpu_recompute_cuda.log" 2>&1
  tail -14 "$R/examples/compare_ppo_gpu_recompute_cuda.log"
fi
if has ppo_gpu_65536; then  # 65536 environments, one seed, recomputing (16 iterations of 2M frames)
  timeout 300 python examples/compare_curves.py --example ppo_gpu --seeds 1 --device cuda --num-envs 65536 \
    --total-frames 33554432 --minibatch-size 65536 --recompute-advantage \
    --out "$R/examples/compare_ppo_gpu_65536envs_cuda" > "$R/examples/compare_ppo_gpu_65536envs_cuda.log" 2>&1
  tail -14 "$R/examples/compare_ppo_gpu_65536envs_cuda.log"
fi
if has ppo; then  # CartPole with 4096 environments on Gymnasium's native vector env, networks on the GPU: both
  # estimators over PPO_SEEDS seeds (curves, table, per-iteration time breakdown in each run's progress.csv)
  timeout 400 python examples/compare_curves.py --seeds ${PPO_SEEDS:-2} --out "$R/examples/compare_ppo_cuda_4096envs" \
    --device cuda --num-envs 4096 --rollout-len 32 --epochs 4 --minibatch-size 16384 --lr 2.5e-3 \
    --total-frames ${PPO_FRAMES:-4000000} --return-window 200 --no-progress > "$R/examples/compare_ppo_cuda.log" 2>&1
  tail -12 "$R/examples/compare_ppo_cuda.log"
fi
if has ddp1; then  # the data-parallel example on one GPU: the baseline of its scaling efficiency
  NCCL_NVLS_ENABLE=0 timeout 200 python -m torch.distributed.run --standalone --nproc_per_node=1 examples/ppo_ddp.py \
    --device cuda --num-envs 4096 --rollout-len 32 --epochs 4 --minibatch-size 16384 --lr 2.5e-3 \
    --total-frames ${DDP_FRAMES:-4000000} --return-window 200 --no-progress --out "$R/examples/ddp_1gpu" \
    > "$R/examples/ddp_1gpu.log" 2>&1
  tail -3 "$R/examples/ddp_1gpu.log"
fi
if has ddp2; then  # two GPUs (nvidia-h200-x2), the same per-rank configuration, twice the frames
  NCCL_NVLS_ENABLE=0 timeout 300 python -m torch.distributed.run --standalone --nproc_per_node=2 examples/ppo_ddp.py \
    --device cuda --num-envs 4096 --rollout-len 32 --epochs 4 --minibatch-size 16384 --lr 2.5e-3 \
    --total-frames ${DDP_FRAMES:-8000000} --return-window 200 --checkpoint "$R/examples/ddp_2gpu/checkpoint.pt" \
    --no-progress --out "$R/examples/ddp_2gpu" > "$R/examples/ddp_2gpu.log" 2>&1
  tail -3 "$R/examples/ddp_2gpu.log"
  rm -f "$R/examples/ddp_2gpu/checkpoint.pt"
fi
echo "end at ${SECONDS} s" >> "$R/steps.txt"
tar czf "$OUT/results.tgz" -C "$R" .
ls -la "$OUT"
