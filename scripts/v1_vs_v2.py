"""Each lite claim's v1 verdict (before issue 23) beside its v2 claim(s) and verdict(s), and why they differ.

Reads the hand-written pairing results/history/v1_to_v2.yaml (one entry per v1 claim, plus one per new v2 claim:
{table, v1: "<v1 text>" or null, v2: ["<v2 text>", ...], why: "..."}), the v1 renderings
results/history/lite_v1/<table>/lite/claims.json and the v2 renderings results/tables/<table>/lite/claims.json.
A table with no v2 rendering yet (registered, or with lite seeds, or a v1 table) takes its v2 claims from
conf/table/<table>.yaml: n/a where the claim has `na.lite`, is for other scales or reads a row not run at lite,
else "not run". Writes results/history/v1_vs_v2.md. Fails (exit 1), naming table and claim, when a rendered or
configured claim is not in the pairing or a text of the pairing matches no claim.

    python scripts/v1_vs_v2.py            # write results/history/v1_vs_v2.md
    python scripts/v1_vs_v2.py --check    # exit 1 if the written file is not what it would write
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml
from repdegen.reproduce.results.claims import MARK

ROOT = Path(__file__).resolve().parents[1]
SYMBOL = {**MARK, "n/a": "n/a", "changed": "⚠", "not run": "not run"}
ORDER = ["✓", "✗", "≈", "–", "n/a", "⚠", "not run"]
OFF_SCALE = ("not run at this scale", "meaningful at", "n/a at")


class MappingError(Exception):
    pass


def natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def rendered_mark(claim: dict) -> str:
    """The mark a rendered claim shows. v1 files have no `shown`: a claim undecided because its rows are not run at
    lite, or that is meaningful at other scales only, is n/a there too (as reproduce/results/claims.py shown_state)."""
    shown = claim.get("shown")
    if shown is None:
        shown = claim["state"]
        reasons = [c.get("reason") or "" for c in claim.get("checks", [])]
        if shown == "undecided" and any(k in r for r in reasons for k in OFF_SCALE):
            shown = "n/a"
    return SYMBOL.get(shown, claim.get("mark", shown))


def configured_mark(conf: dict, claim: dict) -> str:
    """n/a or "not run" for a claim of a table whose v2 cells have not been rendered."""
    if (claim.get("na") or {}).get("lite") or (claim.get("scales") and "lite" not in claim["scales"]):
        return "n/a"
    rows = conf.get("rows") or []
    labels = [r["label"] for r in rows]
    at_lite = {}
    for r in rows:
        runs = r.get("scales") is None or "lite" in r["scales"]
        if r.get("group"):
            at_lite[f"{r['group']} / {r['label']}"] = runs
        if labels.count(r["label"]) == 1:
            at_lite[r["label"]] = runs
    refs = [ref for c in claim.get("checks") or [] for ref in (c.get("row"), c.get("than")) if ref]
    return "n/a" if any(at_lite.get(ref) is False for ref in refs) else "not run"


def load_claims(root: Path) -> tuple[dict, dict]:
    """({table: {v1 text: mark}}, {table: {v2 text: mark}}), each in its file's order."""
    v1, v2 = {}, {}
    for f in sorted((root / "results/history/lite_v1").glob("*/lite/claims.json")):
        v1[f.parts[-3]] = {c["text"]: rendered_mark(c) for c in json.loads(f.read_text())["claims"]}
    tables = set(v1)
    for f in (root / "results/tables").glob("*/lite/claims.json"):
        v2[f.parts[-3]] = {c["text"]: rendered_mark(c) for c in json.loads(f.read_text())["claims"]}
    tables |= set(v2) | {f.parts[-3] for f in (root / "results/tables").glob("*/lite/registration.json")}
    confs = {f.stem: yaml.safe_load(f.read_text()) for f in (root / "conf/table").glob("*.yaml")}
    tables |= {t for t, c in confs.items() if "lite" in ((c or {}).get("seeds") or {})}
    for t in sorted(tables - set(v2)):
        if t not in confs:
            raise MappingError(f"{t}: no v2 rendering and no conf/table/{t}.yaml")
        v2[t] = {c["text"]: configured_mark(confs[t], c) for c in confs[t].get("claims") or []}
    return v1, v2


