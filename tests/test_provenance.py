"""repdegen.core.provenance.git_commit on a throwaway repository: the commit, the dirty flag and which tracked files
differ; and how a rendering names them (uncommitted_note)."""

from __future__ import annotations

import subprocess

import repdegen.core.provenance as provenance


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_git_commit_names_the_changed_tracked_files(tmp_path, monkeypatch, request):
    _git(tmp_path, "init", "-q")
    for name in ("code.py", "results/t.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("a\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    monkeypatch.setattr(provenance, "SOURCE_ROOT", tmp_path.resolve())
    real = provenance.git_commit
    request.addfinalizer(real.cache_clear)  # nothing of this repository stays cached for the other tests

    def fresh():  # git_commit is cached for the process's life; each call here reads the tree again
        real.cache_clear()
        return real()

    monkeypatch.setattr(provenance, "git_commit", fresh)
    clean = provenance.git_commit()
    assert len(clean["commit"]) == 40 and clean == {"commit": clean["commit"], "dirty": False}
    assert provenance.uncommitted_note(clean) == ""
    (tmp_path / "untracked.txt").write_text("u\n")  # untracked files do not count
    assert provenance.git_commit()["dirty"] is False
    (tmp_path / "results/t.md").write_text("rendered again\n")
    rendered = provenance.git_commit()
    assert rendered["dirty"] and rendered["changed"] == ["results/t.md"]
    assert provenance.uncommitted_note(rendered) == " (uncommitted changes in results/ only)"
    (tmp_path / "code.py").write_text("edited code\n")
    code = provenance.git_commit()
    assert sorted(code["changed"]) == ["code.py", "results/t.md"]
    assert provenance.uncommitted_note(code) == " (uncommitted changes)"
    # a record from before the list: dirty without it reads as a code change
    assert provenance.uncommitted_note({"commit": "c", "dirty": True}) == " (uncommitted changes)"
