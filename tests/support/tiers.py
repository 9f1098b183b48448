"""The unit tier's rule, watched: a test that is not marked `integration` starts no process and does not load
TensorFlow (`make test-fast` is seconds). Python's audit events say when a process starts (subprocess, fork,
spawn, exec, os.system) and when a module is first imported; what a unit test (its fixtures included) or the
import of its module did is listed at the end of the run, under "unit tier rule", with the marker to add.

An import event comes only with a module's first load, so it is charged to whichever test or test module
loads it first: in a run where an integration module loaded TensorFlow, a unit module importing it later would
go unseen, and the first unit test to touch a library's lazily loaded part would be charged with that part's
own work. Hence two order-free rules besides the events: a unit test module whose module-level names lead to
TensorFlow (through the modules, classes and functions it imported, their modules' names in turn, and parent
packages) is listed whatever loaded it first; and numpy.testing, whose import runs `lscpu` once (numpy 1.26,
check_support_sve), is loaded here, before any test, as a part of the test tools. (An `import tensorflow`
inside a test's body is still seen only when it is the first.)

Listed, not failed: a test that breaks the rule still tests what it tests. Loaded by tests/conftest.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from types import ModuleType

import numpy.testing  # noqa: F401  (its import starts a process: loaded before any test, see above)
import pytest

PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system"}
)
HEAVY_MODULES = frozenset({"tensorflow", "horovod.tensorflow", "keras"})  # loading any: seconds


class _Watch:
    def __init__(self) -> None:
        self.current: str | None = None  # what the events are charged to: a test's or a module's id
        self.found: dict[str, set[str]] = {}
        self.unit_modules: set[str] = set()  # modules with at least one unit test

    def on_event(self, event: str, args: tuple[object, ...]) -> None:
        if self.current is None:
            return
        if event in PROCESS_EVENTS:
            what = "starts a process"
        elif event == "import" and args and args[0] in HEAVY_MODULES:
            what = f"loads {args[0]}"
        else:
            return
        self.found.setdefault(self.current, set()).add(what)

    def breaking(self) -> dict[str, set[str]]:
        """What broke the rule: unit tests, and modules of unit tests whose import did."""
        return {
            nodeid: what
            for nodeid, what in sorted(self.found.items())
            if "::" in nodeid or nodeid in self.unit_modules
        }


def _heavy(name: str) -> bool:
    return any(name == heavy or name.startswith(heavy + ".") for heavy in HEAVY_MODULES)


def _imported_from(module: ModuleType) -> set[str]:
    """The modules that `module`'s names come from: imported modules, the module of each class or function,
    and its parent package. A package's own submodules are left out: the import system sets each loaded one
    as the package's attribute, so sibling test modules would lead to each other."""
    names = {module.__name__.rpartition(".")[0]} - {""}
    for key, value in list(vars(module).items()):
        if isinstance(value, ModuleType):
            if value.__name__ != f"{module.__name__}.{key}":
                names.add(value.__name__)
            continue
        try:
            owner = getattr(value, "__module__", None)
        except Exception:  # (any object may be a module global; its attributes are not ours)
            continue
        if isinstance(owner, str):
            names.add(owner)
    return names


def reaching_heavy(modules: Mapping[str, ModuleType], wanted: Iterable[str]) -> set[str]:
    """The names in `wanted` whose module leads to a heavy module through what each module imported (all of
    `modules`, e.g. sys.modules, is read once: a module's users are found from the heavy ones outwards)."""
    users: dict[str, set[str]] = {}
    for name, module in list(modules.items()):
        if isinstance(module, ModuleType) and not _heavy(name):
            for used in _imported_from(module):
                users.setdefault(used, set()).add(name)
    reached = {name for name in modules if _heavy(name)}
    todo = list(reached)
    while todo:
        for user in users.get(todo.pop(), ()):
            if user not in reached:
                reached.add(user)
                todo.append(user)
    return reached & set(wanted)


WATCH = _Watch()
sys.addaudithook(WATCH.on_event)


def _unit(item: pytest.Item) -> bool:
    return item.get_closest_marker("integration") is None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """A module's import (at collection) is charged to the module."""
    WATCH.current = collector.nodeid if isinstance(collector, pytest.Module) else None
    try:
        return (yield)
    finally:
        WATCH.current = None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unit = {
        item.nodeid.split("::")[0]: module
        for item in items
        if _unit(item) and isinstance(module := getattr(item, "module", None), ModuleType)
    }
    WATCH.unit_modules |= set(unit)
    by_name = {module.__name__: nodeid for nodeid, module in unit.items()}
    for name in reaching_heavy(sys.modules, by_name):
        WATCH.found.setdefault(by_name[name], set()).add("imports what loads tensorflow")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    WATCH.current = item.nodeid if _unit(item) else None
    try:
        return (yield)
    finally:
        WATCH.current = None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    breaking = WATCH.breaking()
    if breaking:
        terminalreporter.write_sep("=", "unit tier rule: mark these @pytest.mark.integration")
        for nodeid, what in breaking.items():
            terminalreporter.write_line(f"{nodeid}: {', '.join(sorted(what))}")
