"""A trained run read back from its directory: its record, the weights file it finished with, and the model and corpus
it trained on (``repdegen.reproduce.translate``, ``repdegen.reproduce.analyze``); and the analyses of a trained run that a table
reads
besides the run's own record (a table's ``analyses:``), each computed once and kept in the run's ``analysis/`` folder:

* ``continuations: N`` -- greedy continuations of the first N 50-token test prefixes by 100 tokens and their Uniq
  (Yu et al. 2022, Tables 5 and 15): ``cont_uniq_mean`` and ``cont_uniq_total``, in
  ``<run>/analysis/continuations_<N>.json`` with the time it was computed (a claim on them is pre-registered against
  that time, not the time the run started: the measurement is what the claim waits for).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.results.metrics import analysis_metrics

WEIGHT_FILES = ("averaged.pt", "last.pt", "best.pt")


def read_record(run_dir: Path) -> dict:
    path = run_dir / "result.json"
    if not path.is_file():
        raise ConfigError(
            f"{run_dir} has no result.json: checkpoint= must be a run directory of repdegen.reproduce.train (or a file in one)"
        )
    from repdegen.core.loaders import load_run_record

    return load_run_record(path, "restore it from a copy, or train the run again (move its directory aside first)")


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(run directory, weights file) for a run directory or a weights file inside one."""
    p = Path(path).expanduser()
    if p.is_dir():
        run_dir = p
        t = read_record(run_dir)["config"]["trainer"]
        preferred = ["averaged.pt"] if t.get("average_last", 0) > 1 else []
        preferred += ["last.pt", "best.pt"] if t.get("final_weights") == "last" else ["best.pt", "last.pt"]
        for name in preferred:
            if (run_dir / name).is_file():
                return run_dir, run_dir / name
        raise ConfigError(f"{run_dir} holds no weights ({', '.join(preferred)}); has the run finished an epoch?")
    if p.is_file():
        return p.parent, p
    raise ConfigError(f"checkpoint={path!r} is neither a run directory nor a weights file; give outputs/runs/<hash>")


def other_weights(weights: Path) -> str:
    """What to try instead of an unreadable weights file: the run's other weights files."""
    others = [n for n in (*WEIGHT_FILES, "checkpoint.pt") if n != weights.name and (weights.parent / n).is_file()]
    if others:
        return (f"give another weights file of the run ({', '.join(f'checkpoint={weights.parent / n}' for n in others)}), "
                f"or restore {weights.name} from a copy")
    return f"restore {weights.name} from a copy, or train the run again (move {weights.parent} aside first)"


def load_weights_file(weights: Path) -> dict:
    from repdegen.core.loaders import load_checkpoint

    return load_checkpoint(weights, "weights file", other_weights(weights))


@dataclass
class TrainedLM:
    run_dir: Path
    weights: Path
    record: dict
    cfg: DictConfig
    corpus: object
    model: object  # a torch.nn.Module in eval mode, on the device asked for


def load_lm(checkpoint: str | Path, device, what: str = "repdegen.reproduce.analyze") -> TrainedLM:
    """The language model of a run directory (or a weights file in one) with the corpus it trained on."""
    from repdegen.models import build_model
    from repdegen.reproduce.runs.execute import load_any_corpus

    run_dir, weights = resolve_checkpoint(checkpoint)
    record = read_record(run_dir)
    blob = load_weights_file(weights)  # before the corpus: a damaged file is reported at once
    cfg = OmegaConf.create(record["config"])
    if cfg.dataset.kind != "lm":
        raise ConfigError(f"{run_dir} is a {cfg.dataset.kind} run; {what} reads language models (the embedding "
                          f"figures of translation runs are written by repdegen.reproduce.runs.tables)")
    corpus = load_any_corpus(cfg.dataset, cfg.paths.cache_dir)
    model = build_model(cfg.model, len(corpus.vocab), cfg.model.tie_weights)
    model.load_state_dict(blob["model"])
    return TrainedLM(run_dir, weights, record, cfg, corpus, model.to(device).eval())


# ---- analyses a table reads ------------------------------------------------------------------------------------
CONTINUATION_PREFIX, CONTINUATION_STEPS = 50, 100  # Yu et al. 2022, Tables 5 and 15 (their captions)
ANALYSIS_METRICS = analysis_metrics()  # {analysis: the metrics it gives}, from the one metric registry


def analyses_read(metrics, analyses) -> dict:
    """{analysis: its setting} of the table's ``analyses`` that give any of ``metrics`` (e.g. {"continuations": 500})."""
    given = dict(analyses or {})
    return {a: given.get(a) for a, names in ANALYSIS_METRICS.items() if set(names) & set(metrics)}


def decoder(corpus):
    """Token ids -> text, for a corpus of BPE pieces or of words."""
    if corpus.tokenizer is not None:
        return corpus.tokenizer.decode
    return lambda ids: " ".join(corpus.vocab.itos[i] for i in ids)


def continuations(lm: TrainedLM, n: int, examples: int = 5) -> dict:
    """Greedy continuations of the first ``n`` test prefixes (:func:`repdegen.analysis.inspection.continuation_uniq`): their
    mean Uniq, the distinct tokens over all of them, and the first ``examples`` as text."""
    import torch
    from repdegen.analysis.inspection import continuation_uniq

    decode = decoder(lm.corpus)
    stoi = lm.corpus.vocab.stoi
    forbid = [stoi["<pad>"]] if "<pad>" in stoi else []
    with torch.no_grad():
        c = continuation_uniq(lm.model, lm.corpus.test, prefix_len=CONTINUATION_PREFIX, steps=CONTINUATION_STEPS, n=n,
                              forbid=forbid, decode=decode)
    return {"mean_uniq": c["mean_uniq"], "uniq_total": c["uniq_total"], "n": len(c["uniq"]), "uniq": c["uniq"],
            "prefix_len": CONTINUATION_PREFIX, "steps": CONTINUATION_STEPS,
            "examples": [{"prefix": decode(p), "continuation": t, "uniq": u}
                         for p, t, u in zip(c["prefixes"][:examples], c["texts"][:examples], c["uniq"][:examples])]}


def continuations_path(run_dir: Path, n: int) -> Path:
    return Path(run_dir) / "analysis" / f"continuations_{n}.json"


def analysis_values(run_dir: Path, analyses) -> tuple[dict[str, float], str | None]:
    """The metrics of a table's ``analyses`` that ``run_dir`` holds (none computed yet: {}), and when the latest of
    them was computed."""
    from repdegen.core.loaders import load_continuations

    n = int(analyses.get("continuations") or 0) if analyses is not None else 0
    path = continuations_path(run_dir, n)
    if not n or not path.is_file():
        return {}, None
    data = load_continuations(path)
    return {"cont_uniq_mean": float(data["mean_uniq"]), "cont_uniq_total": float(data["uniq_total"])}, data["computed"]


def run_analyses(run_dir: Path, analyses, device: str = "cpu") -> bool:
    """Compute the table's ``analyses`` a complete run does not hold yet; True when something was computed."""
    import torch
    from repdegen.core.files import atomic_write_json
    from repdegen.core.provenance import git_commit

    n = int(analyses.get("continuations") or 0) if analyses is not None else 0
    path = continuations_path(run_dir, n)
    if not n or path.is_file():
        return False
    started = dt.datetime.now()
    lm = load_lm(run_dir, torch.device(device), "a table's analyses")
    out = continuations(lm, n)
    out.update(weights=lm.weights.name, computed=started.isoformat(timespec="seconds"), commit=git_commit(),
               seconds=round((dt.datetime.now() - started).total_seconds(), 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, out)
    return True
