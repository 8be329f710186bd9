"""Training-step benchmark: tokens/s, step time, peak memory and MFU for each model x objective.

    python scripts/bench.py --models gpt2_medium transformer_base --objectives mle cosreg \\
        --precision bf16 --out results/bench/h100-bf16.json
    python scripts/bench.py --models transformer_lm6 --objectives mle cosreg --smoke   # CPU plumbing check

What is timed is the trainer's own optimizer update, :meth:`repdegen.reproduce.engine.trainer.Trainer.train_update`,
the function ``repdegen.reproduce.train`` calls: autocast forward, the objective, token-weighted backward of
``--update-freq`` micro-batches, gradient sync, the objective's once-per-update penalty, clipping,
the optimizer step of the recipe, the objective's ``after_update``. The trainer is built from the
composed config on a synthetic corpus of random tokens with the vocabulary size of the model's own setting (PTB's
10,000 words for the PTB LSTMs, WikiText-2's 33,278 for the AWD-LSTM, 44,256 / 40,624 for the Transformers; LMs:
``trainer.batch_size`` blocks of ``trainer.bptt`` tokens per micro-batch; translation: pairs of
``--src-len``/``--tgt-len`` tokens filling ``trainer.max_tokens``). ``--compile`` sets
``trainer.compile=true`` (``--compile-mode`` its ``trainer.compile_mode``); ``--precision`` sets
``trainer.precision``.

Each (model, objective) runs ``--warmup`` untimed updates, then ``--steps`` timed ones
(``torch.cuda.synchronize`` around each). With ``--rounds R`` the objectives are measured R times,
interleaved (MLE, CosReg, ..., MLE, CosReg, ...), and each round's ratios to that round's MLE are
kept: load drifting over a run then moves numerator and denominator together. The JSON holds every
measurement, the per-round ratios of each objective's median step time (and peak memory) to MLE's on
the same model, their median (``summary``), the machine's load average and torch's thread count,
and MFU = model FLOPs per second / the device's peak dense bf16 (or fp32) FLOPs where known (model
FLOPs per token = 6 x (matmul parameters + the output projection) + 12 x layers x d x context for
attention, the PaLM appendix B count; encoder-decoder attention counted for both stacks). Absolute
times are meaningful only on a GPU; on a CPU report ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra import initialize_config_dir  # noqa: E402
from repdegen.core.errors import UserError  # noqa: E402
from repdegen.core.files import output_problem  # noqa: E402
from repdegen.core.provenance import git_commit, hardware  # noqa: E402
from repdegen.data.corpus import Corpus, Vocab  # noqa: E402
from repdegen.losses import build_objective  # noqa: E402
from repdegen.models import build_model, resolve_tie  # noqa: E402
from repdegen.reproduce.engine.optim import use_bf16  # noqa: E402
from repdegen.reproduce.engine.trainer import Trainer  # noqa: E402
from repdegen.reproduce.errors import EXIT_USER_ERROR, report_user_error  # noqa: E402
from repdegen.reproduce.settings.config import CONF_DIR, compose_config, finalize, register_all  # noqa: E402

# peak dense tensor throughput (FLOP/s) by device name fragment: (bf16, fp32/tf32-off)
PEAK_FLOPS = {
    "H200": (989.5e12, 66.9e12),
    "H100": (989.5e12, 66.9e12),  # SXM; the PCIe card is lower (756 TFLOPs bf16)
    "A100": (312e12, 19.5e12),
    "L4": (121e12, 30.3e12),
}

# each model's own setting: the corpus its paper trains it on and that corpus's vocabulary size (PTB's 10,000 words,
# WikiText-2's 33,278, the 44,256 BPE types of Yu et al.'s WikiText-103 and the 40,624 of WMT14 En-De, Yu et al.
# Table 12); --vocab overrides the size
OWN_SHAPE = {"lstm": ("ptb", 10000), "awd_lstm": ("wikitext2", 33278), "lm": ("wikitext103", 44256),
             "translation": ("wmt14_en_de", 40624)}


def own_shape(model_name: str, kind: str) -> tuple[str, int]:
    """(dataset, vocabulary size) a model is benched with by default: its own paper setting's."""
    if kind == "translation":
        return OWN_SHAPE["translation"]
    if model_name == "awd_lstm":
        return OWN_SHAPE["awd_lstm"]
    if "lstm" in model_name:  # vd_lstm_*, zaremba_lstm_*, inan2016_lstm_*: the PTB models
        return OWN_SHAPE["lstm"]
    return OWN_SHAPE["lm"]


