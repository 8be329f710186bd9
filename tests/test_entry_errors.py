"""Every entry point turns every composition error into one ``repdegen: error:`` line and exit status 2: an unknown
option of a config group, an unknown scale, an unknown key (and for the commands without those groups, the group
itself), each through the ``repdegen`` command as a user types it."""

from __future__ import annotations

import subprocess
import sys

import pytest

# what each command needs besides the bad value to get as far as composing its config
NEEDS = {"train": [], "table": ["table=inan2016_t1"], "describe": ["experiment=inan2017/small"],
         "analyze": ["checkpoint=no-such-run"], "translate": ["checkpoint=no-such-run", "input=no-such-file"]}
BAD = {"a group option": ("model=nope", "model"), "a scale": ("scale=medium", "scale"),
       "a key": ("trainer.nope=1", "trainer.nope")}


@pytest.mark.e2e
@pytest.mark.parametrize("what", list(BAD))
@pytest.mark.parametrize("command", list(NEEDS))
def test_a_bad_value_is_one_error_line(command, what, tmp_path):
    value, named = BAD[what]
    code = "import sys; from repdegen.reproduce.cli import main; sys.argv[0] = 'repdegen'; main()"
    out = subprocess.run([sys.executable, "-c", code, command, *NEEDS[command], value, f"hydra.run.dir={tmp_path}/h"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("repdegen: error:") and named in lines[0], out.stderr
    assert "Traceback" not in out.stderr and "To append" not in out.stderr and not (tmp_path / "outputs").exists()


GROUPS = ("model", "dataset", "objective", "optim", "trainer", "logger", "experiment", "budget", "scale")


@pytest.mark.e2e
@pytest.mark.parametrize("group", GROUPS)
def test_an_unknown_option_of_every_config_group_is_one_error_line(group, tmp_path):
    """``repdegen train <group>=nope`` for each group of the training config: one line naming the group and its
    options (the experiment: the presets that exist), exit status 2."""
    code = "import sys; from repdegen.reproduce.cli import main; sys.argv[0] = 'repdegen'; main()"
    out = subprocess.run([sys.executable, "-c", code, "train", f"{group}=nope", f"hydra.run.dir={tmp_path}/h"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("repdegen: error:"), out.stderr[-2000:]
    assert (f"the options of {group} are" in lines[0]) or (group == "experiment" and "expected one of" in lines[0])
    assert "Traceback" not in out.stderr and not (tmp_path / "outputs").exists()
