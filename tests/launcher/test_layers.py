"""The launcher's packages form layers: every import goes down (or stays in its layer), and no two modules
import each other, directly or around a cycle. A new upward import fails here; put the piece it needs in the
lowest layer that has what that piece needs.

Every form of import counts: `import smhvd.x`, `from smhvd.x import y`, relative ones (`from .x import y`,
`from .. import x`), and `importlib.import_module("smhvd.x")` / `__import__("smhvd.x")`; an import by a name
computed at run time cannot be checked and fails the test itself."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
# Bottom to top. A module is in the layer of its longest listed prefix.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("smhvd.errors", "smhvd.wire", "smhvd.option_spec", "smhvd.env_options"),  # exit codes; what crosses
    # process boundaries; how an option is declared and read, and the launcher's environment variables
    ("smhvd.proc",),  # how processes run and are waited for: the generic kernel, no policy
    ("smhvd.hostenv", "smhvd.link", "smhvd.inflight"),  # the two cross-host protocols, each in one home: a
    # host's environment for its ranks (server, client, trust) and the leader-worker link (connect, relay,
    # listen); and in-flight (a rank's steps, its wrapper's samples, the leader's verdict). They reach
    # nothing above proc/, env_options and wire, so the rank and the relay load neither roles nor config
    ("smhvd.config",),  # what the job is
    ("smhvd.report", "smhvd.environment", "smhvd.sourcecode", "smhvd.s3_download"),  # what the user is told;
    # the script's variables and code
    ("smhvd.mpi",),  # how mpirun runs (its command, the ranks' lines, its output and supervision)
    ("smhvd.preflight",),  # every host measured before the job (its probe runs under the job's mpirun)
    ("smhvd.roles",),  # what this host does: leader, worker, sshd
    (
        "smhvd.rank",
        "smhvd.runscript",
        "smhvd.launch",
        "smhvd.cli",
        "smhvd.__main__",
    ),  # entry points
)
DYNAMIC = "<a name computed at run time>"


@dataclass(frozen=True)
class Import:
    target: str  # the dotted name imported (a module, or a package and the name taken from it)
    line: int


def module_name(path: Path, src: Path = SRC) -> str:
    name = ".".join(path.relative_to(src).with_suffix("").parts)
    return name.removesuffix(".__init__")


def is_module(dotted: str, src: Path = SRC) -> bool:
    where = src / dotted.replace(".", "/")
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def resolve(name: str, level: int, package: str) -> str:
    """The absolute name of `from <level dots><name> import ...` written in `package`."""
    if level == 0:
        return name
    parts = package.split(".")
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _dynamic_target(call: ast.Call, package: str) -> str | None:
    """importlib.import_module(NAME[, PACKAGE]) or __import__(NAME): the name, DYNAMIC if not a literal,
    None for any other call."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if called not in ("import_module", "__import__") or not call.args:
        return None
    name = call.args[0]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return DYNAMIC
    text = name.value
    level = len(text) - len(text.lstrip("."))
    return resolve(text[level:], level, package) if called == "import_module" else text


