"""What a table costs before it runs: ``repdegen table table=<t> scale=<s> plan=true [plan_device=h100]``.

Every cell is listed with its state in the ledger (complete, running, partial, missing) and its estimated cost:

    tokens to train  = the training budget's bound: trainer.max_updates x tokens per update, else every epoch of
                       every session (max_epochs x (retrain_sessions + 1) + finetune_epochs) x the training split's
                       tokens (early stopping may end it sooner: the estimate is an upper bound)
    tokens per second = the throughput measured for the cell's model and objective on that device by
                       ``scripts/bench.py`` (the committed ``results/bench/**.json``; the best measured configuration),
                       else the model's MLE rate times the objective's measured ratio to MLE, else a FLOP-based
                       estimate: the FLOPs per token of the cell's model (6 x matmul parameters + attention) at the
                       FLOP rate another model reached on the device, or at the device's peak times the MFU the model
                       reached on another GPU. Each estimate says which of these it is.
    device-hours     = tokens / (tokens per second) / 3,600: hours of one device; a DDP cell of ``trainer.gpus``
                       GPUs takes about that divided by their number in wall time (linear scaling assumed).

A complete cell shows the wall time its record holds. Nothing is trained, registered or written.
"""

from __future__ import annotations

import glob
import json
import math
import platform
import textwrap
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig
from repdegen.reproduce.runs.cells import Cell
from repdegen.reproduce.runs.ledger import STATUS_COMPLETE, Ledger

# dense bf16 / fp32 peaks of the datasheets (H100 SXM; H200 has H100's compute)
PEAK_FLOPS = {"h200": (989.5e12, 66.9e12), "h100": (989.5e12, 66.9e12), "a100": (312e12, 19.5e12),
              "l4": (121e12, 30.3e12)}
# training-split tokens of the word-level corpora (each line's words + </s>); a BPE corpus's size is read from any
# ledger record of the same corpus
TRAIN_TOKENS = {"ptb": 929_589, "wikitext2": 2_088_628, "wikitext103": 103_227_021}
MT_CONTEXT = 32  # the attention length a translation pair's FLOPs are counted at (scripts/bench.py's default)


