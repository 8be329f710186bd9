"""Golden files of every cell's resolved config: the guard that a refactor of the config tree changes nothing by
accident.

    python scripts/golden_configs.py --check    # compare against tests/golden/ (exit 1 and a per-key diff if not equal)
    python scripts/golden_configs.py --write    # (re)write tests/golden/ from the configs as they compose now

What is recorded: for every table x scale (smoke, lite, paper), each cell the table runs (row label, seed, config hash),
and for every experiment preset x scale, its default cell; for each distinct hash, the config's hashed view
(``repdegen.reproduce.settings.config.hashed_view``: the fully resolved config minus the keys that do not define the experiment:
paths, logger, data locations, progress bars; ``HASH_EXCLUDED``) as YAML in ``tests/golden/configs/<hash>.yaml``.
The index is ``tests/golden/cells.json``.

A difference is printed key by key (dotted path, golden value, value now). A refactor either leaves the files equal
or lists each difference, with its reason, in its closing note; rewriting them is a deliberate ``--write``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"
SCALES = ("smoke", "lite", "paper")


def experiment_names() -> list[str]:
    root = REPO / "conf" / "experiment"
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def collect() -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """(index, views): index maps "table/<name>/<scale>" and "experiment/<name>/<scale>" to its cells
    ({"row": "<group> / <label>" or "<label>", "seed", "hash"}); views maps each hash to its hashed view."""
    from hydra import compose, initialize_config_dir
    from repdegen.reproduce.runs.cells import all_table_names, expand_cells  # registers the schemas
    from repdegen.reproduce.settings.config import CONF_DIR, hashed_view
    from repdegen.reproduce.settings.resolve import resolve
    index: dict[str, list[dict]] = {}
    views: dict[str, dict] = {}
    memo: dict = {}  # the defaults trees, shared by the tables' rows
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for name in all_table_names():
            for scale in SCALES:
                app = compose("table_app", overrides=[f"table={name}", f"scale={scale}"])
                app.overrides = []
                entries = []
                for cell in expand_cells(app, memo):
                    views.setdefault(cell.config_hash, hashed_view(cell.cfg))
                    for i in cell.rows:
                        row = app.table.rows[i]
                        label = f"{row.group} / {row.label}" if row.group else row.label
                        entries.append({"row": label, "seed": cell.seed, "hash": cell.config_hash})
                index[f"table/{name}/{scale}"] = sorted(entries, key=lambda e: (e["row"], str(e["seed"])))
        for name in experiment_names():
            for scale in SCALES:
                spec = resolve([f"experiment={name}", f"scale={scale}"], memo=memo)
                h = spec.config_hash
                views.setdefault(h, hashed_view(spec.cfg))
                index[f"experiment/{name}/{scale}"] = [{"row": None, "seed": None, "hash": h}]
    return index, views


def view_diff(old: dict, new: dict) -> list[str]:
    """One line per dotted key whose value differs (or exists on one side only)."""
    from repdegen.reproduce.settings.sources import flatten

    a, b = flatten(old), flatten(new)
    missing = object()
    lines = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, missing), b.get(key, missing)
        if x != y:
            fmt = lambda v: "(absent)" if v is missing else json.dumps(v)  # noqa: E731
            lines.append(f"{key}: {fmt(x)} -> {fmt(y)}")
    return lines


def write(index: dict, views: dict, golden: Path = GOLDEN) -> None:
    configs = golden / "configs"
    configs.mkdir(parents=True, exist_ok=True)
    for old in configs.glob("*.yaml"):
        if old.stem not in views:
            old.unlink()
    for h, view in views.items():
        (configs / f"{h}.yaml").write_text(yaml.safe_dump(view, sort_keys=True, default_flow_style=False))
    (golden / "cells.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")


def check(index: dict, views: dict, golden: Path = GOLDEN) -> list[str]:
    """The differences between the configs now and the golden files, as lines (empty: identical)."""
    if not (golden / "cells.json").is_file():
        return [f"{golden / 'cells.json'} does not exist: write the golden files first "
                "(python scripts/golden_configs.py --write)"]
    old_index = json.loads((golden / "cells.json").read_text())
    problems = []
    for key in sorted(set(old_index) | set(index)):
        if key not in index:
            problems.append(f"{key}: in the golden files, composes no more (a table, scale or preset was removed)")
            continue
        if key not in old_index:
            problems.append(f"{key}: new (not in the golden files)")
            continue
        old_cells = {(c["row"], c["seed"]): c["hash"] for c in old_index[key]}
        new_cells = {(c["row"], c["seed"]): c["hash"] for c in index[key]}
        for cell in sorted(set(old_cells) | set(new_cells), key=str):
            where = f"{key} row={cell[0]!r} seed={cell[1]}"
            h_old, h_new = old_cells.get(cell), new_cells.get(cell)
            if h_old is None or h_new is None:
                problems.append(f"{where}: {'new' if h_old is None else 'no longer a cell'}")
            elif h_old != h_new:
                path = golden / "configs" / f"{h_old}.yaml"
                old_view = yaml.safe_load(path.read_text()) if path.is_file() else {}
                diff = view_diff(old_view, views[h_new])
                problems.append(f"{where}: hash {h_old} -> {h_new}" + "".join(f"\n    {d}" for d in diff))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="compare with tests/golden/ (exit 1 when they differ)")
    mode.add_argument("--write", action="store_true", help="rewrite tests/golden/ from the configs as they are now")
    args = parser.parse_args(argv)
    index, views = collect()
    if args.write:
        write(index, views)
        n = sum(len(v) for v in index.values())
        print(f"golden_configs: wrote {len(index)} table/experiment x scale entries, {n} cells, "
              f"{len(views)} distinct configs to {GOLDEN.relative_to(REPO)}")
        return 0
    problems = check(index, views)
    for p in problems:
        print(p)
    if problems:
        print(f"golden_configs: {len(problems)} difference(s) from {GOLDEN.relative_to(REPO)}; justify each, "
              "then rewrite with --write", file=sys.stderr)
        return 1
    print(f"golden_configs: all {len(index)} entries and {len(views)} configs equal the golden files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
