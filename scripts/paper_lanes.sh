#!/usr/bin/env bash
# The CPU queue of issue 27's paper-scale cells, as two lanes of one-thread cells (a 2-core machine runs both):
#   nohup bash scripts/paper_lanes.sh A > outputs/logs/laneA.log 2>&1 &
#   nohup bash scripts/paper_lanes.sh B > outputs/logs/laneB.log 2>&1 &
# Each step is `reproduce.table` with rows=[one row]: a cell complete in the ledger is skipped, a partial one resumes
# from its last epoch, one that another process trains is waited for (the ledger lock); each step renders the table.
# A lane stops at the first step that does not complete (the log says why); run it again to continue.
# The AL/REAL weights were fixed by the grid of docs/fidelity.md (Inan 2017) on a lent GPU, 2026-11-27
# (results/sweeps/inan2017_{al,real}_weight.md); to rerun the grid on this CPU instead:
#   python -m reproduce.train -m +sweep=inan2017_al_weight scale=paper objective=al|real
#   python scripts/choose_al_weight.py --objective al|real --write
set -euo pipefail
cd "$(dirname "$0")/.."
export REPDEGEN_DATA_DIR="${REPDEGEN_DATA_DIR:-$(cd .. && pwd)/shared/data}" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PYTHON="${PYTHON:-python}"
row() {  # row <table> <"group / label" or label>
  echo "== $(date -u +%FT%TZ) $1: $2"
  "$PYTHON" -m reproduce.table "table=$1" scale=paper "rows=[\"$2\"]" progress=false restore=true
}
case "${1:-}" in
  A)
    # done: inan2017_t1 "Small (200 units) / VD-LSTM+RE" (2026-11-27); inan2016_t1 "200 hidden units (keep 0.5)"
    # (2026-11-27; committed in results/tables/inan2016_t1/paper/). 2026-11-27 23:50: the work tree (ledger and
    # checkpoints) was lost between sessions, the AL cell at epoch 24 with it; the done rows are not run again.
    row inan2017_t1 "Small (200 units) / VD-LSTM+AL"
    row inan2016_t1 "200 hidden units, only augmented KL loss (keep 0.7, alpha 0.3)"
    ;;
  B)
    # done: inan2017_t1 "Small (200 units) / VD-LSTM" (2026-11-27); inan2016_t2 "200 hidden units [5] (SGD, no
    # dropout)" (2026-11-26); inan2016_t1 "200 hidden units, only L^T in output projection (keep 0.7)" (2026-11-27);
    # all committed in results/tables/<table>/paper/. 2026-11-27 23:50: the work tree was lost between sessions, the
    # REAL cell at epoch 45 with it; the done rows are not run again.
    row inan2017_t1 "Small (200 units) / VD-LSTM+REAL"
    row inan2016_t2 "200 hidden units Proposed-CE (keep 0.7, alpha 0.3)"
    # also inan2016_t2's "200 hidden units Proposed-KL (keep 0.7, alpha 0.3)" (the same cell)
    row inan2016_t1 "200 hidden units, both proposed modifications (keep 0.7, alpha 0.3)"
    ;;
  *)
    echo "usage: bash scripts/paper_lanes.sh A|B (two lanes of one-thread paper cells; see the comments)" >&2
    exit 2
    ;;
esac
