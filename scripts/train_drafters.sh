#!/usr/bin/env bash
# Train the fixture's DFlash drafter and EAGLE-3 head side by side on one GPU, install them into
# specpilot/data/fixture/{dflash,eagle3}, and measure acceptance at x1 on the five benchmark sets
# beside the draft model. Usage: scripts/train_drafters.sh OUT [MINUTES]
# The sequences are generated once and read by both; DFLASH_ARGS adds train_dflash.py options.
set -euo pipefail
out=${1:?usage: scripts/train_drafters.sh OUT [MINUTES]}; minutes=${2:-3}
mkdir -p "$out"
python tools/train_dflash.py --out "$out/data" --data "$out/sequences.pt" --data-only > "$out/data.log" 2>&1
python tools/train_dflash.py --out "$out/dflash-run" --data "$out/sequences.pt" --minutes "$minutes" ${DFLASH_ARGS:-} \
  > "$out/train-dflash.log" 2>&1 &
a=$!
python tools/train_eagle3.py --out "$out/eagle3-run" --data "$out/sequences.pt" --minutes "$minutes" > "$out/train-eagle3.log" 2>&1 &
b=$!
wait $a; wait $b
rm -f "$out/sequences.pt"
for k in dflash eagle3; do
  rm -rf "specpilot/data/fixture/$k"; cp -r "$out/$k-run/$k" "specpilot/data/fixture/$k"
  cp "$out/$k-run/training_log.json" "specpilot/data/fixture/$k/training_log.json"
done
python -m specpilot bench --deployment fixture-dflash --no-progress --out "$out/bench-x1" \
  --system stock --system scripts/systems/ddtree-b32.toml --system scripts/systems/ddtree-b64.toml \
  --system scripts/systems/spine-b32.toml --system scripts/systems/model-d5k4n7.toml \
  --system scripts/systems/eagle3-d5k4n7.toml --system scripts/systems/eagle3-d6k4n16.toml \
  --system scripts/systems/eagle3-d6k1n6.toml --n-prompts 3 --max-new-tokens 384
