"""Training-step benchmark: tokens/s, step time, peak memory and MFU for each model x objective.

    python scripts/bench.py --models gpt2_medium transformer_base --objectives mle cosreg \\
        --precision bf16 --out results/bench/h100-bf16.json
    python scripts/bench.py --models transformer_lm6 --objectives mle cosreg --smoke   # CPU plumbing check

Each (model, objective) runs ``--warmup`` untimed optimizer updates, then ``--steps`` timed ones
(``torch.cuda.synchronize`` around each) on random tokens of the model recipe's batch shape: LMs take
``trainer.batch_size`` blocks of ``trainer.bptt`` tokens per micro-batch; translation models take
sentence pairs of ``--src-len``/``--tgt-len`` tokens filling ``trainer.max_tokens``. One update =
``--update-freq`` micro-batches (default 1: the per-micro-batch cost). The step is the trainer's:
autocast forward, the objective on the hidden states, backward, Adam(W) step.

The JSON holds every measurement, the ratio of each objective's median step time and peak memory to
MLE's on the same model measured in the same run, and MFU = model FLOPs per second / the device's
peak dense bf16 (or fp32) FLOPs where known (model FLOPs per token = 6 x (non-embedding parameters +
the output projection) + 12 x layers x d x context, the PaLM appendix B count; attention of
encoder-decoder models counted for both stacks). Absolute times are meaningful only on a GPU; on a
CPU (``--smoke``) the numbers check the plumbing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra import compose, initialize_config_dir  # noqa: E402

from losses import TokenLayout, build_objective  # noqa: E402
from models import build_model, resolve_tie  # noqa: E402
from reproduce.config import CONF_DIR, finalize, register_all  # noqa: E402
from reproduce.provenance import git_commit, hardware  # noqa: E402
from reproduce.trainer import use_bf16  # noqa: E402

# peak dense tensor throughput (FLOP/s) by device name fragment: (bf16, fp32/tf32-off)
PEAK_FLOPS = {
    "H200": (989.5e12, 66.9e12),
    "H100": (989.5e12, 66.9e12),  # SXM; the PCIe card is lower (756 TFLOPs bf16)
    "A100": (312e12, 19.5e12),
    "L4": (121e12, 30.3e12),
}

# vocabulary sizes of the papers' settings (Yu et al. Table 12)
PAPER_VOCAB = {"lm": 44256, "translation": 40624}


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
        return finalize(compose("config", overrides=[f"model={model}", f"dataset={dataset}", f"objective={objective}", *extra]))


def flops_per_token(model, cfg, context: int) -> float:
    """6 N (matmul parameters incl. the output projection, excl. embedding lookups and norms) +
    12 x layers x d x context for attention scores and values."""
    m = cfg.model
    n = 0
    for name, p in model.named_parameters():
        if p.dim() == 2 and "embedding" not in name and "pos" not in name:
            n += p.numel()
    n += model.output_embedding.numel()  # the output projection (tied or not) is a matmul
    layers = m.get("n_layers") or (m.get("encoder_layers", 0) + 2 * m.get("decoder_layers", 0))
    return 6.0 * n + 12.0 * layers * m.d_model * context


def make_batch(kind: str, cfg, vocab: int, device, src_len: int, tgt_len: int, gen: torch.Generator):
    t = cfg.trainer
    if kind == "lm":
        x = torch.randint(4, vocab, (t.bptt + 1, t.batch_size), generator=gen).to(device)
        return {"x": x[:-1], "y": x[1:]}, t.bptt * t.batch_size, t.bptt
    n = max(1, t.max_tokens // max(src_len, tgt_len))
    src = torch.randint(4, vocab, (n, src_len), generator=gen).to(device)
    tgt = torch.randint(4, vocab, (n, tgt_len), generator=gen).to(device)
    prev = torch.cat([torch.full((n, 1), 2, device=device), tgt[:, :-1]], 1)
    return {"src": src, "prev": prev, "target": tgt}, n * tgt_len, (src_len + tgt_len) / 2


def micro_step(kind, model, objective, batch, step):
    if kind == "lm":
        out = model(batch["x"], None)
        h = out.hidden.reshape(-1, out.hidden.size(-1))
        layout = TokenLayout.time_major(batch["y"].size(0), batch["y"].size(1), h.device)
        result = objective(h, batch["y"].reshape(-1), model, step, layout=layout)
    else:
        out = model(batch["src"], batch["prev"])
        h = out.hidden.reshape(-1, out.hidden.size(-1))
        layout = TokenLayout.from_mask(torch.ones_like(batch["target"], dtype=torch.bool))
        result = objective(h, batch["target"].reshape(-1), model, step, layout=layout)
    return result.token_loss + result.reg_loss


def bench_one(model_name: str, objective: str, args, device) -> dict:
    """``objective``: a name, optionally with config overrides: ``agg:implementation=literal``."""
    objective, _, opts = objective.partition(":")
    obj_overrides = [f"objective.{o}" for o in opts.split(",") if o]
    kind = "translation" if model_name.startswith("transformer_") and model_name not in ("transformer_lm6",) else "lm"
    dataset = "wmt14_en_de" if kind == "translation" else "wikitext103"
    extra = ["scale=smoke"] if args.smoke else []
    extra += [f"trainer.precision={args.precision}"]
    if args.batch_size:
        extra.append(f"trainer.batch_size={args.batch_size}")
    if args.max_tokens:
        extra.append(f"trainer.max_tokens={args.max_tokens}")
    if args.smoke:
        extra += ["trainer.bptt=64", "trainer.batch_size=2", "trainer.max_tokens=256"]
    if args.bptt:
        extra.append(f"trainer.bptt={args.bptt}")
    cfg = compose_cfg(model_name, objective, dataset, extra + obj_overrides)
    vocab = args.vocab or PAPER_VOCAB[kind]
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab, resolve_tie(cfg.model, cfg.objective)).to(device)
    obj = build_objective(cfg.objective, vocab, cfg.trainer.label_smoothing).to(device)
    obj.setup(updates_per_epoch=1000, special_ids=[0, 1, 2, 3], train_counts=torch.arange(vocab, 0, -1))
    params = [p for p in list(model.parameters()) + list(obj.parameters()) if p.requires_grad]
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01, fused=fused)
    step_fn = micro_step
    if args.compile:
        model = torch.compile(model)
    bf16 = use_bf16(cfg.trainer.precision, device)
    gen = torch.Generator().manual_seed(0)
    batch, tokens, context = make_batch(kind, cfg, vocab, device, args.src_len, args.tgt_len, gen)
    model.train()

    def update(step: int) -> None:
        opt.zero_grad(set_to_none=True)
        for _ in range(args.update_freq):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = step_fn(kind, model, obj, batch, step)
            (loss / args.update_freq).backward()
        opt.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for s in range(args.warmup):
        update(s)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for s in range(args.steps):
        sync()
        start = time.perf_counter()
        update(args.warmup + s)
        sync()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    tok_per_update = tokens * args.update_freq
    n_params = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(model if not args.compile else model._orig_mod, cfg, context)
    peak = peak_flops(device, bf16)
    result = {
        "model": model_name,
        "objective": objective + (f"[{opts}]" if opts else ""),
        "kind": kind,
        "precision": "bf16" if bf16 else "fp32",
        "parameters": n_params,
        "vocab_size": vocab,
        "tokens_per_update": tok_per_update,
        "batch": {k: list(v.shape) for k, v in batch.items()},
        "step_time_s": median,
        "step_time_mean_s": statistics.fmean(times),
        "step_time_min_s": min(times),
        "tokens_per_s": tok_per_update / median,
        "peak_mem_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "flops_per_token": fpt,
        "mfu": (fpt * tok_per_update / median / peak) if peak else None,
    }
    print(f"{model_name:18s} {result['objective']:26s} {result['precision']}: {result['tokens_per_s']:>12,.0f} tok/s  "
          f"step {median * 1e3:8.1f} ms  peak mem {result['peak_mem_gb'] or 0:6.2f} GB  "
          f"MFU {result['mfu'] * 100 if result['mfu'] else float('nan'):5.1f}%", flush=True)
    return result


def add_ratios(results: list[dict]) -> None:
    """Each objective's step time and peak memory relative to MLE on the same model (same run)."""
    ref = {r["model"]: r for r in results if r["objective"] == "mle"}
    for r in results:
        base = ref.get(r["model"])
        if base is None:
            continue
        r["step_time_vs_mle"] = r["step_time_s"] / base["step_time_s"]
        if r["peak_mem_gb"] and base["peak_mem_gb"]:
            r["peak_mem_vs_mle"] = r["peak_mem_gb"] / base["peak_mem_gb"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["transformer_lm6"])
    parser.add_argument("--objectives", nargs="+", default=["mle", "cosreg"])
    parser.add_argument("--precision", default="auto", choices=["fp32", "bf16", "auto"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--update-freq", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=None, help="LM blocks per micro-batch (default: the recipe's)")
    parser.add_argument("--max-tokens", type=int, default=None, help="MT padded tokens per micro-batch")
    parser.add_argument("--bptt", type=int, default=None, help="LM block length (default: the recipe's 1,024)")
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--tgt-len", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the papers' 44,256 / 40,624)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--smoke", action="store_true", help="scale=smoke widths and tiny batches (CPU plumbing check)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = parser.parse_args(argv)
    register_all()
    device = torch.device("cuda" if (args.device == "auto" and torch.cuda.is_available()) else
                          ("cpu" if args.device == "auto" else args.device))
    if "mle" not in args.objectives:
        args.objectives = ["mle", *args.objectives]  # the reference of the ratios
    results = []
    for m in args.models:
        for o in args.objectives:
            results.append(bench_one(m, o, args, device))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    add_ratios(results)
    report = {
        "command": " ".join(["python", "scripts/bench.py", *(argv if argv is not None else sys.argv[1:])]),
        "git": git_commit(),
        "hardware": hardware(device),
        "torch": torch.__version__,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "note": "absolute times are meaningful on a GPU only" if device.type != "cuda" else "",
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
