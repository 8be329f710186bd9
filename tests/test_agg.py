"""AGG (Yu et al. 2022) against independent computations: the fused autograd function against the
official three-logit construction, both against Yu App. A eq. 23 written out row by row, the token
counter memory against a hand-worked sequence of updates, and one run through the trainer."""

from __future__ import annotations

import io

import pytest
import torch
from omegaconf import OmegaConf
from repdegen.losses import build_objective
from repdegen.losses.agg import AGGConfig, agg_gates
from repdegen.reproduce.errors import ConfigError
from repdegen.reproduce.train import train

V, D, N = 9, 4, 23


class OutputLayer:
    """What the objective reads from a model: ``output_embedding`` (V, d) and ``output_bias``."""

    def __init__(self, W, b=None):
        self.output_embedding, self.output_bias = W, b


def make_agg(label_smoothing: float = 0.0, **cfg):
    return build_objective(OmegaConf.create({"name": "agg", **cfg}), V, label_smoothing)


def random_case(seed: int, bias: bool, dtype=torch.float64):
    """h, W, b, targets, and gates from an appearance vector with rare, unseen and frequent tokens;
    the targets hit rare and non-rare tokens alike."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g, dtype=dtype)
    W = torch.randn(V, D, generator=g, dtype=dtype)
    b = torch.randn(V, generator=g, dtype=dtype) if bias else None
    a = torch.tensor([5.0, 0.0, 0.01, 0.02, 0.005, 1.5, 0.3, 0.025, 2.0], dtype=torch.float64)
    special = torch.zeros(V, dtype=torch.bool)
    special[0] = True
    rare = (a < 0.03) & ~special
    y = torch.randint(0, V, (N,), generator=g)
    y[:4] = torch.tensor([1, 2, 5, 8])  # at least two rare and two non-rare targets
    return h, W, b, y, a, rare


def loss_and_grads(fn, h, W, b, y, g1, g2, rare_rows):
    leaves = [t.clone().requires_grad_(True) for t in (h, W) + ((b,) if b is not None else ())]
    loss, nll = fn(leaves[0], leaves[1], leaves[2] if b is not None else None, y, g1, g2, rare_rows)
    grads = torch.autograd.grad(loss, leaves)
    return loss.detach(), nll, grads


# -- the loss ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("gate1,gate2", [(True, True), (False, True), (True, False), (False, False)])
def test_fused_equals_literal(gate1, gate2, bias, eps):
    obj = make_agg(eps, gate1=gate1, gate2=gate2)
    for seed in range(3):
        h, W, b, y, a, rare = random_case(seed, bias)
        g1, g2 = agg_gates(a, rare, gate1, gate2)
        fused = loss_and_grads(obj.fused_loss, h, W, b, y, g1, g2, rare[y])
        literal = loss_and_grads(obj.literal_loss, h, W, b, y, g1, g2, rare[y])
        assert torch.allclose(fused[0], literal[0], atol=1e-10)
        assert torch.allclose(fused[1], literal[1], atol=1e-10)
        for gf, gl in zip(fused[2], literal[2]):
            assert gf.dtype == gl.dtype == torch.float64
            assert torch.allclose(gf, gl, atol=1e-10)


def app_a_eq_23(h, W, b, y, g1, g2, rare, eps=0.0):
    """Yu App. A eq. 23 row by row (with label smoothing: p_r - q_r in place of p_r - 1(r = y_i)):
    dL/dw_r = 1/N sum_i c_ir (p_r|i - q_ir) h_i with c_ir = 1 if r = y_i, g1_r if y_i is not rare,
    g2_r if it is; dL/dh_i = 1/N sum_r (p_r|i - q_ir) w_r (ungated). Also the plain mean NLL."""
    n = h.size(0)
    grad_w, grad_b, grad_h, nll = torch.zeros_like(W), torch.zeros(W.size(0), dtype=W.dtype), torch.zeros_like(h), 0.0
    for i in range(n):
        z = W @ h[i] + (b if b is not None else 0.0)
        p = torch.softmax(z, 0)
        nll += float(-torch.log_softmax(z, 0)[y[i]])
        for r in range(W.size(0)):
            q = (1 - eps) * (r == y[i]) + eps / W.size(0)
            gate = 1.0 if r == y[i] else float(g2[r] if rare[y[i]] else g1[r])
            grad_w[r] += gate * (p[r] - q) * h[i] / n
            grad_b[r] += gate * (p[r] - q) / n
            grad_h[i] += (p[r] - q) * W[r] / n
    return grad_h, grad_w, grad_b, nll / n


@pytest.mark.parametrize("implementation", ["fused", "literal"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gradients_are_app_a_eq_23(implementation, eps):
    obj = make_agg(eps)
    h, W, b, y, a, rare = random_case(7, bias=True)
    g1, g2 = agg_gates(a, rare)
    fn = obj.fused_loss if implementation == "fused" else obj.literal_loss
    loss, nll, (gh, gw, gb) = loss_and_grads(fn, h, W, b, y, g1, g2, rare[y])
    eh, ew, eb, enll = app_a_eq_23(h, W, b, y, g1, g2, rare, eps)
    assert torch.allclose(gh, eh, atol=1e-12) and torch.allclose(gw, ew, atol=1e-12) and torch.allclose(gb, eb, atol=1e-12)
    assert float(nll) == pytest.approx(enll, rel=1e-12)
    # the value is two (smoothed) NLL terms of equal value, as the official loss
    z = torch.nn.functional.linear(h, W, b)
    smoothed = torch.nn.functional.cross_entropy(z, y, label_smoothing=eps)
    assert float(loss) == pytest.approx(2 * float(smoothed), rel=1e-12)
    # some rare rows of W really are gated: the gradient differs from plain MLE's
    W_leaf = W.clone().requires_grad_(True)
    mle = torch.autograd.grad(torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, W_leaf, b), y,
                                                                label_smoothing=eps), W_leaf)[0]
    assert not torch.allclose(gw[rare], mle[rare], atol=1e-6)
    assert torch.allclose(gw[~rare], mle[~rare], atol=1e-12)  # non-rare rows: plain MLE


@pytest.mark.parametrize("gate1,gate2,target_set", [(False, False, "any"), (False, True, "frequent"), (True, False, "rare")])
def test_switched_off_gates_leave_that_part_of_the_gradient_as_mle(gate1, gate2, target_set):
    """Yu Table 8: "no g1" leaves part (b) (rows with a non-rare target) ungated, "no g2" part (c)."""
    obj = make_agg(gate1=gate1, gate2=gate2)
    h, W, b, y, a, rare = random_case(3, bias=True)
    if target_set == "frequent":
        y = torch.tensor([0, 5, 6, 8])[torch.arange(N) % 4]
    elif target_set == "rare":
        y = torch.tensor([1, 2, 3, 4, 7])[torch.arange(N) % 5]
    h = h[: y.numel()]
    g1, g2 = agg_gates(a, rare, gate1, gate2)
    loss, _, grads = loss_and_grads(obj.fused_loss, h, W, b, y, g1, g2, rare[y])
    leaves = [t.clone().requires_grad_(True) for t in (h, W, b)]
    mle = torch.nn.functional.cross_entropy(torch.nn.functional.linear(*leaves), y)
    for got, want in zip(grads, torch.autograd.grad(mle, leaves)):
        assert torch.allclose(got, want, atol=1e-12)
    assert float(loss) == pytest.approx(2 * float(mle.detach()), rel=1e-12)


def test_gates_by_hand():
    a = torch.tensor([0.0, 0.0, 0.02, 0.01, 2.0, 0.04], dtype=torch.float64)
    special = torch.tensor([True, False, False, False, False, False])
    rare = (a < 0.03) & ~special  # {1, 2, 3}: the unseen special symbol 0 is not rare
    g1, g2 = agg_gates(a, rare)
    assert g1.tolist() == pytest.approx([1.0, 0.0, 0.02, 0.01, 1.0, 1.0])  # a_k itself, not a_k / alpha
    # mean over the rare set, unseen tokens included: (0 + 0.02 + 0.01) / 3 = 0.01
    assert g2.tolist() == pytest.approx([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    g1, g2 = agg_gates(a * torch.tensor([1, 1, 1, 0.5, 1, 1]), rare)  # a_3 = 0.005, mean 0.025 / 3
    assert g2[3].item() == pytest.approx(0.005 / (0.025 / 3))
    assert agg_gates(a, rare, gate1=False)[0].tolist() == [1.0] * 6
    assert agg_gates(a, rare, gate2=False)[1].tolist() == [1.0] * 6
    # every rare token unseen: g2 = 0 for them (the official code's 0 / (0 + 1e-7))
    g1, g2 = agg_gates(torch.tensor([0.0, 0.0, 3.0], dtype=torch.float64), torch.tensor([True, True, False]))
    assert g2.tolist() == [0.0, 0.0, 1.0]


def test_bf16_autocast_runs_and_matches_float32():
    obj = make_agg()
    h, W, b, y, a, rare = random_case(5, bias=True, dtype=torch.float32)
    g1, g2 = agg_gates(a, rare)
    g1, g2 = g1.float(), g2.float()
    ref = loss_and_grads(obj.fused_loss, h, W, b, y, g1, g2, rare[y])
    for fn in (obj.fused_loss, obj.literal_loss):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = loss_and_grads(fn, h, W, b, y, g1, g2, rare[y])
        assert abs(float(got[0]) - float(ref[0])) < 0.05
        for gg, gr in zip(got[2], ref[2]):
            assert gg.dtype == torch.float32 and torch.allclose(gg, gr, atol=2e-2)


# -- the token counter memory -----------------------------------------------------------------------
def run_batch(obj, targets, step, W=None):
    """One micro-batch through ``forward`` (training mode unless the caller set eval)."""
    W = torch.zeros(obj.vocab_size, 2) if W is None else W
    y = torch.tensor(targets)
    return obj(torch.zeros(len(targets), W.size(1), dtype=W.dtype), y, OutputLayer(W), step)


def rare_set(obj, step):
    return set(torch.nonzero(obj.groups(step)[1]).flatten().tolist())


def test_counter_memory_by_hand():
    """K = 2, V = 5, alpha = 1.5, symbol 0 special. Slot = step % 2; a = memory / min(step + 1, 2)."""
    obj = build_objective(OmegaConf.create({"name": "agg", "alpha": 1.5}), 5)
    obj.setup(updates_per_epoch=2, special_ids=[0], train_counts=torch.ones(5))
    obj.train()
    # step 0, first micro-batch: slot 0 = [1, 2, 1, 0, 0], counted before the gates
    out = run_batch(obj, [1, 1, 2, 0], 0)
    assert obj.counts.tolist() == [[1, 2, 1, 0, 0], [0, 0, 0, 0, 0]]
    assert rare_set(obj, 0) == {2, 3, 4} and int(out.logs["rare_count"]) == 3
    # step 0, second micro-batch: adds into the same slot
    run_batch(obj, [2, 3], 0)
    assert obj.counts[0].tolist() == [1, 2, 2, 1, 0] and rare_set(obj, 0) == {3, 4}
    # step 1: slot 1; a = [1, 3, 2, 1, 3] / 2
    run_batch(obj, [4, 4, 4, 1], 1)
    assert obj.appearance(1).tolist() == [0.5, 1.5, 1.0, 0.5, 1.5]
    assert rare_set(obj, 1) == {2, 3}  # token 0 (a = 0.5) is special
    # step 2: slot 0 is cleared first (it held step 0); a = ([0,0,0,4,0] + [0,1,0,0,3]) / 2
    run_batch(obj, [3, 3, 3, 3], 2)
    a = obj.appearance(2)
    assert obj.counts.tolist() == [[0, 0, 0, 4, 0], [0, 1, 0, 0, 3]] and a.tolist() == [0.0, 0.5, 0.0, 2.0, 1.5]
    _, rare = obj.groups(2)
    assert set(torch.nonzero(rare).flatten().tolist()) == {1, 2}  # unseen token 2 rare; unseen special 0 not
    g1, g2 = agg_gates(a, rare)
    assert g1.tolist() == [1.0, 0.5, 0.0, 1.0, 1.0] and g2.tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    # step 3: slot 1 cleared
    run_batch(obj, [2], 3)
    assert obj.appearance(3).tolist() == [0.0, 0.0, 0.5, 2.0, 0.0] and rare_set(obj, 3) == {1, 2, 4}
    assert obj.total.tolist() == obj.counts.sum(0).tolist() and obj.slot_step.tolist() == [2, 3]


def test_a_jump_in_step_drops_updates_older_than_k():
    obj = make_agg(memory_updates=2)
    obj.train()
    run_batch(obj, [1, 1], 0)
    run_batch(obj, [2], 1)
    run_batch(obj, [3], 4)  # steps 2, 3 never came: only step 4 remains of steps 3..4
    assert obj.total.tolist()[:5] == [0, 0, 0, 1, 0] and obj.total.sum() == 1


def test_evaluation_does_not_touch_the_memory():
    obj = make_agg(alpha=0.5, memory_updates=3, static_after_updates=2)
    obj.train()
    run_batch(obj, [1, 2, 2], 0)
    before = {k: v.clone() for k, v in obj.state_dict().items()}
    obj.eval()
    for step in (0, 1, 5):
        run_batch(obj, [3, 3, 4], step)
    for k, v in obj.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_state_dict_round_trip_restores_the_memory():
    obj = make_agg(alpha=0.5)
    obj.setup(updates_per_epoch=3, special_ids=[0], train_counts=None)
    obj.train()
    for step, targets in enumerate([[1, 1, 2], [3, 4, 4], [5, 1, 1], [2, 2, 2]]):
        run_batch(obj, targets, step)
    buf = io.BytesIO()
    torch.save(obj.state_dict(), buf)
    buf.seek(0)
    fresh = make_agg(alpha=0.5)  # no setup: the checkpoint's K (3) and specials are restored
    fresh.load_state_dict(torch.load(buf))
    fresh.train()
    assert fresh.memory_updates == 3 and fresh.special[0]
    for a, b in zip(obj.groups(3), fresh.groups(3)):
        assert torch.equal(a, b)
    # and they go on identically
    W = torch.randn(V, 3, dtype=torch.float64)
    for step, targets in ((4, [6, 7, 7]), (4, [8]), (5, [1])):
        oa, ob = run_batch(obj, targets, step, W), run_batch(fresh, targets, step, W)
        assert torch.equal(oa.token_loss, ob.token_loss) and torch.equal(oa.logs["rare_count"], ob.logs["rare_count"])
    for k, v in obj.state_dict().items():
        assert torch.equal(v, fresh.state_dict()[k]), k


@pytest.mark.parametrize("when,per_epoch", [({"static_after_updates": 2}, 1), ({"static_after_epochs": 0.5}, 4)])
def test_static_grouping_freezes_the_rare_set(when, per_epoch):
    """From update 2 on (static_after_updates=2, or half an epoch of 4 updates), the rare set is
    update 1's; the gates keep following a."""
    cfg = {"alpha": 1.0, "memory_updates": 1}
    static, dynamic = make_agg(**cfg, **when), make_agg(**cfg)
    for obj in (static, dynamic):
        obj.setup(per_epoch, [0], None)
    assert static.static_after == 2
    for obj in (static, dynamic):
        obj.train()
        run_batch(obj, [1, 1, 2], 0)
        run_batch(obj, [3, 3, 4], 1)  # rare: 1, 2 (unseen in the last K = 1 update) and the never seen 5..8
    assert rare_set(static, 1) == rare_set(dynamic, 1) == {1, 2, 5, 6, 7, 8}
    for obj in (static, dynamic):
        run_batch(obj, [1, 1, 1, 2, 2], 2)
    assert rare_set(dynamic, 2) == {3, 4, 5, 6, 7, 8}
    assert rare_set(static, 2) == {1, 2, 5, 6, 7, 8}
    a, rare = static.groups(2)
    g1, _ = agg_gates(a, rare)
    assert g1[:5].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0]  # frozen-rare 1, 2 now seen >= 1 per update: min(a, 1)
    assert g1[5:].tolist() == [0.0] * (V - 5)


