"""Rebuild the run records of finished paper-scale cells from their committed renderings, for cells that finished
before renderings kept their records (reproduce/runs/archive.py) and whose ledger was lost with a work tree:

    python scripts/recover_records.py inan2016_t1 inan2016_t2 inan2017_t1 [--scale paper] [--tables-dir results/tables]

Writes results/tables/<table>/<scale>/records/<hash>/result.json for each complete cell of the rendering that has no
archived record, marked ``recovered`` (the table's numbers and the cell's provenance only; what was lost is said in the
record and in the rendered table). Then ``repdegen table table=<t> scale=paper render_only=true
restore=true`` brings them into the ledger, and the table renders them with the rows trained since.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra import compose, initialize_config_dir  # noqa: E402
from repdegen.reproduce.describe import describe  # noqa: E402
from repdegen.reproduce.errors import exit_on_user_error  # noqa: E402
from repdegen.reproduce.runs.archive import recover_records  # noqa: E402
from repdegen.reproduce.runs.tables import expand_cells  # noqa: E402
from repdegen.reproduce.settings.config import CONF_DIR  # noqa: E402


def parameters(cfg) -> dict:
    """The parameter counts a run record holds, of the model ``cfg`` builds (no training, no weights)."""
    return {k: v for k, v in describe(cfg)["parameters"].items() if k != "millions"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tables", nargs="+", help="table names (conf/table/<name>.yaml)")
    p.add_argument("--scale", default="paper")
    p.add_argument("--tables-dir", default="results/tables")
    args = p.parse_args(argv)
    known = sorted(x.stem for x in (CONF_DIR / "table").glob("*.yaml"))
    unknown = [t for t in args.tables if t not in known]
    if unknown:
        p.error(f"no table {', '.join(map(repr, unknown))}; expected one of: {', '.join(known)}")
    written = 0
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for table in args.tables:
            app = compose("table_app", overrides=[f"table={table}", f"scale={args.scale}",
                                                  f"paths.tables_dir={args.tables_dir}"])
            written += len(recover_records(app, expand_cells(app), parameters))
    print(f"repdegen: {written} record(s) recovered; bring them into the ledger with repdegen table "
          f"table=<t> scale={args.scale} render_only=true restore=true")
    return 0


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main)())
