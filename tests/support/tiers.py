"""The unit tier's rule, watched: a test that is not marked `integration` starts no process and does not load
TensorFlow (`make test-fast` is seconds). Python's audit events say when a process starts (subprocess, fork,
spawn, exec, os.system) and when a module is first imported; what a unit test (its fixtures included) or the
import of its module did is listed at the end of the run, under "unit tier rule", with the marker to add.

Listed, not failed: a test that breaks the rule still tests what it tests. Loaded by tests/conftest.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

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
    WATCH.unit_modules |= {item.nodeid.split("::")[0] for item in items if _unit(item)}


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
