"""Preparation steps (proc/steps.py) with real processes: output kept, and nothing a step started left
running, whether it exits, runs past its deadline, or is interrupted by a stop (an exception raised by a
signal handler, as `train` raises Stopped); and whatever a step writes to its TMPDIR is gone when
its wait ends, however it ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from smhvd.proc.loop import process_loop
from smhvd.proc.processes import is_alive
from smhvd.proc.steps import OUTPUT_LIMIT, STOP_GRACE, StepResult, last_line, private_tmpdir, run_step
from smhvd.proc.timers import Timer
from smhvd.proc.waiting import wait_until

# A step that writes a file in its TMPDIR, starts a helper (which keeps the step's stdout open) and a daemon
# in its own session, writes their pids, prints bytes that are not UTF-8, then exits or hangs.
LEAVES_HELPERS = textwrap.dedent(
    """
    import os, subprocess, sys, tempfile, time
    out = sys.argv[1]
    with open(os.path.join(tempfile.gettempdir(), "scratch"), "w") as scratch:
        scratch.write(tempfile.gettempdir())
    helper = subprocess.Popen(["sleep", "300"])
    daemon = subprocess.Popen(["sleep", "301"], start_new_session=True, stdout=subprocess.DEVNULL)
    with open(out + ".tmp", "w") as f:
        f.write(f"{helper.pid} {daemon.pid}")
    os.rename(out + ".tmp", out)
    sys.stdout.buffer.write(b"provider: efa\\n\\xff\\xfe not UTF-8\\n")
    sys.stdout.flush()
    print("to stderr", file=sys.stderr, flush=True)
    if sys.argv[2] == "hang":
        time.sleep(300)
    sys.exit(int(sys.argv[2]))
    """
)


# What `train` is when it runs a step: a child subreaper whose SIGTERM handler raises Stopped in the
# main thread. argv: STEP_ARGV_JSON TIMEOUT ('' for none); prints the result as JSON.
DRIVER = textwrap.dedent(
    """
    import json, signal, sys
    from smhvd.proc.processes import become_subreaper
    from smhvd.proc.steps import run_step
    from smhvd.errors import Stopped
    from smhvd.proc.signals import PreparationSignals

    become_subreaper()
    PreparationSignals().install()
    try:
        r = run_step(json.loads(sys.argv[1]), timeout=float(sys.argv[2]) if sys.argv[2] else None)
    except Stopped:
        print(json.dumps({"stopped": True}))
    else:
        print(json.dumps({"returncode": r.returncode, "stdout": r.stdout.hex(), "stderr": r.stderr.hex()}))
    """
)


def drive(step: list[str], tmpdir: Path, timeout: float | None = None) -> subprocess.Popen[str]:
    """The driver with `tmpdir` (created here) as its TMPDIR."""
    tmpdir.mkdir()
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(step), "" if timeout is None else str(timeout)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )


def finish(driver: subprocess.Popen[str]) -> dict[str, object]:
    out, _ = driver.communicate(timeout=60)
    assert driver.returncode == 0
    return json.loads(out)


def run_driver(script: str, tmp_path: Path, *args: str) -> dict[str, object]:
    """`script` (DRIVER, or one made from it) with `args`, tmp_path/tmp as its TMPDIR, to its end."""
    (tmp_path / "tmp").mkdir()
    driver = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
    )
    return finish(driver)


def helpers(pids_file: Path) -> list[int]:
    return [int(p) for p in pids_file.read_text().split()]


def wait_for(path: Path) -> None:
    wait_until(lambda: True if path.exists() else None, what=f"{path} to appear", timeout=30)


def in_tmpdir(tmpdir: Path) -> list[str]:
    return sorted(str(path.relative_to(tmpdir)) for path in tmpdir.rglob("*"))


@pytest.mark.integration
def test_output_is_kept_and_what_the_step_left_is_killed(tmp_path):
    pids = tmp_path / "pids"
    started = time.monotonic()
    result = finish(drive([sys.executable, "-c", LEAVES_HELPERS, str(pids), "3"], tmp_path / "tmp", 120))
    assert time.monotonic() - started < 100  # the helper holding stdout for 300 s did not hold the step
    assert result["returncode"] == 3
    stdout = bytes.fromhex(str(result["stdout"]))
    assert stdout == b"provider: efa\n\xff\xfe not UTF-8\n"
    assert bytes.fromhex(str(result["stderr"])) == b"to stderr\n"
    assert not any(is_alive(pid) for pid in helpers(pids))
    assert in_tmpdir(tmp_path / "tmp") == []


def test_output_is_data_never_a_decoding_error():
    result = StepResult(0, b"provider: efa\n\xff\xfe not UTF-8\n", b"\xc3")
    assert result.text() == ("provider: efa\n\ufffd\ufffd not UTF-8\n", "\ufffd")
    assert last_line(result.stdout) == "\ufffd\ufffd not UTF-8"
    assert last_line(b" \n", "no output") == "no output"


@pytest.mark.integration
def test_of_a_flood_of_output_the_beginning_and_the_end_are_kept():
    flood = "import sys; sys.stdout.buffer.write(b'provider: efa\\n' + b'x' * 5_000_000 + b'\\nlast line\\n')"
    result = run_step([sys.executable, "-c", flood], timeout=60)
    assert result.returncode == 0
    assert result.stdout.startswith(b"provider: efa\n") and result.stdout.endswith(b"x\nlast line\n")
    assert b"\n[...]\n" in result.stdout and len(result.stdout) <= OUTPUT_LIMIT + 7


@pytest.mark.integration
def test_a_step_past_its_deadline_is_ended_with_its_tree(tmp_path):
    pids = tmp_path / "pids"
    result = finish(drive([sys.executable, "-c", LEAVES_HELPERS, str(pids), "hang"], tmp_path / "tmp", 3))
    assert result["returncode"] is None
    assert b"provider: efa" in bytes.fromhex(str(result["stdout"]))
    assert not any(is_alive(pid) for pid in helpers(pids))
    assert in_tmpdir(tmp_path / "tmp") == []


@pytest.mark.integration
def test_a_stop_ends_the_step_and_its_tree_at_once(tmp_path):
    """Ended by the stop, not by the step's own end 300 s later (a deadline only a hang reaches: how fast a
    stop ends `train` is measured in test_preparation_stops.py)."""
    pids = tmp_path / "pids"
    driver = drive([sys.executable, "-c", LEAVES_HELPERS, str(pids), "hang"], tmp_path / "tmp")
    wait_for(pids)
    scratch = next((tmp_path / "tmp").glob("smhvd-step-*/scratch"))
    assert scratch.read_text() == str(scratch.parent)  # the step's TMPDIR: a directory of its own, 0700
    assert (scratch.parent.stat().st_mode & 0o777) == 0o700
    driver.send_signal(signal.SIGTERM)
    assert finish(driver) == {"stopped": True}
    assert not any(is_alive(pid) for pid in helpers(pids))
    assert in_tmpdir(tmp_path / "tmp") == []


@pytest.mark.integration
def test_a_step_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    ready = tmp_path / "ready"
    script = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(300)"
    )
    driver = drive([sys.executable, "-c", script, str(ready)], tmp_path / "tmp")
    wait_for(ready)
    started = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    assert finish(driver) == {"stopped": True}
    assert time.monotonic() - started >= STOP_GRACE  # the grace was given (its end: before the step's 300 s)
    assert in_tmpdir(tmp_path / "tmp") == []


def test_a_private_tmpdir_is_gone_however_its_block_ends(tmp_path):
    with private_tmpdir(tmp_path) as made:
        (made / "sub").mkdir()
        (made / "sub" / "file").write_text("x")
        assert made.parent == tmp_path and (made.stat().st_mode & 0o777) == 0o700

    def interrupted() -> None:
        with private_tmpdir(tmp_path) as made:
            (made / "file").write_text("x")
            raise KeyboardInterrupt  # as a stop raises Stopped

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert list(tmp_path.iterdir()) == []


# A train holding a step's TMPDIR: makes it under argv[1], leaves a pip-like directory in it, says its name,
# and waits.
HOLDS_A_TMPDIR = """
import sys, time
from pathlib import Path
from smhvd.proc.steps import private_tmpdir
with private_tmpdir(Path(sys.argv[1])) as made:
    (made / "pip-build-tracker-x").mkdir()
    print(made.name, flush=True)
    time.sleep(300)
