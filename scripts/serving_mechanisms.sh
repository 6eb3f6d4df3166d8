#!/usr/bin/env bash
# Each batch mechanism on its own against stock and AR, for the draft model and for the EAGLE-3 head,
# in one serving benchmark per concurrency level on fixture-x16-batch (continuous batching, closed
# loop, 256 new tokens): shared node budget (shared-n7), per-request depth (depth-1), segment
# admission (segment-7); EAGLE-3 at SGLang's defaults (eagle3-d5k4n7), each mechanism on it, and all
# three together (eagle3-all); and stock and AR attending over the whole cache (span-off, ar-span-off).
# Usage: scripts/serving_mechanisms.sh OUT [CONCURRENCY...]   (default: 8 32; writes OUT/c<C>/)
set -euo pipefail
out=${1:?usage: scripts/serving_mechanisms.sh OUT [CONCURRENCY...]}; shift
if [ $# -gt 0 ]; then levels=("$@"); else levels=(8 32); fi
s=scripts/systems
mkdir -p "$out"
for c in "${levels[@]}"; do
  python -m specpilot bench --deployment fixture-x16-batch --regime serving --concurrency "$c" \
    --requests-per-slot 2 --units 5 --max-new-tokens 256 --no-progress --out "$out/c$c" \
    --system stock --system $s/shared-n7.toml --system $s/depth-1.toml --system $s/segment-7.toml \
    --system $s/eagle3-d5k4n7.toml --system $s/eagle3-shared-n7.toml --system $s/eagle3-depth-1.toml \
    --system $s/eagle3-segment-7.toml --system $s/eagle3-all.toml --system $s/span-off.toml \
    --system $s/ar-span-off.toml
done
