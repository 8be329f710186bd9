"""The package as it installs: one namespace ``repdegen`` (the top-level folders as ``repdegen.<folder>``, conf/ as
``repdegen.conf``), every package listed in pyproject.toml, and the ``repdegen`` command's list of commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("analysis", "conf", "core", "data", "losses", "models", "reproduce")
# packages that live in a subfolder of another but install under their own name: the Hugging Face integration
MAPPED_SUBFOLDERS = {"repdegen.hf": "losses/hf"}


def test_every_package_folder_is_listed_under_the_namespace():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    # a subfolder mapped as a package of its own (losses/hf/ is repdegen.hf) is named by its mapping
    mapped = {folder: name for name, folder in MAPPED_SUBFOLDERS.items()}

    def package(folder: Path) -> str:
        rel = folder.relative_to(REPO)
        return mapped.get(rel.as_posix()) or "repdegen." + ".".join(rel.parts)

    on_disk = sorted(package(p.parent) for top in FOLDERS for p in (REPO / top).rglob("__init__.py"))
    assert sorted(cfg["packages"]) == on_disk
    assert cfg["package-dir"] == {**{f"repdegen.{top}": top for top in FOLDERS}, **MAPPED_SUBFOLDERS}


def test_configs_are_found_through_the_package():
    import importlib.resources

    from repdegen.reproduce.settings.config import CONF_DIR

    assert CONF_DIR == Path(str(importlib.resources.files("repdegen.conf")))
    assert (CONF_DIR / "config.yaml").is_file() and (CONF_DIR / "table" / "inan2017_t1.yaml").is_file()


def test_the_objectives_import_by_name():
    from repdegen.losses import AGG, CosReg, Objective

    assert issubclass(AGG, Objective) and issubclass(CosReg, Objective)


def _repdegen(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from repdegen.reproduce.cli import main; sys.argv[0] = 'repdegen'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
def test_repdegen_lists_its_commands():
    from repdegen.reproduce.cli import COMMANDS

    ok = _repdegen("--help")
    assert ok.returncode == 0 and ok.stderr == ""
    listed = [line.split()[0] for line in ok.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS)
    for args, says in (((), "no command given"), (("nope",), "'nope' is not a command")):
        bad = _repdegen(*args)
        assert bad.returncode == 2 and bad.stdout == "" and "Traceback" not in bad.stderr
        assert bad.stderr.startswith(f"repdegen: error: {says}") and "  train " in bad.stderr


@pytest.mark.e2e
def test_a_command_gets_the_rest_of_the_command_line():
    out = _repdegen("describe", "model=vd_lstm_small", "dataset=ptb", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "name: vd_lstm_small" in out.stdout and "repdegen: --cfg job" in out.stderr


def test_an_install_without_its_configs_says_where_it_looked(tmp_path, monkeypatch):
    import importlib.resources

    from repdegen.reproduce.settings import config

    monkeypatch.setattr(importlib.resources, "files", lambda name: tmp_path)
    with pytest.raises(SystemExit) as err:
        config._conf_dir()
    message = str(err.value)
    assert message.startswith("repdegen: error:") and f"{tmp_path}/config.yaml does not exist" in message
    assert "reinstall" in message
