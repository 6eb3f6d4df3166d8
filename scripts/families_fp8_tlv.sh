#!/usr/bin/env bash
# GPU checks of the Gemma/MoE, FP8, TLV and hybrid paths, each part under its own timeout so one failure
# or overrun costs only that part (all parts together exceed one 10-minute call: name those that fit);
# everything lands under $OUT:
#   gpu_tests.log   CUDA tests: the new families (Gemma ring cache, MoE grouped GEMMs), TLV and sampled
#                   rounds in graphs, the FP8 kernel against its reference on the device
#   fp8/            scripts/fp8_kernels.py (FP8 kernels vs byte floor, _scaled_mm, BF16; FP8 vs BF16 AR)
#   tlv_b1/         specpilot bench on fixture-x16: AR, stock, stock + TLV chains of 2 and 4
#   sampling/       scripts/sampling_speed.py on fixture-x16-eagle3 (T 0.7, top-p 0.95, greedy beside it): stock,
#                   and the stock tree on the fast paths
#   hybrid_ar/      scripts/hybrid_checks.py: fixture-hybrid-x16 AR vs its byte floor by step configuration ($HYBRID_STEPS,
#                   default the baseline and the fastest), profiled
#   fused/          draft_kernel = "fused" on the GPU: its lossless CUDA test, then scripts/round_kernels.py on fixture-x16
#                   (draft proposal and verify per system, kernel by kernel: stock and d6k8n64-compiled, each with and
#                   without the fused draft layers; $FUSED_SYSTEMS and $FUSED_TESTS (a pytest -k) narrow it)
#   round/          the round's kernels (issue 55): tests/gpu/test_rope_store_cuda.py (round_test), then
#                   scripts/round_kernels.py on fixture-x16 (stock, stock + rope_store), then specpilot bench
#                   (round_bench: AR, stock, stock + rope_store; 5 sets x 5 prompts x 128 tokens)
#   families/       scripts/families_checks.py (AR vs byte floor by step configuration and verify curves, random weights;
#                   top kernels)
#   hybrid_final/   specpilot bench on fixture-hybrid-x16: stock vs the loop's final system (scripts/systems/hybrid-final.toml)
#   loop_sampled/   scripts/loop_fixture.py on fixture-x16-eagle3-sampled, loop_hybrid/ on fixture-hybrid-x16: the
#                   loop in the time left before DEADLINE (seconds since the epoch; default: 585 s after the start)
#   times.txt       seconds per part
#   all.log         every part's log, one after another (`tail -n +1`); parts.tgz: the part folders (a device
#                   call returns at most 8 files: nothing else is left under $OUT)
#     bash scripts/families_fp8_tlv.sh COMMIT [PART ...]
#   PARTS: gpu_tests fp8 tlv_b1 sampling families fused round hybrid_final hybrid_ar loop_sampled loop_hybrid; default: gpu_tests fp8 tlv_b1 sampling families
set -u
DEADLINE=${DEADLINE:-$(( $(date +%s) + 585 ))}  # one device call: the loop parts take the time left before it
C=${1:-unknown}
shift || true
PARTS=" ${*:-gpu_tests fp8 tlv_b1 sampling families} "
run() {  # name timeout command... (parts X_test and X_bench run with part X)
  local name=$1 limit=$2; shift 2
  [[ "$PARTS" == *" $name "* || "$PARTS" == *" ${name%_test} "* || "$PARTS" == *" ${name%_bench} "* ]] || return 0
  local t0=$(date +%s)
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/times.txt"
}
export PYTHONUNBUFFERED=1
run gpu_tests 120 python -m pytest -q tests/gpu/test_families_cuda.py tests/gpu/test_new_paths_cuda.py \
  tests/kernels/test_fp8_gemm.py tests/kernels/test_fp8_dispatch.py -p no:cacheprovider
run fp8 170 python scripts/fp8_kernels.py --out "$OUT/fp8" --commit "$C" --rounds 1
run hybrid_final 200 python -m specpilot bench --deployment fixture-hybrid-x16 --system stock \
  --system scripts/systems/hybrid-final.toml --n-prompts 5 --max-new-tokens 512 --out "$OUT/hybrid_final" --no-progress
run tlv_b1 110 python -m specpilot bench --deployment fixture-x16 --system stock --system scripts/systems/tlv-2.toml \
  --system scripts/systems/tlv-4.toml --n-prompts 5 --max-new-tokens 128 --out "$OUT/tlv_b1" --no-progress
run hybrid_ar 150 python scripts/hybrid_checks.py --out "$OUT/hybrid_ar" --commit "$C" --skip ulp kernels --profile \
  --steps ${HYBRID_STEPS:-cublas+sdpa triton_bf16+split_kv+compiled+pdl}
run sampling 240 python scripts/sampling_speed.py --deployment fixture-x16-eagle3 --n-prompts 1 --max-new-tokens 256 \
  --out "$OUT/sampling" --commit "$C" --system stock --system scripts/systems/eagle3-d5k4n7-fast.toml
run fused_test 120 python -m pytest -q tests/gpu/test_engine_cuda.py -k "${FUSED_TESTS:-fused}" -p no:cacheprovider
run fused 240 python scripts/round_kernels.py --deployment fixture-x16 --out "$OUT/fused" --tokens 128 --reps 10 \
  --system ${FUSED_SYSTEMS:-stock scripts/systems/stock-fused.toml scripts/systems/d6k8n64-compiled.toml scripts/systems/d6k8n64-compiled-fused.toml}
run round_test 50 python -m pytest -q -s tests/gpu/test_rope_store_cuda.py -p no:cacheprovider
run round 120 python scripts/round_kernels.py --deployment fixture-x16 --out "$OUT/round" --tokens 128 --reps 10 \
  --system stock scripts/systems/stock-rope-store.toml
run round_bench 140 python -m specpilot bench --deployment fixture-x16 --system stock \
  --system scripts/systems/stock-rope-store.toml --n-prompts 5 --max-new-tokens 128 --out "$OUT/round_bench" --no-progress
run families 200 python scripts/families_checks.py --out "$OUT/families" --commit "$C" --kernels
loop() {  # name deployment: `loop_fixture.py` on the deployment in the time left before DEADLINE (<= 9 min)
  [[ "$PARTS" == *" $1 "* ]] || return 0
  local t0=$(date +%s) left=$(( DEADLINE - $(date +%s) - 25 ))
  local minutes=$(python -c "print(round(min(9.0, $left / 60), 2))")
  SPECPILOT_HOME=$(mktemp -d) timeout --signal=INT --kill-after=20 "$left" python scripts/loop_fixture.py \
    --deployment "$2" --out "$OUT/$1" --budget-minutes "$minutes" > "$OUT/$1.log" 2>&1
  echo "$1 rc=$? $(( $(date +%s) - t0 ))s budget ${minutes} min" | tee -a "$OUT/times.txt"
}
loop loop_sampled fixture-x16-eagle3-sampled
loop loop_hybrid fixture-hybrid-x16
rm -f "$OUT"/*/*.png
# a device call returns at most 8 files: the logs in one, the part folders in one archive
(cd "$OUT" && tail -n +1 times.txt ./*.log > all.log 2>/dev/null; tar czf parts.tgz --exclude='*.log' --exclude=parts.tgz ./*/ 2>/dev/null \
  && find . -mindepth 1 -maxdepth 1 ! -name parts.tgz ! -name all.log -exec rm -rf {} +)
