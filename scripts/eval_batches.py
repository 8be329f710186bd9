"""Validation and test PPL of finished LM cells read at several batch sizes (issue 25: the GPU cell whose test PPL at
batch 1 was 290.7 against 224.2 on validation at batch 50).

With no dropout at evaluation and the state carried across segments, the PPL of a split depends on the batch size
only through which N mod B trailing tokens are dropped and how long each column's unbroken stream is (batch 1: the
whole split is one stream). A large gap between batch 1 and batch 50 on the same weights points at the weights'
behaviour over a long stream, not at the data; ``--trace-state`` prints beside it the largest absolute value of the
recurrent state the model carries between segments (an LSTM's h and c: c is unbounded).

    python scripts/eval_batches.py outputs/runs/<hash> [...] [--batches 1 50] [--splits valid test] [--device cuda]
        [--weights best.pt] [--out F.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repdegen.core.files import atomic_write_json  # noqa: E402


def _tensors(state):
    """The tensors of a model's carried state (None, a tensor, or nested tuples/lists of them:
    ``LanguageModel.detach_state``'s shapes)."""
    if torch.is_tensor(state):
        yield state
    elif isinstance(state, (list, tuple)):
        for x in state:
            yield from _tensors(x)


def _max_state(model, ids, batch_size, bptt, device) -> float:
    """The largest absolute value in the recurrent state the model carries between segments (an LSTM's h and c)
    over the split read at ``batch_size``; NaN for a model that carries none."""
    from repdegen.analysis.evaluate import _segments

    peak = float("nan")
    with torch.no_grad():
        for out, _ in _segments(model, ids, batch_size, bptt, device):
            for t in _tensors(out.state):
                if t.numel():
                    m = float(t.abs().max())
                    peak = m if peak != peak else max(peak, m)
    return peak


def evaluate_run(run: Path, weights: str, batches: list[int], splits: list[str], device: str, trace: bool,
                 tf32: bool = False) -> dict:
    from omegaconf import OmegaConf
    from repdegen.analysis.evaluate import evaluate_nll
    from repdegen.reproduce.engine.tasks import LMTask
    from repdegen.reproduce.runs.execute import pick_device
    from repdegen.reproduce.runs.trained import load_lm

    dev = pick_device(device)
    if dev.type == "cuda":  # fp32 as the trainer runs fp32 (reproduce/engine/trainer.py): cuDNN's TF32 off unless asked
        torch.backends.cudnn.allow_tf32 = tf32
    lm = load_lm(run / weights, dev, what="scripts/eval_batches.py")
    rec = lm.record.get("metrics", {}).get("final", {})
    out = {"run": run.name, "label": lm.record.get("label"), "weights": weights, "device": str(dev),
           "arithmetic": "fp32" + (" (cuDNN TF32 on)" if tf32 and dev.type == "cuda" else ""),
           "recorded": {k: rec.get(k) for k in ("valid_ppl", "test_ppl")}, "ppl": {}, "max_abs_cell_state": {}}
    task = LMTask(OmegaConf.create(OmegaConf.to_container(lm.cfg, resolve=True)), lm.corpus, lm.model, dev)
    with torch.no_grad():
        for split in splits:
            ids = lm.corpus.split(split)
            for b in batches:
                bptt = task.eval_bptt(b)  # the segment length the trainer reads this batch size with
                t0 = time.time()
                r = evaluate_nll(lm.model, ids, b, bptt, dev)
                out["ppl"][f"{split}@{b}"] = r["ppl"]
                if trace:
                    out["max_abs_cell_state"][f"{split}@{b}"] = _max_state(lm.model, ids, b, bptt, dev)
                print(f"{run.name} {split} batch {b}: PPL {r['ppl']:.2f} ({r['tokens']:,} tokens, "
                      f"{time.time() - t0:.0f}s)" + (f", max |state| {out['max_abs_cell_state'][f'{split}@{b}']:.1f}"
                                                    if trace else ""), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--weights", default="best.pt")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 50])
    ap.add_argument("--splits", nargs="+", default=["valid", "test"], choices=["valid", "test"])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--trace-state", action="store_true", help="also the largest |value| of the carried state over each pass")
    ap.add_argument("--tf32", action="store_true", help="on a GPU, let cuDNN's LSTM use TF32 (its default; the "
                                                         "trainer turns it off at precision fp32)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if any(b < 1 for b in a.batches):
        sys.exit(f"eval_batches: --batches {a.batches}: each must be a positive integer (e.g. --batches 1 50)")
    from repdegen.reproduce.errors import exit_on_user_error

    run_one = exit_on_user_error(evaluate_run)
    results = [run_one(run, a.weights, a.batches, a.splits, a.device, a.trace_state, a.tf32) for run in a.runs]
    if a.out is not None:
        atomic_write_json(a.out, results, parents=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
