#!/usr/bin/env bash
# Issue 25 item 3, optional (~3-4 minutes; run only when a lease has time left after the medium rows): does
# torch.compile's reduce-overhead mode (CUDA graphs: the host launches one graph instead of each kernel) speed up the
# host-bound medium VD-LSTM update on the GPU? The 2026-11-29 probe measured the device busy only 35-46 % of the wall
# and the default compile mode 1.12-1.21x slower than eager (results/bench/gpu/README.md). One bench of RE and REAL
# (chunked AL, 1,024 rows), eager against trainer.compile_mode=reduce-overhead, 100 timed updates after 30 warm-up
# (graph recording happens in the warm-up); then the GPU test that six consecutive updates under the mode give eager's
# losses and weights (the hidden state carried from one update to the next is an output of the graph, which the next
# replay overwrites). A cell uses the mode only if both say so.
# Run from the repository root with .whl carried; everything lands in $OUT.
set -uo pipefail
. scripts/device_env.sh
export OMP_NUM_THREADS=2
b=(--zipf --models vd_lstm_medium --precision fp32 --vocab 10000 --batch-size 20 --bptt 35 --device cuda
   --objectives re real:chunk_rows=1024 --steps 100 --warmup 30)
timeout 90 python3 scripts/bench.py "${b[@]}" --out "$OUT/medium-eager.json" 2>&1 | grep -v USDT
timeout 240 python3 scripts/bench.py "${b[@]}" --compile --compile-mode reduce-overhead \
  --out "$OUT/medium-reduce-overhead.json" > "$OUT/reduce-overhead.log" 2>&1
echo "reduce-overhead: rc=$?"; grep -v USDT "$OUT/reduce-overhead.log" | tail -15
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k reduce_overhead 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
echo done
