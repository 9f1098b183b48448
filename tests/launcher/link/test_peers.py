"""The leader reaching its workers (link/connect.py), with real processes standing in for the ssh sessions
(`command`) and the real TCP check of each worker's sshd port (a listening socket per worker): every worker is
reached at once, none is tried before its port answers, one that never comes up is named, a stop signal ends
the wait, a worker whose link closes before the start ends it, the leader's end before the start reaches
every worker, READY is found in any amount of chatter, and closing hangs up on every worker before waiting for
any."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from smhvd.errors import EX_STOPPED, EX_UNAVAILABLE, PeerError, Stopped, exit_for
from smhvd.link import END, LINKED, READY, Event
from smhvd.link import connect as peers
from smhvd.link.connect import SAID_KEPT, Address, Linking, Resolve, Said, addresses
from smhvd.proc.signals import SignalWatch
from smhvd.roles.sshd import render_ssh_config
from support.ci import unavailable

pytestmark = pytest.mark.integration

HOSTS = ["algo-2", "algo-3", "algo-4", "algo-5"]
# A stand-in for `ssh HOST <the relay>`: records its start, says READY (and records that), holds
# the session until its input ends, records what it was told ("told-HOST") and the end, and exits.
# argv: MARKS HOST TOGETHER SESSIONS FAILING. TOGETHER names the marks ("start", "eof") at which it waits
# until all SESSIONS made the same one: it says ready only once every session started, and exits only once
# every session saw its input end. A leader that waited for one worker before starting (or hanging up on) the
# next would wait forever: the leader's own deadline ends the test, and the relay's (60 s) the relay, with
# exit 3. Behaviour, not timing: a loaded machine is only slower. FAILING is HOST:N: the first N tries on HOST
# fail as the real relay does when no launcher waits on its host yet (a line on stderr, a non-zero exit).
# CLOSING names a host whose session ends right after READY (its `train` ended). Before READY each says a
# few kB, as a chatty rc file on the worker would.
RELAY = """
import sys, time
from pathlib import Path
marks, host, together = Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
sessions = int(sys.argv[4])
failing_host, failing = sys.argv[5].split(":")
closing = sys.argv[6]

def mark(kind):
    (marks / f"{kind}-{host}").write_text(repr(time.time()))
    if kind in together:
        deadline = time.monotonic() + 60
        while len(list(marks.glob(f"{kind}-*"))) < sessions:
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.01)

with (marks / f"tries-{host}").open("a") as tries:
    tries.write("x")
if host == failing_host and len((marks / f"tries-{host}").read_text()) <= int(failing):
    sys.exit("smhvd.link: no launcher is waiting on this host")
mark("start")
sys.stdout.buffer.write(b"a chatty rc file says hello\\n" * 1000 + READY); sys.stdout.flush()
mark("ready")
if host == closing:
    sys.exit(0)
