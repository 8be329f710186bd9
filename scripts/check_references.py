"""Stale references: repository paths that the Markdown files of the repository name but that no longer exist.

    python scripts/check_references.py          # results/**/*.md, README.md, docs/*.md; exit 1 and one line each
    python scripts/check_references.py FILE.md  # only these files

    stale_references([Path("results/NOTES.md"), Path("README.md")], Path("."))
    # ['results/NOTES.md:12: names conf/scale_patch/, which does not exist; fix: edit results/NOTES.md']

Three kinds of reference are checked, outside fenced code blocks:

* inline-code spans that look like a concrete repository path: the span starts with one of the repository's
  top-level directories or files (listed from ``repo_root`` at run time; hidden and git-ignored ones such as
  ``outputs/`` are not checked) and holds no spaces, templates or expressions (``<t>``, ``{a,b}``, ``...``, ``=``,
  ``$VAR``); a ``:LINE``, ``:function``, ``::test`` suffix or ``#fragment`` is dropped;
* the same paths written in plain text (a word that starts with a top-level directory and a slash, such as
  ``see conf/model/vd_lstm_small.yaml.``; trailing punctuation is dropped);
* Markdown links and reference definitions ``[text](target)``, ``[id]: target``, resolved relative to the file
  that holds them (relative to ``repo_root`` when they start with ``/``); URLs (``http:``, ``mailto:``, ...) and
  pure ``#anchors`` are skipped, a ``#fragment`` or ``?query`` is dropped.

A path may name a directory, with or without a trailing slash; ``conf/<group>/<name>`` with no extension may name
``conf/<group>/<name>.yaml``. A path whose only template is ``*`` / ``**`` is a glob: stale when nothing matches it.
Example names in how-tos (a component starting ``my_`` or ``my-``: ``losses/my_obj.py``) are placeholders, not paths.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote

# a run of backticks, its content, and the same run again (CommonMark inline code)
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_LINK_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# what makes an inline-code span a template, a glob, a command or an expression rather than one concrete path
_NOT_A_PATH = (" ", "\t", "=", "<", ">", "?", "[", "]", "{", "}", "...", "$", "|", "~", "(", ")", ",", ";", "'", '"', "\\")
_PLACEHOLDER = re.compile(r"(^|/)my[_-]")
# run output, never committed: not checked even if .gitignore is missing
_ALWAYS_IGNORED = ("outputs", "multirun", "wandb", "__pycache__", "*.egg-info")


def _ignored_names(repo_root: Path) -> list[str]:
    """Top-level name patterns that .gitignore leaves out (simple patterns only), plus the known run outputs."""
    patterns = list(_ALWAYS_IGNORED)
    gitignore = repo_root / ".gitignore"
    if gitignore.is_file():
        for line in gitignore.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            line = line.lstrip("/").rstrip("/")
            if line and "/" not in line:
                patterns.append(line)
    return patterns


def top_level_names(repo_root: Path) -> set[str]:
    """The repository's top-level directories and files a path may start with: not hidden, not git-ignored."""
    ignored = _ignored_names(repo_root)
    return {p.name for p in Path(repo_root).iterdir()
            if not p.name.startswith(".") and not any(fnmatch.fnmatch(p.name, pat) for pat in ignored)}


def code_span_path(span: str, top_level: set[str]) -> str | None:
    """The repository path an inline-code span names, or None if it does not name one concrete path."""
    span = span.strip()
    if not span or any(bad in span for bad in _NOT_A_PATH):
        return None
    path = span.split("::", 1)[0].split(":", 1)[0].split("#", 1)[0]  # `f.py:12`, `f.py:func`, `f.py::test`
    first = path.split("/", 1)[0]
    if first not in top_level or path.startswith("/") or "//" in path or _PLACEHOLDER.search(path):
        return None
    return path


def _bare_paths(prose: str, top_level: set[str]) -> list[tuple[int, str]]:
    """(column, path) of each repository path written in plain text: a word starting with a top-level name and '/'."""
    if not top_level:
        return []
    names = "|".join(re.escape(name) for name in sorted(top_level, key=len, reverse=True))
    found = []
    for match in re.finditer(rf"(?<![\w./:@~$-])((?:{names})/[^\s`()\[\]<>\"']*)", prose):
        word = match.group(1).rstrip(".,;:!?")
        path = code_span_path(word, top_level)
        if path is not None:
            found.append((match.start(1), path))
    return found


def _exists(path: Path, repo_root: Path) -> bool:
    if "*" in str(path):  # a glob: something must match it
        try:
            rel = Path(path).resolve().relative_to(Path(repo_root).resolve())
        except ValueError:
            return False
        return any(Path(repo_root).resolve().glob(str(rel).rstrip("/")))
    if path.exists():
        return True
    # conf/<group>/<name> may mean conf/<group>/<name>.yaml
    try:
        rel = path.resolve().relative_to(Path(repo_root).resolve())
    except ValueError:
        return False
    return rel.parts[:1] == ("conf",) and not path.suffix and path.with_name(path.name + ".yaml").is_file()


def _link_target(target: str) -> str | None:
    """A link's file part, or None for URLs, pure anchors and empty targets."""
    if not target or target.startswith("#") or _SCHEME.match(target):
        return None
    return unquote(target.split("#", 1)[0].split("?", 1)[0]) or None


