"""List the runs in the ledger: label, scale, status, epochs, PPL, wall time.

    python scripts/runs.py [outputs/runs]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(root: str = "outputs/runs") -> None:
    rows = []
    for path in sorted(Path(root).glob("*/result.json")):
        r = json.loads(path.read_text())
        final = r.get("metrics", {}).get("final", {})
        last = r["history"][-1] if r.get("history") else {}
        valid = final.get("valid_ppl", last.get("valid_ppl"))
        rows.append((r["config_hash"], r.get("label", "?"), r.get("scale", "?"), r.get("status", "?"), len(r.get("history", [])),
                     f"{valid:.2f}" if valid else "-", f"{final['test_ppl']:.2f}" if "test_ppl" in final else "-",
                     f"{r.get('wall_time_s', 0):.0f}s"))
    header = ("hash", "label", "scale", "status", "epochs", "valid", "test", "wall")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in (header, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))


if __name__ == "__main__":
    main(*sys.argv[1:])
