#!/usr/bin/env bash
# Issue 27 on a lent GPU: the Inan 2017 small AL and REAL weight grids at paper (docs/fidelity.md; conf/sweep/
# inan2017_al_weight.yaml: alpha {30, 100, 300} x target_grad {official, none}, seed 101, 4 PTB epochs, one session),
# 12 runs, SLOTS at a time on the one GPU, in fp32 (the presets' precision: the config hashes are the CPU's, so
# `python scripts/choose_al_weight.py --objective al|real --runs-dir <the records>` applies the rule to them here).
# Time-boxed: runs still going at SECONDS get SIGTERM (checkpoint, "preempted"). Records (no weights) in ledger.tgz.
# Usage (carry .whl, .data):  bash scripts/device_al_grid.sh SECONDS [SLOTS]
set -uo pipefail
secs=${1:-500}; slots=${2:-6}
. scripts/device_env.sh
export OMP_NUM_THREADS=2
start=$(date +%s)
jobs_run=0
for obj in al real; do
  for alpha in 30 100 300; do
    for tg in official none; do
      left=$(( secs - ($(date +%s) - start) ))
      [ "$left" -le 30 ] && break 3
      timeout -s TERM -k 20 "$left" repdegen train +sweep=inan2017_al_weight scale=paper objective=$obj \
        objective.alpha=$alpha objective.target_grad=$tg seed=101 trainer.max_epochs=4 trainer.retrain_sessions=0 \
        trainer.progress=false > "/tmp/grid-$obj-$alpha-$tg.log" 2>&1 &
      jobs_run=$((jobs_run + 1))
      while [ "$(jobs -rp | wc -l)" -ge "$slots" ]; do sleep 2; done
    done
  done
done
wait
echo "grid: $jobs_run runs started, $(( $(date +%s) - start )) s" | tee -a "$OUT/device.txt"
tail -n 3 /tmp/grid-*.log > "$OUT/grid.log"
for obj in al real; do python3 scripts/choose_al_weight.py --objective $obj >> "$OUT/grid.log" 2>&1; done
tail -n 40 "$OUT/grid.log"
pack_ledger
