"""The import structure ("floors"): `core` imports nothing of ours; `models`, `losses`, `data` and
`analysis` never import `reproduce`; no two modules import each other, directly or through others. Read from
the source with `ast` (every import, including the ones inside functions), not by importing."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "models", "losses", "data", "analysis", "reproduce")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """module -> the modules of ours it imports (``from pkg import mod`` counts as ``pkg.mod`` when that is a module),
    named without the ``repdegen.`` namespace they install under (``repdegen.core.errors`` is ``core.errors``)."""
    modules = {module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name.removeprefix("repdegen.") for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mod = node.module.removeprefix("repdegen.") if node.module != "repdegen" else ""
                targets = [f"{mod}.{a.name}".lstrip(".") if f"{mod}.{a.name}".lstrip(".") in modules else mod
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def test_core_imports_nothing_of_ours_and_nothing_imports_reproduce():
    graph = import_graph()
    assert {m for m in graph if m.startswith("core")} >= {"core", "core.errors", "core.registry", "core.files"}
    wrong = sorted(f"{m} imports {d}" for m, deps in graph.items() for d in deps
                   if (m.split(".")[0] == "core" and d.split(".")[0] != "core")
                   or (m.split(".")[0] != "reproduce" and d.split(".")[0] == "reproduce"))
    assert not wrong, wrong


def test_no_import_cycles():
    graph = import_graph()
    # a package's __init__ importing its own modules (a registry filling itself) is not a cycle between floors
    edges = {m: {d for d in deps if not (m in PACKAGES and d.startswith(m + "."))} for m, deps in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_the_graph_reader_sees_a_cycle_and_a_wrong_floor(tmp_path):
    # the checks above would pass on an empty graph: show on a made-up tree that the reader finds imports
    for pkg, body in {"core": "from repdegen.reproduce import x\n", "models": "from repdegen.models.b import f\n",
                      "reproduce": "", "losses": "", "data": "", "analysis": ""}.items():
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text(body)
    (tmp_path / "reproduce" / "x.py").write_text("")
    (tmp_path / "models" / "a.py").write_text("def g():\n    from repdegen.models.b import f\n")
    (tmp_path / "models" / "b.py").write_text("from repdegen.models import a\n")
    graph = import_graph(tmp_path)
    assert graph["core"] == {"reproduce.x"} and graph["models.a"] == {"models.b"} and graph["models.b"] == {"models.a"}


def test_no_product_module_is_over_500_lines():
    """A module that grows past 500 lines holds more than one role: split it by role (as runs/cells, runs/tables and
    results/table_render are one table pipeline)."""
    long = {str(p.relative_to(REPO)): n for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long
