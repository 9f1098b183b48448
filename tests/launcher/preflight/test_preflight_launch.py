"""The pre-flight when no probe says a word: what the leader sees of mpirun's launch (launch.py), the hosts it
names from that, and the stall that makes the check run once more. Through `train` on the simulated cluster:
test_preflight_cluster.py (a worker's daemon that does not start)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smhvd.config.launcher_options import PreflightOptions
from smhvd.preflight.blame import stalled
from smhvd.preflight.check import second_attempt
from smhvd.preflight.collected import Collected
from smhvd.preflight.launch import Launch, established_peers, launch_limit, ssh_addresses, tcp_peers, tie
from smhvd.preflight.runner import findings_of, run_probes, stalled_launch
from smhvd.preflight.verdict import judge
from smhvd.wire import PREFLIGHT_MARK

HOSTS = ("algo-1", "algo-2", "algo-3", "algo-4")


def row(remote: str, state: str, inode: int) -> str:
    return f"   0: 0100007F:1F90 {remote} {state} 00000000:00000000 00:00000000 00000000 0 0 {inode} 1"


def test_the_kernels_tcp_tables_are_read_as_established_peers_on_the_process_sockets() -> None:
    rows = [
        row("0200000A:D431", "01", 11),  # 10.0.0.2, established, this process's socket
        row("0300000A:D431", "01", 99),  # another process's socket
        row("0400000A:0000", "0A", 11),  # listening
        row("0000000000000000FFFF00000500000A:D431", "01", 12),  # ::ffff:10.0.0.5, IPv4 mapped into IPv6
        row("B80D0120000000000000000001000000:D431", "01", 13),  # 2001:db8::1
        "garbage",
    ]
    if sys.byteorder != "little":
        pytest.skip("the rows above are written as a little-endian kernel prints them")
    assert established_peers(rows, {11, 12, 13}) == ["10.0.0.2", "10.0.0.5", "2001:db8::1"]


def test_a_connection_of_this_process_is_seen_from_proc() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        try:
            assert "127.0.0.1" in tcp_peers(os.getpid())
        finally:
            client.close()
            accepted.close()
    assert tcp_peers(2**22 + 7) == []  # no such process: nothing, no exception


def stalled_collected(launch: Launch) -> Collected:
    collected = Collected(HOSTS)
    collected.launch = launch
    return collected


def test_a_stalled_launch_names_the_hosts_whose_daemon_never_connected_back_and_not_the_leader() -> None:
    waiting = Launch(20.0, probe_ran=False, reached=frozenset({"algo-2", "algo-4"}), ended_it=True)
    verdict = judge(findings_of(stalled_collected(waiting), 20.0, 60.0, 10.0, {}), PreflightOptions())
    assert [n.host for n in verdict.named] == ["algo-3"]
    assert verdict.named[0].reason == (
        "its Open MPI daemon (orted) did not connect back to mpirun within 20.0s, so mpirun started no "
        "probe on any host"
    )
    every = Launch(20.0, probe_ran=False, reached=frozenset(HOSTS[1:]))  # mpirun itself did not go on
    assert stalled(every, HOSTS).missing == {}  # no evidence against anyone, the leader least: a note
    assert stalled(every, HOSTS).notes == (
        "mpirun started no probe within 20.0s, though every host's daemon had connected back: the evidence "
        "names no host",
    )
    started = Launch(60.0, probe_ran=True, reached=frozenset(HOSTS[1:]))  # launched, and silent: as before
    named = judge(findings_of(stalled_collected(started), 60.0, 60.0, 10.0, {}), PreflightOptions()).named
    assert [n.host for n in named] == list(HOSTS)
    assert all(n.reason.startswith("did not answer") for n in named)


def test_the_summary_says_how_long_mpirun_took_to_its_first_probe_word() -> None:
    now = [100.0]
    collected = Collected(HOSTS, clock=lambda: now[0], started=97.5)
    assert findings_of(collected, 5.0, 60.0, 10.0, {}).first_word_seconds is None  # nobody spoke
    collected.feed(b"[1,2]<stdout>:" + PREFLIGHT_MARK.encode() + b'{"beat":true}\n')
    now[0] = 101.0
    collected.feed(b"[1,1]<stdout>:" + PREFLIGHT_MARK.encode() + b'{"beat":true}\n')
    verdict = judge(findings_of(collected, 5.0, 60.0, 10.0, {}), PreflightOptions())
    assert verdict.to_json()["first_word_seconds"] == 2.5


def test_only_a_launch_that_stalled_before_the_bound_makes_the_check_run_again() -> None:
    early = Launch(20.0, probe_ran=False, reached=frozenset({"algo-2", "algo-4"}), ended_it=True)
    assert stalled_launch(stalled_collected(early)) == (
        "mpirun started no probe within 20.0s (no daemon connection from algo-3)"
    )
    assert (
        stalled_launch(stalled_collected(Launch(60.0, probe_ran=False, reached=frozenset()))) is None
    )  # the bound
    assert (
        stalled_launch(stalled_collected(Launch(20.0, probe_ran=True, reached=frozenset(), ended_it=True)))
        is None
    )
    assert stalled_launch(Collected(HOSTS)) is None
    assert [launch_limit(bound) for bound in (6.0, 30.0, 60.0, 600.0)] == [5.0, 10.0, 20.0, 20.0]


@pytest.mark.integration
def test_the_runner_ends_a_launch_that_started_nothing_and_waits_on_one_that_did() -> None:
    """A command that never prints and starts no probe is ended at the launch limit; one whose probe runs
    (a process named like it) and stays silent is waited on to the bound, as a launched check is."""
    started = time.monotonic()
    collected, _ = run_probes(["sleep", "30"], os.environ, HOSTS[:2], 20.0, launch_limit=0.5)
    assert time.monotonic() - started < 5
    assert collected.launch is not None and not collected.launch.probe_ran and collected.launch.ended_it
    assert collected.launch.reached == frozenset()
    script = '"$0" -c "import time; time.sleep(30)" smhvd.preflight.probe; true'
    started = time.monotonic()
    collected, seconds = run_probes(
        ["sh", "-c", script, sys.executable], os.environ, HOSTS[:2], 2.0, launch_limit=0.5
    )
    assert seconds >= 2.0
    assert collected.launch is not None and collected.launch.probe_ran and not collected.launch.ended_it


# Issue 51 item 1, from an adversarial run with fake hosts: a host's daemon was tied to it when the source
# address of its connection to mpirun was one the leader resolved for its name. The addresses known for each
# host are now those of the launcher's own ssh connections to it, and what they cannot tell names nobody.
KNOWN = {"algo-2": {"10.0.0.2"}, "algo-3": {"10.0.0.3"}, "algo-4": {"10.0.0.4"}}


def test_a_daemon_connected_from_its_hosts_known_address_is_reached_and_a_missing_one_is_waited_on() -> None:
    reached, unknown = tie(["10.0.0.2", "10.0.0.4"], KNOWN, HOSTS[1:])
    assert (reached, unknown) == ({"algo-2", "algo-4"}, frozenset())
    assert Launch(20.0, False, reached, True, unknown).waiting_on(HOSTS) == ["algo-3"]


@pytest.mark.parametrize(
    ("peers", "known", "reached"),
    [
        # algo-2 has a second address (multi-ENI) and its daemon connects from it; algo-3 is the stuck one.
        # Before: algo-2 named beside algo-3 ("its Open MPI daemon (orted) did not connect back").
        (["10.0.1.2", "10.0.0.4"], KNOWN, {"algo-4"}),
        # algo-2's name is known by an IPv6 address only, its daemon connects over IPv4: the same.
        (["10.0.0.2", "10.0.0.4"], KNOWN | {"algo-2": {"fd00::2"}}, {"algo-4"}),
        # algo-2 and algo-3 behind one address (one NAT): before, algo-3 went unnamed, and with every host
        # looking connected the leader was named ("mpirun started no probe ..., though every host's daemon
        # reported").
        (["10.0.0.9", "10.0.0.4"], KNOWN | {"algo-2": {"10.0.0.9"}, "algo-3": {"10.0.0.9"}}, {"algo-4"}),
    ],
)
def test_connections_that_cannot_be_tied_to_a_host_name_nobody_and_say_so(
    peers: list[str], known: dict[str, set[str]], reached: set[str]
) -> None:
    got, unknown = tie(peers, known, HOSTS[1:])
    assert (got, unknown) == (reached, {"algo-2", "algo-3"})
    launch = Launch(20.0, probe_ran=False, reached=got, ended_it=True, unknown=unknown)
    verdict = judge(findings_of(stalled_collected(launch), 20.0, 60.0, 10.0, {}), PreflightOptions())
    assert verdict.named == ()
    assert verdict.notes == (
        "mpirun started no probe within 20.0s (which daemon connection is whose cannot be told for algo-2, "
        "algo-3): no host named",
    )
    assert stalled_launch(stalled_collected(launch)) is not None  # still a stall: the check runs again


@pytest.mark.integration
def test_a_hosts_addresses_are_those_of_the_launchers_own_ssh_connections_to_it(tmp_path: Path) -> None:
    """No name is resolved (a resolver can hold the loop, and the heartbeat, for seconds): an ssh process of
    this launcher (`ssh -F CONFIG algo-2 ...`) and its connection tie algo-2 to the address it reached."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket,time; s=socket.create_connection(('127.0.0.1',{port})); time.sleep(30)"
        ssh = tmp_path / "ssh"  # a process named ssh, as the link's is
        ssh.symlink_to(sys.executable)
        proc = subprocess.Popen([str(ssh), "-c", code, "-F", "cfg", "user@algo-2", "orted"])
        try:
            server.settimeout(10)
            accepted, _ = server.accept()
            with accepted:
                assert ssh_addresses(HOSTS[1:], [proc.pid, os.getpid()]) == {"algo-2": {"127.0.0.1"}}
        finally:
            proc.kill()
            proc.wait()


def test_the_second_attempt_has_a_budget_of_its_own() -> None:
    """Issue 51 item 2: the second attempt ran with what the first had left and no stall limit, so a second
    stall cost the whole bound (60 s; 600 s with a user's bound) and a daemon lost at 55 of 60 s left it 5 s,
    after which every host was named 'did not answer'. It now has the option's bound again, and a stall ends
    it at the launch limit."""
    assert [second_attempt(bound) for bound in (6.0, 60.0, 600.0)] == [
        (6.0, 5.0),
        (60.0, 20.0),
        (600.0, 20.0),
    ]