def test_setup_takes_k_from_the_epoch_unless_configured():
    obj = make_agg()
    with pytest.raises(RuntimeError, match="setup"):
        run_batch(obj, [1], 0)
    obj.setup(updates_per_epoch=7, special_ids=[0, 3], train_counts=torch.ones(V))
    assert obj.counts.shape == (7, V) and obj.slot_step.shape == (7,)
    assert obj.special.nonzero().flatten().tolist() == [0, 3]
    fixed = make_agg(memory_updates=4)
    fixed.setup(updates_per_epoch=7, special_ids=[], train_counts=None)
    assert fixed.counts.shape == (4, V)


def test_distributed_counts_are_all_reduced(monkeypatch):
    calls = []

    def fake_all_reduce(tensor, op=None):  # two ranks with the same batch
        calls.append(op)
        tensor.mul_(2)

    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", fake_all_reduce)
    obj = make_agg(memory_updates=2)
    obj.train()
    run_batch(obj, [1, 1, 2], 0)
    assert calls == [torch.distributed.ReduceOp.SUM]
    assert obj.counts[0, :3].tolist() == [0, 4, 2]


@pytest.mark.parametrize("bad,match", [({"alpha": 0.0}, "alpha"), ({"implementation": "triton"}, "implementation"),
                                       ({"memory_updates": 0}, "memory_updates"),
                                       ({"static_after_updates": 0}, "static_after_updates"),
                                       ({"static_after_epochs": 0.0}, "static_after_epochs"),
                                       ({"static_after_updates": 5, "static_after_epochs": 1.0}, "set one of them")])
