"""A host whose Python prints megabytes at every start (issue 44: a `.pth` file that writes a few MB each time
an interpreter starts) is linked all the same: `train` on a real 2-host simulated cluster, the `.pth` in the
Python environment every host runs, printing only on algo-2 (a simulated host's name: nothing else on this
machine has it).
The relay starts without `site` (`python -I -S`), so it runs nothing of the .pth; the leader finds the
ready marker whatever came before it, and keeps only a bounded piece of it. Before, every attempt failed (the
relay had to print `ready` first), and the leader exited 69 after launcher_peer_timeout_seconds."""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cluster import Launch

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

CHATTER = 3_000_000  # bytes each Python start prints on the chatty host


@pytest.fixture
def chatty_pth() -> Iterator[None]:
    """The .pth in the environment's site-packages for the test's duration."""
    pth = Path(sysconfig.get_paths()["purelib"]) / "smhvd-test-chatty-python.pth"
    pth.write_text(
        f"import socket, sys; socket.gethostname() == 'algo-2' and sys.stdout.write('c' * {CHATTER} + '\\n') "
        "and sys.stdout.flush()\n"
    )
    try:
        yield
    finally:
        pth.unlink()


def test_a_host_whose_python_prints_megabytes_at_start_is_linked_and_the_job_runs(
    launch: Launch, chatty_pth: None
) -> None:
    _, processes = launch("ok", launcher_peer_timeout_seconds=120)
    codes = {host: process.wait(240) for host, process in processes.items()}
    processes["algo-1"].finish_output()
    log = processes["algo-1"].log.read_text()
    assert codes == {"algo-1": 0, "algo-2": 0}, log[-3000:]
    assert "[1,algo-2]<stdout>: rank 1 running on algo-2" in log