def peak_flops(device: torch.device, bf16: bool) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if "H100" in name and "PCIe" in name:
        return 756e12 if bf16 else 51e12
    for key, (p_bf16, p_fp32) in PEAK_FLOPS.items():
        if key in name:
            return p_bf16 if bf16 else p_fp32
    return None


def compose_cfg(model: str, objective: str, dataset: str, extra: list[str]):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return finalize(compose_config([f"model={model}", f"dataset={dataset}", f"objective={objective}", *extra]))


def flops_per_token(model, cfg, context: int) -> float:
    """6 N (matmul parameters incl. the output projection, excl. embedding lookups and norms) +
    12 x layers x d x context for attention scores and values (0 for recurrent models)."""
    m = cfg.model
    n = 0
    for name, p in model.named_parameters():
        if p.dim() == 2 and "embedding" not in name and "pos" not in name:
            n += p.numel()
    n += model.output_embedding.numel()  # the output projection (tied or not) is a matmul
    layers = m.get("n_layers") or (m.get("encoder_layers", 0) + 2 * m.get("decoder_layers", 0))
    d = m.get("d_model") or 0  # LSTMs: no attention term
    return 6.0 * n + 12.0 * (layers or 0) * d * context


def synthetic_corpus(kind: str, cfg, vocab: int, src_len: int, tgt_len: int, seed: int = 0, zipf: bool = False):
    """A corpus of random tokens with ``vocab`` types, holding exactly the training data of one update of
    the config's batch shape (the trainer's task cycles through it), built without any files. ``zipf`` (language
    models): the tokens drawn with probability ~ 1 / rank, as words are, instead of uniformly; what a batch's number
    of distinct targets depends on (the augmented loss forms y~ once per distinct target: PTB's 700-token batches
    hold ~360, uniform draws ~680)."""
    gen = torch.Generator().manual_seed(seed)
    t = cfg.trainer
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    itos = specials + [f"w{i}" for i in range(vocab - len(specials))]
    counts = torch.arange(vocab, 0, -1, dtype=torch.long)  # frequency-sorted, as a real vocabulary
    if kind == "lm":
        n = t.batch_size * t.bptt * t.update_freq + t.batch_size
        if zipf:
            weights = 1.0 / torch.arange(1, vocab - len(specials) + 1, dtype=torch.float64)
            stream = torch.multinomial(weights, n, replacement=True, generator=gen) + len(specials)
        else:
            stream = torch.randint(len(specials), vocab, (n,), generator=gen)
        return Corpus("synthetic", stream, stream[: 2 * t.batch_size], stream[: 2 * t.batch_size],
                      Vocab(itos, counts, eos="</s>"), {"synthetic": True})
    from repdegen.data.translation import ParallelCorpus, ParallelSplit

    pairs = max(1, t.max_tokens // max(src_len, tgt_len)) * t.update_freq
    src = [torch.randint(len(specials), vocab, (src_len,), generator=gen) for _ in range(pairs)]
    tgt = [torch.randint(len(specials), vocab, (tgt_len,), generator=gen) for _ in range(pairs)]
    split = ParallelSplit(src, tgt, [""] * pairs, [""] * pairs)
    return ParallelCorpus("synthetic", split, split, split, Vocab(itos, counts, eos="</s>"), None, "src", "tgt",
                          {"synthetic": True})


def build_bench(model_name: str, objective: str, args, device, run_dir: Path):
    """(trainer, the update's micro-batches, tokens per update, attention context, cfg, kind, label)."""
    objective, _, opts = objective.partition(":")
    obj_overrides = [f"objective.{o}" for o in opts.split(",") if o]
    model_name, *model_opts = model_name.split(":")
    model_overrides = [f"model.{o}" for part in model_opts for o in part.split(",") if o]
    kind = "translation" if model_name.startswith("transformer_") and model_name not in ("transformer_lm6",) else "lm"
    dataset, own_vocab = own_shape(model_name, kind)
    extra = ["scale=smoke"] if args.smoke else []
    extra += [f"trainer.precision={args.precision}", f"trainer.update_freq={args.update_freq}",
              "trainer.progress=false", f"trainer.compile={'true' if args.compile else 'false'}",
              f"trainer.compile_mode={getattr(args, 'compile_mode', 'default')}",
              f"trainer.device={device.type}", f"paths.output_dir={run_dir}"]
    if args.batch_size:
        extra.append(f"trainer.batch_size={args.batch_size}")
    if args.max_tokens:
        extra.append(f"trainer.max_tokens={args.max_tokens}")
    if args.smoke:
        extra += ["trainer.bptt=64", "trainer.batch_size=2", "trainer.max_tokens=256"]
    if args.bptt:
        extra.append(f"trainer.bptt={args.bptt}")
    cfg = compose_cfg(model_name, objective, dataset, extra + obj_overrides + model_overrides)
    vocab = args.vocab or own_vocab
    corpus = synthetic_corpus(kind, cfg, vocab, args.src_len, args.tgt_len, zipf=getattr(args, "zipf", False))
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab, resolve_tie(cfg.model, cfg.objective)).to(device)
    obj = build_objective(cfg.objective, vocab, cfg.trainer.label_smoothing).to(device)
    trainer = Trainer(cfg, model, obj, corpus, run_dir, device)
    batches = trainer.task.train_batches(1, "train")[: cfg.trainer.update_freq]
    tokens = sum(trainer.task.n_targets(b) for b in batches)
    context = cfg.trainer.bptt if kind == "lm" else (args.src_len + args.tgt_len) / 2
    label = "+".join([model_name, *model_opts]) if model_opts else model_name
    return trainer, batches, tokens, context, cfg, kind, label, objective + (f"[{opts}]" if opts else "")