def imports_in(source: str, module: str, *, is_package: bool, src: Path = SRC) -> list[Import]:
    """The smhvd modules a module's source imports (a `from package import module` counts as the module)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = resolve(node.module or "", node.level, package)
            if base.split(".")[0] != "smhvd":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(sub if is_module(sub, src) else base, node.lineno))
        elif isinstance(node, ast.Import):
            found += [Import(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "smhvd"]
        elif isinstance(node, ast.Call) and (target := _dynamic_target(node, package)) is not None:
            if target == DYNAMIC or target.split(".")[0] == "smhvd":
                found.append(Import(target, node.lineno))
    return found


def imports(path: Path, src: Path = SRC) -> list[Import]:
    module = module_name(path, src)
    return imports_in(path.read_text(), module, is_package=path.name == "__init__.py", src=src)


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


def modules(src: Path = SRC) -> dict[str, Path]:
    return {module_name(p, src): p for p in (src / "smhvd").rglob("*.py")}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: {i.target for i in imports(path) if i.target in known}
        for name, path in known.items()
        if name != "smhvd"
    }


def upward_imports(src: Path = SRC) -> list[str]:
    """One line per import that goes up a layer (or cannot be checked): where it is, and both layers."""
    known = modules(src)
    found = []
    for name, path in sorted(known.items()):
        for i in imports(path, src):
            where = f"{path.relative_to(src)}:{i.line}"
            if i.target == DYNAMIC:
                found.append(f"{where}: {name} imports {DYNAMIC} (the layer test cannot check it)")
            elif name != "smhvd" and i.target in known and layer(i.target) > layer(name):
                found.append(
                    f"{where}: {name} (layer {layer(name)}) imports {i.target} (layer {layer(i.target)})"
                )
    return found


def test_every_import_goes_down_or_stays_in_its_layer() -> None:
    upward = upward_imports()
    assert not upward, "imports that go up a layer (move what they need down):\n" + "\n".join(upward)


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("from .launch import launch", "smhvd.cli", ["smhvd.launch"]),
        ("from . import launch", "smhvd.cli", ["smhvd.launch"]),
        ("from ..mpi import command", "smhvd.config.job", ["smhvd.mpi.command"]),
        ("from ..roles.leader import run_leader", "smhvd.config.job", ["smhvd.roles.leader"]),
        ("from .job import Job", "smhvd.config", ["smhvd.config.job"]),  # in the package's __init__
        (
            "import importlib\nimportlib.import_module('smhvd.mpi.command')",
            "smhvd.config.job",
            ["smhvd.mpi.command"],
        ),
        (
            "from importlib import import_module\nimport_module('..mpi', 'smhvd.config')",
            "smhvd.config.job",
            ["smhvd.mpi"],
        ),
        ("__import__('smhvd.roles.leader')", "smhvd.config.job", ["smhvd.roles.leader"]),
        ("import importlib\nimportlib.import_module(NAME)", "smhvd.config.job", [DYNAMIC]),
        ("import json, importlib\nimportlib.import_module('json')", "smhvd.config.job", []),
    ],
)
def test_every_form_of_import_is_seen(source: str, module: str, expected: list[str]) -> None:
    found = imports_in(source, module, is_package=module == "smhvd.config")
    assert [i.target for i in found] == expected


def test_the_message_names_the_upward_import(tmp_path: Path) -> None:
    """A copy of the tree with one relative upward import: the failure names its file, line and layers."""
    shutil.copytree(SRC / "smhvd", tmp_path / "smhvd", ignore=shutil.ignore_patterns("__pycache__"))
    job = tmp_path / "smhvd" / "config" / "job.py"
    job.write_text(job.read_text() + "\nfrom ..mpi import command  # upward\n")
    line = len(job.read_text().splitlines())
    before = upward_imports()  # (empty, unless the test above fails too)
    assert [found for found in upward_imports(tmp_path) if found not in before] == [
        f"smhvd/config/job.py:{line}: smhvd.config.job (layer 3) imports smhvd.mpi.command (layer 5)"
    ]


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
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.integration  # starts a process
def test_the_rank_wrapper_loads_neither_the_roles_nor_the_jobs_configuration() -> None:
    """Every rank imports smhvd.rank: what it loads is paid once per rank (issue 37: 26 smhvd modules, 14 of
    them roles/ and config/, when the rank took its host's environment from hostenv/server.py)."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import smhvd.rank, sys; print(*sorted(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [m for m in loaded if m.startswith(("smhvd.roles", "smhvd.config"))] == []


def test_the_test_folders_mirror_the_launchers_folders() -> None:
    """tests/launcher/<folder>/ holds the tests of src/smhvd/<folder>/: a folder of tests is a package's."""
    tests = Path(__file__).resolve().parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    packages = {p.parent.name for p in (SRC / "smhvd").glob("*/__init__.py")}
    assert folders <= packages, sorted(folders - packages)
    assert folders, "no folder of tests"
