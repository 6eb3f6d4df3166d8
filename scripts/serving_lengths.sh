#!/usr/bin/env bash
# Does the EAGLE-3 switch's gain over n16 depend on output length? The loop times continuous
# deployments in requests of 128 new tokens (`Timing.SCALED`); the serving benchmark used 256.
# One serving benchmark per length on fixture-x16-batch at concurrency 8: AR, n16 (the loop's
# promotion), the loop's EAGLE-3 candidate (eagle3-n16-segment-16) and the hand-picked
# eagle3-d6k4n16-segment-7.
# Usage: scripts/serving_lengths.sh OUT [TOKENS...]   (default: 128 512; writes OUT/t<TOKENS>/)
set -euo pipefail
out=${1:?usage: scripts/serving_lengths.sh OUT [TOKENS...]}; shift
if [ $# -gt 0 ]; then lengths=("$@"); else lengths=(128 512); fi
s=scripts/systems
mkdir -p "$out"
for t in "${lengths[@]}"; do
  python -m specpilot bench --deployment fixture-x16-batch --regime serving --concurrency 8 \
    --requests-per-slot 2 --units 5 --max-new-tokens "$t" --no-progress --out "$out/t$t" \
    --system $s/n16.toml --system $s/eagle3-n16-segment-16.toml --system $s/eagle3-d6k4n16-segment-7.toml
done
