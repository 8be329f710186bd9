"""scripts/lease_carry.py: a cell's run directory through pack -> emit (one part a call) -> gather -> unpack, byte for
byte; and the refusals (a damaged or missing part, an occupied run directory, a non-empty pack folder)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import lease_carry  # noqa: E402
from repdegen.reproduce.errors import UserError  # noqa: E402


def _cell(runs: Path, name: str, size: int) -> Path:
    d = runs / name
    d.mkdir(parents=True)
    (d / "cell.yaml").write_text("seed: 1\n")
    (d / "checkpoint.pt").write_bytes(os.urandom(size))
    (d / "best.pt").write_bytes(os.urandom(size // 2))
    (d / "result.json").write_text(json.dumps({"status": "preempted"}))
    (d / ".lock").write_text("123\n")
    return d


def test_round_trip_in_parts_one_a_call(tmp_path):
    src = tmp_path / "device" / "outputs" / "runs"
    cells = [_cell(src, "aaaa", 250_000), _cell(src, "bbbb", 120_000)]
    m = lease_carry.pack(cells, tmp_path / "device" / "carry", part_mb=0.1)
    n = -(-m["bytes"] // 100_000)  # ceil: parts of 0.1 MB
    assert len(m["parts"]) == n >= 4 and sum(p["bytes"] for p in m["parts"]) == m["bytes"]
    calls = []
    for k in range(1, len(m["parts"]) + 1):  # each call's $OUT, fetched into its own folder
        out = tmp_path / "fetched" / str(k)
        lease_carry.emit(tmp_path / "device" / "carry", [k], out)
        assert sorted(p.name for p in out.iterdir()) == ["manifest.json", f"part{k:02d}"]
        calls.append(out)
    partial = lease_carry.gather(calls[:2], tmp_path / "here" / "pack")
    assert partial["missing"] == [f"part{k:02d}" for k in range(3, n + 1)]
    with pytest.raises(UserError, match="part03 is missing"):
        lease_carry.unpack(tmp_path / "here" / "pack", tmp_path / "next" / "runs")
    assert lease_carry.gather(calls, tmp_path / "here" / "pack")["missing"] == []
    runs = tmp_path / "next" / "runs"
    assert lease_carry.unpack(tmp_path / "here" / "pack", runs) == ["aaaa", "bbbb"]
    for c in cells:
        for f in c.iterdir():
            if f.name == ".lock":
                assert not (runs / c.name / f.name).exists()
            else:
                assert (runs / c.name / f.name).read_bytes() == f.read_bytes()
    # nothing is overwritten: the cells are there now
    with pytest.raises(UserError, match="already holds a run"):
        lease_carry.unpack(tmp_path / "here" / "pack", runs)


def test_a_damaged_part_and_bad_inputs_are_refused(tmp_path):
    cell = _cell(tmp_path / "runs", "cccc", 50_000)
    pack = tmp_path / "pack"
    m = lease_carry.pack([cell], pack, part_mb=0.03)
    with pytest.raises(UserError, match="is not empty"):
        lease_carry.pack([cell], pack, part_mb=0.03)
    with pytest.raises(UserError, match="not a cell's run directory"):
        lease_carry.pack([tmp_path], tmp_path / "other", part_mb=1)
    n = len(m["parts"])
    with pytest.raises(UserError, match=rf"part 9: expected 1\.\.{n} "):
        lease_carry.emit(pack, [1, 9], tmp_path / "out")
    damaged = bytearray((pack / "part02").read_bytes())
    damaged[0] ^= 0xFF
    (pack / "part02").write_bytes(bytes(damaged))
    with pytest.raises(UserError, match="part02 does not match its SHA-256"):
        lease_carry.unpack(pack, tmp_path / "new")
    # gather skips the damaged copy and reports it missing
    assert lease_carry.gather([pack], tmp_path / "g")["missing"] == ["part02"]
    with pytest.raises(UserError, match="not a carry manifest"):
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "manifest.json").write_text("{}")
        lease_carry.unpack(tmp_path / "bad", tmp_path / "new")


def test_the_command_line_says_what_is_missing(tmp_path, capsys):
    cell = _cell(tmp_path / "runs", "dddd", 80_000)
    done = _cell(tmp_path / "runs", "eeee", 1_000)
    (done / "result.json").write_text(json.dumps({"status": "complete"}))
    assert lease_carry.unfinished(tmp_path / "runs") == [cell]
    assert lease_carry.main(["pack", "--unfinished", str(tmp_path / "runs"), "--dir", str(tmp_path / "p"),
                             "--part-mb", "0.05"]) == 0
    assert lease_carry._manifest(tmp_path / "p")["cells"] == ["dddd"]
    assert lease_carry.main(["emit", str(tmp_path / "p"), str(tmp_path / "o1"), "1"]) == 0
    assert lease_carry.main(["emit", str(tmp_path / "p"), str(tmp_path / "all"), "--first", "99"]) == 0
    parts = [p["name"] for p in lease_carry._manifest(tmp_path / "p")["parts"]]
    assert len(parts) >= 2 and sorted(p.name for p in (tmp_path / "all").iterdir()) == ["manifest.json", *parts]
    assert lease_carry.main(["gather", str(tmp_path / "o1"), "--dir", str(tmp_path / "g")]) == 1
    n = len(json.loads((tmp_path / "p" / "manifest.json").read_text())["parts"])
    assert f"1/{n} part(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:
        lease_carry.main(["emit", str(tmp_path / "p"), str(tmp_path / "o9"), "9"])
    assert err.value.code == 2 and f"part 9: expected 1..{n}" in capsys.readouterr().err


def test_a_carried_cell_resumes_to_the_uninterrupted_result(compose_cfg, tmp_path):
    """A smoke cell stopped after epoch 1 on "one machine", carried in parts to another output folder, resumed there:
    the same final numbers and per-epoch history as the cell run straight through (bit-identical on CPU)."""
    from repdegen.reproduce.train import train

    from tests.test_train import VD_SMOKE, final_numbers, history_numbers

    extra = ["scale.max_epochs=3", "optim.decay_after_epoch=1", "optim.lr_decay=0.5", "objective=re"]
    straight = train(compose_cfg(*VD_SMOKE, *extra, output_dir=tmp_path / "straight"))
    first = train(compose_cfg(*VD_SMOKE, *extra, "trainer.stop_after_epochs=1", output_dir=tmp_path / "lease1"))
    assert first["status"] == "interrupted"
    h = first["config_hash"]
    lease_carry.pack([tmp_path / "lease1" / "runs" / h], tmp_path / "carry", part_mb=0.2)
    calls = []
    n = len(lease_carry._manifest(tmp_path / "carry")["parts"])
    for first in range(1, n + 1, 4):  # four parts a call
        calls.append(tmp_path / "fetched" / str(first))
        lease_carry.emit(tmp_path / "carry", list(range(first, min(first + 4, n + 1))), calls[-1])
    assert lease_carry.gather(calls, tmp_path / "pack")["missing"] == []
    lease_carry.unpack(tmp_path / "pack", tmp_path / "lease2" / "runs")
    resumed = train(compose_cfg(*VD_SMOKE, *extra, "trainer.resume=true", output_dir=tmp_path / "lease2"))
    assert resumed["status"] == "complete" and resumed["config_hash"] == straight["config_hash"] == h
    assert final_numbers(resumed) == final_numbers(straight)
    assert history_numbers(resumed) == history_numbers(straight)
    assert [s["from"] for s in resumed["starts"]] == ["the start", "after train epoch 1"]


def test_the_carry_plan_fits_each_call_and_keeps_every_part_in_order(tmp_path, capsys):
    """Hand-worked, room 210 kB a call: pack a's parts are 100, 100, 100 and ~17 kB, pack b's 100 and ~95 kB. Call 1:
    the extra path (30 kB), both manifests (<1 kB each) and a1 (~131 kB; a2 would make ~231). Call 2: a2 + a3 = 200
    (a4 would make ~217). Call 3: a4 + b1 = ~117 (b2 would make ~212). Call 4: b2."""
    src = tmp_path / "runs"
    pa = lease_carry.pack([_cell(src, "aaaa", 200_000)], tmp_path / "pa", part_mb=0.1)
    pb = lease_carry.pack([_cell(src, "bbbb", 120_000)], tmp_path / "pb", part_mb=0.1)
    assert [p["bytes"] for p in pa["parts"]][:3] == [100_000] * 3 and 0 < pa["parts"][3]["bytes"] < 20_000
    assert pb["parts"][0]["bytes"] == 100_000 and 90_000 < pb["parts"][1]["bytes"] < 100_000
    extra = tmp_path / "whl"
    extra.mkdir()
    (extra / "w.whl").write_bytes(b"x" * 30_000)
    calls = lease_carry.plan([tmp_path / "pa", tmp_path / "pb"], [extra], room=210_000)
    a = [str(tmp_path / "pa" / f"part{k:02d}") for k in (1, 2, 3, 4)]
    b = [str(tmp_path / "pb" / f"part{k:02d}") for k in (1, 2)]
    assert calls == [[str(extra), str(tmp_path / "pa" / "manifest.json"), str(tmp_path / "pb" / "manifest.json"), a[0]],
                     [a[1], a[2]], [a[3], b[0]], [b[1]]]
    with pytest.raises(UserError, match="smaller --part-mb"):
        lease_carry.plan([tmp_path / "pa"], [], room=90_000)
    with pytest.raises(UserError, match="no such file"):
        lease_carry.plan([tmp_path / "pa"], [tmp_path / "nope"], room=250_000)
    with pytest.raises(UserError, match="carry fewer paths first"):
        lease_carry.plan([tmp_path / "pa"], [extra], room=20_000)
    with pytest.raises(SystemExit) as err:  # a clear error, no traceback
        lease_carry.main(["plan", str(tmp_path / "pa"), "--room-mb", "0"])
    assert err.value.code == 2 and "--room-mb 0.0: expected a positive size" in capsys.readouterr().err
    assert lease_carry.main(["plan", str(tmp_path / "pa"), "--room-mb", "0.21"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [json.loads(x) for x in lines] == lease_carry.plan([tmp_path / "pa"], [], room=210_000)
