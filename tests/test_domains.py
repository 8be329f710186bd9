"""Every numeric setting has a declared domain (reproduce/settings/domains.py) and values outside it are refused where the
config is resolved: a property test over the resolved config of every table cell and preset (tests/golden), then the
command line (exit 2, one `repdegen: error:` line, nothing written)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.settings.domains import DOMAINS, check_domains, domain_of, numeric_leaves, parse_domain

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = sorted((ROOT / "tests" / "golden" / "configs").glob("*.yaml"))


def golden_trees() -> list[dict]:
    return [yaml.safe_load(p.read_text()) for p in GOLDEN]


def one_config_per_key() -> dict[str, dict]:
    """For every numeric key of the golden configs, one config that holds a number there."""
    out: dict[str, dict] = {}
    for tree in golden_trees():
        for key, value in numeric_leaves(tree).items():
            if value is not None and key not in out:
                out[key] = tree
    return out


def set_key(tree: dict, key: str, value) -> dict:
    import copy

    tree = copy.deepcopy(tree)
    node = tree
    *parents, last = key.split(".")
    for p in parents:
        node = node[p]
    node[last] = value
    return tree


def bad_values(key: str) -> list:
    """Values outside the key's domain: below/above its bounds, a fraction for an integer, NaN, inf, a string."""
    d = domain_of(key)
    out = [float("nan"), float("inf"), "abc"]
    if d.low is not None:
        out.append(d.low if d.low_open else d.low - 1)
        out.append(-1 if d.low >= 0 else d.low - 10)
    if d.high is not None:
        out.append(d.high if d.high_open else d.high + 1)
    if d.integer:
        out.append(2.5)
    return out


def test_every_numeric_key_of_every_cell_has_a_domain_and_every_cell_is_inside():
    assert GOLDEN, "tests/golden has no configs"
    undeclared = {k for tree in golden_trees() for k, v in numeric_leaves(tree).items()
                  if v is not None and domain_of(k) is None}
    assert not undeclared, f"numeric settings without a domain in reproduce/settings/domains.py: {sorted(undeclared)}"
    for tree in golden_trees():
        check_domains(tree)  # the papers' own settings are inside (a ConfigError here names the key)


def test_values_outside_each_domain_are_refused_with_the_key_value_and_a_fix():
    cases = one_config_per_key()
    assert len(cases) >= 80  # the golden configs' numeric keys (88 when written)
    n = 0
    for key, tree in cases.items():
        for bad in bad_values(key):
            with pytest.raises(ConfigError) as err:
                check_domains(set_key(tree, key, bad))
            msg = str(err.value)
            assert msg.startswith(f"{key}=") and "expected" in msg and f"set {key}=" in msg, msg
            n += 1
        # and a value inside stays accepted
        check_domains(set_key(tree, key, type(tree_value(tree, key))(domain_of(key).example())))
    assert n >= 4 * len(cases)


def tree_value(tree: dict, key: str):
    node = tree
    for p in key.split("."):
        node = node[p]
    return node


@pytest.mark.parametrize("text,inside,outside", [
    ("int>0", [1, 7], [0, -1]),
    ("int>=0", [0, 3], [-1]),
    ("float>0", [1e-9, 2.0], [0.0, -0.1]),
    ("[0,1)", [0.0, 0.999], [1.0, -0.01]),
    ("(0,1]", [1.0, 0.5], [0.0, 1.01]),
    ("[0,1]", [0.0, 1.0], [-0.5, 1.5]),
])
def test_domain_bounds_by_hand(text, inside, outside):
    d = parse_domain(text)
    assert all(d.contains(v) for v in inside) and not any(d.contains(v) for v in outside)
    assert d.contains(float(d.example()))


def test_domains_parse():
    for text in set(DOMAINS.values()):
        d = parse_domain(text)
        assert d.low is None or not math.isnan(d.low)


@pytest.mark.e2e
@pytest.mark.parametrize("override,key", [("seed=-1", "seed"), ("model.dropout=1.5", "model.dropout"),
                                          ("optim.lr=0", "optim.lr"), ("trainer.batch_size=2.5", "trainer.batch_size")])
def test_the_command_line_refuses_a_bad_value_in_one_line_and_writes_nothing(tmp_path, tiny_data, override, key):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "repdegen.reproduce.train", "experiment=inan2017/small", "scale=smoke",
                        f"dataset.data_dir={tiny_data}", f"paths.output_dir={out}", override],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("repdegen: error:")]
    assert len(errors) == 1 and key in errors[0], r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert not (out / "runs").exists() or not any((out / "runs").iterdir())


# ---- the same property through the train entry: exit status 2, one error line, nothing written ----------------
REAL_CELLS = (["experiment=inan2017/small", "objective=real", "scale=smoke"],
              ["experiment=yu2022/gpt2_wt103", "objective=agg", "scale=smoke"],
              ["experiment=gao2019/transformer_base_en_de", "objective=cosreg", "scale=smoke"])


@pytest.mark.e2e  # through the train entry function, 873 times
def test_every_numeric_field_of_real_cells_is_refused_by_the_train_entry(tmp_path, capsys):
    """Every numeric field of three real table cells (an LSTM LM, a Transformer LM with AGG, a translation model)
    set to each value outside its domain (negative, zero where excluded, NaN, inf, a string, a fraction for an
    integer): the train entry exits 2 with one `repdegen: error:` line naming the key, and writes nothing."""
    from omegaconf import OmegaConf
    from repdegen.reproduce.errors import EXIT_USER_ERROR, exit_on_user_error
    from repdegen.reproduce.settings.resolve import compose
    from repdegen.reproduce.train import train

    out = tmp_path / "out"
    fields = values = 0
    for overrides in REAL_CELLS:
        cfg = compose([*overrides, f"paths.output_dir={out}"])[0]
        tree = OmegaConf.to_container(cfg, resolve=True)
        for key, value in numeric_leaves(tree).items():
            if value is None or key.startswith(("scale.", "objectives.", "scales.")):
                continue  # the scale's record is checked against its file first; a preset's sections are overrides
            assert domain_of(key) is not None, f"{key} has no domain in reproduce/settings/domains.py"
            fields += 1
            for bad in bad_values(key):
                bad_cfg = OmegaConf.create(set_key(tree, key, bad))  # untyped: the value reaches the resolution
                with pytest.raises(SystemExit) as stop:
                    exit_on_user_error(train)(bad_cfg)
                assert stop.value.code == EXIT_USER_ERROR, (key, bad)
                lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("repdegen: error:")]
                assert len(lines) == 1 and key in lines[0], (key, bad, lines)
                values += 1
    assert not out.exists()  # nothing written, not even the ledger folder
    assert fields >= 100 and values >= 4 * fields, (fields, values)
