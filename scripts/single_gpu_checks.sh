#!/usr/bin/env bash
# The single-GPU measurements of the loop issue's targets, in one GPU call (about 6-7 minutes on an
# H100 or H200), each in its own process and its own SPECPILOT_HOME (no tuned table: what a fresh
# install runs):
#   OUT/ar     AR of the 8B-shaped model by step configuration against its byte floor
#              (engine_ar.py: cuBLAS + SDPA, and Triton BF16 + split-KV + compiled + PDL);
#   OUT/eager  W12 projections called eagerly vs captured in a CUDA graph (w12_eager.py);
#   OUT/bench  fixture-x16's 128-node tree on W12 against the same tree on cuBLAS (specpilot bench,
#              6 prompts per set, 256 new tokens, EOS ignored).
# Plots are left out (files come back from the GPU machine by count). The results are committed
# as results/engine/steps, results/w12/eager and results/w12/tree128 (H200) or their _h100 twins.
# Usage: scripts/single_gpu_checks.sh OUT COMMIT
set -uo pipefail
out=${1:?usage: scripts/single_gpu_checks.sh OUT COMMIT}
commit=${2:?usage: scripts/single_gpu_checks.sh OUT COMMIT}
mkdir -p "$out"
nvidia-smi --query-gpu=name --format=csv,noheader
SPECPILOT_HOME=$(mktemp -d) timeout 280 python scripts/engine_ar.py --out "$out/ar" --commit "$commit" \
  --skip hf curve kernels attention --steps cublas+sdpa triton_bf16+split_kv+compiled+pdl 2>&1 | tail -4
SPECPILOT_HOME=$(mktemp -d) timeout 100 python scripts/w12_eager.py --out "$out/eager" --commit "$commit" 2>&1 | tail -14
s=scripts/systems
SPECPILOT_HOME=$(mktemp -d) timeout 200 python -m specpilot bench --deployment fixture-x16 \
  --system $s/tree-d7k8n128.toml --system $s/tree-d7k8n128-w12.toml --n-prompts 6 --max-new-tokens 256 \
  --ignore-eos --no-progress --out "$out/bench" 2>&1 | tail -12
rm -f "$out"/*/*.png
ls -R "$out"
