"""The launcher's packages form layers: every import goes down (or stays in its layer), and no two modules
import each other, directly or around a cycle. A new upward import fails here; put the piece it needs in the
lowest layer that has what that piece needs."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
# Bottom to top. A module is in the layer of its longest listed prefix.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("smhvd.errors", "smhvd.wire"),  # exit codes; what crosses process boundaries
    ("smhvd.proc",),  # how processes run and are waited for
    ("smhvd.config",),  # what the job is
    ("smhvd.report", "smhvd.environment", "smhvd.sourcecode", "smhvd.s3_download"),  # what the user is told;
    # the script's variables and code
    ("smhvd.mpi",),  # how mpirun runs (its command, output and supervision)
    ("smhvd.roles",),  # what this host does
    (
        "smhvd.rank",
        "smhvd.link",
        "smhvd.runscript",
        "smhvd.launch",
        "smhvd.cli",
        "smhvd.__main__",
    ),  # entry points
)


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(SRC).with_suffix("").parts)
    return name.removesuffix(".__init__")


def imports(path: Path) -> set[str]:
    """The smhvd modules `path` imports (a `from package import module` counts as the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "smhvd":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (SRC / (sub.replace(".", "/") + ".py")).exists()
                found.add(sub if is_module else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "smhvd"}
    return found


def layer(module: str) -> int:
    best = max(
        (
            (i, p)
            for i, names in enumerate(LAYERS)
            for p in names
            if module == p or module.startswith(p + ".")
        ),
        key=lambda item: len(item[1]),
        default=None,
    )
    assert best is not None, f"{module}: in no layer (add it to LAYERS)"
    return best[0]


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in (SRC / "smhvd").rglob("*.py")}
    return {
        name: {t for t in imports(path) if t in modules} for name, path in modules.items() if name != "smhvd"
    }


def test_every_import_goes_down_or_stays_in_its_layer() -> None:
    upward = sorted(
        f"{source} (layer {layer(source)}) imports {target} (layer {layer(target)})"
        for source, targets in graph().items()
        for target in targets
        if layer(target) > layer(source)
    )
    assert upward == []


def test_no_module_import_cycle() -> None:
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert cycles == []
