#!/usr/bin/env bash
# Issue 25 item 1, for the next lease: objective.chunk_rows (losses/fused.py chunked_softmax_loss: the output layer
# and its loss chunk by chunk, gradients formed in the forward pass, no N x V logits) against the default kernels on
# GPT-2-medium (bf16, compiled, 2 x 16 x 1,024 a micro-batch, the best setting so far), interleaved twice, then the
# largest micro-batch that the saved memory allows (1 x 32 x 1,024); MLE and AGG on each side. Everything lands in
# $OUT. Carry ".whl" (and ".base", below). ~6-8 min of device time.   bash scripts/device_bench_chunked.sh [CHUNK_ROWS]
set -uo pipefail
chunk=${1:-4096}
deadline=${DEADLINE:-480}  # seconds: a step that could not finish before it is skipped (the lease is 15 min in all)
. scripts/device_env.sh
# fits NEED: whether a step of up to NEED seconds ends before the deadline (else it says so and is skipped)
fits() { if (( SECONDS + $1 > deadline )); then echo "skipped at ${SECONDS}s (deadline ${deadline}s): $2" | tee -a "$OUT/device.txt"; return 1; fi; }
timeout 90 python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
objs=(mle "mle:chunk_rows=$chunk" agg "agg:chunk_rows=$chunk")
lm=(--models gpt2_medium --precision bf16 --steps 6 --warmup 3 --compile)
mkdir -p /tmp/bench
pack() { tar czf "$OUT/bench.tgz" -C /tmp/bench .; }  # after every bench: a call cut off still returns what finished
lm16() { fits 150 "lm-bs16-$1" && { timeout 150 python3 scripts/bench.py "${lm[@]}" --batch-size 16 --update-freq 2 \
  --objectives "${objs[@]}" --out /tmp/bench/lm-bs16-$1.json 2>&1 | grep -v USDT; pack; }; }
lm16 1
fits 150 lm-bs32 && { timeout 150 python3 scripts/bench.py "${lm[@]}" --batch-size 32 --update-freq 1 \
  --objectives "${objs[@]}" --out /tmp/bench/lm-bs32.json 2>&1 | grep -v USDT; pack; }
# the update-wide autocast context (commit after 0d9ffcd): MLE at the recipe's 4 x 8 x 1,024, eager, where the
# per-micro-batch weight casts weigh most, A/B against the code before it if carried as .base
# (here, before the call:  mkdir .base && git archive 0d9ffcd | tar -x -C .base; carry ".whl" and ".base")
if [ -d .base ]; then
  rec=(--models gpt2_medium --precision bf16 --steps 6 --warmup 3 --batch-size 8 --update-freq 4 --objectives mle)
  for r in 1 2; do
    for side in base new; do
      dir=$PWD; [ "$side" = base ] && dir=$PWD/.base
      fits 80 "recipe-$side-$r" || continue
      (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 80 python3 scripts/bench.py "${rec[@]}" \
        --out /tmp/bench/recipe-$side-$r.json) 2>&1 | grep -v USDT; pack
    done
  done
fi
lm16 2  # the second round of the chunked A/B, last: the first round and the autocast A/B come first
echo "done in ${SECONDS}s"
