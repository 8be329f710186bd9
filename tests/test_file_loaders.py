"""One loader per kind of file the project reads (``repdegen.core.loaders``): a bad file (truncated, of the wrong
top-level type, a required key missing or of the wrong type) is a CorruptFile naming the file and the key; a good
one reads as a plain json / yaml / OmegaConf / torch read reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from repdegen.core import loaders as files
from repdegen.core.errors import CorruptFile
from repdegen.reproduce.runs.ledger import CorruptRecord, Ledger, read_record
from repdegen.reproduce.settings.config import CONF_DIR

from tests.test_bad_inputs import call_entry, one_error_line, trained  # noqa: F401 (trained: a fixture)

GOOD_RECORD = {"config_hash": "abc", "status": "complete", "label": "x", "config": {"trainer": {"max_epochs": 1}},
               "history": [{"epoch": 1, "valid_ppl": 9.5}], "metrics": {"final": {"test_ppl": 9.0}},
               "started": "2024-01-01T00:00:00"}
GOOD_CELLS = {"table": "t", "scale": "lite", "command": "repdegen table table=t", "meta": {"source": "s"},
              "cells": [{"label": "A", "status": "complete", "config_hash": "h", "run_dir": "/r/h", "seed": 1}],
              "figures": {}}
GOOD_CLAIMS = {"table": "t", "title": "T", "scale": "lite", "seeds": [1],
               "claims": [{"text": "A beats B", "state": "holds", "checks": []}]}
GOOD_REGISTRATION = {"table": "t", "scale": "lite", "claims": {"c1": {"text": "c"}}, "cells": {"h": {"seed": 1}}}
GOOD_NOTE = {"status": "failed", "error": "RuntimeError: CUDA out of memory"}
GOOD_CELL_YAML = {"model": {"name": "m"}, "dataset": {"name": "d"}, "objective": {"name": "mle"},
                  "trainer": {"resume": True, "lr_note": "${optim.lr}"}, "optim": {"lr": 0.001}, "seed": 1}
GOOD_OVERRIDES = ["objective=cosreg", "objective.gamma=0.1", "seed=2"]

# kind: (loader of a path, format, a good document, required key (missing / of the wrong type), a wrong value)
JSON_KINDS = {
    "run record": (files.load_run_record, GOOD_RECORD, "config", "a string"),
    "run record status": (files.load_run_record, GOOD_RECORD, "status", 3),
    "run record hash": (files.load_run_record, GOOD_RECORD, "config_hash", None),
    "cells.json": (files.load_cells_json, GOOD_CELLS, "cells", {"a": 1}),
    "claims.json": (files.load_claims_json, GOOD_CLAIMS, "claims", "none"),
    "registration.json": (files.load_registration, GOOD_REGISTRATION, "cells", []),
    "failure note": (files.load_failure_note, GOOD_NOTE, "error", ["x"]),
}


def _write(path: Path, data, fmt: str = "json") -> Path:
    path.write_text(json.dumps(data) if fmt == "json" else yaml.safe_dump(data))
    return path


def _raises(loader, path: Path, *names: str) -> str:
    with pytest.raises(CorruptFile) as err:
        loader(path)
    message = str(err.value)
    assert str(path) in message and err.value.path == path, message
    for name in names:
        assert name in message, (name, message)
    return message


# ---- JSON kinds --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(JSON_KINDS))
def test_a_good_json_file_reads_as_plain_json(kind, tmp_path):
    loader, good, _, _ = JSON_KINDS[kind]
    path = _write(tmp_path / "f.json", good)
    assert loader(path) == json.loads(path.read_text())


@pytest.mark.parametrize("kind", list(JSON_KINDS))
def test_a_bad_json_file_is_named_with_what_is_wrong(kind, tmp_path):
    loader, good, key, wrong = JSON_KINDS[kind]
    path = tmp_path / "f.json"
    path.write_text(json.dumps(good)[:25])
    _raises(loader, path, "invalid JSON", "truncated")
    path.write_bytes(b"\xff\xfe{")
    _raises(loader, path, "UTF-8")
    _write(path, [good])
    _raises(loader, path, "a JSON list, not an object")
    _write(path, {k: v for k, v in good.items() if k != key})
    _raises(loader, path, f"no key {key!r}")
    _write(path, dict(good, **{key: wrong}))
    _raises(loader, path, f"the key {key!r}", "expected")


def test_entries_of_cells_and_claims_are_checked(tmp_path):
    path = _write(tmp_path / "cells.json", dict(GOOD_CELLS, cells=["h"]))
    _raises(files.load_cells_json, path, "cells[0]", "expected an object")
    path = _write(tmp_path / "claims.json", dict(GOOD_CLAIMS, claims=[{"state": "holds"}]))
    _raises(files.load_claims_json, path, "claims[0].'text'")


def test_a_run_record_error_is_a_corrupt_record_with_its_fix(tmp_path):
    path = _write(tmp_path / "result.json", {"status": "complete", "config_hash": "h"})
    with pytest.raises(CorruptRecord) as err:
        read_record(path, "do this")
    assert "'config'" in err.value.why and str(err.value).endswith("do this")
    assert read_record(_write(path, GOOD_RECORD), "x") == GOOD_RECORD
    assert Ledger(tmp_path.parent).load(tmp_path.name) == GOOD_RECORD


def test_a_missing_file_is_left_to_the_caller(tmp_path):
    with pytest.raises(FileNotFoundError):
        files.load_run_record(tmp_path / "absent.json")


# ---- YAML kinds --------------------------------------------------------------------------------------------
def test_cell_yaml_reads_as_omegaconf_load(tmp_path):
    path = _write(tmp_path / "cell.yaml", GOOD_CELL_YAML, "yaml")
    cfg = files.load_cell_yaml(path)
    assert cfg == OmegaConf.load(path) and OmegaConf.to_container(cfg) == OmegaConf.to_container(OmegaConf.load(path))
    assert cfg.trainer._get_node("lr_note")._value() == "${optim.lr}"  # not resolved, as OmegaConf.load


def test_a_bad_cell_yaml_is_named_with_what_is_wrong(tmp_path):
    path = tmp_path / "cell.yaml"
    path.write_text("model: {name: [m\n")
    _raises(files.load_cell_yaml, path, "invalid YAML")
    _write(path, [GOOD_CELL_YAML], "yaml")
    _raises(files.load_cell_yaml, path, "not a mapping")
    path.write_text("5\n")
    _raises(files.load_cell_yaml, path, "invalid YAML")
    _write(path, {k: v for k, v in GOOD_CELL_YAML.items() if k != "trainer"}, "yaml")
    _raises(files.load_cell_yaml, path, "no key 'trainer'", "cell config")
    _write(path, dict(GOOD_CELL_YAML, model="m"), "yaml")
    _raises(files.load_cell_yaml, path, "the key 'model' is a string; expected an object")


def test_overrides_read_as_yaml_and_bad_ones_are_named(tmp_path):
    path = _write(tmp_path / "overrides.yaml", GOOD_OVERRIDES, "yaml")
    assert files.load_overrides(path) == yaml.safe_load(path.read_text())
    path.write_text("")
    assert files.load_overrides(path) == []  # an empty file: no overrides (as `yaml.safe_load(...) or []`)
    path.write_text("- a=1\n- [b\n")
    _raises(files.load_overrides, path, "invalid YAML")
    _write(path, {"seed": 2}, "yaml")
    _raises(files.load_overrides, path, "not a list")
    _write(path, ["seed=2", 3], "yaml")
    _raises(files.load_overrides, path, "item 1", "expected a string")


# ---- torch files -------------------------------------------------------------------------------------------
def test_checkpoint_and_weights_files(tmp_path):
    path = tmp_path / "best.pt"
    blob = {"model": {"w": torch.arange(6.0)}, "objective": {}}
    torch.save(blob, path)
    got = files.load_checkpoint(path, "weights file", "fix it")
    plain = torch.load(path, map_location="cpu", weights_only=False)
    assert got.keys() == plain.keys() and torch.equal(got["model"]["w"], plain["model"]["w"])
    path.write_bytes(path.read_bytes()[:100])
    _raises(lambda p: files.load_checkpoint(p, "weights file", "fix it"), path, "cannot be read", "fix it")
    with pytest.raises(CorruptFile, match="truncated or corrupt"):
        files.check_torch_file(path, "checkpoint", "fix it")
    torch.save([1, 2], path)
    _raises(lambda p: files.load_checkpoint(p, "weights file", "fix"), path, "a list, not a dict")
    torch.save({"objective": {}}, path)
    _raises(lambda p: files.load_checkpoint(p, "weights file", "fix"), path, "no key 'model'")
    torch.save({"model": torch.zeros(2)}, path)
    _raises(lambda p: files.load_checkpoint(p, "weights file", "fix"), path, "the key 'model' is a Tensor")


def test_tensor_files(tmp_path):
    path = tmp_path / "vocab_counts.pt"
    torch.save(torch.tensor([5, 3, 1]), path)
    assert torch.equal(files.load_tensor_file(path, "vocabulary counts file", "fix"), torch.load(path))
    torch.save({"counts": torch.tensor([1])}, path)
    _raises(lambda p: files.load_tensor_file(p, "vocabulary counts file", "fix"), path, "not a tensor")
    path.write_bytes(b"PK\x03\x04 truncated")
    _raises(lambda p: files.load_tensor_file(p, "vocabulary counts file", "fix"), path, "cannot be read")


# ---- through the entry points ---------------------------------------------------------------------------
@pytest.mark.parametrize("entry", ["analyze", "translate"])
def test_a_record_without_its_config_is_one_error_line(entry, tmp_path, capsys):
    """The issue's example: repdegen.reproduce.analyze checkpoint=<run dir> on a record that lacks its config (a KeyError
    before); repdegen.reproduce.translate the same."""
    import repdegen.reproduce.analyze as analyze_mod
    import repdegen.reproduce.translate as translate_mod

    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    record = _write(run_dir / "result.json", {k: v for k, v in GOOD_RECORD.items() if k != "config"})
    (tmp_path / "x.txt").write_text("a sentence\n")
    fn = analyze_mod.analyze if entry == "analyze" else translate_mod.run
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        app = compose(f"{entry}_app", overrides=[f"checkpoint={run_dir}", "device=cpu"]
                      + ([f"input={tmp_path / 'x.txt'}"] if entry == "translate" else []))
    line = one_error_line(call_entry(fn, app, capsys), str(record), "'config'")
    assert "train the run again" in line
    assert not (run_dir / "analysis").exists()


# ---- every file the suite's own runs write passes its loader ---------------------------------------------
def test_the_files_a_real_run_writes_pass_their_loaders(trained, tmp_path):  # noqa: F811
    from repdegen.reproduce.errors import write_failure_note
    from repdegen.reproduce.settings.resolve import as_spec, read_cell, write_cell

    out, cfg, run_dir = trained
    for path in sorted(out.rglob("result*.json")):
        assert files.load_run_record(path) == json.loads(path.read_text())
    for name in ("checkpoint.pt", "best.pt", "last.pt", "averaged.pt"):
        if (run_dir / name).is_file():
            blob = files.load_checkpoint(run_dir / name, name, "fix")
            assert blob.keys() == torch.load(run_dir / name, map_location="cpu", weights_only=False).keys()
    for name in ("vocab_counts.pt", "init_embedding.pt"):
        if (run_dir / name).is_file():
            assert torch.equal(files.load_tensor_file(run_dir / name, name, "fix"), torch.load(run_dir / name))
    spec = as_spec(cfg)
    cell = write_cell(spec, tmp_path / "runs")
    assert files.load_cell_yaml(cell) == OmegaConf.load(cell)
    assert read_cell(cell).config_hash == spec.config_hash == run_dir.name  # the trained run's own hash
    write_failure_note(tmp_path, RuntimeError("boom"))
    assert files.load_failure_note(tmp_path / "failure.json") == json.loads((tmp_path / "failure.json").read_text())
