"""The translation task selects the target rows without a device sync (indices found on the host); they must be
the rows boolean masking of the padded batch gives, in the same order, with the layout ``TokenLayout.from_mask``
gives."""

import sys
from argparse import Namespace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench  # noqa: E402
from repdegen.data.translation import PAD, ParallelSplit, collate  # noqa: E402
from repdegen.losses import TokenLayout  # noqa: E402
from repdegen.reproduce.settings.config import register_all  # noqa: E402


def test_target_rows_equal_boolean_masking(tmp_path):
    register_all()
    args = Namespace(smoke=True, precision="fp32", update_freq=1, compile=False, batch_size=None, max_tokens=None,
                     bptt=None, vocab=64, src_len=8, tgt_len=8)
    trainer, *_ = bench.build_bench("transformer_base", "mle", args, torch.device("cpu"), tmp_path)
    model, task = trainer.model.eval(), trainer.task
    gen = torch.Generator().manual_seed(0)
    lens = [(5, 3), (2, 7), (6, 1), (4, 4)]  # ragged: the batch pads targets to 7
    src = [torch.randint(4, 64, (s,), generator=gen) for s, _ in lens]
    tgt = [torch.randint(4, 64, (t,), generator=gen) for _, t in lens]
    part = ParallelSplit(src, tgt, [""] * 4, [""] * 4)
    with torch.no_grad():
        hidden, target, layout = task._forward(model, part, [0, 1, 2, 3])
        b = collate(part, [0, 1, 2, 3])
        mask = b.target != PAD
        want_hidden = model(b.src, b.prev).hidden[mask]
    want_layout = TokenLayout.from_mask(mask)
    assert target.tolist() == torch.cat(tgt).tolist() == b.target[mask].tolist()
    assert torch.allclose(hidden, want_hidden, atol=1e-6)
    assert layout.seq.tolist() == want_layout.seq.tolist() and layout.pos.tolist() == want_layout.pos.tolist()
    assert (layout.n_seq, layout.length) == (4, 7)
