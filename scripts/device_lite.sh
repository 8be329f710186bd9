#!/usr/bin/env bash
# Issue 25 item 2: the lite tables on the lent GPU, several cells side by side on the one GPU
# (launch.gpus=[0,0,...]: each slot is the same device), time-boxed; the finished cells' ledger records
# (result.json, cell.yaml, train.log, analysis/, no checkpoints) come back in $OUT/ledger.tgz to be
# compared cell by cell with the CPU ledger (scripts/compare_device_cells.py).
# Run on the device machine from the repository root, carrying .whl (../shared/tools/device-wheels.sh) and
# .data (a copy of ../shared/data: ptb, wikitext-2, word-sim).
# Usage: bash scripts/device_lite.sh SECONDS SLOTS TABLES
# Other scales and single rows (issue 25 item 3: a paper cell alone, continued by a second call on the warm machine,
# whose ledger stays between calls):  SCALE=paper ROWS='["Medium (650 units) / VD-LSTM"]' bash scripts/device_lite.sh 540 1 inan2017_t1
# Across leases (scripts/lease_carry.py): CARRY_IN=.carry/<name> (or several, space-separated) unpacks each carried pack
# into outputs/runs first (its manifest and every part carried in earlier calls of this lease); CARRY_OUT=1 packs the cells left unfinished into
# outputs/carry afterwards and puts parts 1-4 in $OUT (then: python3 scripts/lease_carry.py emit outputs/carry "$OUT" 5 6 7 8).
# EXTRA: more overrides of every cell's training config, space-separated (run control only, e.g. trainer.compile=true:
# an override that changes the experiment changes the cells' hashes, and carried cells would start again).
set -uo pipefail
secs=${1:-450}; slots=${2:-6}; tables=${3:-yu2022_t1}; scale=${SCALE:-lite}
rows=(); [ -n "${ROWS:-}" ] && rows=("rows=$ROWS")
read -r -a extra <<< "${EXTRA:-}"
. scripts/device_env.sh
export OMP_NUM_THREADS=2
gpus=$(python3 -c "print('[' + ','.join(['0'] * $slots) + ']')")
for pack in ${CARRY_IN:-}; do python3 scripts/lease_carry.py unpack "$pack" --runs outputs/runs || exit 1; done
start=$(date +%s)
timeout -s INT -k 30 "$secs" repdegen table "table=$tables" "scale=$scale" "launch.gpus=$gpus" "${rows[@]}" \
  "${extra[@]}" progress=false > "$OUT/table.log" 2>&1
echo "table run: rc=$? after $(( $(date +%s) - start )) s" | tee -a "$OUT/device.txt"
tail -40 "$OUT/table.log"
pack_ledger
if [ -n "${CARRY_OUT:-}" ]; then
  rm -rf outputs/carry
  python3 scripts/lease_carry.py pack --unfinished outputs/runs --dir outputs/carry \
    && [ -f outputs/carry/manifest.json ] && python3 scripts/lease_carry.py emit outputs/carry "$OUT" --first 4
fi
ls -la "$OUT"
