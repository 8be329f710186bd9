"""`make sweep NAME=<preset>`: one target for every preset of conf/sweep/, VALUES going to the preset's own swept key
(read from the preset); sweep-gamma / sweep-alpha are names of it. A stand-in python prints the training command."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@pytest.fixture
def echo_python(tmp_path):
    """A `python` that runs `-c` snippets for real and prints any other command line instead of running it (also given
    as the `repdegen` command: its command lines are printed the same way)."""
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\necho "RUN $*"\n')
    script.chmod(0o755)
    return script


def make(*args, python):
    return subprocess.run(["make", "--no-print-directory", *args, f"PYTHON={python}", f"REPDEGEN={python}"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, MAKEFLAGS=""))


@pytest.mark.parametrize("target, preset", [
    (["sweep", "NAME=agg_alpha"], "agg_alpha"),
    (["sweep", "NAME=adv_mle_eps"], "adv_mle_eps"),
    (["sweep", "NAME=sc_lambda"], "sc_lambda"),
    (["sweep-gamma"], "cosreg_gamma"),
    (["sweep-alpha", "OBJECTIVE=al"], "al_alpha"),
])
def test_values_go_to_the_presets_swept_key(target, preset, echo_python, tmp_path):
    params = yaml.safe_load((REPO / "conf" / "sweep" / f"{preset}.yaml").read_text())["hydra"]["sweeper"]["params"]
    (key,) = [k for k in params if k != "seed"]
    out = make(*target, "SCALE=lite", "VALUES=1,2", "SEEDS=7", f"SWEEP_DIR={tmp_path}/d", python=echo_python)
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RUN ")]
    assert f"RUN train -m +sweep={preset} scale=lite {key}=1,2 seed=7 hydra.sweep.dir={tmp_path}/d" in line


def test_an_unknown_preset_names_the_ones_there(echo_python):
    out = make("sweep", "NAME=agg_alfa", python=echo_python)
    assert out.returncode != 0 and "NAME=agg_alfa is not a preset of conf/sweep/" in out.stderr
    assert "agg_alpha" in out.stderr and "RUN" not in out.stdout
