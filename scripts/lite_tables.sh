#!/usr/bin/env bash
# Run lite tables one after another, two one-thread cells at a time (cells shared between tables run once: the
# ledger), each rendered into results/tables/<t>/lite/ as it completes. Register first (repdegen.reproduce.runs.tables does, before
# it launches anything) and commit the registrations before the cells run (docs/claims.md, pre-registration).
#   nohup bash scripts/lite_tables.sh yu2022_t3 yu2022_t10 > outputs/logs/lite_tables.log 2>&1 &
# A table that does not complete stops the list (the log says why); run the same command again to resume.
set -euo pipefail
cd "$(dirname "$0")/.."
export REPDEGEN_DATA_DIR="${REPDEGEN_DATA_DIR:-$(cd .. && pwd)/shared/data}" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PYTHON="${PYTHON:-python}"
[ $# -gt 0 ] || { echo "usage: bash scripts/lite_tables.sh <table> [<table> ...]" >&2; exit 2; }
for t in "$@"; do
  echo "== $(date -u +%FT%TZ) $t"
  "$PYTHON" -m repdegen.reproduce.table "table=$t" scale=lite launch.parallel=2 progress=false
done
echo "== $(date -u +%FT%TZ) done"