"""


@pytest.mark.integration
def test_a_tmpdir_whose_train_was_killed_is_removed_by_the_next_step_and_a_live_ones_is_kept(tmp_path):
    parent = tmp_path / "tmp"
    parent.mkdir()
    trains = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDS_A_TMPDIR, str(parent)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        killed, alive = (train.stdout.readline().strip() for train in trains if train.stdout)
        trains[0].kill()  # SIGKILL: nothing of it runs any more, its directory stays
        trains[0].wait()
        assert sorted(p.name for p in parent.iterdir()) == sorted([killed, alive])
        with private_tmpdir(parent) as mine:
            assert sorted(p.name for p in parent.iterdir()) == sorted([alive, mine.name])
        assert [p.name for p in parent.iterdir()] == [alive]
    finally:
        for train in trains:
            train.kill()
            train.communicate()


def test_a_tmpdir_that_cannot_be_made_is_not_a_missing_program(tmp_path):
    """FileNotFoundError from run_step means "no such program" (the EFA probe reads it so)."""
    failed = "cannot create the step's temporary directory"
    with pytest.raises(OSError, match=failed) as raised, private_tmpdir(tmp_path / "missing"):
        pass
    assert not isinstance(raised.value, FileNotFoundError)


@pytest.mark.integration
def test_a_missing_program_raises_file_not_found():
    with pytest.raises(FileNotFoundError):
        run_step(["/nonexistent/fi_info"])


# The driver, with a process the launcher itself starts while the step runs (as the leader's ssh links and a
# worker's sshd run beside the preparation): in the launcher's own session, so not the step's to end.
BESIDE = (
    DRIVER.replace(
        "    r = run_step(",
        "    import subprocess, threading\n"
        "    beside = []\n"
        "    def start():\n"
        "        beside.append(subprocess.Popen(['sleep', '300'], stdout=subprocess.DEVNULL))\n"
        "    threading.Timer(0.5, start).start()\n"
        "    r = run_step(",
    )
    .replace(
        'print(json.dumps({"returncode"',
        'print(json.dumps({"beside": beside[0].poll() is None, "returncode"',
    )
    .replace("r.stderr.hex()}))", "r.stderr.hex()}))\n    beside[0].kill()")
)


@pytest.mark.integration
def test_what_the_launcher_starts_itself_while_a_step_runs_is_not_the_steps(tmp_path):
    """The leader reaches its workers while its pip runs: the ssh sessions it starts then (in its own session)
    outlived pip's step until a step's end killed every process started since it began."""
    result = run_driver(
        BESIDE, tmp_path, json.dumps([sys.executable, "-c", "import time; time.sleep(2)"]), ""
    )
    assert result["returncode"] == 0
    assert result["beside"] is True


# A worker's sshd forks while the worker's own steps run (the leader's mpirun starts orted under it, orted
# its probe): an own child (the launcher's session) that forks short-lived children as fast as it can, each
# exiting 0 by itself, and writes down each one that died of a signal instead.
FORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    killed = open(sys.argv[1], "a")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(0.005)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            killed.write(f"{os.WTERMSIG(status)}\\n")
            killed.flush()
    """
)
FORKING_BESIDE = DRIVER.replace(
    "    r = run_step(json.loads(sys.argv[1]), timeout=float(sys.argv[2]) if sys.argv[2] else None)",
    "    import subprocess\n"
    f"    forker = subprocess.Popen([sys.executable, '-c', {FORKER!r}, sys.argv[3]])\n"
    "    for _ in range(int(sys.argv[4])):\n"
    "        r = run_step(json.loads(sys.argv[1]))\n"
    "    forker.terminate()\n"
    "    forker.wait()",
)


