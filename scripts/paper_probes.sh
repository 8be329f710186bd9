#!/usr/bin/env bash
# Probes outside the paper tables, run on this CPU after the queue of scripts/paper_lanes.sh (each on every core, one
# at a time; each resumes from its last checkpoint when run again):
#   nohup bash -c 'bash scripts/paper_lanes.sh S && bash scripts/paper_probes.sh' >> outputs/logs/laneS.log 2>&1 &
# Declared before they run, with what each tests and how its result is used: results/tables/inan2016_t1/NOTES.md,
# "Probes outside the table". They never enter a table: the tables' seeds, rows and verdicts stay as registered.
# Their records stay in the ledger (outputs/runs/<hash>/: repdegen status --all); what they gave goes into
# that NOTES section by hand, with their records copied to results/probes/inan2016_t1/.
set -euo pipefail
cd "$(dirname "$0")/.."
export REPDEGEN_DATA_DIR="${REPDEGEN_DATA_DIR:-$(cd .. && pwd)/shared/data}"
THREADS="$(nproc)"
export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
PYTHON="${PYTHON:-python}"
probe() {  # probe <name> <overrides...>: one run of repdegen train, continued if it is partial
  echo "== $(date -u +%FT%TZ) probe $1 ($THREADS thread(s)): ${*:2}"
  "$PYTHON" -m repdegen.reproduce.train "${@:2}" trainer.resume=true trainer.progress=false logger.group=probes/inan2016_t1
}
H200=(experiment=inan2016/h200 scale=paper)
# P1: a second seed of inan2016_t1's baseline and AL-only rows (does AL's test PPL above the baseline's, and the
# rows' spread of test/valid ratios, repeat?)
probe P1-baseline-seed2 "${H200[@]}" objective=mle model.dropout=0.5 seed=2
probe P1-al-seed2 "${H200[@]}" objective=al model.dropout=0.3 seed=2
# P2: the AL-only row with the target fully detached (is the entropy term's gradient into L what keeps y~ uniform?)
probe P2-al-target-grad-none "${H200[@]}" objective=al model.dropout=0.3 objective.target_grad=none
# P3 (declared 2026-11-29 ~20:50 UTC, results/tables/inan2016_t1/NOTES.md): the "both" row (tied, KL form) with eq. 9's
# KL differentiated as written, through both parts of y~ (target_grad=full; the chunked kernel has none, so the
# unchunked loss: the same function up to float summation order, not in the config hash)
probe P3-both-target-grad-full "${H200[@]}" objective=real model.dropout=0.3 objective.target_grad=full objective.chunk_rows=null
