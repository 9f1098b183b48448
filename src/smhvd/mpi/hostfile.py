"""The MPI hostfile: one `host slots=N` line per host, the leader first."""

from __future__ import annotations

from collections.abc import Sequence


def render_hostfile(hosts: Sequence[str], slots: int) -> str:
    return "".join(f"{host} slots={slots}\n" for host in hosts)
