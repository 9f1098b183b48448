"""Python stack dumps of every rank, for jobs that hang: where is each rank stuck?
`python -m smhvd.report.stacks HOST OUT_DIR` dumps this host's ranks with py-spy, in parallel and bounded,
into `OUT_DIR/stacks/<host>-rank<N>.txt`, and prints a JSON line per rank. The leader runs it on every MPI
host (a worker on its own) and logs one line of where the ranks sit (docs/architecture.md says why a process
of its own). `Dumps` says when to take one, `AfterDump` what to do once it is taken.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from smhvd.link.connect import ssh_command
from smhvd.proc.loop import Scope
from smhvd.proc.processes import is_rank_wrapper, read_process_table
from smhvd.proc.timers import Timer, Timers
from smhvd.report import failure

DUMP_TIMEOUT = 45.0  # one py-spy dump, its start included (see HOST_DUMP_TIMEOUT)
STOP_DUMP_WAIT = 8.0  # on a stop, the ranks get SIGTERM once the dump has ended, or this long after
# A host's dumps: its process's start (and ssh) + its parallel dumps. Generous, as a stop never waits for it
# (STOP_DUMP_WAIT): while ranks flood their output, starting a process may wait 5-60 s on 2 cores (measured).
HOST_DUMP_TIMEOUT = 90.0
log = logging.getLogger("smhvd")
_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>[^()]*?):(?P<line>\d+)\)\s*$")
_HOROVOD_FILE = re.compile(r"(^|/)horovod/")


@dataclass(frozen=True)
class RankProcess:
    rank: int | None
    pid: int


@dataclass(frozen=True)
class RankDump:
    rank: int | None
    host: str
    where: str  # the innermost Horovod frame of the main thread, else its innermost frame
    file: str  # the full dump

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def _environ(pid: int, proc: Path) -> dict[str, str]:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def find_ranks(host: str, output_data_dir: Path, proc: Path = Path("/proc")) -> list[RankProcess]:
    """The training programs of this job's ranks on this host (children of the rank wrappers whose
    SM_CURRENT_HOST and SM_OUTPUT_DATA_DIR are this host's and this job's), sorted by rank."""
    table = read_process_table(proc)
    wrappers = {pid for pid in table if is_rank_wrapper(pid)}
    found = []
    for pid, (ppid, _) in table.items():
        if ppid not in wrappers:
            continue
        env = _environ(pid, proc)
        if env.get("SM_CURRENT_HOST", host) != host:
            continue  # another simulated host's rank, visible through a shared /proc
        if env.get("SM_OUTPUT_DATA_DIR", str(output_data_dir)) != str(output_data_dir):
            continue  # another job's
        rank = env.get("OMPI_COMM_WORLD_RANK", "")
        found.append(RankProcess(int(rank) if rank.isdigit() else None, pid))
    return sorted(found, key=lambda r: (r.rank is None, r.rank or 0, r.pid))


def where(dump: str) -> str:
    """Where the main thread is: its innermost Horovod frame, else its innermost frame. Pure."""
    frames: list[tuple[str, str, str]] = []
    for line in dump.splitlines():
        if line.startswith("Thread ") and frames:
            break  # only the first thread listed (py-spy lists the main thread first)
        match = _FRAME.match(line)
        if match:
            frames.append((match["func"], match["file"], match["line"]))
    if not frames:
        return "no Python frames (" + (dump.strip().splitlines() or ["empty dump"])[-1][:120] + ")"
    func, file, line = next((f for f in frames if _HOROVOD_FILE.search(f[1])), frames[0])
    return f"{func} ({file}:{line})"


def dump_one(rank: RankProcess, host: str, out_dir: Path, py_spy: str) -> RankDump:
    try:
        proc = subprocess.run(
            [py_spy, "dump", "--pid", str(rank.pid)],
            capture_output=True,
            text=True,
            timeout=DUMP_TIMEOUT,
            check=False,
        )
        text = proc.stdout + (f"\n[py-spy exited {proc.returncode}] {proc.stderr}" if proc.returncode else "")
    except subprocess.TimeoutExpired:
        text = f"[py-spy dump took more than {DUMP_TIMEOUT:g}s]"
    path = out_dir / "stacks" / dump_file_name(host, rank.rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:  # a dump that cannot be kept must not end the job's stop: say so instead
        return RankDump(rank.rank, host, where(text), f"(not written: {exc.strerror or exc})")
    return RankDump(rank.rank, host, where(text), str(path))


def dump_file_name(host: str, rank: int | None) -> str:
    """`<host>-rank<N>.txt` within a file name's 255 bytes: a long host name is cut and keeps a digest of the
    whole, so that two hosts never share a file."""
    suffix = f"-rank{'unknown' if rank is None else rank}.txt"
    safe = host.replace("/", "_")
    if len(safe.encode()) + len(suffix) > 200:
        digest = hashlib.sha256(host.encode()).hexdigest()[:12]
        safe = safe.encode()[:120].decode(errors="ignore") + "-" + digest
    return safe + suffix


def summary_line(dumps: Iterable[RankDump], reason: str, silent: Sequence[str] = ()) -> str:
    """'stack dump (why): ranks 0,2 in allreduce (...); rank 1 on algo-2 in sleep (...)', and the hosts whose
    dumps did not answer in time (`silent`). Pure."""
    by_place: dict[str, list[RankDump]] = defaultdict(list)
    for dump in dumps:
        by_place[dump.where].append(dump)
    late = [f"no answer within {HOST_DUMP_TIMEOUT:g}s from {','.join(silent)}"] if silent else []
    if not by_place:
        return f"stack dump ({reason}): " + ("; ".join(late) or "no rank was running")
    parts = []
    for place, group in sorted(by_place.items(), key=lambda kv: min(d.rank or 0 for d in kv[1])):
        ranks = ",".join(
            "?" if d.rank is None else str(d.rank) for d in sorted(group, key=lambda d: d.rank or 0)
        )
        hosts = ",".join(sorted({d.host for d in group}))
        label = "ranks" if len(group) > 1 else "rank"
        parts.append(f"{label} {ranks} on {hosts} in {place}")
    return f"stack dump ({reason}): " + "; ".join(parts + late)


# The stop's own dump (supervisor.Stop: "stopped by SIGTERM"), as summary_line writes its reason.
_STOP_DUMP = re.compile(r"stack dump \(stopped by (SIG[A-Z0-9]+)\)")


def stop_failure(dump_line: str | None, started: int, ranks: int) -> str:
    """The failure file of a job stopped while it ran: that it was stopped, by which signal (read from the
    stop's stack dump, `dump_line`) and in which phase (`started` of the job's `ranks` had started the script)
    on the first line, then where each rank was (the dump's line). It read like a crash in Horovod when the
    dump's line came first (issue 52). Pure."""
    found = _STOP_DUMP.match(dump_line or "")
    by = f" by {found.group(1)}" if found else ""
    if started >= ranks:
        phase = f"while the script ran (all {ranks} rank(s) had started it)"
    else:
        phase = f"while the job started ({started} of {ranks} rank(s) had started the script)"
    headline = f"stopped{by} {phase}" + ("; where each rank was:" if dump_line else "")
    return failure.compose(headline, dump_line or "")


def parse_dumps(lines: Iterable[str]) -> list[RankDump]:
    """RankDump JSON lines (from `python -m smhvd.report.stacks` on another host); other lines are skipped."""
    dumps = []
    for line in lines:
        try:
            data: Mapping[str, object] = json.loads(line)
            rank = data["rank"] if isinstance(data["rank"], int) else None
            dumps.append(RankDump(rank, *(str(data[key]) for key in ("host", "where", "file"))))
        except (ValueError, KeyError, TypeError):
            continue
    return dumps


class StackDumper:
    """Dumps of this host's ranks and, over ssh, `others`', in parallel; one summary line logged and kept
    (`last_line`) for the failure file. `whose`: what the log says it dumps (a worker: its own ranks)."""

    def __init__(
        self,
        host: str,
        out_dir: Path,
        others: Sequence[str],
        ssh_config: Path | None,
        whose: str = "every rank",
    ) -> None:
        self.host, self.whose, self.out_dir, self.ssh_config = host, whose, out_dir, ssh_config
        self.others = list(others) if ssh_config is not None else []
        self.last_line: str | None = None
        self._thread: threading.Thread | None = None
        # Readable once the dump `start` began (or the one already running) has ended.
        self.finished = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def start(self, reason: str) -> None:
        """Dump in a thread; a request while a dump runs is dropped, and `finished` says when it ends."""
        if self._thread is not None and self._thread.is_alive():
            return
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.finished)  # an earlier dump's word
        self._thread = threading.Thread(target=self._dump, args=(reason,), name="smhvd-stacks", daemon=True)
        self._thread.start()

    def _dump(self, reason: str) -> None:
        try:
            self.dump(reason)
        except Exception as exc:  # diagnostics only: said, and the job goes on (its stop too)
            log.warning("stack dump (%s) failed: %s", reason, exc)
        finally:
            os.eventfd_write(self.finished, 1)

    def finish(self, timeout: float) -> None:
        """The job is over: give a running dump up to `timeout` seconds, then close `finished` (unless the
        dump still runs and will write to it)."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            os.close(self.finished)

    def dump(self, reason: str) -> str:
        log.warning("taking a stack dump of %s (%s)", self.whose, reason)
        here = [sys.executable, "-m", __name__, self.host, str(self.out_dir)]
        commands = [here] + [
            ssh_command(self.ssh_config, host, [sys.executable, "-m", __name__, host, str(self.out_dir)])
            for host in self.others
            if self.ssh_config is not None
        ]
        running = [
            subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,  # its py-spys with it, when it is ended
            )
            for argv in commands
        ]
        dumps, silent = [], []
        deadline = time.monotonic() + HOST_DUMP_TIMEOUT
        for host, proc in zip([self.host, *self.others], running, strict=True):
            try:
                out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # what it said of the ranks it dumped is kept
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                silent.append(host)
            dumps += parse_dumps(out.splitlines())
        line = summary_line(dumps, reason, silent)
        log.warning("%s (files in %s)", line, self.out_dir / "stacks")
        with contextlib.suppress(OSError), (self.out_dir / "stacks" / "summary.txt").open("a") as f:
            f.write(line + "\n")
        self.last_line = line
        return line


class AfterDump:
    """Call `then` once, when the stack dump just started has ended (`dumps.finished` readable on the loop),
    or `wait` seconds after `start` if it has not; `now` calls it at once. The loop runs on meanwhile."""

    def __init__(self, loop: Scope, dumps: Dumps, wait: float, then: Callable[[], object]) -> None:
        self.loop, self.dumps, self.wait, self.then = loop, dumps, wait, then
        self.timer = Timer("the wait for a stack dump")
        self.watched: int | None = None  # the dump's `finished` fd while the loop waits on it
        self.done = False

    def start(self) -> None:
        if self.dumps.finished is None:  # `dump` returned when it was done
            self.now()
            return
        self.watched = self.dumps.finished
        self.loop.reader(self.watched, self.now)
        self.loop.timers.after(self.timer, self.wait, self.now)

    def now(self) -> None:
        if self.done:
            return
        self.done = True
        if self.watched is not None:
            self.loop.timers.cancel(self.timer)
            self.loop.forget(self.watched)
            self.watched = None
        self.then()


@dataclass
class Dumps:
    """When to take stack dumps, besides SIGUSR1 and a stop: once when Horovod reports a stall, and once per
    silence when no rank has written anything for `silence` seconds."""

    dump: Callable[[str], object]  # starts a dump in the background
    finished: int | None = None  # readable once the dump last started has ended (None: `dump` returns then)
    silence: float | None = None  # launcher_hang_dump_seconds
    stall_dumped: bool = False
    timers: Timers | None = None
    silence_timer: Timer = field(default_factory=lambda: Timer("silence"))

    def start(self, timers: Timers) -> None:
        self.timers = timers
        self._listen_for_silence()

    def heard(self, stalled: bool) -> None:
        """Some rank wrote: the silence starts again; a stall Horovod reported (`stalled`) is dumped once."""
        self._listen_for_silence()
        if stalled and not self.stall_dumped:
            self.stall_dumped = True
            self.dump("Horovod reported a stall")

    def _listen_for_silence(self) -> None:
        if self.silence is not None and self.timers is not None:
            why = f"no output from any rank for {self.silence:g}s"
            self.timers.after(self.silence_timer, self.silence, lambda: self.dump(why))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m smhvd.report.stacks HOST OUTPUT_DATA_DIR\n")
        return 64
    host, out_dir = args[0], Path(args[1])
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    todo = find_ranks(host, out_dir)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(todo) or 1)) as pool:
        done = [pool.submit(dump_one, rank, host, out_dir, py_spy) for rank in todo]
        for future in concurrent.futures.as_completed(done):  # each dump is bounded, so the whole is too
            print(future.result().to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
