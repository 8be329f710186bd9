#!/usr/bin/env bash
# Issue 25 item 1, for the next lease: objective.chunk_rows (losses/fused.py chunked_softmax_loss: the output layer
# and its loss chunk by chunk, gradients formed in the forward pass, no N x V logits) against the default kernels on
# GPT-2-medium (bf16, compiled, 2 x 16 x 1,024 a micro-batch), MLE and AGG on each side. The fourth lease
# (2026-11-27, results/bench/gpu/README.md) measured it 1.065-1.086x slower than MLE: the chunk's cast, log-sum-exp,
# subtraction and exp were separate passes. The commit after e357598 forms the chunk's log-probabilities with one
# log_softmax kernel; this A/B compares it with the code before it, carried as .base, interleaved base, new, base,
# new. Before the call:  rm -rf .base && mkdir .base && git archive e357598 | tar -x -C .base
# then carry ".whl" and ".base". Everything lands in $OUT. ~5 min of device time, ~7 with the closing AGG profile.
# Usage: bash scripts/device_bench_chunked.sh [CHUNK_ROWS]     (DEADLINE=seconds: later steps are skipped, and said so)
set -uo pipefail
chunk=${1:-4096}
deadline=${DEADLINE:-480}  # seconds: a step that could not finish before it is skipped (the lease is 15 min in all)
[ -d .base ] || { echo "no .base: the A/B needs the code before the change carried as .base (see the header)"; exit 2; }
. scripts/device_env.sh
# fits NEED NAME: whether a step of up to NEED seconds ends before the deadline (else it says so and is skipped)
fits() { if (( SECONDS + $1 > deadline )); then echo "skipped at ${SECONDS}s (deadline ${deadline}s): $2" | tee -a "$OUT/device.txt"; return 1; fi; }
timeout 90 python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
objs=(mle "mle:chunk_rows=$chunk" agg "agg:chunk_rows=$chunk")
lm=(--models gpt2_medium --precision bf16 --steps 6 --warmup 3 --compile --batch-size 16 --update-freq 2)
mkdir -p /tmp/bench
pack() { tar czf "$OUT/bench.tgz" -C /tmp/bench .; }  # after every bench: a call cut off still returns what finished
for r in 1 2; do
  for side in base new; do
    dir=$PWD; [ "$side" = base ] && dir=$PWD/.base
    fits 150 "lm-$side-$r" || continue
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 150 python3 scripts/bench.py "${lm[@]}" --objectives "${objs[@]}" \
      --out /tmp/bench/lm-$side-$r.json) 2>&1 | grep -v USDT; pack
  done
done
# then, for AGG's 1.10x (target 1.05x): where its extra time goes, MLE and fused AGG side by side under the profiler
fits 130 profile-agg && { timeout 130 python3 scripts/bench.py "${lm[@]}" --objectives mle agg --profile 2 \
  --out /tmp/bench/profile-agg.json 2>&1 | grep -v USDT; pack; }
echo "done in ${SECONDS}s"
