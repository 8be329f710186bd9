"""RunSpec (reproduce/settings/resolve.py): overrides resolve once into a frozen spec; a table cell's process reads the
spec its table wrote without composing or finalizing again; a sweep job records its hash. The expected configs are
built independently: Hydra's own compose, given the experiment's file for the scale where it exists on disk."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from repdegen.core.errors import CorruptFile
from repdegen.reproduce.runs import sweeps
from repdegen.reproduce.settings import resolve as runspec
from repdegen.reproduce.settings.config import CONF_DIR, DEFAULT_SCALE, config_hash, finalize, register_all
from repdegen.reproduce.settings.resolve import JOB_SPEC, RunSpec, read_cell, record_job_spec, resolve, write_cell

register_all()


def _by_hand(experiment: str, scale: str, objective: str) -> tuple[str, list[str]]:
    """The hash of the preset's cell composed by Hydra, given ``experiment_scale=`` when that file exists."""
    added = ([f"experiment_scale={experiment}/{scale}"]
             if (CONF_DIR / "experiment_scale" / experiment / f"{scale}.yaml").is_file() else [])
    given = [f"experiment={experiment}", f"scale={scale}", f"objective={objective}"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*added, *given])
    return config_hash(finalize(cfg)), added


@pytest.mark.parametrize(("experiment", "scale", "objective"), [
    ("inan2017/small", "lite", "real"), ("inan2017/small", "paper", "al"), ("gao2019/awd_lstm_wt2", "lite", "cosreg"),
    ("inan2016/h300", "paper", "al"), ("yu2022/gpt2_wt103", "smoke", "agg")])
def test_resolve_equals_hydras_composition_given_the_experiments_scale_file(experiment, scale, objective):
    spec = resolve([f"experiment={experiment}", f"scale={scale}", f"objective={objective}"])
    h, added = _by_hand(experiment, scale, objective)
    assert spec.config_hash == h
    assert list(spec.preset) == added
    assert spec.overrides[len(spec.preset):] == (f"experiment={experiment}", f"scale={scale}", f"objective={objective}")
    assert spec.choices["experiment"] == experiment and spec.choices["objective"] == objective


def test_the_default_scale_is_the_one_conf_config_yaml_chooses():
    defaults = yaml.safe_load((CONF_DIR / "config.yaml").read_text())["defaults"]
    assert {"scale": DEFAULT_SCALE} in defaults
    assert resolve(["experiment=inan2017/small"]).preset == ("experiment_scale=inan2017/small/paper",)


def test_a_scale_file_chosen_or_refused_on_the_command_line_is_not_added():
    assert resolve(["experiment=inan2017/small", "scale=lite", "~experiment_scale"]).preset == ()