@pytest.mark.integration
def test_a_step_that_ends_never_kills_what_an_own_child_forks_meanwhile(tmp_path):
    """Seen in SDK local mode: a worker's code download (a step) ended while the leader's pre-flight started
    orted under the worker's sshd, and the step's end killed it (mpirun lost its daemon, or its launch
    stalled). Which processes are the launcher's own was read from one look at /proc and the step's
    from another: what was forked between the two was the step's, and killed."""
    killed = tmp_path / "killed"
    killed.write_text("")
    assert (
        run_driver(FORKING_BESIDE, tmp_path, json.dumps(["true"]), "", str(killed), "30")["returncode"] == 0
    )
    assert killed.read_text().split() == []  # not one child of the forker was killed by a step's end


# The driver, with Open MPI's way on a worker while the step runs: a process in the launcher's own session
# (sshd) starts a daemon that leaves its session and its parent (orted --daemonize), re-parented to the
# launcher (a subreaper). Prints whether that daemon outlived the step. argv 3, 4: the daemon's pid file and
# a FIFO the daemonizer opens (so once the step reads it) before it forks, and the daemon writes to.
DAEMONIZED_BESIDE = DRIVER.replace(
    "    r = run_step(json.loads(sys.argv[1]), timeout=float(sys.argv[2]) if sys.argv[2] else None)",
    "    import os, subprocess, threading, time\n"
    "    daemonize = ('import os, sys, time\\n'\n"
    "                 'born = open(sys.argv[2], \"w\")\\n'\n"
    "                 'if os.fork() == 0:\\n'\n"
    "                 '    os.setsid()\\n'\n"
    "                 '    open(sys.argv[1], \"w\").write(str(os.getpid()))\\n'\n"
    "                 '    born.write(\"born\")\\n'\n"
    "                 '    born.close()\\n'\n"
    "                 '    time.sleep(300)\\n')\n"
    "    daemonizer = [sys.executable, '-c', daemonize, *sys.argv[3:5]]\n"
    "    threading.Thread(target=subprocess.call, args=(daemonizer,)).start()\n"
    "    r = run_step(json.loads(sys.argv[1]))\n"
    "    from smhvd.proc.processes import is_alive, signal_pids\n"
    "    daemon = int(open(sys.argv[3]).read())\n"
    "    alive = is_alive(daemon)\n"
    "    signal_pids([daemon], 9)",
).replace('print(json.dumps({"returncode"', 'print(json.dumps({"daemon_alive": alive, "returncode"')