def bench_one(model_name: str, objective: str, args, device, run_dir: Path) -> dict:
    """``objective``: a name, optionally with config overrides: ``agg:implementation=literal``; ``model_name``
    likewise: ``transformer_lm6:d_model=256``."""
    trainer, batches, tokens, context, cfg, kind, label, obj_label = build_bench(model_name, objective, args, device,
                                                                                 run_dir)
    model = trainer.model
    model.train()
    trainer.objective.train()
    trainer.task.begin_epoch(model)
    lr = trainer.current_lr(1)

    def update() -> None:
        if kind == "lm" and not trainer.task.stateless:
            trainer.task.begin_epoch(model)  # the same segment every time: start from a fresh state
        trainer.train_update(batches, lr)
        trainer.state.updates += 1

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        update()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.steps):
        sync()
        start = time.perf_counter()
        update()
        sync()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    profile = profile_updates(update, sync, device, args.profile) if args.profile else None
    bf16 = use_bf16(cfg.trainer.precision, device)
    fpt = flops_per_token(model, cfg, context)
    peak = peak_flops(device, bf16)
    result = {
        "model": label,
        "objective": obj_label,
        "kind": kind,
        "precision": "bf16" if bf16 else "fp32",
        "compile": bool(args.compile),
        "compile_mode": getattr(args, "compile_mode", "default") if args.compile else None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(trainer.corpus.vocab),
        "tokens_per_update": tokens,
        "micro_batches": len(batches),
        "step_time_s": median,
        "step_time_mean_s": statistics.fmean(times),
        "step_time_min_s": min(times),
        "tokens_per_s": tokens / median,
        "peak_mem_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "flops_per_token": fpt,
        "mfu": (fpt * tokens / median / peak) if peak else None,
    }
    if profile is not None:
        result["profile"] = profile
    print(f"{label:18s} {obj_label:26s} {result['precision']}: {result['tokens_per_s']:>12,.0f} tok/s  "
          f"step {median * 1e3:8.1f} ms  peak mem {result['peak_mem_gb'] or 0:6.2f} GB  "
          f"MFU {result['mfu'] * 100 if result['mfu'] else float('nan'):5.1f}%", flush=True)
    return result


SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
            "cudaMemcpyAsync")


