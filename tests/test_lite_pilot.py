"""The pilot's overfit check (docs/lite_v2.md section 5 as amended: an overfit must last), on hand-worked curves."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from lite_pilot import lasting_overfit_epoch  # noqa: E402


def test_a_one_epoch_spike_is_not_an_overfit():
    # the Inan 2017 small pilot at lr 1 (results/pilots/inan2017_small.md, best 207.65): the epoch-7 spike (224.5 after
    # 216.1) is followed by new bests at 8 and 10, and epoch 11 is only +0.99 % over 207.65 -> no lasting overfit
    curve = [532.1, 336.6, 309.4, 262.9, 228.1, 216.1, 224.5, 209.0, 211.7, 207.65, 209.7, 213.0]
    assert lasting_overfit_epoch(curve) is None


def test_the_first_epoch_with_a_lasting_overfit():
    # best 8.0 at epoch 3; epochs 4 and 5 are +6.25 % and +7.5 % over it: at E = 5 the best is at <= E - 2
    assert lasting_overfit_epoch([10, 9, 8, 8.5, 8.6, 8.7]) == 5
    # epoch 4 is only +0.6 % over the best: never lasting within these epochs
    assert lasting_overfit_epoch([10, 9, 8, 8.05, 8.6]) is None
    # best at epoch 2, epochs 3 and 4 +1.25 % over it: E = 4, the smallest E with the best at <= E - 2
    assert lasting_overfit_epoch([10.0, 8.0, 8.1, 8.1]) == 4
    assert lasting_overfit_epoch([5.0, 4.0]) is None  # too short to say


def test_the_report_names_the_device_the_runs_trained_on(tmp_path):
    import json

    from lite_pilot import hardware

    gpu = {"hardware": {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "cpu_count": 16},
           "config": {"trainer": {"precision": "fp32"}}}
    cpu = {"hardware": {"device": "cpu", "cpu": "AMD EPYC", "cpu_count": 2}, "config": {"trainer": {"precision": "auto"}}}
    for name, rec in (("gpu", gpu), ("cpu", cpu)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps({"status": "complete", "config_hash": "0" * 16, **rec}))
    assert hardware(tmp_path / "gpu") == "one NVIDIA H100 80GB HBM3 (fp32)"
    assert hardware(tmp_path / "cpu") == "2-core AMD EPYC CPU (auto)"