@pytest.mark.integration
def test_a_daemon_started_beside_a_step_is_not_the_steps_though_it_is_re_parented_here(tmp_path):
    """What failed the SDK local-mode test: on a worker, the leader's pre-flight started orted (which
    daemonizes: its own session, re-parented to the worker's launcher) while the worker's EFA probe or code
    download ran; that step's end killed it, and mpirun lost its daemon. A daemon the step itself leaves is
    still ended (test_output_is_kept_and_what_the_step_left_is_killed)."""
    born = tmp_path / "born"
    os.mkfifo(born)  # the daemonizer opens it once the step reads it, and forks: born while the step runs
    step = [sys.executable, "-c", "import sys; print(open(sys.argv[1]).read())", str(born)]
    result = run_driver(
        DAEMONIZED_BESIDE, tmp_path, json.dumps(step), "", str(tmp_path / "daemon.pid"), str(born)
    )
    assert result["returncode"] == 0
    assert bytes.fromhex(str(result["stdout"])) == b"born\n"  # the step ended after the daemon's birth
    assert result["daemon_alive"] is True


class _First(Exception):
    """What ended the step's wait first (the leader's `end`, a stop)."""


class _Second(Exception):
    """What another owner's callback would raise while the step's tree ends (its link closing)."""


@pytest.mark.integration
def test_the_ending_that_interrupts_a_step_is_the_one_raised_whatever_happens_while_its_tree_ends():
    """Issue 53.2: a worker's pip ignoring SIGTERM is ended by the leader's `end`; while its tree ends (up to
    STOP_GRACE), the leader's link closes. That second callback once ran in the cleanup's wait and its
    exception replaced the first (the worker exited 69 'lost the leader', not with the leader's code): the
    cleanup now waits on its own processes only, and the second waits for the loop's next wait."""
    ignores_sigterm = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    peer = subprocess.Popen(["sleep", "1"])  # ends while the step's tree is being ended
    seen: list[str] = []

    def closed() -> None:
        seen.append("second")
        raise _Second

    def first() -> None:
        raise _First

    with process_loop().scope() as other:
        other.exit_of(peer.pid, closed)
        other.timers.after(Timer("the first ending"), 0.3, first)
        started = time.monotonic()
        with pytest.raises(_First):
            run_step([sys.executable, "-c", ignores_sigterm])
        took = time.monotonic() - started
    peer.wait()
    assert seen == []
    assert STOP_GRACE <= took < STOP_GRACE + 30  # the tree was ended (SIGKILL after the grace), then raised


# The driver, printing after the step whether each process the step left (argv 3: their pids) still has a
# /proc entry: a zombie has one, and is_alive counts it as gone.
LEFT_IN_PROC = DRIVER.replace(
    'print(json.dumps({"returncode"',
    "import os\n"
    "    left = [p for p in map(int, open(sys.argv[3]).read().split()) if os.path.exists(f'/proc/{p}')]\n"
    '    print(json.dumps({"left": left, "returncode"',
)


@pytest.mark.integration
def test_what_a_step_left_is_killed_and_reaped_not_left_a_zombie(tmp_path):
    """Issue 53.3: the daemon a step leaves (its own session, the step's TMPDIR) was SIGKILLed and then never
    reaped: once a zombie its environment reads empty, so no later look counted it as the step's."""
    pids = tmp_path / "pids"
    step = [sys.executable, "-c", LEAVES_HELPERS, str(pids), "0"]
    result = run_driver(LEFT_IN_PROC, tmp_path, json.dumps(step), "", str(pids))
    assert result["returncode"] == 0
    assert result["left"] == []
