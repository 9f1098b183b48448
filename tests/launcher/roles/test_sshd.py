"""A worker's sshd (roles/sshd.py) with the real sshd: `start_sshd` returns once it listens, and a port
already taken is one clear error with nothing left running. The wait is on the loop: the PidFile's creation,
sshd's exit, a deadline."""

from __future__ import annotations

import select
import socket
from pathlib import Path

import pytest

from smhvd.errors import PeerError
from smhvd.proc.created import Created
from smhvd.roles.sshd import start_sshd
from support.ci import need_root


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.integration  # starts sshd
def test_start_returns_once_sshd_listens(tmp_path: Path) -> None:
    need_root("sshd runs as root, as in SageMaker containers")
    port = free_port()
    proc = start_sshd(tmp_path, port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            assert conn.recv(4) == b"SSH-"  # listening when start_sshd returned, and it is sshd
    finally:
        proc.terminate()
        proc.wait()


@pytest.mark.integration  # starts sshd
def test_a_port_in_use_is_one_error_and_nothing_runs(tmp_path: Path) -> None:
    need_root("sshd runs as root, as in SageMaker containers")
    with socket.socket(socket.AF_INET6) as taken:  # every address, v4 and v6, as sshd would listen on
        taken.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        taken.bind(("::", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = rf"^sshd exited with code 255 at start \(port {port} in use\?\)$"
        with pytest.raises(PeerError, match=refused):
            start_sshd(tmp_path, port)
    assert not (tmp_path / "sshd.pid").exists()


def test_created_is_readable_for_a_new_entry_only(tmp_path: Path) -> None:
    (tmp_path / "before").write_text("")
    with Created(tmp_path) as created:
        assert select.select([created], [], [], 0)[0] == []
        (tmp_path / "before").write_text("again")  # written, not created
        assert select.select([created], [], [], 0)[0] == []
        (tmp_path / "new.tmp").write_text("1")
        assert select.select([created], [], [], 5)[0] == [created]
        created.drain()
        assert select.select([created], [], [], 0)[0] == []
        (tmp_path / "new.tmp").rename(tmp_path / "moved")  # moved in: as a PidFile written whole would be
        assert select.select([created], [], [], 5)[0] == [created]
