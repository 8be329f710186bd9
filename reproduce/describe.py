"""Sizes without training: parameter counts (total and by part) and the resolved hyperparameters; or one cell's
config with where each value comes from.

    repdegen describe model=awd_lstm dataset=wikitext2
    repdegen describe experiment=inan2017/medium objective=real
    repdegen describe table=yu2022_t7 row=AGG scale=lite [seed=N] [all=true]   # a table cell, annotated
    repdegen describe experiment=gao2019/awd_lstm_wt2 objective=cosreg scale=lite sources=true
    repdegen describe experiment=inan2017/small objective=real scale=lite --cfg job   # the config, as YAML

The annotated form prints ``key: value  # source [over: the layers it overrode]`` for every key a file, an
override sets (``all=true``: schema defaults too), then the config hash
(see :mod:`repdegen.reproduce.settings.sources`).

The vocabulary size is counted from the corpus when it is in a local directory (``REPDEGEN_DATA_DIR``),
else taken from ``dataset.vocab_size`` (the papers' value); the output says which. The model
is built on PyTorch's meta device, so even the largest model costs no memory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig
from repdegen.models import build_model, resolve_tie
from repdegen.reproduce.errors import exit_on_user_error
from repdegen.reproduce.settings.config import CONF_DIR, register_all
from repdegen.reproduce.settings.resolve import RunSpec, as_spec
from repdegen.reproduce.train import plain_config, resolve_app

register_all()


def describe(run: RunSpec | DictConfig) -> dict:
    spec = as_spec(run)
    cfg = spec.cfg
    from repdegen.data.corpus import data_dir_from, resolve_source
    from repdegen.reproduce.runs.execute import load_any_corpus

    d = cfg.dataset
    root = data_dir_from(d)
    local = resolve_source(d) == "local" and root is not None and (Path(root) / d.local_dir).is_dir()
    if d.vocab_size is not None and not local:  # no network round trip just to count types
        vocab_size = d.vocab_size
        vocab_source = "dataset.vocab_size (the papers' corpus; set REPDEGEN_DATA_DIR to count a local copy)"
    elif d.tokenizer == "bpe" and not local:
        from repdegen.data.bpe import N_SPECIALS

        vocab_size = d.bpe_vocab_size + N_SPECIALS
        vocab_source = ("dataset.bpe_vocab_size + 4 specials (the BPE is not trained yet; set REPDEGEN_DATA_DIR to count "
                        "a local copy)")
    else:
        vocab_size = len(load_any_corpus(d, cfg.paths.cache_dir).vocab)
        vocab_source = "corpus"
    tie = resolve_tie(cfg.model, cfg.objective)
    with torch.device("meta"):
        model = build_model(cfg.model, vocab_size, tie)
    total = sum(p.numel() for p in model.parameters())
    return {
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "objective": cfg.objective.name,
        "vocab_size": vocab_size,
        "vocab_size_from": vocab_source,
        "tie_weights": tie,
        "parameters": {"total": total, "millions": round(total / 1e6, 2), "by_part": model.parameter_breakdown()},
        "config_hash": spec.config_hash,
        "config": plain_config(cfg),
    }


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    print(json.dumps(exit_on_user_error(lambda app_cfg: describe(resolve_app(app_cfg)))(cfg), indent=2))


def _pop_flag(args: list[str], key: str) -> str | None:
    """Remove ``key=value`` from ``args``; its value (None: absent)."""
    for i, a in enumerate(args):
        if a.startswith(f"{key}="):
            return args.pop(i).split("=", 1)[1]
    return None


def table_cell(table: str, row: str | None, scale: str, seed: int | None, extra: list[str]):
    """The cell of ``table`` (at ``scale``) whose row is labelled ``row`` (and runs ``seed``; else its first)."""
    from hydra import compose
    from repdegen.reproduce.errors import ConfigError
    from repdegen.reproduce.runs.cells import all_table_names, expand_cells

    if table not in all_table_names():
        raise ConfigError(f"table={table!r} is not a table; tables: {', '.join(all_table_names())}")
    app = compose("table_app", overrides=[f"table={table}", f"scale={scale}"])
    app.overrides = list(extra)
    cells = expand_cells(app)
    from repdegen.reproduce.results.claims import row_references

    # a row by its label, or '<group> / <label>' where the label is in several groups (as rows= and claims name rows)
    refs = row_references(app.table.rows)
    name: dict[int, str] = {}
    for ref, i in refs.items():  # one name a row: its bare label where that is unique
        if i not in name or len(ref) < len(name[i]):
            name[i] = ref
    runs = [ref for i, ref in sorted(name.items()) if any(i in c.rows for c in cells)]
    if not runs:
        raise ConfigError(f"{table} runs no row at scale={scale} (its rows are paper-only there)")
    running = [ref for ref in runs if ref.endswith(f" / {row}") and ref.split(" / ", 1)[1] == row]
    if row not in refs and len(running) == 1:  # a label in several groups, only one of which runs at this scale
        row = running[0]
    if row is None or row not in refs:
        several = [f"{r.group} / {r.label}" for r in app.table.rows if r.label == row and r.group]
        what = (f"the label {row!r} is in {len(several)} groups: name one of them" if len(several) > 1
                else f"row={row!r} is not a row of {table}")
        raise ConfigError(f"{what}; the rows it runs at scale={scale}: {', '.join(repr(x) for x in runs)} "
                          f"(e.g. row={runs[0]!r}; quote labels with spaces)")
    index = refs[row]
    mine = [c for c in cells if index in c.rows]
    if not mine:
        raise ConfigError(f"row={row!r} of {table} does not run at scale={scale} (paper only there)")
    if seed is not None:
        picked = [c for c in mine if c.seed == seed]
        if not picked:
            runs = ", ".join(str(c.seed) for c in mine if c.seed is not None) or "the preset's seed only (no seed=)"
            raise ConfigError(f"seed={seed}: row {row!r} of {table} at scale={scale} runs seeds {runs}")
        return picked[0], mine
    return mine[0], mine


def annotated(args: list[str]) -> str:
    """The text of ``describe table=... row=...`` or ``describe experiment=... sources=true``."""
    from hydra import initialize_config_dir
    from repdegen.reproduce.settings.config import CONF_DIR, config_hash
    from repdegen.reproduce.settings.sources import compose_with_sources, format_sources

    args = list(args)
    show_all = (_pop_flag(args, "all") or "false").lower() == "true"
    _pop_flag(args, "sources")
    table = _pop_flag(args, "table")
    header = []
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        if table is not None:
            row = _pop_flag(args, "row")
            scale = _pop_flag(args, "scale") or "paper"
            seed = _pop_flag(args, "seed")
            cell, mine = table_cell(table, row, scale, None if seed is None else int(seed), args)
            overrides = [f"experiment={cell.experiment}", *cell.overrides]
            seeds = ", ".join(str(c.seed) for c in mine if c.seed is not None)
            header.append(f"# table {table}, row {row!r}, scale {scale}, "
                          + (f"seed {cell.seed} (the row runs seeds {seeds})" if seeds else "the preset's seed"))
        else:
            overrides = args
        cfg, sources = compose_with_sources(overrides)
    h = config_hash(cfg)
    header.append(f"# repdegen train {' '.join(o for o in overrides if not o.startswith(('paths.', 'logger.')))}")
    header.append(f"# config hash {h}; every key a config file or an override sets"
                  + (", and the schema defaults" if show_all else " (all=true: the schema defaults too)"))
    return "\n".join(header + [format_sources(cfg, sources, only_set=not show_all)])


def cli() -> None:
    from repdegen.reproduce.cli import HELP_FLAGS, cfg_request, show_resolved_cfg, use_app_help
    from repdegen.reproduce.errors import exit_on_user_error, install_hydra_error_handler

    args = sys.argv[1:]
    asks_help = any(a in HELP_FLAGS for a in args)
    if not asks_help and (any(a.startswith("table=") for a in args) or any(a.startswith("sources=") for a in args)):
        if cfg_request(sys.argv) is not None:
            print("repdegen: error: --cfg with table= or sources=: describe prints that run's config itself, each value "
                  "with its source; drop --cfg", file=sys.stderr)
            sys.exit(2)
        print(exit_on_user_error(annotated)(args))
        return
    if asks_help:  # describe's own keys are no config keys: the help page composes without them
        sys.argv[1:] = [a for a in args if not a.startswith(("table=", "row=", "sources=", "all="))]
    install_hydra_error_handler()
    use_app_help("describe")  # --help: conf/hydra/help/describe.yaml
    if not show_resolved_cfg():  # --cfg job: the resolved config, as the JSON's "config"
        main()


if __name__ == "__main__":
    cli()
