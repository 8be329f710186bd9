# Sourced by the scripts/device_*.sh run on a lent GPU (repository root, `.whl` carried): installs the wheels the
# device image lacks (../shared/tools/device-wheels.sh fetched them), exports the run's environment, creates $OUT
# and writes the device, torch and commit to $OUT/device.txt. Exits the caller when the wheels do not install.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out} HF_DATASETS_OFFLINE=1
[ -d .data ] && export REPDEGEN_DATA_DIR=$PWD/.data
mkdir -p "$OUT"
{ nvidia-smi -L; python3 -c "import torch; print(torch.__version__, torch.version.cuda)"; git rev-parse HEAD; } \
  | tee "$OUT/device.txt"
# the run records of outputs/runs (result.json, cell.yaml, train.log, analysis; no weights, no BPE model) as
# $OUT/ledger.tgz: $OUT brings back at most 8 files and 64 MB a call
pack_ledger() { (cd outputs/runs && tar czf "$OUT/ledger.tgz" --exclude='*.pt' --exclude='bpe.model' */ 2>/dev/null); }