(marks / f"told-{host}").write_text(sys.stdin.read())
mark("eof")
"""


def relay(
    marks: Path, together: str = "", failing: str = ":0", closing: str = ""
) -> Callable[[str], list[str]]:
    """`failing`: HOST:N, the first N tries on HOST fail; `closing`: a host whose session ends after READY."""
    code = f"READY = {READY!r}\n{RELAY}"

    def command(host: str) -> list[str]:
        return [sys.executable, "-c", code, str(marks), host, together, str(len(HOSTS)), failing, closing]

    return command


# Each worker's sshd port is a real listening socket on a loopback address of its own, probed by the real
# non-blocking connect at that address (the names algo-N do not resolve here: `resolve` gives the address).
# The sessions are stand-ins for ssh (RELAY): the real ssh path runs in the cluster tier
# (test_launcher_faults.py).
ADDRESSES = {host: f"127.0.0.{index}" for index, host in enumerate(HOSTS, start=2)}


def told(marks: Path, host: str) -> list[Event | None]:
    """The events the relay of `host` was sent before its session ended."""
    return [Event.decode(line) for line in (marks / f"told-{host}").read_bytes().splitlines()]


def connect_all(
    hosts: list[str],
    ssh_config: Path,
    port: int,
    timeout: float,
    signals: SignalWatch | None = None,
    clock: Callable[[], float] = time.monotonic,
    command: Callable[[str], list[str]] | None = None,
    resolve: Resolve = addresses,
) -> Linking:
    """What the leader does (roles/leader.py): every worker linked, or, when that fails, every worker reached
    told why (errors.exit_for) and the exception. The caller closes what it returns."""
    linking = Linking(hosts, ssh_config, port, timeout, command, resolve, clock).__enter__()
    try:
        linking.wait(signals)
    except BaseException as exc:
        linking.end(Event(END, *exit_for(exc)), 0.0)
        linking.close()
        raise
    return linking


class SshPorts:
    def __init__(self) -> None:
        self.listening: dict[str, socket.socket] = {}
        with socket.socket() as free:
            free.bind((ADDRESSES[HOSTS[0]], 0))
            self.port = int(free.getsockname()[1])

    def open(self, *hosts: str) -> None:
        for host in hosts:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((ADDRESSES[host], self.port))
            sock.listen(16)
            self.listening[host] = sock

    @staticmethod
    def resolve(host: str, port: int) -> list[Address]:
        return [(socket.AF_INET, (ADDRESSES[host], port))]

    def reach(
        self,
        marks: Path,
        timeout: float = 60,
        signals: SignalWatch | None = None,
        resolve: Resolve | None = None,
        clock: Callable[[], float] = time.monotonic,
        **relay_options: str,
    ) -> Linking:
        """connect_all to HOSTS at these ports, each session a RELAY (`relay_options`: together, failing)."""
        command = relay(marks, **relay_options)
        return connect_all(
            HOSTS,
            marks / "ssh_config",
            self.port,
            timeout,
            signals,
            clock=clock,
            command=command,
            resolve=resolve or self.resolve,
        )

    def deadline_once(
        self, host: str, skip: float, happened: Callable[[], bool]
    ) -> tuple[Resolve, Callable[[], float]]:
        """A lookup and a clock for connect_all, so that its deadline comes only after what the test needs
        to have happened before it, however slow the machine: the clock is the real one until `happened()`
        was true at one probe of `host` and another probe of it followed (by then the loop has read what the
        relays had said when their marks appeared); from then on it runs `skip` seconds (the timeout) ahead,
        so the deadline is due at once. If it never happens, the real deadline ends the wait."""
        seen = False
        ahead = 0.0

        def resolve(name: str, port: int) -> list[Address]:
            nonlocal seen, ahead
            if name == host:
                if seen:
                    ahead = skip
                seen = happened()
            return self.resolve(name, port)

        return resolve, lambda: time.monotonic() + ahead

    def close(self) -> None:
        for sock in self.listening.values():
            sock.close()


@pytest.fixture
def ports() -> Iterator[SshPorts]:
    opened = SshPorts()
    try:
        yield opened
    finally:
        opened.close()


def test_every_worker_is_reached_at_once(tmp_path: Path, ports: SshPorts) -> None:
    """No session waits for another to be ready: each relay is ready only once all four started."""
    ports.open(*HOSTS)
    with ports.reach(tmp_path, together="start") as linking:
        links = linking.links
        assert [worker.host for worker in links] == HOSTS
    assert all(worker.proc.returncode == 0 for worker in links)
    assert all(told(tmp_path, host) == [Event(LINKED)] for host in HOSTS)


def test_no_session_is_tried_before_the_workers_port_answers(tmp_path: Path, ports: SshPorts) -> None:
    """algo-3's sshd starts listening only after its port refused three probes (each probe looks its
    address up first: the fourth lookup opens the port)."""
    ports.open("algo-2", "algo-4", "algo-5")
    probes: Counter[str] = Counter()

    def resolve(host: str, port: int) -> list[Address]:
        probes[host] += 1
        if host == "algo-3" and probes[host] == 4:
            ports.open("algo-3")
        return ports.resolve(host, port)

    ports.reach(tmp_path, resolve=resolve).close()
    assert probes["algo-3"] == 4
    assert {host: len((tmp_path / f"tries-{host}").read_text()) for host in HOSTS} == dict.fromkeys(HOSTS, 1)


def test_a_worker_that_never_comes_up_is_named_and_the_others_are_told(
    tmp_path: Path, ports: SshPorts
) -> None:
    """The deadline comes once the three others are linked (their relays said ready): then only algo-3 is
    missing."""
    ports.open("algo-2", "algo-4", "algo-5")
    others = [tmp_path / f"ready-{host}" for host in ("algo-2", "algo-4", "algo-5")]
    resolve, clock = ports.deadline_once("algo-3", 60, lambda: all(p.exists() for p in others))
    with pytest.raises(
        PeerError, match=rf"workers algo-2, algo-3.*algo-3: port {ports.port}: Connection refused"
    ) as info:
        ports.reach(tmp_path, 60, resolve=resolve, clock=clock)
    assert "algo-2:" not in str(info.value).split("last:")[-1]  # only the missing host is blamed
    assert not (tmp_path / "tries-algo-3").exists()
    for host in ("algo-2", "algo-4", "algo-5"):  # the workers that were reached got the end and a hang-up
        assert told(tmp_path, host) == [Event(LINKED), Event(END, EX_UNAVAILABLE, str(info.value))]


def test_a_failed_attempt_is_tried_again_and_its_error_named(tmp_path: Path, ports: SshPorts) -> None:
    """algo-3's port is open but its first two sessions fail (no launcher waits there yet): a third one links
    it; one that always fails is named with the last line it wrote on stderr."""
    ports.open(*HOSTS)
    with ports.reach(tmp_path, failing="algo-3:2") as linking:
        assert [worker.host for worker in linking.links] == HOSTS
    assert len((tmp_path / "tries-algo-3").read_text()) == 3
    # The deadline comes once the others are linked and algo-4 failed at least once (its retry's probe).
    marks = tmp_path / "always"
    marks.mkdir()
    others = [marks / f"ready-{host}" for host in ("algo-2", "algo-3", "algo-5")]
    resolve, clock = ports.deadline_once(
        "algo-4", 60, lambda: (marks / "tries-algo-4").exists() and all(p.exists() for p in others)
    )
    with pytest.raises(PeerError) as info:
        ports.reach(marks, 60, resolve=resolve, clock=clock, failing="algo-4:99")
    assert str(info.value).endswith("(last: algo-4: smhvd.link: no launcher is waiting on this host)")


def test_a_stop_signal_ends_the_wait_and_the_workers_reached_are_told(
    tmp_path: Path, ports: SshPorts
) -> None:
    """SIGTERM while algo-3 is still refused (sent by the test's lookup of algo-3 once the other three said
    ready and were read: a probe after the one that saw them): Stopped at once, not at the deadline, and
    the three linked workers get the end with the stop's exit code."""
    ports.open("algo-2", "algo-4", "algo-5")
    seen_ready = False

    def resolve(host: str, port: int) -> list[Address]:
        nonlocal seen_ready
        if host == "algo-3":
            if seen_ready:
                os.kill(os.getpid(), signal.SIGTERM)
            seen_ready = len(list(tmp_path.glob("ready-*"))) == 3
        return ports.resolve(host, port)

    with (
        SignalWatch() as watch,
        pytest.raises(Stopped, match="stopped while waiting for workers algo-2") as info,
    ):
        ports.reach(tmp_path, 60, watch, resolve)
    for host in ("algo-2", "algo-4", "algo-5"):
        assert told(tmp_path, host) == [Event(LINKED), Event(END, EX_STOPPED, str(info.value))]


