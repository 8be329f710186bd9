#!/usr/bin/env bash
# Issue 25 item 1, for the next lease: the rewritten fused softmax losses (losses/fused.py, commit dea276c) A/B against
# the code before it, on GPT-2-medium (compiled, 16 x 1,024 a micro-batch: the best setting so far) and
# transformer_base (the recipe's 3 x 8,192), bf16, interleaved base/new twice; everything lands in $OUT.
# Before the call, here:  mkdir .base && git archive dea276c~1 | tar -x -C .base  (git-ignored; no nested .git),
# then carry ".whl" and ".base". ~6 min of device time.
set -uo pipefail
. scripts/device_env.sh
timeout 60 python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
lm=(--models gpt2_medium --objectives mle agg ul_agg --precision bf16 --steps 6 --warmup 3 --batch-size 16 --update-freq 2 --compile)
mt=(--models transformer_base --objectives mle agg ul ul_agg --precision bf16 --steps 8 --warmup 3 --update-freq 3)
mkdir -p /tmp/bench
pack() { tar czf "$OUT/bench.tgz" -C /tmp/bench .; }  # after every bench: $OUT brings back at most 8 files, and a
for r in 1 2; do                                       # call cut off by its limit still returns what finished
  [ "$r" = 2 ] && [ "$SECONDS" -gt 300 ] && { echo "round 2 skipped (${SECONDS}s used)"; break; }
  for side in base new; do
    dir=$PWD; [ "$side" = base ] && dir=$PWD/.base
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 110 python3 scripts/bench.py "${lm[@]}" --out /tmp/bench/lm-$side-$r.json) 2>&1 | grep -v USDT; pack
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 50 python3 scripts/bench.py "${mt[@]}" --out /tmp/bench/mt-$side-$r.json) 2>&1 | grep -v USDT; pack
  done
done
echo done
