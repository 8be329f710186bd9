"""core/malloc.py: with the allocator set to keep freed memory, a large buffer freed and asked for again costs no
new page faults (the kernel's own count, getrusage), where glibc's default faults it all in again; training gives
the same numbers either way; a bad REPDEGEN_MALLOC is a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent("""
    import json, resource, sys
    sys.path.insert(0, %r)
    import torch
    from repdegen.core.malloc import keep_freed_memory
    done = keep_freed_memory()
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    n = 48 * 2**20 // 4  # 48 MiB: above glibc's largest mmap threshold (32 MiB)
    for _ in range(20):  # warm up: the heap grows until a freed buffer's place is found again (~10 rounds)
        x = torch.ones(n); del x
    before = faults()
    for _ in range(5):
        x = torch.ones(n); del x
    print(json.dumps({"applied": done, "faults": faults() - before, "pages": 5 * n * 4 // 4096}))
""") % str(REPO)


def _probe(env_value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "REPDEGEN_MALLOC"}
    if env_value is not None:
        env["REPDEGEN_MALLOC"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_reuse_removes_the_page_faults_of_a_reallocated_buffer():
    reuse, system = _probe(None), _probe("system")
    assert reuse["applied"] == "reuse" and system["applied"] == "system"
    # glibc's default: each 48 MiB buffer is a fresh mmap, faulted in page by page (at least most of its pages)
    assert system["faults"] > 0.5 * system["pages"]
    # kept in the heap: the five buffers reuse the warm-up's pages
    assert reuse["faults"] < 0.25 * reuse["pages"]


def test_bad_value_is_a_clear_error(monkeypatch):
    from repdegen.core import malloc
    from repdegen.core.errors import UserError

    monkeypatch.setattr(malloc, "_applied", None)
    monkeypatch.setenv("REPDEGEN_MALLOC", "fast")
    with pytest.raises(UserError) as e:
        malloc.keep_freed_memory()
    assert "REPDEGEN_MALLOC='fast'" in str(e.value) and "reuse" in str(e.value) and "system" in str(e.value)