def test_closing_hangs_up_on_every_worker_before_waiting_for_any(tmp_path: Path, ports: SshPorts) -> None:
    """Each relay exits only once all four saw their input end: waiting for one before hanging up on the next
    would keep the first one waiting until Linking.close's deadline kills it (a non-zero exit)."""
    ports.open(*HOSTS)
    with ports.reach(tmp_path, together="eof") as linking:
        links = linking.links
    assert all((tmp_path / f"eof-{host}").exists() for host in HOSTS)
    assert [worker.proc.returncode for worker in links] == [0] * len(HOSTS)


def test_a_host_that_does_not_resolve_or_refuses_is_named_with_why(tmp_path: Path) -> None:
    """The real lookup and connect: a name that does not resolve, and localhost on a closed port."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        closed = int(free.getsockname()[1])
    with pytest.raises(PeerError) as info:
        connect_all(["no-such-host.invalid", "localhost"], tmp_path / "c", closed, 1.0)
    last = str(info.value).split("last: ")[-1]
    assert last.startswith("no-such-host.invalid: cannot resolve no-such-host.invalid (")
    assert last.endswith(f"; localhost: port {closed}: Connection refused)")


def test_once_the_wait_timed_out_the_end_waits_for_no_host_whose_name_never_resolved(
    tmp_path: Path, ports: SshPorts
) -> None:
    """Issue 53.5: a job naming nosuchhost.invalid, launcher_peer_timeout_seconds 2: its reason was written
    and `train` still ran the 30 s farewell for a name that never resolved. A worker that is only late
    (algo-2: resolves, port refused) is still waited for, up to the end's wait."""
    ends = Event(END, EX_UNAVAILABLE, "timed out")

    def resolve(host: str, port: int) -> list[Address]:
        if host not in ADDRESSES:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return ports.resolve(host, port)

    for hosts, waited in ((["nosuchhost.invalid"], False), (["nosuchhost.invalid", "algo-2"], True)):
        with Linking(hosts, tmp_path / "c", ports.port, 1.0, relay(tmp_path), resolve) as linking:
            with pytest.raises(PeerError, match="cannot resolve nosuchhost.invalid"):
                linking.wait()
            started = time.monotonic()
            assert linking.end(ends, wait=2.0) == dict.fromkeys(hosts, False)
            assert (time.monotonic() - started >= 2.0) is waited


