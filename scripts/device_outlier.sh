#!/usr/bin/env bash
# Issue 25 (the lease of 2026-11-26b): one inan2016_t2 lite cell on the GPU had test PPL 290.7 against 224.2 on
# validation, in fp32 (results/device/README.md, third lease). This reruns the table's 6 lite cells on the GPU (fp32,
# TF32 off: their presets' precision), keeps their weights here, and reads each cell's validation and test PPL at
# batch 1 (one unbroken stream: the test pass of the table) and batch 50 (the validation pass), with the largest
# carried state (scripts/eval_batches.py --trace-state) -> $OUT/eval_batches.json; records in $OUT/ledger.tgz.
# Usage (carry .whl, .data):  bash scripts/device_outlier.sh SECONDS
set -uo pipefail
secs=${1:-300}
. scripts/device_env.sh
export OMP_NUM_THREADS=2
start=$(date +%s)
timeout -s INT -k 30 "$secs" repdegen table table=inan2016_t2 scale=lite "launch.gpus=[0,0,0,0,0,0]" \
  progress=false > "$OUT/table.log" 2>&1
echo "table run: rc=$? after $(( $(date +%s) - start )) s" | tee -a "$OUT/device.txt"
runs=$(python3 - <<'PY'
import json, pathlib
for r in sorted(pathlib.Path("outputs/runs").glob("*/result.json")):
    rec = json.loads(r.read_text())
    if rec.get("status") == "complete" and rec["config"]["dataset"].get("kind") == "lm":
        print(r.parent)
PY
)
python3 scripts/eval_batches.py $runs --device cuda --batches 1 50 --trace-state --out "$OUT/eval_batches.json" \
  2>&1 | tee "$OUT/eval_batches.log"
# the same with cuDNN's TF32 on (its default outside the trainer), in case the outlier needs it
python3 scripts/eval_batches.py $runs --device cuda --batches 1 --splits test --tf32 --out "$OUT/eval_batches_tf32.json" \
  2>&1 | tee -a "$OUT/eval_batches.log"
pack_ledger
ls -la "$OUT"