def test_bad_configs_are_rejected(bad, match):
    from repdegen.losses import validate_objective

    with pytest.raises(ConfigError, match=match):
        validate_objective(OmegaConf.merge(OmegaConf.structured(AGGConfig), bad))


# -- end to end -------------------------------------------------------------------------------------
def test_training_run_saves_the_counter_memory(compose_cfg, tmp_path):
    rec = train(compose_cfg("experiment=inan2017/small", "scale=smoke", "objective=agg", "objective.alpha=0.5"))
    assert rec["status"] == "complete"
    ckpt = torch.load(tmp_path / "out" / "runs" / rec["config_hash"] / "checkpoint.pt", map_location="cpu",
                      weights_only=False)
    memory, updates = ckpt["objective"], ckpt["run_state"]["updates"]
    k = memory["counts"].size(0)
    assert updates >= k > 1  # K = the updates of one epoch
    assert memory["slot_step"].sort().values.tolist() == list(range(updates - k, updates))  # the last K updates
    assert memory["total"].tolist() == memory["counts"].sum(0).tolist() and int(memory["total"].sum()) > 0
    assert memory["special"].any()  # <unk> / <eos> of the word corpus


def test_the_trainer_records_the_traces_the_objective_declares(compose_cfg, tmp_path):
    """AGG declares `traces = {"rare_count": ...}`; the trainer (which names no objective) records it per update."""
    rec = train(compose_cfg("experiment=inan2017/small", "scale=smoke", "objective=agg", "objective.alpha=20"))
    ckpt = torch.load(tmp_path / "out" / "runs" / rec["config_hash"] / "checkpoint.pt", map_location="cpu",
                      weights_only=False)
    memory, updates = ckpt["objective"], ckpt["run_state"]["updates"]
    trace = rec["trace"]["rare_count"]
    assert [s for s, _ in trace] == list(range(updates))
    # the last value, recomputed from the saved memory: types (not special) seen < alpha times per update
    appearance = memory["total"].double() / min(updates, memory["counts"].size(0))
    expected = int(((appearance < 20) & ~memory["special"]).sum())
    assert trace[-1][1] == expected and 0 < expected < memory["total"].numel()
    assert "trace" not in train(compose_cfg("experiment=inan2017/small", "scale=smoke", "objective=mle"))