def profile_updates(update, sync, device, n: int, rows: int = 25) -> dict:
    """``n`` more updates under ``torch.profiler``, after the timed ones: the busy share of the device (its
    kernels' summed time over the updates' wall time: far below 1 means the host, not the kernels, sets the
    pace), the calls that wait for the device (``.item()``, synchronizations, copies), and the ops that take
    the most device time (or host time on a CPU), as ``key_averages`` prints them."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    with profile(activities=activities, record_shapes=False) as prof:
        start = time.perf_counter()
        for _ in range(n):
            update()
        sync()
        wall = time.perf_counter() - start
    events = prof.key_averages()

    def self_device_us(e) -> float:
        return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) or 0.0)

    from torch.autograd import DeviceType

    # the kernels' (and copies') own rows only: an op's row repeats the time of the kernels it launched
    device_us = sum(self_device_us(e) for e in events if e.device_type == DeviceType.CUDA) if cuda else None
    sort = "self_cpu_time_total"
    if cuda:
        sort = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    return {
        "updates": n,
        "wall_s": wall,
        "device_busy_share": (device_us / 1e6 / wall) if cuda and wall > 0 else None,
        "host_waits": {e.key: e.count for e in events if e.key in SYNC_OPS},
        "table": events.table(sort_by=sort, row_limit=rows, max_name_column_width=60),
    }


def add_ratios(results: list[dict]) -> None:
    """Each objective's step time and peak memory relative to MLE on the same model in the same round."""
    ref = {(r["round"], r["model"]): r for r in results if r["objective"] == "mle"}
    for r in results:
        base = ref.get((r["round"], r["model"]))
        if base is None:
            continue
        r["step_time_vs_mle"] = r["step_time_s"] / base["step_time_s"]
        if r["peak_mem_gb"] and base["peak_mem_gb"]:
            r["peak_mem_vs_mle"] = r["peak_mem_gb"] / base["peak_mem_gb"]


def summarize(results: list[dict]) -> list[dict]:
    """Per (model, objective): the median over rounds of the step-time ratio to MLE, and of tokens/s."""
    out: dict[tuple, dict] = {}
    for r in results:
        key = (r["model"], r["objective"])
        entry = out.setdefault(key, {"model": key[0], "objective": key[1], "ratios": [], "tokens_per_s": []})
        if "step_time_vs_mle" in r:
            entry["ratios"].append(r["step_time_vs_mle"])
        entry["tokens_per_s"].append(r["tokens_per_s"])
    for entry in out.values():
        entry["step_time_vs_mle"] = statistics.median(entry["ratios"]) if entry["ratios"] else None
        entry["tokens_per_s"] = statistics.median(entry["tokens_per_s"])
    return list(out.values())


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one ``repdegen: error:`` line and exit status 2, as the entry points report them."""

    def error(self, message: str):
        report_user_error(UserError(f"{message}; python scripts/bench.py --help lists the flags"))
        sys.exit(EXIT_USER_ERROR)


def at_least(low: int, example: str):
    """An argparse type: an integer >= ``low``; ``example`` (a flag with a value that fits) is the fix offered."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= {low}; give one, e.g. {example}")
        return value

    return parse


def device_name(text: str) -> str:
    """An argparse type: ``auto`` or a torch device (cpu, cuda, cuda:1, ...)."""
    if text != "auto":
        try:
            torch.device(text)
        except (RuntimeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a device; expected auto, cpu, cuda or cuda:<index>, "
                                             f"e.g. --device cpu") from None
    return text


