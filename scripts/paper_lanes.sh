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
  "$PYTHON" -m reproduce.table "table=$1" scale=paper "rows=[\"$2\"]" progress=false
}
case "${1:-}" in
  A)
    # done: inan2017_t1 "Small (200 units) / VD-LSTM+RE" (2026-11-27). The rows without the augmented loss run first
    # (2026-11-27: an AL epoch costs ~2.3x an MLE one, and a faster AL may restart the AL cells; their checkpoints stay)
    row inan2016_t1 "200 hidden units (keep 0.5)"
    # a diagnostic, not a cell (2026-11-27): the baseline's best weights under a halving Adam lr (results/NOTES.md)
    probe=outputs/probes/6e9129559f5f0212-decay0.5
    [ -f "$probe/probe.json" ] || "$PYTHON" scripts/schedule_probe.py outputs/runs/6e9129559f5f0212 --decay 0.5 \
      --epochs 6 --patience 1 --out-dir "$probe"
    row inan2017_t1 "Small (200 units) / VD-LSTM+AL"
    row inan2016_t1 "200 hidden units, only augmented KL loss (keep 0.7, alpha 0.3)"
    # 2026-11-27 21:10: inan2016_t1's "both proposed modifications" moved to lane B's end (left here: ~28 h of cells
    # against B's ~16 h; now ~19 h and ~25 h)
    ;;
  B)
    # done: inan2017_t1 "Small (200 units) / VD-LSTM" (2026-11-27). inan2016_t2 "200 hidden units [5]" ran first
    # (2026-11-26, AMD EPYC; committed in results/tables/inan2016_t2/paper/); its ledger record was lost with a work
    # tree, so it runs again here, and until then inan2016_t2's paper rendering is left as it is
    # (reproduce.runs.tables.render_latest). 2026-11-27 12:05: moved ahead of the L^T row (stopped at epoch 4, update 5;
    # it resumes from its checkpoint), so the issue's anchor row (13 epochs, ~1.5 h) completes within one session
    row inan2016_t2 "200 hidden units [5] (SGD, no dropout)"
    row inan2016_t1 "200 hidden units, only L^T in output projection (keep 0.7)"
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
