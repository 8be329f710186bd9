#!/usr/bin/env bash
# Issue 25 item 3 in ONE call of a fresh lease (docs/compute.md, "GPU leases"): the medium probe
# (scripts/device_medium_probe.sh), then a medium Inan 2017 row at paper for the call's remaining time, carried out.
# $OUT brings back at most 8 files, so the probe's files and the run's logs come back as one meta.tgz, beside
# ledger.tgz, the carry manifest and parts 1-4 (7 files). The next warm call emits parts 5-8, and so on:
#   python3 scripts/lease_carry.py emit outputs/carry "$OUT" 5 6 7 8
# Usage (repository root, carrying .whl and .data):  bash scripts/device_lease_medium.sh SECONDS ["ROW"]
#   SECONDS: this call's whole time (the probe's, the row's, the packing's); ROW: a row label of inan2017_t1.
set -uo pipefail
total=${1:-550}; row=${2:-Medium (650 units) / VD-LSTM+RE}
t0=$(date +%s); final=${OUT:-/tmp/out}
mkdir -p /tmp/probe /tmp/lite
OUT=/tmp/probe bash scripts/device_medium_probe.sh > /tmp/probe/probe.log 2>&1
echo "probe: rc=$? after $(( $(date +%s) - t0 )) s"; grep -h "tok/s" /tmp/probe/probe.log
left=$(( total - ($(date +%s) - t0) - 45 ))
echo "row '$row': $left s"
OUT=/tmp/lite CARRY_OUT=1 SCALE=paper ROWS="[\"$row\"]" bash scripts/device_lite.sh "$left" 1 inan2017_t1 \
  > /tmp/lite/lite.log 2>&1
echo "lite: rc=$?"; tail -25 /tmp/lite/lite.log
mv /tmp/lite/ledger.tgz "$final/" 2>/dev/null
for f in /tmp/lite/manifest.json /tmp/lite/part*; do [ -f "$f" ] && mv "$f" "$final/"; done
tar czf "$final/meta.tgz" -C /tmp probe lite
ls -la "$final"; echo "call: $(( $(date +%s) - t0 )) s"