def _display(path: Path, repo_root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(repo_root).resolve()))
    except ValueError:
        return str(path)


def fix_hint(file: str) -> str:
    """How to fix a stale reference in this file: edit the source of its text, then re-render if it is rendered."""
    parts = Path(file).parts
    tables = [i for i, part in enumerate(parts) if part == "tables" and len(parts) >= i + 4]
    if "history" in parts:
        return "fix: an archived rendering; edit the stale path in this file"
    if tables:
        table, scale = parts[tables[-1] + 1], parts[tables[-1] + 2]
        return (f"fix: edit the text's source (conf/table/{table}.yaml, or the preset whose notes it shows), then "
                f"re-render (repdegen table table={table} scale={scale} render_only=true) or make the "
                "same edit in this committed rendering")
    generated = parts[-2:] in (("results", "README.md"), ("results", "smoke.md"), ("results", "more.md")) or (
        len(parts) >= 4 and parts[-4:-2] == ("results", "tables") and parts[-1] == "README.md")
    if generated:
        return (f"fix: {file} is generated by repdegen report; edit the file the text comes from (a "
                "table's rendering or config, its NOTES.md, a figure's notes, results/NOTES.md, ...), then run it")
    return f"fix: edit {file}"


def stale_references(paths: Iterable[Path], repo_root: Path) -> list[str]:
    """One message per repository path that a Markdown file in ``paths`` names but that does not exist.

    Each message reads ``<file>:<line>: names <path>, which does not exist; fix: ...`` with ``<file>`` relative
    to ``repo_root`` where it lies inside it. [] = no stale references."""
    repo_root = Path(repo_root)
    top_level = top_level_names(repo_root)
    ignored = _ignored_names(repo_root)
    problems = []
    for md in paths:
        md = Path(md)
        rel_file = _display(md, repo_root)
        hint = fix_hint(rel_file)
        fence = None
        for lineno, line in enumerate(md.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            opened = _FENCE.match(line)
            if fence is not None:  # inside a fenced code block: only its closing fence matters
                if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence) \
                        and not line.strip()[len(opened.group(1)):].strip():
                    fence = None
                continue
            if opened:
                fence = opened.group(1)
                continue
            named: list[tuple[int, str]] = []  # (column, path as written)
            for match in _CODE_SPAN.finditer(line):
                path = code_span_path(match.group(2), top_level)
                if path is not None and not _exists(repo_root / path, repo_root):
                    named.append((match.start(), path))
            prose = _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)  # links inside code are literal text
            targets = [(m.start(), m.group(1)) for m in _LINK.finditer(prose)]
            text = _LINK.sub(lambda m: " " * len(m.group(0)), prose)
            named += [(column, path) for column, path in _bare_paths(text, top_level)
                      if not _exists(repo_root / path, repo_root)]
            definition = _LINK_DEF.match(prose)
            if definition:
                targets.append((definition.start(1), definition.group(1)))
            for column, target in targets:
                file_part = _link_target(target)
                if file_part is None:
                    continue
                resolved = repo_root / file_part.lstrip("/") if file_part.startswith("/") else md.parent / file_part
                inside = _display(resolved, repo_root)
                if any(fnmatch.fnmatch(Path(inside).parts[0], pat) for pat in ignored):
                    continue  # a link into run output (outputs/): not checked
                if not _exists(resolved, repo_root):
                    named.append((column, target.split("#", 1)[0].split("?", 1)[0]))
            problems.extend(f"{rel_file}:{lineno}: names {path}, which does not exist; {hint}" for _, path in sorted(named))
    return problems


def report_markdown_files(results_dir: Path) -> list[Path]:
    """The Markdown files checked by default: every *.md under results/, and README.md and docs/*.md of the project
    that holds results/ (its parent folder)."""
    results_dir = Path(results_dir)
    project = results_dir.resolve().parent
    files = sorted(p for p in results_dir.rglob("*.md") if p.is_file())
    files += [p for p in [project / "README.md"] if p.is_file()]
    files += sorted(p for p in (project / "docs").glob("*.md") if p.is_file())
    return files


def check_stale_references(results_dir: Path, repo_root: Path | None = None) -> list[str]:
    """The stale references in the files ``report_markdown_files(results_dir)`` lists. Paths are looked up in
    ``repo_root`` (default: results/'s parent, the repository)."""
    repo_root = Path(results_dir).resolve().parent if repo_root is None else Path(repo_root)
    return stale_references(report_markdown_files(results_dir), repo_root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="List the repository paths that Markdown files name but that do "
                                     "not exist (exit 1 if there are any).")
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: results/**/*.md, README.md, "
                        "docs/*.md)")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the repository the paths are looked up in (default: this script's)")
    args = parser.parse_args(argv)
    if not args.repo.is_dir():
        parser.error(f"--repo {args.repo}: not a folder; expected the repository whose paths the files name")
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        parser.error(f"{', '.join(missing)}: no such file; expected Markdown files (or none: the repository's)")
    files = args.files or report_markdown_files(args.repo / "results")
    problems = stale_references(files, args.repo)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(problems)} stale reference(s) in {len(files)} Markdown file(s)", file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