def options(group: str) -> list[str]:
    """The options of a config group (``conf/<group>/*.yaml``): what ``--models`` / ``--objectives`` name."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_args(parser: argparse.ArgumentParser, args) -> None:
    """What the argparse types cannot see: the model and objective names (before ``:overrides``) are options of
    conf/model and conf/objective, a CUDA device is there, --out is not a folder; checked before anything runs."""
    for flag, group, names, example in (("--models", "model", args.models, "transformer_lm6:d_model=256"),
                                        ("--objectives", "objective", args.objectives, "agg:implementation=literal")):
        known = options(group)
        unknown = [n for n in names if n.split(":")[0] not in known]
        if unknown:
            parser.error(f"{flag} {' '.join(unknown)}: not an option of conf/{group}; expected one of "
                         f"{', '.join(known)} (optionally with overrides, e.g. {example})")
    if args.compile_mode != "default" and not args.compile:
        parser.error(f"--compile-mode {args.compile_mode}: a mode of torch.compile, so it needs --compile; add --compile")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is available here; use --device cpu (or auto)")
    problem = output_problem(args.out, "--out", overwrite=False) if args.out else None
    if problem:
        parser.error(problem)


def main(argv: list[str] | None = None) -> dict:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["transformer_lm6"])
    parser.add_argument("--objectives", nargs="+", default=["mle", "cosreg"])
    parser.add_argument("--precision", default="auto", choices=["fp32", "bf16", "auto"])
    parser.add_argument("--steps", type=at_least(1, "--steps 20"), default=20)
    parser.add_argument("--warmup", type=at_least(0, "--warmup 5"), default=5)
    parser.add_argument("--update-freq", type=at_least(1, "--update-freq 1"), default=1)
    parser.add_argument("--batch-size", type=at_least(1, "--batch-size 8"), default=None,
                        help="LM blocks per micro-batch (default: the recipe's)")
    parser.add_argument("--max-tokens", type=at_least(1, "--max-tokens 4096"), default=None,
                        help="MT padded tokens per micro-batch")
    parser.add_argument("--bptt", type=at_least(1, "--bptt 1024"), default=None,
                        help="LM block length (default: the recipe's 1,024)")
    parser.add_argument("--src-len", type=at_least(1, "--src-len 32"), default=32)
    parser.add_argument("--tgt-len", type=at_least(1, "--tgt-len 32"), default=32)
    parser.add_argument("--vocab", type=at_least(5, "--vocab 300 (4 special tokens and at least one word)"),
                        default=None, help="vocabulary size (default: the model's own setting's: 10,000 for the PTB LSTMs, "
                             "33,278 for the AWD-LSTM, 44,256 for the Transformer LMs, 40,624 for translation)")
    parser.add_argument("--compile", action="store_true", help="trainer.compile=true (torch.compile the model)")
    parser.add_argument("--compile-mode", default="default",
                        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
                        help="trainer.compile_mode with --compile (reduce-overhead: CUDA graphs)")
    parser.add_argument("--rounds", type=at_least(1, "--rounds 3"), default=1,
                        help="measure every objective this many times, interleaved")
    parser.add_argument("--zipf", action="store_true",
                        help="language models: tokens drawn ~ 1 / rank (realistic distinct targets a batch) instead of uniformly")
    parser.add_argument("--smoke", action="store_true", help="scale=smoke widths and tiny batches (CPU plumbing check)")
    parser.add_argument("--device", type=device_name, default="auto", help="auto (default), cpu, cuda or cuda:<index>")
    parser.add_argument("--profile", type=at_least(0, "--profile 5"), default=0, metavar="N",
                        help="after timing, profile N more updates (torch.profiler): device busy share, host waits, "
                             "top ops; kept in the JSON under each result's 'profile'")
    parser.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = parser.parse_args(argv)
    check_args(parser, args)
    register_all()
    device = torch.device("cuda" if (args.device == "auto" and torch.cuda.is_available()) else
                          ("cpu" if args.device == "auto" else args.device))
    if "mle" not in args.objectives:
        args.objectives = ["mle", *args.objectives]  # the reference of the ratios
    results = []
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="repdegen-bench-") as run_dir:
        for rnd in range(args.rounds):
            for m in args.models:
                for o in args.objectives:
                    results.append({"round": rnd, **bench_one(m, o, args, device, Path(run_dir))})
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    add_ratios(results)
    report = {
        "command": " ".join(["python", "scripts/bench.py", *(argv if argv is not None else sys.argv[1:])]),
        "git": git_commit(),
        "hardware": hardware(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average": {"before": load_before, "after": load_average()},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "note": "absolute times are meaningful on a GPU only" if device.type != "cuda" else "",
        "summary": summarize(results),
        "results": results,
    }
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"bench: wrote {out}")
    return report


if __name__ == "__main__":
    main()
