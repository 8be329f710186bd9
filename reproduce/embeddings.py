"""``repdegen embeddings PATH [--key K] [--counts FILE] --out DIR``: a degeneration report for any embedding matrix.

PATH is one of

* a ``.pt`` file holding a tensor, or a state dict (a dict of tensors, or one under ``model`` / ``state_dict``);
* a ``.safetensors`` file (needs ``pip install safetensors``);
* a local Hugging Face model folder: ``config.json`` with ``model.safetensors`` or ``pytorch_model.bin`` (or their
  sharded ``*.index.json``), read directly, without ``transformers``; its ``tokenizer.json`` (with the
  ``tokenizers`` package) tokenises a text corpus given as ``--counts``;
* a run folder of the ledger (``outputs/runs/<hash>/``: ``result.json`` and its weights, ``best.pt`` / ``last.pt`` /
  ``averaged.pt``, the one its final metrics name first): without ``--counts`` its own training counts
  (``vocab_counts.pt``) make the groups, cut as the run cuts them, and the run's recorded geometry is shown beside.

The matrix: ``--key``, else the output embedding (``output_weight``, ``lm_head.weight``, ``decoder.weight``,
``*.output_embedding.weight`` ...), else the input embedding (``embedding.weight``, ``wte.weight``,
``embed_tokens.weight`` ...); the report says which. ``--counts`` (the frequency groups): a counts file, one
non-negative integer per row id in row order (a text file of one integer a line, a JSON list, or a 1-D ``.pt``
tensor such as a run's ``vocab_counts.pt``), or a text corpus, tokenised by the model's tokenizer (a run folder's:
its corpus's vocabulary, which must be reachable). The files are read by :mod:`repdegen.core.weights`, the
report is :mod:`repdegen.analysis.report`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from repdegen.core.errors import DataError, UserError
from repdegen.core.weights import check_finite, counts_tensor, open_source, pick_matrix, read_counts

EPILOG = """\
Examples:
  repdegen embeddings outputs/runs/<hash> --out reports/run           # a trained run, its own counts and groups
  repdegen embeddings matrix.pt --counts counts.json --out reports/m  # a tensor, counts one per row id
  repdegen embeddings ./gpt2 --counts corpus.txt --out reports/gpt2   # a Hugging Face folder, a corpus to count
  repdegen embeddings model.safetensors --key transformer.wte.weight --out reports/wte

