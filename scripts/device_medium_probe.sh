#!/usr/bin/env bash
# Issue 25 item 3, the first call of the next lease (~2 minutes): what would let a medium (650-unit) Inan 2017 row,
# 60-80 epochs of 1,328 updates, fit a 15-minute lease (docs/compute.md, "GPU leases"). One update of the medium
# VD-LSTM, fp32, batch 20 x 35, vocabulary 10,000, tokens ~ 1/rank (--zipf):
#   1. RE and REAL (chunked AL) alone, with the device's busy share (--profile: far below 1 = the host sets the pace);
#   2. the same with trainer.compile=true;
#   3. two RE benches at once on the one GPU: their tokens/s against one alone (what launch.gpus=[0,0] would give).
# Run from the repository root with .whl carried; everything lands in $OUT.
set -uo pipefail
. scripts/device_env.sh
export OMP_NUM_THREADS=2
b=(--zipf --models vd_lstm_medium --precision fp32 --vocab 10000 --batch-size 20 --bptt 35 --device cuda)
timeout 120 python3 scripts/bench.py "${b[@]}" --objectives re real:chunk_rows=1024 --steps 100 --warmup 10 --profile 20 \
  --out "$OUT/medium-eager.json" 2>&1 | grep -v USDT
timeout 180 python3 scripts/bench.py "${b[@]}" --objectives re real:chunk_rows=1024 --steps 100 --warmup 20 --compile \
  --out "$OUT/medium-compile.json" 2>&1 | grep -v USDT
for i in 1 2; do
  timeout 120 python3 scripts/bench.py "${b[@]}" --objectives re --steps 300 --warmup 10 --out "$OUT/medium-pair-$i.json" \
    > "$OUT/pair-$i.log" 2>&1 &
done
wait
grep -h "tok/s" "$OUT"/pair-*.log
echo done
