"""``scripts/paper_lanes.sh``: every row a lane names is a row of its table that runs at paper, so a lane does not stop
on a typo hours into its queue (the lane runs each step as ``repdegen.reproduce.table table=<t> scale=paper rows=[<row>]``)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.results.claims import resolve_row
from repdegen.reproduce.runs.tables import runs_at
from repdegen.reproduce.settings.config import CONF_DIR

LANES = Path(__file__).resolve().parents[1] / "scripts" / "paper_lanes.sh"
STEP = re.compile(r'^\s*row (\S+) "([^"]+)"((?:\s+\S+)*)\s*$')


def lane_steps(extra: bool = False) -> list[tuple]:
    steps = [m.groups() for line in LANES.read_text().splitlines() if (m := STEP.match(line))]
    return [(t, r, tuple(x.split())) for t, r, x in steps] if extra else [(t, r) for t, r, _ in steps]


def test_every_lane_step_names_a_paper_row_once():
    steps = lane_steps()
    assert len(steps) >= 4, "the lanes' steps were not found: the `row <table> \"<row>\"` form changed?"
    assert len(set(steps)) == len(steps), "a row is queued twice"
    for table, ref in steps:
        conf = OmegaConf.load(CONF_DIR / "table" / f"{table}.yaml")
        row = conf.rows[resolve_row(conf, ref, "rows=")]  # a ConfigError naming the rows if it is not one
        assert runs_at(row, "paper"), f"{table}: {ref!r} does not run at paper"


def test_a_steps_more_arguments_are_table_options():
    """A step may add arguments (the retrain of a recovered cell: retrain_recovered=true); each must be a key of the
    table command's config, or the step would stop the lane with an error hours into its queue."""
    from repdegen.reproduce.runs.tables import TableAppConfig

    keys = set(TableAppConfig.__dataclass_fields__)
    extras = [x for _, _, more in lane_steps(extra=True) for x in more]
    assert "retrain_recovered=true" in extras
    for x in extras:
        assert "=" in x and x.split("=", 1)[0] in keys, f"{x!r} is not an option of repdegen.reproduce.table"
    retrain = [line for line in _queued("S") if "retrain_recovered=true" in line]
    assert len(retrain) == 1 and 'rows=["Small (200 units) / VD-LSTM"]' in retrain[0]


def test_a_misspelt_row_is_caught():
    conf = OmegaConf.load(CONF_DIR / "table" / "inan2017_t1.yaml")
    with pytest.raises(ConfigError):
        resolve_row(conf, "Small (200 units) / VD-LSTM+RAEL", "rows=")


def test_each_step_restores_the_rows_committed_with_the_tables():
    """A work tree lost between sessions takes the ledger with it (2026-11-27): each step restores the committed
    records (reproduce/runs/archive.py) so that a finished row is rendered, not trained again."""
    (command,) = [line for line in LANES.read_text().splitlines() if "-m repdegen.reproduce.table" in line]
    assert "restore=true" in command.split() and "scale=paper" in command.split()


def _queued(lane: str) -> list[str]:
    """The steps a lane would run, with `PYTHON=echo`: nothing is trained."""
    out = subprocess.run(["bash", str(LANES), lane], env={**os.environ, "PYTHON": "echo"}, capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("-m repdegen.reproduce.table")]


def test_lanes_a_and_b_split_lane_s_queue():
    """Lane S runs the queue in order on every core; A and B run the same steps between them, each once."""
    s, a, b = _queued("S"), _queued("A"), _queued("B")
    assert len(s) == len(lane_steps()) and not set(a) & set(b)
    assert sorted(a + b) == sorted(s) and a == s[0::2] and b == s[1::2]


def test_an_unknown_lane_is_refused():
    run = subprocess.run(["bash", str(LANES), "C"], capture_output=True, text=True)
    assert run.returncode == 2 and "usage: bash scripts/paper_lanes.sh S|A|B" in run.stderr


PROBES = LANES.with_name("paper_probes.sh")
PROBES_NOTES = LANES.parents[1] / "results" / "tables" / "inan2016_t1" / "NOTES.md"


def test_each_probe_is_the_run_its_declaration_names():
    """scripts/paper_probes.sh: each probe's overrides resolve as repdegen.reproduce.train resolves them (the preset's sections
    included; a typo would stop the queue hours in), and its config hash is one the table's NOTES declared before it
    ran; the probes' logger group (the one setting the script adds to each run) stays out of the hash."""
    from hydra import initialize_config_dir
    from repdegen.reproduce.settings.resolve import resolve

    text = PROBES.read_text()
    base = re.search(r"^H200=\((.*)\)$", text, re.M).group(1).split()
    probes = [line.split()[2:] for line in text.splitlines() if line.startswith("probe P")]
    assert len(probes) == 4  # P1 (two runs), P2, P3
    declared = set(re.findall(r"\| `([0-9a-f]{16})` \|", PROBES_NOTES.read_text()))
    hashes = []
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for overrides in probes:
            assert overrides[0] == '"${H200[@]}"'
            h = resolve([*base, *overrides[1:]]).config_hash
            assert h == resolve([*base, *overrides[1:], "logger.group=probes/inan2016_t1"]).config_hash
            hashes.append(h)
    assert set(hashes) == declared and len(hashes) == 4, (hashes, declared)