def join(mapping: list[dict], v1: dict, v2: dict) -> dict:
    """{table: [(entry, v1 mark, [v2 marks])]} in the files' claim order; MappingError listing every mismatch."""
    errors, seen1, seen2 = [], {}, {}
    for e in mapping:
        t = e.get("table")
        if t not in v1 and t not in v2:
            errors.append(f"{t}: the mapping names a table with no v1 or v2 claims")
            continue
        if not isinstance(e.get("v2"), list) or not e.get("why") or (e.get("v1") is None and not e["v2"]):
            errors.append(f"{t}: an entry needs a v1 text or a non-empty v2 list, a v2 list and a why: {e}")
            continue
        if e.get("v1") is not None:
            if e["v1"] not in v1.get(t, {}):
                errors.append(f'{t}: the mapping\'s v1 text "{e["v1"]}" matches no v1 claim')
            elif (t, e["v1"]) in seen1:
                errors.append(f'{t}: v1 claim "{e["v1"]}" is in the mapping twice')
            seen1[(t, e["v1"])] = e
        for text in e["v2"]:
            if text not in v2.get(t, {}):
                errors.append(f'{t}: the mapping\'s v2 text "{text}" matches no v2 claim')
            elif (t, text) in seen2:
                errors.append(f'{t}: v2 claim "{text}" is in the mapping twice')
            seen2[(t, text)] = e
    for name, claims, seen in (("v1", v1, seen1), ("v2", v2, seen2)):
        for t, texts in claims.items():
            errors += [f'{t}: {name} claim "{x}" is not in the mapping' for x in texts if (t, x) not in seen]
    if errors:
        raise MappingError("\n".join(errors))
    out = {}
    for t in sorted(set(v1) | set(v2), key=natural):
        o1, o2 = list(v1.get(t, {})), list(v2.get(t, {}))
        entries = [e for e in mapping if e["table"] == t]
        entries.sort(key=lambda e: (0, o1.index(e["v1"])) if e["v1"] is not None else (1, o2.index(e["v2"][0])))
        out[t] = [(e, v1[t][e["v1"]] if e["v1"] is not None else "", [v2[t][x] for x in e["v2"]]) for e in entries]
    return out


def counts(marks: list[str]) -> str:
    n = {m: marks.count(m) for m in ORDER}
    shown = [m for m in ORDER if n[m] or m in ("✓", "✗", "≈", "–", "n/a")]
    return f"{len(marks)} claim{'' if len(marks) == 1 else 's'}: " + ", ".join(f"{m} {n[m]}" for m in shown)


def cell(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def render(joined: dict) -> str:
    def tally(rows):
        m1 = [m for _, m, _ in rows if m]
        return m1, [m for _, _, ms in rows for m in ms]

    all1, all2 = [], []
    for rows in joined.values():
        a, b = tally(rows)
        all1 += a
        all2 += b
    lines = [
        "# Lite claims: v1 (before issue 23) and v2, claim by claim",
        "",
        "Written by `python scripts/v1_vs_v2.py` from the hand-written pairing `results/history/v1_to_v2.yaml`, the v1",
        "renderings (`results/history/lite_v1/<table>/lite/claims.json`) and the v2 renderings",
        "(`results/tables/<table>/lite/claims.json`). A table without a v2 rendering takes its claims from",
        "`conf/table/<table>.yaml`: **not run** (no cell rendered yet) or n/a (`na.lite`, a claim for other scales, or",
        "a row not run at lite). Marks: ✓ holds, ✗ fails, ≈ tie inside its margin, – undecided, n/a not decidable at",
        "lite. v1 files predate the n/a mark: a v1 claim left undecided because its rows do not run at lite, or",
        "meaningful at paper only, is shown n/a, as the current renderer shows it. v1 decided a check with no tie",
        "margin (it held when every seed agreed); v2 with the margin of `docs/claims.md`.",
        "",
        f"**All tables.** v1: {counts(all1)}. v2: {counts(all2)}.",
    ]
    for t, rows in joined.items():
        a, b = tally(rows)
        lines += ["", f"## {t}", "", f"v1: {counts(a) if a else 'no v1 rendering'}. v2: {counts(b)}.", "",
                  "| v1 claim | v1 | v2 claim(s) | v2 | why |", "|---|---|---|---|---|"]
        for e, m1, ms in rows:
            c1 = cell(e["v1"]) if e["v1"] is not None else "(new)"
            c2 = "<br>".join(cell(x) for x in e["v2"]) or "(dropped)"
            lines.append(f"| {c1} | {m1} | {c2} | {'<br>'.join(ms)} | {cell(e['why'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: this checkout)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the written file differs from what it would write")
    args = ap.parse_args(argv)
    mapping_file = args.root / "results/history/v1_to_v2.yaml"
    out = args.root / "results/history/v1_vs_v2.md"
    try:
        text = render(join(yaml.safe_load(mapping_file.read_text()) or [], *load_claims(args.root)))
    except MappingError as err:
        print(f"v1_vs_v2: {mapping_file} does not match the claims:\n{err}", file=sys.stderr)
        return 1
    if args.check:
        if not out.exists() or out.read_text() != text:
            print(f"v1_vs_v2: {out} is out of date; run python scripts/v1_vs_v2.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
