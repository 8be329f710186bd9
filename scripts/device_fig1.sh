#!/usr/bin/env bash
# Issue 23 item 6 on a lent GPU: the Inan 2017 Fig. 1 positive control (results/sanity/inan2017_fig1_control.md),
# beta = 0 and beta = 1 at tau = 10, seed 101, side by side, in fp32, at `paper` (conf/experiment/inan2017/fig1.yaml:
# Adam to the minimum of J_tot, <= 500 epochs). Time-boxed: at SECONDS the runs get SIGTERM (a checkpoint, status
# "preempted"); then the subspace distance of whatever weights each run has (its final metric if it finished, else
# its last epoch's checkpoint, said so) goes to $OUT/fig1.json with each run's per-epoch history; records in ledger.tgz.
# Usage (carry .whl, .data):  bash scripts/device_fig1.sh SECONDS [RUN ...]
# each RUN is a comma-separated list of overrides of the preset run (default: "objective.beta=0.0" "objective.beta=1.0"),
# e.g.  bash scripts/device_fig1.sh 400 objective.beta=1.0 objective.beta=1.0,objective.target_grad=none objective.beta=0.0
set -uo pipefail
secs=${1:-150}; shift || true
runs=("$@"); [ ${#runs[@]} -eq 0 ] && runs=(objective.beta=0.0 objective.beta=1.0)
. scripts/device_env.sh
for run in "${runs[@]}"; do
  IFS=, read -ra extra <<< "$run"
  timeout -s TERM -k 20 "$secs" repdegen train experiment=inan2017/fig1 objective=al \
    objective.temperature=10.0 scale=paper seed=101 trainer.precision=fp32 trainer.progress=false "${extra[@]}" \
    > "$OUT/${run//[^a-zA-Z0-9.=_]/_}.log" 2>&1 &
done
wait
python3 - <<'PY'
import json, os, pathlib, torch
from repdegen.analysis.inspection import subspace_distance
out = {}
for run in sorted(pathlib.Path("outputs/runs").iterdir()):
    rec = json.loads((run / "result.json").read_text())
    o = rec["config"]["objective"]
    beta = f'{o["beta"]}/{o.get("target_grad")}' 
    final = (rec.get("metrics") or {}).get("final") or {}
    if "subspace_distance" in final:
        d, source = final["subspace_distance"], "final metrics (last weights)"
    else:
        sd = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]
        d = subspace_distance(sd["embedding.weight"].double(), sd["output_weight"].double())
        source = "the last epoch's checkpoint (run not finished)"
    out[str(beta)] = {"config_hash": rec["config_hash"], "status": rec["status"], "epochs": len(rec["history"]),
                      "subspace_distance": d, "source": source,
                      "history": [{k: h.get(k) for k in ("epoch", "train_loss", "train_ppl", "valid_ppl", "epoch_seconds")}
                                  for h in rec["history"]]}
    print(beta, rec["status"], len(rec["history"]), "epochs, distance", d, source)
(pathlib.Path(os.environ["OUT"]) / "fig1.json").write_text(json.dumps(out, indent=1))
PY
pack_ledger