def device_key(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``; a CPU -> ``cpu``; any other GPU: its name, lower case."""
    low = name.lower()
    return next((k for k in PEAK_FLOPS if k in low), "cpu" if low == "cpu" else low)


def local_device() -> tuple[str, str]:
    """(key, name) of the device a cell would run on here: the first CUDA device, else this CPU."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return device_key(name), name
    return "cpu", platform.processor() or "cpu"


@dataclass
class Measured:
    device: str
    device_name: str
    model: str
    objective: str
    precision: str
    tokens_per_s: float
    flops_per_token: float | None
    mfu: float | None
    source: str
    kind: str = "lm"  # lm | translation: what a token is, and the model family a FLOP rate carries over to


def load_measurements(bench_dir: Path) -> list[Measured]:
    """Every result of the committed benchmark files (``scripts/bench.py``'s JSON) under ``bench_dir``."""
    out = []
    for path in sorted(glob.glob(str(bench_dir / "**" / "*.json"), recursive=True)):
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        hw = data.get("hardware") or {} if isinstance(data, dict) else {}
        name = hw.get("gpu") if hw.get("device") == "cuda" else "cpu"
        for r in data.get("results") or [] if isinstance(data, dict) else []:
            if not isinstance(r, dict) or not r.get("tokens_per_s") or not r.get("model") or not r.get("objective"):
                continue
            out.append(Measured(device_key(name or "cpu"), hw.get("gpu") or hw.get("cpu") or "cpu", r["model"],
                                r["objective"], r.get("precision", "fp32"), float(r["tokens_per_s"]),
                                r.get("flops_per_token"), r.get("mfu"), str(Path(path).relative_to(bench_dir)),
                                r.get("kind", "lm")))
    return out


@dataclass
class Rate:
    tokens_per_s: float | None
    how: str  # short: "measured" | "MLE x 0.91" | "FLOP-based" | why there is none
    source: str = ""  # what it comes from, in full


def model_flops_per_token(cfg: DictConfig, vocab_size: int) -> float:
    """6 x (matmul parameters + the output projection) + 12 x layers x d x context: ``scripts/bench.py``'s count, of
    the cell's model built on PyTorch's meta device (no memory, no time)."""
    import torch
    from repdegen.models import build_model, resolve_tie

    with torch.device("meta"):
        model = build_model(cfg.model, vocab_size, resolve_tie(cfg.model, cfg.objective))
    return flops_per_token(model, cfg, cfg.trainer.bptt if cfg.dataset.kind == "lm" else MT_CONTEXT)


def flops_per_token(model, cfg, context: float) -> float:
    """6 N (matmul parameters incl. the output projection, excl. embedding lookups and norms) +
    12 x layers x d x context for attention scores and values (0 for recurrent models)."""
    m = cfg.model
    n = sum(p.numel() for name, p in model.named_parameters()
            if p.dim() == 2 and "embedding" not in name and "pos" not in name)
    n += model.output_embedding.numel()  # the output projection (tied or not) is a matmul
    layers = m.get("n_layers") or (m.get("encoder_layers", 0) + 2 * m.get("decoder_layers", 0))
    d = m.get("d_model") or 0  # LSTMs: no attention term
    return 6.0 * n + 12.0 * (layers or 0) * d * context


def _family(model_name: str, kind: str) -> tuple[bool, str]:
    """What a FLOP rate carries over between: recurrent or not, language model or translation."""
    return "lstm" in model_name, kind


def rate_of(cfg: DictConfig, device: str, bench: list[Measured], fpt: float | None) -> Rate:
    """Tokens per second of the cell's model and objective on ``device`` (see the module doc for the order). An
    objective's rate is the model's best MLE rate times the objective's ratio to MLE measured side by side (the
    median over the files that measured both), so every objective is read against the same MLE."""
    model, objective = cfg.model.name, cfg.objective.name
    gpu = device != "cpu"
    precision = "bf16" if gpu and cfg.trainer.get("precision", "auto") in ("auto", "bf16") else "fp32"
    here = [m for m in bench if m.device == device and m.precision == precision]

    def best(rows):
        return max(rows, key=lambda m: m.tokens_per_s) if rows else None

    def same(m) -> bool:  # the cell's model as measured: its name, and its size (a width override is another model)
        return m.model == model and not (fpt and m.flops_per_token and abs(m.flops_per_token / fpt - 1) > 0.1)

    def objective_ratio(scope_model):
        """(the objective's throughput over MLE's, measured side by side in one file: the median; how many; where)."""
        for scope in (scope_model, None):  # the ratio on this model, else on any model measured on this device
            ratios = sorted(o.tokens_per_s / b.tokens_per_s for o in here for b in here
                            if o.objective == objective and b.objective == "mle" and o.source == b.source
                            and o.model == b.model and scope in (None, o.model) and not o.source.startswith("ledger"))
            if ratios:
                return ratios[len(ratios) // 2], len(ratios), "" if scope else " (measured on other models)"
        return None, 0, ""

    trained = sorted((m for m in here if m.source.startswith("ledger") and same(m)
                      and m.objective == objective), key=lambda m: m.tokens_per_s)
    if trained:  # runs of this model and objective on this device: their own epochs' pace
        mid = trained[len(trained) // 2]
        return Rate(mid.tokens_per_s, "ledger", f"{model} {objective}: the median epoch of {mid.source}"
                                               + (f" (the middle of {len(trained)} runs)" if len(trained) > 1 else ""))
    here = [m for m in here if not m.source.startswith("ledger")] + [m for m in here if m.source.startswith("ledger")]
    mle = best([m for m in here if same(m) and m.objective == "mle" and not m.source.startswith("ledger")])
    if mle:
        if objective == "mle":
            return Rate(mle.tokens_per_s, "measured", f"{model} mle: results/bench/{mle.source}")
        ratio, n, on = objective_ratio(model)
        if ratio is not None:
            return Rate(mle.tokens_per_s * ratio, f"MLE x {ratio:.2f}",
                        f"{model} {objective}: MLE's rate (results/bench/{mle.source}) x {objective}'s ratio to "
                        f"MLE, the median of {n} measured side by side{on}")
        return Rate(mle.tokens_per_s, "MLE's rate", f"{model} {objective}: {objective} not measured, MLE's rate "
                                                   f"(results/bench/{mle.source})")
    if fpt is None:
        return Rate(None, "no FLOPs", f"{model}: no FLOP count")
    kind = cfg.dataset.get("kind", "lm")
    family = [m for m in here if m.flops_per_token and _family(m.model, m.kind) == _family(model, kind)]
    ledger = [m for m in family if m.source.startswith("ledger")]
    # runs in the ledger first (a benchmark's short loop misses what a whole epoch costs: validation, data), of the
    # same objective, else MLE; then the benchmarks' MLE
    def fastest(rows):  # the highest FLOP rate
        return max(rows, key=lambda m: m.tokens_per_s * m.flops_per_token) if rows else None

    ref = (fastest([m for m in ledger if m.objective == objective])
           or fastest([m for m in ledger if m.objective == "mle"]) or fastest([m for m in family if m.objective == "mle"]))
    if ref:
        achieved = ref.tokens_per_s * ref.flops_per_token
        where = ref.source if ref.source.startswith("ledger") else f"results/bench/{ref.source}"
        ratio, _, _ = objective_ratio(ref.model) if ref.objective != objective else (None, 0, "")
        times = f", x {objective}'s measured ratio to MLE {ratio:.2f}" if ratio is not None else ""
        return Rate(achieved / fpt * (ratio or 1.0), "FLOP-based", f"{model}: its FLOPs per token at the "
                    f"{achieved / 1e12:.3g} TFLOP/s {ref.model} {ref.objective} reached ({where}){times}")
    if gpu and device in PEAK_FLOPS:
        other = [m for m in bench if m.mfu and m.device != "cpu" and m.precision == precision and m.objective == "mle"
                 and _family(m.model, m.kind) == _family(model, kind)]
        alike = [m for m in other if m.model == model] or other
        if alike:
            ref = max(alike, key=lambda m: m.mfu)
            peak = PEAK_FLOPS[device][0 if precision == "bf16" else 1]
            return Rate(peak * ref.mfu / fpt, "FLOP-based", f"{model}: {device}'s {precision} peak x the MFU {ref.mfu:.0%} "
                                                            f"{ref.model} reached on {ref.device} (results/bench/{ref.source})")
    return Rate(None, "unmeasured", f"{model}: nothing measured on {device} and no peak known for it")


def ledger_measurements(records: dict[str, dict]) -> list[Measured]:
    """The pace of the runs in the ledger ({hash: record}): a run's training tokens per epoch over its median epoch
    (training and validation, the last 10 epochs), on the device its record names; FLOPs per token of its model."""
    import statistics

    out, flops = [], {}
    for h, r in records.items():
        cfg, hw = r.get("config") or {}, r.get("hardware") or {}
        tokens = ((r.get("corpus") or {}).get("used_tokens") or {}).get("train")
        seconds = [e.get("epoch_seconds", 0) + e.get("valid_seconds", 0) for e in r.get("history") or []
                   if isinstance(e, dict) and isinstance(e.get("epoch_seconds"), (int, float))][-10:]
        if not (isinstance(tokens, int) and seconds and cfg.get("model") and cfg.get("objective")):
            continue
        gpu = hw.get("device") == "cuda"
        precision = "bf16" if gpu and (cfg.get("trainer") or {}).get("precision", "auto") in ("auto", "bf16") else "fp32"
        model = cfg["model"].get("name")
        key = (model, (cfg.get("trainer") or {}).get("bptt"))
        if key not in flops:
            try:
                flops[key] = model_flops_per_token(DictConfig(cfg), int((r.get("corpus") or {}).get("vocab_size") or 0))
            except Exception:  # a record of an older schema: its pace is still known
                flops[key] = None
        out.append(Measured(device_key(hw.get("gpu") or "cpu") if gpu else "cpu", hw.get("gpu") or hw.get("cpu") or "cpu",
                            model, cfg["objective"].get("name"), precision, tokens / statistics.median(seconds),
                            flops[key], None, f"ledger run {h}", (cfg.get("dataset") or {}).get("kind", "lm")))
    return out


def train_tokens(cfg: DictConfig, records: list[dict]) -> int | None:
    """Tokens of the training split a cell reads per epoch: a ledger record of the same corpus, else the stored
    size of a word-level corpus; None when neither is known."""
    d = cfg.dataset
    for r in records:
        rd = (r.get("config") or {}).get("dataset") or {}
        if all(rd.get(k) == d.get(k) for k in ("name", "tokenizer", "bpe_vocab_size", "train_tokens", "train_start")):
            n = ((r.get("corpus") or {}).get("used_tokens") or {}).get("train")
            if isinstance(n, int):
                return n
    if d.get("tokenizer", "word") == "word" and d.name in TRAIN_TOKENS:
        n = TRAIN_TOKENS[d.name]
        return min(n, d.train_tokens) if d.get("train_tokens") else n
    return None


def budget_tokens(cfg: DictConfig, records: list[dict]) -> tuple[float | None, str]:
    """(tokens to train, the bound that sets it)."""
    t = cfg.trainer
    if cfg.dataset.kind == "lm":
        per_update = t.batch_size * t.bptt * t.update_freq
    else:
        per_update = (t.get("max_tokens") or 0) * t.update_freq
    by_updates = t.max_updates * per_update if t.get("max_updates") else math.inf
    epochs = (t.max_epochs or 0) * ((t.get("retrain_sessions") or 0) + 1) + (t.get("finetune_epochs") or 0)
    per_epoch = train_tokens(cfg, records)
    by_epochs = epochs * per_epoch if per_epoch else math.inf
    if by_updates <= by_epochs and by_updates < math.inf:
        return by_updates, f"{t.max_updates:,} updates"
    if by_epochs < math.inf:
        return by_epochs, f"{epochs} epochs" + (" at most" if t.get("early_stopping") else "")
    return None, "corpus size unknown"


def _done_fraction(record: dict, cfg: DictConfig) -> float:
    history = [h for h in record.get("history") or [] if isinstance(h, dict)]
    t = cfg.trainer
    if t.get("max_updates") and history and isinstance(history[-1].get("updates"), int):
        return min(1.0, history[-1]["updates"] / t.max_updates)
    epochs = (t.max_epochs or 0) * ((t.get("retrain_sessions") or 0) + 1) + (t.get("finetune_epochs") or 0)
    return min(1.0, len(history) / epochs) if epochs else 0.0


@dataclass
class PlannedCell:
    label: str
    config_hash: str
    state: str
    tokens: float | None
    bound: str
    rate: Rate
    hours_left: float | None  # device-hours
    gpus: int


def cell_name(table, cell: Cell) -> str:
    """The row label a cell renders in (the first, when rows share it), with its seed when the table has several."""
    row = table.rows[cell.rows[0]]
    name = (f"{row.group} / " if row.get("group") else "") + row.label
    name += f" (+{len(cell.rows) - 1} rows)" if len(cell.rows) > 1 else ""
    return name + (f", seed {cell.seed}" if cell.seed is not None else "")


def committed_records(tables_dir: Path) -> dict[str, dict]:
    """{hash: record} of the complete runs committed with the tables (``results/tables/<t>/paper/records/``): a cell
    there is done though the ledger lacks it (``restore=true`` brings it back), and its epochs pace the plan."""
    from repdegen.core.loaders import load_run_record
    from repdegen.reproduce.runs.archive import archived_records

    out = {}
    for h, folder in archived_records(Path(tables_dir)).items():
        try:
            record = load_run_record(folder / "result.json", "restore it from git")
        except Exception:  # noqa: BLE001 - a record that does not read is no measurement; restore=true names it
            continue
        if record.get("status") == STATUS_COMPLETE:
            out[h] = record
    return out


def plan_cells(cells: list[Cell], ledger: Ledger, device: str, bench: list[Measured], table=None,
               committed: dict[str, dict] | None = None) -> list[PlannedCell]:
    committed = committed or {}
    records = [r for c in cells if (r := ledger.load(c.config_hash) or committed.get(c.config_hash)) is not None]
    flops: dict[tuple, float | None] = {}
    out = []
    for c in cells:
        cfg, record = c.cfg, ledger.load(c.config_hash) or committed.get(c.config_hash)
        key = (cfg.model.name, cfg.dataset.name, cfg.trainer.bptt)
        if key not in flops:
            vocab = cfg.dataset.get("vocab_size") or ((cfg.dataset.get("bpe_vocab_size") or 0) + 4) or 10000
            flops[key] = model_flops_per_token(cfg, int(vocab))
        tokens, bound = budget_tokens(cfg, records)
        rate = rate_of(cfg, device, bench, flops[key])
        full = tokens / rate.tokens_per_s / 3600 if tokens and rate.tokens_per_s else None
        if record is None:
            state, left = "missing", full
        elif record.get("status") == STATUS_COMPLETE:
            state, left = ("complete" if ledger.load(c.config_hash) else "committed"), 0.0
            if record.get("wall_time_s"):
                bound = f"took {record['wall_time_s'] / 3600:.1f} h"
        else:
            state = "running" if ledger.holder(c.config_hash) else "partial"
            left = full * (1 - _done_fraction(record, cfg)) if full is not None else None
        gpus = int(cfg.trainer.get("gpus") or 1) if device != "cpu" else 1
        name = cell_name(table, c) if table is not None else c.label
        out.append(PlannedCell(name, c.config_hash, state, tokens, bound, rate, left, gpus))
    return out


def _short(text: str, width: int) -> str:
    """``text`` in ``width`` characters: its start and its end (where the cells of a table differ)."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def _num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "?"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f}{suffix}{unit}"
    return f"{x:.0f}{unit}"


def format_plan(table: str, scale: str, device: str, planned: list[PlannedCell]) -> str:
    """The plan of one table: one line per cell (≤ 120 columns), then the table's total."""
    lines = [f"{table} at {scale}, estimated on {device}:",
             f"  {'cell':50} {'state':8} {'tokens':>7} {'bound':17} {'tok/s':>7} {'hours':>6}  tok/s from"]
    for p in planned:
        hours = "–" if p.hours_left is None else f"{p.hours_left:6.1f}"
        lines.append(f"  {_short(p.label, 50):50} {p.state:8} {_num(p.tokens):>7} {_short(p.bound, 17):17} "
                     f"{_num(p.rate.tokens_per_s):>7} {hours:>6}  {_short(p.rate.how, 12)}")
    lines.append("  " + plan_total(planned))
    for src in dict.fromkeys(p.rate.source for p in planned if p.rate.source):
        lines += textwrap.wrap(src, 118, initial_indent="    ", subsequent_indent="      ",
                               break_on_hyphens=False)
    return "\n".join(lines)


def plan_total(planned: list[PlannedCell]) -> str:
    known = [p.hours_left for p in planned if p.hours_left is not None]
    unknown = sum(p.hours_left is None for p in planned)
    done = sum(p.state in ("complete", "committed") for p in planned)
    committed = sum(p.state == "committed" for p in planned)
    return (f"total: {len(planned)} cells, {done} complete" + (f" ({committed} committed with the tables, not in the "
                                                               f"ledger: restore=true)" if committed else "")
            + f"; {sum(known):,.1f} device-hours to go"
            + (f" (+ {unknown} cell(s) without an estimate)" if unknown else ""))


def plan_markdown(device: str, per_table: list[tuple[str, list[PlannedCell]]]) -> str:
    """One Markdown row per table: its cells, the device-hours of all of them (complete ones at their estimate too:
    what the table costs from scratch) and how many of the rates are measured, a ratio to a measured MLE, or
    FLOP-based (docs/compute.md's paper-scale section)."""
    lines = [f"| table | cells | {device}-hours, all cells from scratch | rates: measured / MLE x ratio / FLOP-based / none |",
             "|---|---|---|---|"]
    for table, planned in per_table:
        full = [p.tokens / p.rate.tokens_per_s / 3600 for p in planned if p.tokens and p.rate.tokens_per_s]
        kinds = [sum(p.rate.how in ("measured", "ledger") for p in planned),
                 sum(p.rate.how.startswith("MLE") for p in planned), sum(p.rate.how == "FLOP-based" for p in planned)]
        kinds.append(len(planned) - sum(kinds))
        missing = len(planned) - len(full)
        lines.append(f"| `{table}` | {len(planned)} | {sum(full):,.1f}" + (f" (+{missing} unknown)" if missing else "")
                     + f" | {' / '.join(map(str, kinds))} |")
    return "\n".join(lines)


def plan_tables(expanded: list[tuple[DictConfig, list[Cell]]], device: str | None, bench_dir: Path,
                markdown: bool = False) -> str:
    """The plan of every table (``expanded``: each app with its cells); shared cells count once in the total."""
    key, name = (device_key(device), device) if device else local_device()
    first = expanded[0][0]
    ledger = Ledger(first.paths.runs_dir)
    every = {c.config_hash for _, cells in expanded for c in cells}
    records = {h: r for h in every if (r := ledger.load(h)) is not None}
    committed = committed_records(Path(first.paths.tables_dir))
    # the ledger's runs, then every complete run committed with any table (its pace on the hardware it names)
    bench = load_measurements(bench_dir) + ledger_measurements(records | {h: r for h, r in committed.items()
                                                                          if h not in records})
    parts, distinct, per_table = [], {}, []
    for app, cells in expanded:
        planned = plan_cells(cells, ledger, key, bench, app.table, committed)
        distinct.update({p.config_hash: p for p in planned})
        per_table.append((app.table.name, planned))
        parts.append(format_plan(app.table.name, app.scale.name, key, planned))
    if markdown:
        return plan_markdown(key, per_table)
    head = (f"repdegen: plan on {key} ({name}); hours are device-hours (a cell of N GPUs: about 1/N of them in wall "
            f"time); nothing is run")
    if not load_measurements(bench_dir):
        head += (f"\nrepdegen: no benchmark files under {bench_dir}: rates come from this ledger's runs only (a checkout "
                 f"has them in results/bench/; plan_bench_dir=<folder> names another)")
    tail = [f"all {len(expanded)} tables: " + plan_total(list(distinct.values()))] if len(expanded) > 1 else []
    return "\n".join([head, *parts, *tail])
