"""The degeneration analysis of one trained language model, from its run directory.

    repdegen analyze checkpoint=outputs/runs/<hash>
    repdegen analyze checkpoint=outputs/runs/<hash> words='[the,money,river]' \\
        phrases='["the meaning of life is"]' continuations=50 wordsim=true

Writes ``<checkpoint>/analysis/`` (or ``out=``): ``analysis.json`` and the figures

* ``svd_projection.png``   output embedding on its top-2 singular directions, coloured by frequency
                           group (Gao Figs 1(a), 2(a); Yu Figs 1, 3)
* ``singular_values.png``  normalised singular values (Gao Fig. 2(b), Yu Fig. 3(c))
* ``token_frequency.png``  training frequency against rank (Gao Fig. 3)
* ``geometry_over_training.png``  I(W), rare/frequent I(W) and rare-frequent cosine per evaluation (Yu Fig. 2)

and in ``analysis.json``: per-group test PPL and Uniq, I(W) per group, the rare-frequent cosine
(Yu Tables 1-4, 10, 11), word similarity (Yu Table 6, ``wordsim=true``), the top-5 nearest
neighbours of ``words`` (Yu Tables 13, 14), the top-10 next words after each of ``phrases`` (Inan 2017
Table 3), greedy continuations of ``continuations`` test prefixes of 50 tokens by 100 tokens with their
Uniq (Yu Tables 5, 15), and for untied models the subspace distance between the input and output
embeddings (Inan 2017 Fig. 1). Every number comes from the run's weights and corpus (the corpus is
loaded as the run loaded it: set ``REPDEGEN_DATA_DIR`` where the run used a local copy).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from repdegen.reproduce.errors import exit_on_user_error
from repdegen.reproduce.settings.config import CONF_DIR, register_all

register_all()


@dataclass
class AnalyzeConfig:
    checkpoint: str = MISSING
    out: str | None = None
    device: str = "auto"
    words: list[str] = field(default_factory=lambda: ["the", "money", "river", "king", "computer"])
    phrases: list[str] = field(default_factory=list)
    continuations: int = 0
    wordsim: bool = False


ConfigStore.instance().store(name="analyze_app_base", node=AnalyzeConfig)


def _encode(text: str, corpus) -> list[int]:
    if corpus.tokenizer is not None:
        return corpus.tokenizer.encode(text)
    unk = corpus.vocab.unk_id
    return [corpus.vocab.stoi.get(w, unk) for w in text.split()]


def analyze(app: DictConfig) -> dict:
    from repdegen.analysis.embedding_figures import (
        plot_metric_over_training,
        plot_singular_values,
        plot_svd_projection,
        plot_token_frequency,
    )
    from repdegen.analysis.inspection import nearest_neighbours, subspace_distance, top_predictions
    from repdegen.reproduce.engine.tasks import LMTask
    from repdegen.reproduce.runs.execute import pick_device
    from repdegen.reproduce.runs.trained import continuations, load_lm

    device = pick_device(app.device)
    lm = load_lm(app.checkpoint, device)
    run_dir, weights, record, cfg, corpus, model = lm.run_dir, lm.weights, lm.record, lm.cfg, lm.corpus, lm.model
    out_dir = Path(app.out) if app.out else run_dir / "analysis"
    out_dir.mkdir(parents=True, exist_ok=True)
    itos = corpus.vocab.itos
    label = record.get("label", run_dir.name)
    W = model.output_embedding.detach().float().cpu()
    report: dict = {"run": str(run_dir), "weights": weights.name, "label": label}

    cfg_t = OmegaConf.to_container(cfg, resolve=True)
    cfg_t["trainer"]["analysis"]["wordsim"] = bool(app.wordsim)
    task = LMTask(OmegaConf.create(cfg_t), corpus, model, device)
    with torch.no_grad():
        report["metrics"] = task.final_extras(model, out_dir, weights.stem)
    groups = task.groups()
    plot_svd_projection(W, groups, out_dir / "svd_projection.png", f"{label}: output embedding (SVD)", max_points=20000)
    plot_singular_values({label: W}, out_dir / "singular_values.png", f"{label}: singular values")
    plot_token_frequency(corpus.vocab.counts, out_dir / "token_frequency.png", f"{cfg.dataset.name}: token frequency")
    if record.get("history"):
        hist = {label: [dict(h, step=h.get("updates", i + 1)) for i, h in enumerate(record["history"])]}
        keys = [k for k in ("isotropy", "isotropy_rare", "isotropy_frequent", "cos_rare_frequent") if k in record["history"][-1]]
        plot_metric_over_training(hist, keys, out_dir / "geometry_over_training.png", f"{label}: embedding geometry")

    words = [w for w in app.words if _encode(w, corpus)]
    if corpus.tokenizer is None:
        words = [w for w in words if w in corpus.vocab.stoi]
        report["neighbours"] = nearest_neighbours(W, words, k=5, itos=itos) if words else {}
    else:  # a word's first piece (word-initial form)
        ids = {w: corpus.tokenizer.encode(w)[0] for w in words}
        nn = nearest_neighbours(W, list(ids.values()), k=5, itos=itos)
        report["neighbours"] = {w: nn[itos[i]] for w, i in ids.items() if itos[i] in nn}
    report["top_predictions"] = {p: top_predictions(model, torch.tensor(_encode(p, corpus)), k=10, itos=itos)
                                 for p in app.phrases}
    if app.continuations:
        c = continuations(lm, app.continuations)
        report["continuations"] = {k: c[k] for k in ("mean_uniq", "uniq_total", "examples")}
    if model.output_embedding is not model.input_embedding:
        report["subspace_distance_input_output"] = subspace_distance(model.input_embedding.detach().cpu().double(),
                                                                     W.double())
    report["groups"] = {k: (v.start, v.stop) if isinstance(v, slice) else len(v) for k, v in groups.items()}
    (out_dir / "analysis.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"repdegen: wrote {out_dir}/analysis.json and figures "
          f"(svd_projection, singular_values, token_frequency{', geometry_over_training' if record.get('history') else ''})")
    return report


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="analyze_app")
def main(app: DictConfig) -> None:
    exit_on_user_error(analyze)(app)


def cli() -> None:
    """``repdegen analyze``: this command's entry (``python -m repdegen.reproduce.analyze`` runs the same)."""
    from repdegen.reproduce.cli import use_app_help
    from repdegen.reproduce.errors import install_hydra_error_handler

    install_hydra_error_handler()
    use_app_help("analyze")  # --help: conf/hydra/help/analyze.yaml
    main()


if __name__ == "__main__":
    cli()
