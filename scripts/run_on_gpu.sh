#!/usr/bin/env bash
# Run several GPU benchmark scripts in one device call, each under its own time limit, and pack
# everything they wrote into $OUT/results.tgz (the device returns at most 8 files).
#
#   bash scripts/run_on_gpu.sh COMMIT STEP:SECONDS [STEP:SECONDS ...]
#
# Steps: smoke, engine, engine-kernels, escape, w12, w12-shipped, fixture, guard, speed, noise, noise-both, loop, first. Each writes under
# /tmp/specpilot-results/<step>/ and logs to <step>.log there; a step that fails or runs out of
# time does not stop the next one. Unpack here with: tar xzf results.tgz -C results/
set -u
commit=$1; shift
res=/tmp/specpilot-results
mkdir -p "$res"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPECPILOT_COMMIT=$commit
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm,clocks.mem --format=csv > "$res/nvidia-smi.csv" 2>&1
# clocks, power and throttle reasons every 500 ms while the steps run (a kernel that is issue-bound
# rather than memory-bound slows with the SM clock; cuBLAS on these shapes does not)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 500 > "$res/clocks.csv" 2>&1 &
smi_pid=$!

for item in "$@"; do
  step=${item%%:*}; secs=${item##*:}
  out="$res/$step"; mkdir -p "$out"
  case $step in
    smoke)   cmd=(python scripts/gpu_smoke.py --out "$out") ;;
    engine)  cmd=(python scripts/engine_ar.py --out "$out" --commit "$commit" --skip kernels) ;;
    engine-kernels) cmd=(python scripts/engine_ar.py --out "$out" --commit "$commit" --skip hf curve) ;;
    escape)  cmd=(python scripts/w12_escape_cost.py --out "$out") ;;
    w12)     cmd=(python scripts/w12_kernels.py --out "$out" --budget-s "${W12_BUDGET_S:-$(( secs * 2 / 3 ))}" ${W12_EXTRA:-}) ;;
             # the 518e0bd sweep took 342 s of 351; d856760's 385 s of 373. After the budget each row times only its
             # heuristic config (a few seconds), so W12_BUDGET_S may go to about the limit less 100 s.
    w12-shipped) cmd=(python scripts/w12_kernels.py --out "$out" --shipped ${W12_EXTRA:-}) ;;  # the dispatcher's configs, no sweep
    fixture) cmd=(python tools/fixture_report.py --out "$out" --compile) ;;
    guard)   cmd=(python scripts/guard_report.py --deployment fixture --out "$out") ;;
    speed)   cmd=(python scripts/speed_fixture.py --out "$out" --overwrite --n-prompts 10 --max-new-tokens 512) ;;
    noise)   cmd=(python scripts/controller_noise.py --deployment fixture-x16 --out "$out" --blocks 12
                  --requests-per-block 2 --max-new-tokens 256 --variants default gc-during-requests --in-process) ;;
    noise-both) cmd=(python scripts/controller_noise.py --deployment fixture-x16 --out "$out" --placement both --blocks 12
                  --requests-per-block 2 --max-new-tokens 256 ${NOISE_EXTRA:-}) ;;
             # issue 9 on nvidia-h200-x2: arms alternating on one GPU and side by side on two, noise and cost of each;
             # on one GPU, NOISE_EXTRA="--devices cuda:0,cuda:0" checks the code path (the arms then contend)
    loop)    cmd=(python scripts/loop_fixture.py --deployment fixture-x16 --out "$out"
                  --budget-minutes "${LOOP_BUDGET_MINUTES:-8.5}" ${LOOP_EXTRA:-}) ;;
    first)   cmd=(python scripts/first_request.py --out "$out" --tag "${FIRST_TAG:-default}") ;;
    *) echo "unknown step $step" >&2; continue ;;
  esac
  echo "=== $step (limit ${secs}s): ${cmd[*]}"
  start=$(date +%s)
  timeout --signal=INT --kill-after=20 "$secs" "${cmd[@]}" > "$res/$step.log" 2>&1
  rc=$?
  echo "=== $step rc=$rc in $(( $(date +%s) - start ))s"
  tail -n 25 "$res/$step.log"
  if [ "$step" = w12 ]; then  # later steps of this call (engine-kernels) use the fresh tuned table,
    mkdir -p specpilot/kernels/tuned  # which the kernels read as tuned/<gpu>.json (the sweep writes tuned_<gpu>.json)
    for f in "$out"/tuned_*.json; do [ -f "$f" ] && cp "$f" "specpilot/kernels/tuned/$(basename "${f#"$out"/tuned_}")"; done
  fi
done
kill "$smi_pid" 2>/dev/null
echo "$commit" > "$res/commit.txt"
tar czf "$OUT/results.tgz" -C "$res" .
ls -la "$OUT"
