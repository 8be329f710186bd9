#!/usr/bin/env bash
# Issue 25 item 1, second lease: the GPU tests, then a profile of the training update (scripts/bench.py
# --profile) on GPT-2-medium and transformer_base, to diagnose the throughput targets the first lease missed.
# Run on the device machine from the repository root with .whl carried (scripts: ../shared/tools/device-wheels.sh);
# everything lands in $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/device.txt"
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" | tee -a "$OUT/device.txt"
timeout 120 python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -25 > "$OUT/gpu_tests.txt"; cat "$OUT/gpu_tests.txt"
common=(--precision bf16 --steps 6 --warmup 3)
timeout 200 python3 scripts/bench.py --models gpt2_medium --objectives mle agg ul "${common[@]}" --batch-size 8 \
  --update-freq 4 --profile 2 --out "$OUT/h100-gpt2_medium-profile.json" 2>&1 | grep -v USDT
timeout 60 python3 scripts/bench.py --models gpt2_medium --objectives mle "${common[@]}" --batch-size 16 \
  --update-freq 2 --out "$OUT/h100-gpt2_medium-bs16.json" 2>&1 | grep -v USDT
timeout 120 python3 scripts/bench.py --models transformer_base --objectives mle agg "${common[@]}" --update-freq 3 \
  --profile 3 --out "$OUT/h100-transformer_base-profile.json" 2>&1 | grep -v USDT
timeout 60 python3 scripts/bench.py --models transformer_base --objectives mle "${common[@]}" --update-freq 3 \
  --src-len 64 --tgt-len 64 --profile 3 --out "$OUT/h100-transformer_base-64tok.json" 2>&1 | grep -v USDT
echo done
