#!/usr/bin/env bash
# Issue 25 item 1, second call of the 2026-11-26 lease: the translation task's host-side target rows (no device
# sync per micro-batch) A/B against the previous commit's code (carried in .base/, bench.py the same in both),
# interleaved base/new twice; then GPT-2-medium at its best setting (compiled, 16 x 1,024 a micro-batch); the GPU
# tests again after the TF32 fix. Everything lands in $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/device.txt"
timeout 60 python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
mt=(--models transformer_base --objectives mle agg ul --precision bf16 --steps 6 --warmup 3 --update-freq 3)
for r in 1 2; do
  (cd .base && PYTHONPATH=/tmp/site:$PWD timeout 60 python3 scripts/bench.py "${mt[@]}" --out "$OUT/mt-base-$r.json") 2>&1 | grep -v USDT
  PYTHONPATH=/tmp/site:$PWD timeout 80 python3 scripts/bench.py "${mt[@]}" --profile $((r == 1 ? 3 : 0)) \
    --out "$OUT/mt-new-$r.json" 2>&1 | grep -v USDT
done
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 scripts/bench.py --models gpt2_medium --objectives mle agg --precision bf16 \
  --steps 6 --warmup 3 --batch-size 16 --update-freq 2 --compile --out "$OUT/gpt2m-bs16-compile.json" 2>&1 | grep -v USDT
echo done