Writes DIR/report.md (the numbers and how to read them), DIR/metrics.json and the figures. See docs/usage.md
(section "A degeneration report for any embedding matrix") and docs/cli.md.
"""


# ---- the counts of a text corpus ------------------------------------------------------------------------------------
def _count_corpus(lines: list[str], v: int, info: dict, path: Path) -> tuple[torch.Tensor, str]:
    import numpy as np

    if info.get("run_dir") is not None:
        ids, how = _run_tokenise(lines, info, path)
    elif info.get("tokenizer") is not None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UserError(f"--counts {path} is a text corpus, to be tokenised by the model's tokenizer.json, and the "
                            f"tokenizers package is not installed: pip install tokenizers (or give a counts file)") from None
        tok = Tokenizer.from_file(str(info["tokenizer"]))
        ids = np.asarray([i for e in tok.encode_batch(lines, add_special_tokens=False) for i in e.ids], dtype=np.int64)
        how = "a text corpus tokenised by the folder's tokenizer.json"
    else:
        raise UserError(f"--counts {path} is a text corpus, and a bare matrix has no tokenizer to map its words to row "
                        f"ids (whitespace words are not row ids); give a counts file: one integer per row id a line, "
                        f"or a JSON list")
    if ids.size and int(ids.max()) >= v:
        raise DataError(f"--counts {path}: the tokenizer gives ids up to {int(ids.max()):,} for a matrix of {v:,} rows "
                        f"(another vocabulary?)")
    return torch.bincount(torch.as_tensor(ids, dtype=torch.long), minlength=v), how


def _run_tokenise(lines: list[str], info: dict, path: Path):
    import numpy as np
    from omegaconf import OmegaConf
    from repdegen.reproduce.runs.execute import load_any_corpus

    cfg = OmegaConf.create(info["record"]["config"])
    try:
        corpus = load_any_corpus(cfg.dataset, cfg.paths.cache_dir, verbose=False)
    except Exception as err:  # noqa: BLE001 - a corpus that cannot be loaded here (data moved, no network)
        raise DataError(f"--counts {path} is a text corpus, and the vocabulary of the run's corpus "
                        f"({cfg.dataset.name}) is not reachable here ({type(err).__name__}: {str(err)[:200]}); set "
                        f"REPDEGEN_DATA_DIR where the run found it, or give a counts file") from None
    if getattr(corpus, "tokenizer", None) is not None:
        return corpus.tokenizer.encode_flat(lines, add_eos=True)[0], "a text corpus tokenised by the run's tokenizer"
    stoi, unk = corpus.vocab.stoi, corpus.vocab.unk_id
    eos = stoi.get(cfg.dataset.eos, unk)
    ids = [stoi.get(w, unk) for line in lines for w in line.split()] + [eos] * len(lines)
    return np.asarray(ids, dtype=np.int64), "a text corpus read with the run's vocabulary (words, <eos> a line)"


def make_groups(counts: torch.Tensor, info: dict):
    from repdegen.analysis.groups import frequency_groups

    if info.get("run_dir") is None:
        return frequency_groups(counts)
    cfg = info["record"]["config"]
    cutoffs = ((cfg.get("trainer") or {}).get("analysis") or {}).get("group_cutoffs")
    dataset = cfg.get("dataset") or {}
    specials = 4 if dataset.get("kind") != "lm" or dataset.get("tokenizer", "word") != "word" else 0
    return frequency_groups(counts, cutoffs=cutoffs, n_specials=specials)  # as the run's task groups its rows


# ---- the command ---------------------------------------------------------------------------------------------------
def _json_safe(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def build_report(path, out, key=None, counts=None, counts_as="auto", sample_pairs=200_000, all_pairs=False,
                 seed=0) -> dict:
    """Read the matrix (and counts), compute the report, write ``out``/report.md, metrics.json and the figures."""
    from repdegen.analysis.report import embedding_report, render_markdown, write_figures

    start = time.time()
    path, out = Path(path).expanduser(), Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; expected a folder (new or existing) for report.md and the figures")
    tensors, info = open_source(path)
    key, why, others = pick_matrix(tensors, key, path)
    weight = tensors.get(key)
    dtype = str(weight.dtype).removeprefix("torch.")
    if not weight.is_floating_point():
        raise DataError(f"{path}: {key!r} holds {dtype} values; an embedding matrix holds floats")
    check_finite(weight, key)
    del tensors  # the other tensors of the file
    weight = weight.to(torch.float64)  # what the report computes in; the stored copy is freed
    v = weight.shape[0]
    counts_info = groups = None
    if counts is not None:
        c, description = read_counts(Path(counts).expanduser(), v, counts_as,
                                     lambda lines, where: _count_corpus(lines, v, info, where))
    elif info.get("run_dir") is not None and (info["run_dir"] / "vocab_counts.pt").is_file():
        c = counts_tensor(info["run_dir"] / "vocab_counts.pt", path)
        description = "the run's own training counts (`vocab_counts.pt`), grouped as the run groups them"
        if c.numel() != v:
            raise DataError(f"{info['run_dir']}/vocab_counts.pt holds {c.numel():,} counts for {v:,} rows")
    else:
        c = None
    if c is not None:
        groups = make_groups(c, info)
        counts_info = {"description": description, "total": int(c.sum()), "seen": int((c > 0).sum())}
    report = embedding_report(weight, groups, sample_pairs=sample_pairs, all_pairs=all_pairs, seed=seed)
    name = info["run_dir"].name if info.get("run_dir") is not None else path.name
    source = {"name": name, "path": str(path), "kind": info["kind"], "key": key, "why": why, "dtype": dtype,
              "others": others}
    final = info.get("final") or {}
    if final:
        source["record"] = {k: final.get(k) for k in ("weights", "isotropy", "mean_cos", "isotropy_frequent",
                                                       "isotropy_medium", "isotropy_rare", "cos_rare_frequent")}
    out.mkdir(parents=True, exist_ok=True)
    files = write_figures(report, groups, out, name)
    report.pop("_figures")
    (out / "report.md").write_text(render_markdown(report, source, counts_info, files) + "\n")
    metrics = {"source": source, "counts": counts_info, **report, "figures": files, "seconds": time.time() - start}
    if final:
        metrics["run_record"] = source.pop("record")
    (out / "metrics.json").write_text(json.dumps(_json_safe(metrics), indent=1) + "\n")
    return metrics


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="repdegen embeddings", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="A degeneration report for any embedding matrix: I(W), the mean cosine, the singular values, the\n"
                    "2-D projection and the cosine distribution, and per frequency group I(W) and mean cosine\n"
                    "(Gao et al. 2019, Yu et al. 2022), from a .pt or .safetensors file, a Hugging Face model folder\n"
                    "or a run folder of the ledger.")
    p.add_argument("path", metavar="PATH", help="a .pt / .safetensors file, a Hugging Face model folder or a run folder")
    p.add_argument("--key", help="the state dict key of the matrix (default: the output embedding, else the input one)")
    p.add_argument("--counts", metavar="FILE", help="the rows' training counts (one integer per row id a line, a JSON "
                                                    "list, a 1-D .pt tensor) or a text corpus to count with the model's "
                                                    "tokenizer: makes the 30/50/20 %% frequency groups")
    p.add_argument("--counts-as", choices=("auto", "counts", "text"), default="auto",
                   help="read --counts as counts or as a text corpus (default: counts when every line is one integer)")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder for report.md, metrics.json and the figures")
    p.add_argument("--pairs", type=int, default=200_000, help="random pairs for the cosine distribution (default 200000)")
    p.add_argument("--all-pairs", action="store_true", help="the cosine distribution over every pair (O(V^2 d) time, "
                                                            "a block of rows at a time: slow for a large V)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the sampled pairs (default 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    from repdegen.reproduce.errors import EXIT_USER_ERROR, as_user_error, report_user_error

    p = parser()
    p.error = lambda message: (print(f"repdegen: error: {message}; see repdegen embeddings --help", file=sys.stderr),
                               sys.exit(EXIT_USER_ERROR))
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs {args.pairs}: expected a positive number of pairs")
    try:
        m = build_report(args.path, args.out, args.key, args.counts, args.counts_as, args.pairs, args.all_pairs,
                         args.seed)
    except Exception as err:
        user = as_user_error(err)
        if user is None:
            raise
        report_user_error(user)
        return EXIT_USER_ERROR
    rare = (m.get("groups") or {}).get("rare", {}).get("isotropy")
    cos = "–" if m["mean_cos"] is None else f"{m['mean_cos']:.4f}"
    print(f"repdegen: {m['source']['key']} ({m['rows']:,} x {m['dim']:,}): I(W) {m['isotropy']:.4g}, mean cos {cos}"
          + (f", I(W) rare {rare:.4g}" if rare is not None else "")
          + f"; wrote {Path(args.out) / 'report.md'}, metrics.json and {len(m['figures'])} figures ({m['seconds']:.1f} s)")
    return 0


def cli() -> None:
    """``repdegen embeddings``: this command's entry (``python -m repdegen.reproduce.embeddings`` runs the same)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
