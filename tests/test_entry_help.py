"""Every entry point's ``--help`` says what it does, gives examples and where to look next (the Hydra apps' pages are
``conf/hydra/help/<name>.yaml``, without the ConfigStore's schemas); ``repdegen.reproduce.train ... --cfg job`` prints the config
the run trains, the one :func:`repdegen.reproduce.settings.resolve.resolve` gives (as ``repdegen.reproduce.describe``), not
Hydra's
composition before it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
TRAIN_ARGS = ["experiment=inan2017/small", "objective=real", "scale=lite"]

# entry point -> (words of its description, a Hydra app)
ENTRY_POINTS = {
    "train": ("train one run", True),
    "table": ("regenerate paper tables", True),
    "describe": ("sizes without training", True),
    "analyze": ("the degeneration analysis of one trained language model", True),
    "translate": ("translate a text file", True),
    "aggregate": ("Aggregate a Hydra multirun", False),
    "report": ("every reproduced table and figure", False),
    "status": ("What the run ledger holds now", False),
    "embeddings": ("A degeneration report", False),
}
CFG_JOB = ("train", *TRAIN_ARGS, "--cfg", "job")


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("REPDEGEN_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _run(args: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"reproduce.{args[0]}", *args[1:]], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def outputs() -> dict:
    """Every command of this file, three at a time (each is mostly imports)."""
    commands = [(name, "--help") for name in ENTRY_POINTS] + [CFG_JOB]
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(commands, pool.map(_run, commands)))


def example_lines(text: str) -> list[str]:
    """The command lines of the help's ``Examples:`` section (up to the next blank line)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().lower() == "examples:"), None)
    assert start is not None, f"no Examples: section in\n{text}"
    section = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        section.append(line)
    command = r"\s*(repdegen \w+|python -m repdegen\.reproduce\.\w+|make [\w-]+|torchrun)(\s|$)"
    return [line for line in section if re.match(command, line)]


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_help(outputs, name):
    proc = outputs[(name, "--help")]
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    description, hydra_app = ENTRY_POINTS[name]
    assert description in " ".join(text.split())  # however it is wrapped
    examples = example_lines(text)
    assert len(examples) >= 3, examples
    assert any(f"repdegen {name} " in line for line in examples), examples
    assert "docs/" in text  # where to look next
    if hydra_app:
        assert not re.search(r"\b(schema|base)_", text)  # the ConfigStore's schemas (transformer_base_... is an option)
        assert "Config ==" not in text  # not Hydra's default page (the whole config)
    if name in ("train", "describe", "table"):
        assert re.search(r"^\s+scale:\s+lite, paper, smoke$", text, re.M), text  # the config groups, from conf/
    if name in ("train", "describe"):
        assert "inan2017/small" in text and "repdegen describe" in text
        assert not re.search(r"^\s+table:", text, re.M)  # a group of repdegen.reproduce.table only


@pytest.mark.e2e
def test_table_help_is_short(outputs):
    text = outputs[("table", "--help")].stdout
    assert len(text.splitlines()) < 80, text
    assert "yu2022_t3" in text  # the tables, listed from conf/table/


@pytest.mark.e2e
def test_cfg_job_prints_the_resolved_config(outputs):
    """Not Hydra's composition (max_epochs 100, train_tokens null, tie_weights false for this command), but what
    the run trains: the RunSpec computed here, in this process."""
    from repdegen.reproduce.settings.config import config_hash
    from repdegen.reproduce.settings.resolve import resolve

    proc = outputs[CFG_JOB]
    spec = resolve(TRAIN_ARGS)
    if proc.returncode != 0:  # the other answer the issue allows: a refusal that names describe
        assert "repdegen describe" in proc.stderr
        return
    printed = OmegaConf.create(proc.stdout)
    assert printed.trainer.max_epochs == spec.cfg.trainer.max_epochs
    assert printed.dataset.train_tokens == spec.cfg.dataset.train_tokens
    assert printed.model.tie_weights == spec.cfg.model.tie_weights
    assert OmegaConf.to_container(printed) == OmegaConf.to_container(spec.cfg)
    assert config_hash(printed) == spec.config_hash
    assert spec.config_hash in proc.stderr and "repdegen describe" in proc.stderr


def test_cfg_job_of_a_sweep_is_refused(capsys):
    """With -m every job has its own config: one line naming describe, exit status 2, nothing on stdout (refused
    before anything is composed, so it runs here)."""
    from repdegen.reproduce.cli import show_resolved_cfg

    with pytest.raises(SystemExit) as exit_info:
        show_resolved_cfg(["prog", "-m", "+sweep=agg_alpha", "scale=smoke", "--cfg", "job"])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("repdegen: error:") and "repdegen describe" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, cfg", [
    (["a=1", "--cfg", "job"], "job"),
    (["-c", "all", "a=1"], "all"),
    (["--cfg=job", "-p", "model"], "job"),
    (["--cfg", "hydra"], None),  # Hydra's own settings: Hydra prints them
    (["--help", "--cfg", "job"], None),  # Hydra answers --help first
    (["-cn", "config", "a=1"], None),
    (["a=1"], None),
])
def test_cfg_request(argv, cfg):
    from repdegen.reproduce.cli import cfg_request

    args = cfg_request(["prog", *argv])
    assert (args.cfg if args is not None else None) == cfg


def test_config_groups_help():
    from repdegen.reproduce.cli import config_groups_help

    text = config_groups_help("-table")
    groups = dict(re.findall(r"^  (\w+):\s+(.*)$", text, re.M))
    assert {"experiment", "objective", "scale", "dataset", "model", "optim", "budget", "sweep", "logger"} <= set(groups)
    assert "table" not in groups and "hydra" not in groups
    assert not re.search(r"\b(schema|base)_", text)
    assert "inan2017/small" in text  # a nested group, under its parent
    assert [line.split(":")[0].strip() for line in config_groups_help("table", "scale").splitlines()
            if not line.startswith("   ")] == ["table", "scale"]
