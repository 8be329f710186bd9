#!/usr/bin/env bash
# Issue 25 item 1, for the next lease: the rewritten fused softmax losses (losses/fused.py, commit dea276c) A/B against
# the code before it, on GPT-2-medium (compiled, 16 x 1,024 a micro-batch: the best setting so far) and
# transformer_base (the recipe's 3 x 8,192), bf16, interleaved base/new twice; everything lands in $OUT.
# Before the call, here:  git worktree add .base dea276c~1  (or copy that commit's tree into .base/, git-ignored),
# then carry ".whl" and ".base". ~6 min of device time.
set -uo pipefail
. scripts/device_env.sh
timeout 60 python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
lm=(--models gpt2_medium --objectives mle agg ul ul_agg --precision bf16 --steps 6 --warmup 3 --batch-size 16 --update-freq 2 --compile)
mt=(--models transformer_base --objectives mle agg ul ul_agg --precision bf16 --steps 8 --warmup 3 --update-freq 3)
for r in 1 2; do
  for side in base new; do
    dir=$PWD; [ "$side" = base ] && dir=$PWD/.base
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 120 python3 scripts/bench.py "${lm[@]}" --out "$OUT/lm-$side-$r.json") 2>&1 | grep -v USDT
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 60 python3 scripts/bench.py "${mt[@]}" --out "$OUT/mt-$side-$r.json") 2>&1 | grep -v USDT
  done
done
(cd "$OUT" && tar czf bench.tgz *.json && rm -f *.json)  # $OUT brings back at most 8 files
echo done
