#!/usr/bin/env bash
# Each batch mechanism on its own, then together, against stock and AR in one serving benchmark per
# concurrency level on fixture-x16-batch (continuous batching, closed loop, 256 new tokens):
# shared node budget (shared-n7), per-request depth (depth-1), segment admission (segment-7),
# depth + segments (depth-seg), shared + depth (shared-n7-depth).
# Usage: scripts/serving_mechanisms.sh OUT [CONCURRENCY...]   (default: 8 32; about 4 min per level)
set -euo pipefail
out=${1:?usage: scripts/serving_mechanisms.sh OUT [CONCURRENCY...]}; shift
if [ $# -gt 0 ]; then levels=("$@"); else levels=(8 32); fi
mkdir -p "$out"
for c in "${levels[@]}"; do
  python -m specpilot bench --deployment fixture-x16-batch --regime serving --concurrency 1 "$c" \
    --requests-per-slot 2 --units 5 --max-new-tokens 256 --no-progress --out "$out/c$c" \
    --system stock --system scripts/systems/shared-n7.toml --system scripts/systems/depth-1.toml \
    --system scripts/systems/segment-7.toml --system scripts/systems/depth-seg.toml \
    --system scripts/systems/shared-n7-depth.toml
done
