"""scripts/v1_vs_v2.py: the v1/v2 claim report, on hand-made claims.json, conf and mapping files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from v1_vs_v2 import main  # noqa: E402


def claim(text, state, shown=None, reason=""):
    mark = {"holds": "✓", "fails": "✗", "tie": "≈", "undecided": "–"}[state]
    c = {"text": text, "state": state, "mark": mark, "checks": [{"metric": "test_ppl", "reason": reason}]}
    if shown:
        c["shown"] = shown
    return c


def write_json(path: Path, claims: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"table": path.parts[-3], "scale": "lite", "claims": claims}, ensure_ascii=False))


MAPPING = [
    {"table": "p_t2", "v1": None, "v2": ["A5"], "why": "new, undecided"},
    {"table": "p_t2", "v1": "A3", "v2": [], "why": "dropped"},
    {"table": "p_t2", "v1": "x < y | z", "v2": ["x < y | z"], "why": "same"},
    {"table": "p_t2", "v1": "A2", "v2": ["A2a", "A2b"], "why": "split"},
    {"table": "p_t2", "v1": None, "v2": ["A4"], "why": "new"},
    {"table": "p_t10", "v1": "B1", "v2": ["B1 new"], "why": "reworded"},
    {"table": "p_t10", "v1": None, "v2": ["B2", "B3"], "why": "new, n/a"},
    {"table": "p_t10", "v1": None, "v2": ["B4"], "why": "paper only"},
]


def make_root(tmp_path: Path, mapping=MAPPING) -> Path:
    root = tmp_path / "repo"
    write_json(root / "results/history/lite_v1/p_t2/lite/claims.json", [
        claim("x < y | z", "holds"), claim("A2", "fails"),
        claim("A3", "undecided", reason="meaningful at paper only")])
    write_json(root / "results/tables/p_t2/lite/claims.json", [
        claim("x < y | z", "holds", "holds"), claim("A2a", "tie", "tie"), claim("A2b", "undecided", "n/a"),
        claim("A4", "fails", "fails"), claim("A5", "undecided", "undecided")])
    write_json(root / "results/history/lite_v1/p_t10/lite/claims.json", [claim("B1", "holds")])
    conf = root / "conf/table"
    conf.mkdir(parents=True)
    check = lambda row: {"metric": "test_ppl", "row": row, "relation": "lower", "than": "G / base"}  # noqa: E731
    (conf / "p_t10.yaml").write_text(yaml.safe_dump({
        "name": "p_t10", "seeds": {"lite": [1, 2]},
        "rows": [{"group": "G", "label": "base"}, {"group": "G", "label": "new"},
                 {"group": "G", "label": "big", "scales": ["smoke", "paper"]}],
        "claims": [{"text": "B1 new", "checks": [check("G / new")]},
                   {"text": "B2", "checks": [check("new")], "na": {"lite": "measured reason"}},
                   {"text": "B3", "checks": [check("big")]},
                   {"text": "B4", "checks": [check("new")], "scales": ["paper"]}]}))
    # no lite seeds, rendering or registration: not a lite table, so its claims need no mapping
    (conf / "p_t3.yaml").write_text(yaml.safe_dump({"name": "p_t3", "rows": [], "claims": [{"text": "C", "checks": []}]}))
    (root / "results/history/v1_to_v2.yaml").write_text(yaml.safe_dump(mapping, allow_unicode=True, sort_keys=False))
    return root


EXPECTED = """\
**All tables.** v1: 4 claims: ✓ 2, ✗ 1, ≈ 0, – 0, n/a 1. v2: 9 claims: ✓ 1, ✗ 1, ≈ 1, – 1, n/a 4, not run 1.

## p_t2

v1: 3 claims: ✓ 1, ✗ 1, ≈ 0, – 0, n/a 1. v2: 5 claims: ✓ 1, ✗ 1, ≈ 1, – 1, n/a 1.

| v1 claim | v1 | v2 claim(s) | v2 | why |
|---|---|---|---|---|
| x &lt; y \\| z | ✓ | x &lt; y \\| z | ✓ | same |
| A2 | ✗ | A2a<br>A2b | ≈<br>n/a | split |
| A3 | n/a | (dropped) |  | dropped |
| (new) |  | A4 | ✗ | new |
| (new) |  | A5 | – | new, undecided |

## p_t10

v1: 1 claim: ✓ 1, ✗ 0, ≈ 0, – 0, n/a 0. v2: 4 claims: ✓ 0, ✗ 0, ≈ 0, – 0, n/a 3, not run 1.

| v1 claim | v1 | v2 claim(s) | v2 | why |
|---|---|---|---|---|
| B1 | ✓ | B1 new | not run | reworded |
| (new) |  | B2<br>B3 | n/a<br>n/a | new, n/a |
| (new) |  | B4 | n/a | paper only |
"""


def test_joins_the_claims_with_their_marks(tmp_path):
    root = make_root(tmp_path)
    assert main(["--root", str(root)]) == 0
    text = (root / "results/history/v1_vs_v2.md").read_text()
    assert text[text.index("**All tables.**"):] == EXPECTED


def test_check_mode_fails_when_the_file_is_stale(tmp_path, capsys):
    root = make_root(tmp_path)
    assert main(["--root", str(root), "--check"]) == 1  # not written yet
    assert main(["--root", str(root)]) == 0
    assert main(["--root", str(root), "--check"]) == 0
    out = root / "results/history/v1_vs_v2.md"
    out.write_text(out.read_text().replace("| same |", "| edited |"))
    assert main(["--root", str(root), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err


def test_a_v1_claim_missing_from_the_mapping_is_an_error(tmp_path, capsys):
    root = make_root(tmp_path, [e for e in MAPPING if e["v1"] != "A2"])
    assert main(["--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert 'p_t2: v1 claim "A2" is not in the mapping' in err
    assert 'p_t2: v2 claim "A2a" is not in the mapping' in err and 'p_t2: v2 claim "A2b" is not in the mapping' in err
    assert not (root / "results/history/v1_vs_v2.md").exists()


def test_a_stale_mapping_text_is_an_error(tmp_path, capsys):
    stale = [dict(e) for e in MAPPING]
    stale[5] = {**stale[5], "v1": "B1 (old words)"}
    stale[3] = {**stale[3], "v2": ["A2a", "A2b", "A2c"]}
    root = make_root(tmp_path, stale)
    assert main(["--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert 'p_t10: the mapping\'s v1 text "B1 (old words)" matches no v1 claim' in err
    assert 'p_t10: v1 claim "B1" is not in the mapping' in err
    assert 'p_t2: the mapping\'s v2 text "A2c" matches no v2 claim' in err


def test_a_claim_mapped_twice_is_an_error(tmp_path, capsys):
    root = make_root(tmp_path, MAPPING + [{"table": "p_t10", "v1": None, "v2": ["B4"], "why": "again"}])
    assert main(["--root", str(root)]) == 1
    assert 'p_t10: v2 claim "B4" is in the mapping twice' in capsys.readouterr().err
