"""Carry unfinished cells, weights included, from one GPU lease to the next (issue 25).

A lease is 15 device-minutes and nothing stays on the device after it. A call brings back at most 8 files of at most
16 MiB each, 64 MiB together, and carries at most 64 MiB with the working tree (~30 MB tracked here, so ~30 MB of
carried paths beside `.whl` and `.data/ptb`). A medium Inan 2017 cell's run directory (checkpoint, best weights,
initial embedding) is 130-190 MB, so it travels in parts of 15 MB: four back a call, two carried a call (a warm call
costs ~10 s of the lease):

    # on the device, at the end of a lease (the same warm machine as the run):
    python3 scripts/lease_carry.py pack outputs/runs/<hash> [...] --dir outputs/carry          # once
    python3 scripts/lease_carry.py emit outputs/carry "$OUT" 1 2 3 4   # call 1 (then 5 6 7 8, ...): parts + manifest
    # here: each call's files land in /work/.device/<n>/; gather them (and check them):
    python scripts/lease_carry.py gather /work/.device/<n> [/work/.device/<m> ...] --dir .carry/<name>
    # next lease: carry .carry/<name>/manifest.json and two parts a call, then, in the call that trains:
    python3 scripts/lease_carry.py unpack .carry/<name> --runs outputs/runs && <the run command>
    # the carry list of every call, worked out here before the lease (one JSON list a line, the first call's first):
    python scripts/lease_carry.py plan .carry/<name> [.carry/<other>] --first .whl .data

Parts are a plain tar stream (weights do not compress) cut into pieces of ``--part-mb`` MB, each with its SHA-256 in
``manifest.json``; ``unpack`` checks every part and refuses to replace a run directory that already holds
a checkpoint (nothing is overwritten: move it away first). Lock files are left out.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repdegen.reproduce.errors import UserError, exit_on_user_error  # noqa: E402

MANIFEST = "manifest.json"
SKIP = {".lock"}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(run_dirs: list[Path], out: Path, part_mb: float) -> dict:
    """The run directories as one tar stream in parts of ``part_mb`` MB under ``out`` with their manifest."""
    if part_mb <= 0:
        raise UserError(f"--part-mb {part_mb}: expected a positive size in MB, e.g. --part-mb 60")
    for d in run_dirs:
        if not (d / "result.json").is_file():
            raise UserError(f"{d} is not a cell's run directory (no result.json); expected outputs/runs/<hash>")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} is not empty; pack into a new directory (nothing is overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in run_dirs:
            for f in sorted(p for p in d.iterdir() if p.is_file() and p.name not in SKIP):
                tar.add(f, arcname=f"{d.name}/{f.name}")
    data = buf.getvalue()
    size = int(part_mb * 1_000_000)
    parts = []
    for k, start in enumerate(range(0, len(data), size), 1):
        piece = data[start:start + size]
        name = f"part{k:02d}"
        (out / name).write_bytes(piece)
        parts.append({"name": name, "bytes": len(piece), "sha256": _sha256(piece)})
    manifest = {"cells": [d.name for d in run_dirs], "bytes": len(data), "sha256": _sha256(data), "parts": parts}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def unfinished(runs: Path) -> list[Path]:
    """The run directories under ``runs`` whose record is not complete (what a next lease would continue)."""
    out = []
    for rec in sorted(runs.glob("*/result.json")):
        try:
            status = json.loads(rec.read_text()).get("status")
        except (OSError, ValueError):
            status = "unreadable"
        if status != "complete":
            out.append(rec.parent)
    return out


def _manifest(d: Path) -> dict:
    path = d / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        if not isinstance(manifest.get("parts"), list):
            raise ValueError("no 'parts' list")
        return manifest
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: not a carry manifest ({err}); expected the {MANIFEST} that `pack` wrote") from None


def emit(d: Path, ks: list[int], out: Path) -> list[Path]:
    """Parts ``ks`` (from 1) and the manifest into ``out`` (the device's $OUT)."""
    manifest = _manifest(d)
    n = len(manifest["parts"])
    bad = [k for k in ks if not 1 <= k <= n]
    if bad or not ks:
        raise UserError(f"part {bad[0] if bad else '(none)'}: expected 1..{n} ({d} holds {n} part(s))")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(d / MANIFEST, out / MANIFEST)
    written = []
    for k in ks:
        name = manifest["parts"][k - 1]["name"]
        shutil.copyfile(d / name, out / name)
        written.append(out / name)
    return written


def gather(sources: list[Path], dest: Path) -> dict:
    """The parts found in ``sources`` (the calls' fetched folders) into ``dest``, each checked; says what is missing."""
    manifests = [_manifest(s) for s in sources if (s / MANIFEST).is_file()]
    if not manifests:
        raise UserError(f"none of {', '.join(map(str, sources))} holds a {MANIFEST}; expected the folders the emit "
                        "calls came back in")
    manifest = manifests[0]
    if any(m != manifest for m in manifests[1:]):
        raise UserError("the folders hold manifests of different packs; gather one pack at a time")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    for part in manifest["parts"]:
        for s in sources:
            f = s / part["name"]
            if f.is_file() and _sha256(f.read_bytes()) == part["sha256"]:
                shutil.copyfile(f, dest / part["name"])
                break
    missing = [p["name"] for p in manifest["parts"] if not (dest / p["name"]).is_file()]
    return {"dest": str(dest), "parts": len(manifest["parts"]), "missing": missing}


CARRY_LIMIT = 64 * 2**20  # what a call carries, the tracked tree included


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    raise UserError(f"{path}: no such file or folder to carry; expected a path in this work tree (e.g. .whl, .data)")


def tracked_bytes(repo: Path = REPO) -> int:
    """The tracked tree's size: every call carries it beside the carry list."""
    import subprocess

    names = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout.split(b"\0")
    return sum(_size(repo / n.decode()) for n in names if n and (repo / n.decode()).is_file())


def plan(packs: list[Path], first: list[Path], room: int) -> list[list[str]]:
    """The carry list of each call that brings ``packs`` in: ``first`` and every manifest in the first call, then
    the parts in order, as many a call as fit in ``room`` bytes (what a call carries beside the tracked tree)."""
    calls: list[list[str]] = [[str(p) for p in first] + [str(d / MANIFEST) for d in packs]]
    used = sum(_size(p) for p in first) + sum(_size(d / MANIFEST) for d in packs)
    if used > room:
        raise UserError(f"the first call's paths take {used / 1e6:.1f} MB, more than the {room / 1e6:.1f} MB a call "
                        "carries beside the tracked tree; carry fewer paths first (--first)")
    for d in packs:
        for part in _manifest(d)["parts"]:
            f = d / part["name"]
            if not f.is_file():
                raise UserError(f"{f} is missing: gather the whole pack before planning its carry")
            size = _size(f)
            if size > room:
                raise UserError(f"{f} is {size / 1e6:.1f} MB, more than the {room / 1e6:.1f} MB a call carries; "
                                "pack with a smaller --part-mb")
            if used + size > room:
                calls.append([])
                used = 0
            calls[-1].append(str(f))
            used += size
    return calls


def unpack(d: Path, runs: Path) -> list[str]:
    """Every part checked, joined and extracted into ``runs``; refuses a run directory that already has weights."""
    manifest = _manifest(d)
    chunks = []
    for part in manifest["parts"]:
        f = d / part["name"]
        if not f.is_file():
            raise UserError(f"{f} is missing: carry every part of the pack ({len(manifest['parts'])}) before unpack")
        data = f.read_bytes()
        if _sha256(data) != part["sha256"]:
            raise UserError(f"{f} does not match its SHA-256 in {d / MANIFEST}: fetch that part again")
        chunks.append(data)
    data = b"".join(chunks)
    if _sha256(data) != manifest["sha256"]:
        raise UserError(f"the joined parts of {d} do not match the pack's SHA-256: fetch the pack again")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        members = tar.getmembers()
        for m in members:
            p = Path(m.name)
            if p.is_absolute() or ".." in p.parts or len(p.parts) != 2 or not m.isfile():
                raise UserError(f"{d}: unexpected entry {m.name!r} in the pack; expected <hash>/<file>")
        for cell in sorted({Path(m.name).parts[0] for m in members}):
            target = runs / cell
            if (target / "checkpoint.pt").exists() or (target / "result.json").exists():
                raise UserError(f"{target} already holds a run (checkpoint or record); move it away to unpack the "
                                "carried one (nothing is overwritten)")
        runs.mkdir(parents=True, exist_ok=True)
        try:
            tar.extractall(runs, filter="data")
        except TypeError:  # a Python before 3.11.4 (a device image): the entries were checked above
            tar.extractall(runs)
    return list(manifest["cells"])


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="run directories -> parts + manifest")
    p.add_argument("run_dirs", nargs="*", type=Path)
    p.add_argument("--unfinished", type=Path, metavar="RUNS", help="every run directory under RUNS not yet complete")
    p.add_argument("--dir", type=Path, required=True, help="a new, empty folder for the parts")
    p.add_argument("--part-mb", type=float, default=15.0, help="MB a part (a file back from $OUT: at most 16 MiB)")
    e = sub.add_parser("emit", help="parts k ... + manifest -> $OUT")
    e.add_argument("dir", type=Path)
    e.add_argument("out", type=Path)
    e.add_argument("k", type=int, nargs="*", help="the parts to emit (from 1)")
    e.add_argument("--first", type=int, metavar="N", help="parts 1..N, or as many as there are")
    g = sub.add_parser("gather", help="the fetched calls' folders -> one checked pack")
    g.add_argument("sources", nargs="+", type=Path)
    g.add_argument("--dir", type=Path, required=True)
    u = sub.add_parser("unpack", help="a carried pack -> outputs/runs")
    u.add_argument("dir", type=Path)
    u.add_argument("--runs", type=Path, default=Path("outputs/runs"))
    pl = sub.add_parser("plan", help="the carry list of each call that brings packs in (one JSON list a line)")
    pl.add_argument("packs", nargs="+", type=Path)
    pl.add_argument("--first", nargs="*", type=Path, default=[], help="paths the first call carries too (.whl .data)")
    pl.add_argument("--room-mb", type=float, help="MB a call carries beside the tracked tree (default: 64 MiB less "
                    "the tracked tree, less 1 MB)")
    args = parser.parse_args(argv)
    if args.cmd == "pack":
        dirs = list(args.run_dirs) + (unfinished(args.unfinished) if args.unfinished else [])
        if not dirs:
            print(f"lease_carry: nothing to pack (no run directory given{', none unfinished' if args.unfinished else ''})")
            return 0
        m = pack(dirs, args.dir, args.part_mb)
        print(f"lease_carry: {len(m['cells'])} cell(s), {m['bytes'] / 1e6:.1f} MB in {len(m['parts'])} part(s) "
              f"under {args.dir}; emit up to four a call")
    elif args.cmd == "emit":
        ks = list(args.k) + (list(range(1, min(args.first, len(_manifest(args.dir)["parts"])) + 1)) if args.first else [])
        print(f"lease_carry: wrote {', '.join(map(str, emit(args.dir, ks, args.out)))}")
    elif args.cmd == "gather":
        r = gather(args.sources, args.dir)
        left = f"; still missing: {', '.join(r['missing'])}" if r["missing"] else "; complete"
        print(f"lease_carry: {r['parts'] - len(r['missing'])}/{r['parts']} part(s) in {r['dest']}{left}")
        return 1 if r["missing"] else 0
    elif args.cmd == "plan":
        if args.room_mb is not None and not args.room_mb > 0:
            raise UserError(f"--room-mb {args.room_mb}: expected a positive size in MB, e.g. --room-mb 30")
        room = int(args.room_mb * 1e6) if args.room_mb is not None else CARRY_LIMIT - tracked_bytes() - 1_000_000
        calls = plan(args.packs, args.first, room)
        for c in calls:
            print(json.dumps(c))
        print(f"lease_carry: {len(calls)} call(s) at {room / 1e6:.1f} MB a call; the pack(s) are in after the last",
              file=sys.stderr)
    else:
        cells = unpack(args.dir, args.runs)
        print(f"lease_carry: unpacked {', '.join(cells)} into {args.runs}; the run command continues them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
