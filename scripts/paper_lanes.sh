#!/usr/bin/env bash
# The CPU queue of issue 27's paper-scale cells. One cell at a time on every core (what runs since 2026-11-28 14:50
# UTC; why: results/NOTES.md, "One cell at a time"):
#   nohup bash scripts/paper_lanes.sh S > outputs/logs/laneS.log 2>&1 &
# or the same queue as two lanes of one-thread cells, side by side (A takes its odd steps, B its even ones; ~13 % more
# epochs an hour on the 2-core AMD EPYC, but each cell takes ~1.7x as long):
#   nohup bash scripts/paper_lanes.sh A > outputs/logs/laneA.log 2>&1 &
#   nohup bash scripts/paper_lanes.sh B > outputs/logs/laneB.log 2>&1 &
# Each step is `repdegen.reproduce.table` with rows=[one row]: a cell complete in the ledger (or in the records committed with
# its table: restore=true) is skipped, a partial one resumes from its last checkpoint, one that another process
# trains is waited for (the ledger lock); each step renders the table. A lane stops at the first step that does not
# complete (the log says why); run it again to continue.
# The AL/REAL weights were fixed by the grid of docs/fidelity.md (Inan 2017) on a lent GPU, 2026-11-27
# (results/sweeps/inan2017_{al,real}_weight.md); to rerun the grid on this CPU instead:
#   repdegen train -m +sweep=inan2017_al_weight scale=paper objective=al|real
#   python scripts/choose_al_weight.py --objective al|real --write
set -euo pipefail
cd "$(dirname "$0")/.."
LANE="${1:-}"
case "$LANE" in
  S) THREADS="$(nproc)" ;;
  A|B) THREADS=1 ;;
  *)
    echo "usage: bash scripts/paper_lanes.sh S|A|B (S: one queue of paper cells on all the cores; A and B: the same" \
         "queue as two lanes of one-thread cells; see the comments)" >&2
    exit 2
    ;;
esac
export REPDEGEN_DATA_DIR="${REPDEGEN_DATA_DIR:-$(cd .. && pwd)/shared/data}"
export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
PYTHON="${PYTHON:-python}"
STEP=0
row() {  # row <table> <"group / label" or label> [more arguments]: the queue's next step, if this lane takes it
  STEP=$((STEP + 1))
  if { [ "$LANE" = A ] && [ $((STEP % 2)) = 0 ]; } || { [ "$LANE" = B ] && [ $((STEP % 2)) = 1 ]; }; then
    return 0
  fi
  echo "== $(date -u +%FT%TZ) step $STEP, $1: $2 ($THREADS thread(s))"
  "$PYTHON" -m repdegen.reproduce.table "table=$1" scale=paper "rows=[\"$2\"]" progress=false restore=true "${@:3}"
}
# Done, committed in results/tables/<table>/paper/ (not run again: restore=true): inan2016_t2 "200 hidden units [5]
# (SGD, no dropout)" (2026-11-26); inan2017_t1 "Small (200 units) / VD-LSTM" and "... / VD-LSTM+RE", inan2016_t1
# "200 hidden units (keep 0.5)" and "200 hidden units, only L^T in output projection (keep 0.7)" (2026-11-27).
# The work tree (ledger and checkpoints) was lost between sessions twice: 2026-11-27 ~23:50 UTC (the AL and REAL cells
# at epoch 24 and 45) and 2026-11-28 12:00–14:47 UTC (at epoch 62 and 64); each time they started again from epoch 1.
row inan2017_t1 "Small (200 units) / VD-LSTM+AL"
row inan2017_t1 "Small (200 units) / VD-LSTM+REAL"
row inan2016_t1 "200 hidden units, only augmented KL loss (keep 0.7, alpha 0.3)"
row inan2016_t2 "200 hidden units Proposed-CE (keep 0.7, alpha 0.3)"
# (also inan2016_t2's "200 hidden units Proposed-KL (keep 0.7, alpha 0.3)": the same cell)
row inan2016_t1 "200 hidden units, both proposed modifications (keep 0.7, alpha 0.3)"
# Then inan2017_t1's small VD-LSTM trained again (retrain_recovered=true): its record was rebuilt from the rendering
# after the work tree was lost (2026-11-27), without the test-time metrics that the two Sec. 6.4 claims at small read
# (p_unk_nontarget, p_articles_nontarget) and without its curves. Declared before it runs (2026-11-29): the new run's
# record replaces the recovered one in the table whatever it gives (its numbers and every verdict that reads them);
# the recovered record stays beside it (records/<hash>/result.<started>.json; results/NOTES.md).
row inan2017_t1 "Small (200 units) / VD-LSTM" retrain_recovered=true
