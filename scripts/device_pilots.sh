#!/usr/bin/env bash
# Issue 23 pilots on a lent GPU (issue 25 lease), in fp32 (trainer.precision=fp32: the CPU's arithmetic; only the
# random streams and kernels differ): the Gao 2019 T1 lite pilot (AWD-LSTM on 100k WikiText-2 tokens, lr grid x
# {0.5, 1, 2, 4}, 12 epochs) and the Zaremba small regime check (docs/lite_v2.md section 5), side by side.
# results/pilots/<name>.{json,md}, the logs and the ledger records (no checkpoints) come back in $OUT.
# Run on the device machine from the repository root, carrying .whl and .data (see scripts/device_lite.sh).
# Usage: bash scripts/device_pilots.sh SECONDS [gao_zaremba|mt]   (mt: the MT lite pilot, docs/lite_v2.md section 5)
set -uo pipefail
secs=${1:-300}; which=${2:-gao_zaremba}
. scripts/device_env.sh
mkdir -p outputs/logs
start=$(date +%s)
if [ "$which" = mt ]; then
timeout -s INT -k 20 "$secs" python3 scripts/lite_pilot.py --name mt_base --parallel 4 --checks degenerates levelled \
  -- experiment=gao2019/transformer_base_en_de objective=mle trainer.precision=fp32 \
  > outputs/logs/pilot_mt_base.log 2>&1 &
else
timeout -s INT -k 20 "$secs" python3 scripts/lite_pilot.py --name gao2019_t1 --parallel 4 \
  --checks overfits levelled degenerates -- experiment=gao2019/awd_lstm_wt2 objective=mle \
  dataset.train_tokens=100000 trainer.max_epochs=12 trainer.finetune_epochs=0 trainer.precision=fp32 \
  > outputs/logs/pilot_gao2019_t1.log 2>&1 &
timeout -s INT -k 20 "$secs" python3 scripts/lite_pilot.py --name zaremba_small --factors 1 --parallel 1 \
  --checks overfits levelled -- experiment=zaremba2014/small objective=mle trainer.precision=fp32 \
  > outputs/logs/pilot_zaremba_small.log 2>&1 &
fi
wait
echo "pilots done after $(( $(date +%s) - start )) s" | tee -a "$OUT/device.txt"
for f in outputs/logs/pilot_*.log; do echo "== $f"; tail -n 15 "$f"; done
tar czf "$OUT/pilots.tgz" results/pilots outputs/logs/pilot_*.log outputs/logs/pilot-*
(cd outputs/runs && tar czf "$OUT/ledger.tgz" --exclude='checkpoint.pt' --exclude='best.pt' */)
ls -la "$OUT"