def test_the_ssh_config_prefers_a_cheap_key_exchange_that_ssh_accepts(tmp_path: Path) -> None:
    if shutil.which("ssh") is None:
        unavailable("no ssh client (make setup installs openssh-client)")
    config = tmp_path / "ssh_config"
    config.write_text(render_ssh_config(2222))
    done = subprocess.run(
        ["ssh", "-G", "-F", str(config), "algo-2"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    settings = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert settings["kexalgorithms"].split(",")[0] == "curve25519-sha256"
    assert settings["port"] == "2222"


def test_a_hundred_failed_attempts_leave_the_leader_holding_no_more_fds(
    tmp_path: Path, ports: SshPorts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """algo-3's first 100 sessions fail (retried at once here): at each probe before another attempt the
    leader holds as many fds as at the first. Each attempt's pidfd is closed when it is forgotten; before
    (issue 37) the loop held one more for every attempt until the wait ended."""
    monkeypatch.setattr(peers, "retry_delay", lambda _attempts: 0.0)
    ports.open("algo-3")
    ports.listening["algo-3"].listen(1024)  # room for every probe's connection: none is accepted here
    held: list[int] = []

    def resolve(host: str, port: int) -> list[Address]:
        held.append(len(os.listdir("/proc/self/fd")))
        return ports.resolve(host, port)

    connect_all(
        ["algo-3"],
        tmp_path / "ssh_config",
        ports.port,
        600,
        command=relay(tmp_path, failing="algo-3:100"),
        resolve=resolve,
    ).close()
    assert len((tmp_path / "tries-algo-3").read_text()) == 101
    assert len(held) == 101  # a probe before each attempt
    print(f"fds held at the 1st, 50th and 101st probe: {held[0]}, {held[49]}, {held[100]}")
    assert set(held) == {held[0]}


def test_ready_is_found_whatever_comes_before_it_in_bounded_memory() -> None:
    """A host whose shell or Python prints megabytes first (issue 44: a chatty .pth): READY is found however
    the pieces fall, and what is kept of the chatter stays bounded (it was `said += chunk`, quadratic)."""
    chatter = b"x" * 3_000_000 + b"\n"
    for cut in range(len(READY) + 1):  # READY split between two pieces at every place
        said = Said()
        pieces = [*(chatter[i : i + 65536] for i in range(0, len(chatter), 65536))]
        pieces += [READY[:cut], READY[cut:] + b"later"]
        found = [said.ready(piece) for piece in pieces]
        assert found[-1] or (cut == len(READY) and found[-2])
        assert not any(found[: len(pieces) - 2])
        assert len(said.carry) < len(READY) and len(said.tail) <= SAID_KEPT


def test_a_worker_whose_link_closes_before_the_start_ends_the_wait_naming_it(
    tmp_path: Path, ports: SshPorts
) -> None:
    """algo-4's `train` ends right after its relay said READY (its session closes) while the others are not
    up yet: the wait fails at once, naming it, not at its deadline (600 s)."""
    ports.open("algo-4")
    with pytest.raises(PeerError, match="^algo-4 ended before the job started"):
        ports.reach(tmp_path, 600, closing="algo-4")


def test_the_leaders_end_before_the_start_reaches_every_worker_and_one_that_comes_up_meanwhile(
    tmp_path: Path, ports: SshPorts
) -> None:
    """The leader ends (its pip failed, say) while algo-3's sshd is not up yet: the three linked workers are
    told at once, and algo-3 when its port opens during the end's wait."""
    ports.open("algo-2", "algo-4", "algo-5")
    ending = Event(END, 70, "pip install -r requirements.txt failed: no such package")
    ended: list[bool] = []

    def resolve(host: str, port: int) -> list[Address]:
        if host == "algo-3" and ended and "algo-3" not in ports.listening:
            ports.open("algo-3")
        return ports.resolve(host, port)

    with Linking(HOSTS, tmp_path / "c", ports.port, 600, relay(tmp_path), resolve) as linking:
        others = [tmp_path / f"ready-{host}" for host in ("algo-2", "algo-4", "algo-5")]
        while not all(host.link is not None for host in linking.workers if host.host != "algo-3"):
            linking.loop.timers.after(peers.Timer("a look"), 0.05, linking.loop.stop)
            linking.loop.run()  # the leader's preparation runs the loop
        assert all(p.exists() for p in others)
        ended.append(True)
        reached = linking.end(ending, wait=60)
    assert reached == dict.fromkeys(HOSTS, True)
    for host in HOSTS:
        assert told(tmp_path, host) == [Event(LINKED), ending]


def test_closing_waits_for_the_sessions_ends_without_sleeping(
    tmp_path: Path, ports: SshPorts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing once waited for each session with Popen.wait(timeout), which polls with time.sleep every few
    milliseconds (issue 46: a hidden sleep-poll at every multi-host job's end); it waits on each session's end
    (a pidfd) on the loop. Here the sessions take a moment to end after the hang-up (each waits for all four
    to see it)."""
    ports.open(*HOSTS)
    linking = ports.reach(tmp_path, together="eof")
    sleeps: list[float] = []
    real = time.sleep
    monkeypatch.setattr(time, "sleep", lambda seconds: (sleeps.append(seconds), real(seconds))[1])
    linking.close()
    assert [link.proc.returncode for link in linking.links] == [0] * len(HOSTS)
    assert sleeps == []