def test_the_spec_is_frozen_and_its_config_read_only():
    spec = resolve(["experiment=inan2017/small", "objective=mle", "scale=smoke"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.config_hash = "x"
    with pytest.raises(Exception, match="read-only"):
        spec.cfg.optim.lr = 2.0
    with pytest.raises(TypeError):
        spec.choices["model"] = "other"


def test_a_cell_is_read_back_without_composing_or_finalizing(tmp_path, monkeypatch):
    spec = resolve(["experiment=inan2017/small", "objective=real", "scale=smoke"])
    path = write_cell(spec, tmp_path)
    assert path == tmp_path / spec.config_hash / "cell.yaml"

    def forbidden(*_a, **_k):
        raise AssertionError("read_cell composed or finalized again")

    monkeypatch.setattr(runspec, "finalize", forbidden)
    monkeypatch.setattr(runspec, "compose_with_choices", forbidden)
    back = read_cell(path)
    assert back.config_hash == spec.config_hash
    assert OmegaConf.to_container(back.cfg.model) == OmegaConf.to_container(spec.cfg.model)
    assert back.cfg.trainer.resume is True  # a cell resumes its checkpoint
    assert dict(back.choices) == dict(spec.choices)


def test_an_edited_or_unfinalized_cell_is_refused_naming_the_file(tmp_path):
    spec = resolve(["experiment=inan2017/small", "objective=mle", "scale=smoke"])
    path = write_cell(spec, tmp_path)
    text = path.read_text()
    path.write_text(text.replace("lr: 1.0", "lr: 2.0", 1))
    with pytest.raises(CorruptFile, match=rf"{path}.*not of {spec.config_hash}.*edited"):
        read_cell(path)
    # a cell.yaml written before the presets' sections became config groups holds them and a flag: read the same
    older = tmp_path / spec.config_hash / "cell.yaml"
    older.write_text(text + "_finalized: true\nobjectives: {al: {alpha: 3.0}}\nscales: {lite: {budget: x}}\n")
    assert read_cell(older).config_hash == spec.config_hash


def test_a_sweep_job_is_found_by_its_recorded_hash_not_by_composing(tmp_path, monkeypatch):
    spec = resolve(["experiment=inan2017/small", "objective=mle", "scale=smoke", f"paths.output_dir={tmp_path}"])
    job_dir = tmp_path / "sweep" / "0"
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text("- objective=mle\n")
    record_job_spec(job_dir, spec)
    recorded = json.loads((job_dir / JOB_SPEC).read_text())
    assert recorded["config_hash"] == spec.config_hash
    run = tmp_path / "runs" / spec.config_hash
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps({"config_hash": spec.config_hash, "status": "complete", "config": {},
                                                 "metrics": {"final": {"valid_ppl": 5.0}}}))

    def forbidden(*_a, **_k):
        raise AssertionError("the job's overrides were composed again")

    monkeypatch.setattr(sweeps, "compose_job", forbidden)
    job = sweeps.load_job(job_dir, "final")
    assert (job.config_hash, job.status) == (spec.config_hash, "complete")


def test_runspec_fields():
    assert [f.name for f in dataclasses.fields(RunSpec)] == ["cfg", "config_hash", "overrides", "preset", "choices"]


def test_a_bad_job_spec_names_the_file_and_the_key(tmp_path):
    job_dir = tmp_path / "0"
    job_dir.mkdir()
    (job_dir / JOB_SPEC).write_text(json.dumps({"runs_dir": "/x"}))
    with pytest.raises(CorruptFile, match=r"run_spec.json.*config_hash"):
        sweeps._recorded_spec(job_dir)


# ---- the composition memo: the defaults tree once per set of group choices, the values applied by Hydra's function --
VALUES = ["seed=7", "objective.alpha=30", "paths.runs_dir=/tmp/somewhere/runs", "trainer.progress=false",
          "+extra_note=hello"]


def _hydra(overrides: list[str]):
    """Hydra's own composition of ``overrides`` (no memo), without the ``choices`` compose_with_choices fills in."""
    cfg = OmegaConf.to_container(compose(config_name="config", overrides=overrides), resolve=False)
    assert cfg.pop("choices") == {}  # the schema's empty default
    return cfg


def test_the_memo_composes_what_hydra_composes_and_reuses_the_group_choices(monkeypatch):
    calls = []
    real = runspec.compose_with_choices
    monkeypatch.setattr(runspec, "compose_with_choices", lambda o, n="config": calls.append(list(o)) or real(o, n))
    memo: dict = {}
    groups = ["experiment=inan2017/small", "objective=al", "scale=lite"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for seed in (1, 2):
            got = runspec._compose_memo([*groups, *VALUES, f"seed={seed}"], "config", memo)
            want = _hydra([*groups, *VALUES, f"seed={seed}"])
            got = OmegaConf.to_container(got, resolve=False)
            choices = got.pop("choices")  # what compose_with_choices adds (Hydra's runtime choices)
            assert choices["experiment"] == "inan2017/small" and choices["objective"] == "al"
            assert got == want and got["seed"] == seed and got["objective"]["alpha"] == 30
        # one composition of the group choices served both calls; another choice composes anew
        assert calls == [groups]
        runspec._compose_memo(["experiment=inan2017/small", "objective=real", "scale=lite", "seed=1"], "config", memo)
        assert calls[-1] == ["experiment=inan2017/small", "objective=real", "scale=lite"]
        runspec._compose_memo([*groups, "seed=3"], "config", None)  # no memo: Hydra's composition, every time
        assert calls[-1] == [*groups, "seed=3"]


@pytest.mark.parametrize(("bad", "match"), [("trainer.no_such_key=1", "Could not override 'trainer.no_such_key'"),
                                            ("+seed=3", "Could not append to config"),
                                            ("~trainer.no_such_key", "Could not delete")])
def test_the_memo_raises_hydras_own_error_for_a_bad_value(bad, match):
    from hydra.errors import ConfigCompositionException

    memo: dict = {}
    groups = ["experiment=inan2017/small", "scale=smoke"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        with pytest.raises(ConfigCompositionException, match=match) as hydra_err:
            compose(config_name="config", overrides=[*groups, bad])
        runspec._compose_memo(groups, "config", memo)  # the group choices composed before: the memo's path
        with pytest.raises(ConfigCompositionException, match=match) as memo_err:
            runspec._compose_memo([*groups, bad], "config", memo)
    assert str(memo_err.value) == str(hydra_err.value)
