"""A stop while `train` prepares the job (code download, pip, the EFA probe) ends it at once, with everything
it started; SIGUSR1 then (a stack-dump request, with no rank to dump) changes nothing.

The hanging servers are real sockets that accept connections (the kernel completes the handshake on a
listening socket) and never answer: what pip or boto3 meet behind a dead proxy. No EFA device exists here: a
fake `fi_info` first on PATH stands in for libfabric's, forking a helper as a real probe can."""

from __future__ import annotations

import base64
import hashlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from smhvd.proc.processes import cmdline, descendants, is_alive, state
from smhvd.proc.steps import STOP_GRACE
from smhvd.proc.waiting import NotYet, wait_until

pytestmark = pytest.mark.integration

TRAIN = Path(sys.executable).parent / "train"
# A stop must end `train` within this bound (measured: about 0.05 s); pip and boto3 wait 60 s and more.
STOP_BOUND = STOP_GRACE + 2.0
SCRIPT = "open('ran', 'w').write('the script must not run')\n"


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A TCP port on loopback that accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield server


def wait_for_client(server: socket.socket) -> None:
    """Until a client's connection is queued on `server` (the client now waits for an answer)."""

    def pending() -> bool:
        if select.select([server], [], [], 0)[0]:
            return True
        raise NotYet("no connection yet")

    wait_until(pending, what="a client to connect to the silent server", timeout=60)


def wait_for_file(path: Path) -> None:
    wait_until(lambda: True if path.exists() else None, what=f"{path} to appear", timeout=60)


def start(job, env: dict[str, str]) -> subprocess.Popen[str]:
    """`train` on the job, with none of this machine's pip settings (PIP_NO_INDEX would keep pip off the
    network, PIP_FIND_LINKS would offer it local wheels)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return subprocess.Popen(
        [str(TRAIN)],
        env={**base, "SAGEMAKER_BASE_DIR": str(job.paths.base), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def end(train: subprocess.Popen[str], timeout: float) -> str:
    """`train`'s stderr once it exited; past `timeout`, its tree is killed and the test fails."""
    try:
        return train.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        for pid in [*reversed(descendants(train.pid)), train.pid]:
            os.kill(pid, signal.SIGKILL)
        train.communicate()
        raise AssertionError(f"train did not exit within {timeout:g}s") from None


def stop(
    train: subprocess.Popen[str], sig: int, frozen_pip: int | None = None
) -> tuple[list[int], float, str]:
    """Send `sig`: (the job's processes at that moment, seconds until `train` exited, its stderr). A
    `frozen_pip` (freeze_at_moment) goes on once the signal waits for it: it meets the stop where it was."""
    tree = descendants(train.pid)
    sent = time.monotonic()
    train.send_signal(sig)
    if frozen_pip is not None:
        what = f"the stop to reach pip ({frozen_pip})"
        wait_until(lambda: True if pending(frozen_pip, sig) else None, what=what, timeout=60)
        os.kill(frozen_pip, signal.SIGCONT)
    stderr = end(train, STOP_BOUND + 10)
    return tree, time.monotonic() - sent, stderr


def pip_pid(train: subprocess.Popen[str]) -> int | None:
    """The job's pip process, if one runs."""
    return next((pid for pid in descendants(train.pid) if cmdline(pid)[1:3] == ["-m", "pip"]), None)


def assert_stopped(job, train, stopped: tuple[list[int], float, str], sig: int, during: str) -> None:
    tree, seconds, stderr = stopped
    assert train.returncode == 143, stderr
    assert seconds < STOP_BOUND, f"{seconds:.1f}s"
    assert tree, "the step had no process"
    left = [(pid, cmdline(pid)) for pid in tree if is_alive(pid)]
    assert not left, f"left running: {left}"
    assert "Traceback" not in stderr, stderr
    failure = job.failure()
    reason = f"stopped by {signal.Signals(sig).name} before the job started, during {during}"
    assert failure is not None and failure.startswith(reason), (failure, stderr)
    assert not (job.code / "ran").exists()


def pip_env(server: socket.socket) -> dict[str, str]:
    """pip with the silent server as its only index (no config file, no local wheels)."""
    return {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": f"http://127.0.0.1:{server.getsockname()[1]}/simple",
        "PIP_DEFAULT_TIMEOUT": "60",
        "PIP_RETRIES": "0",
    }


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_during_pip_ends_pip_and_its_tree_at_once(train_job, silent_server, sig):
    job = train_job(SCRIPT)
    (job.code / "requirements.txt").write_text("smhvd-no-such-package==1.0\n")
    train = start(job, pip_env(silent_server))
    wait_for_client(silent_server)
    assert pip_pid(train) is not None
    stopped = stop(train, sig)
    assert_stopped(job, train, stopped, sig, "pip install -r requirements.txt")


def tiny_wheel(directory: Path, modules: int = 200) -> None:
    """A pure-Python wheel, smhvdtiny 1.0, of `modules` small modules (enough for pip to spend a few tenths of
    a second writing files and compiling them)."""
    info = "smhvdtiny-1.0.dist-info"
    files = {f"smhvdtiny/m{i}.py": f"X = {i}\n".encode() for i in range(modules)}
    files["smhvdtiny/__init__.py"] = b""
    files[f"{info}/METADATA"] = b"Metadata-Version: 2.1\nName: smhvdtiny\nVersion: 1.0\n"
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )

    def record(name: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{name},sha256={digest},{len(data)}"

    rows = [record(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = "".join(f"{row}\n" for row in rows).encode()
    directory.mkdir()
    with zipfile.ZipFile(directory / "smhvdtiny-1.0-py3-none-any.whl", "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)


@pytest.fixture
def local_pip(tmp_path: Path) -> dict[str, str]:
    """`train`'s environment for a pip that installs smhvdtiny from a local wheel directory, into a target
    directory (never into the venv running the tests), with an empty TMPDIR of the test's own."""
    tiny_wheel(tmp_path / "wheels")
    (tmp_path / "tmp").mkdir()
    return {
        "TMPDIR": str(tmp_path / "tmp"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "wheels"),
        "PIP_TARGET": str(tmp_path / "target"),
    }


# Moments of `pip install` from a local wheel, in the order they come (pip 24; measured on 2 idle cores: pip
# 0 s, pip-target-* 0.4 s, pip-unpack-* 0.7 s, the package's files 0.9 s, their byte code 1.0 s, done 1.3 s).
# Each is a name that appears in TMPDIR (at any depth) at that moment; the first is pip's start.
PIP_MOMENTS = ("pip", "pip-target-", "pip-unpack-", "m150.py", "__pycache__")


def pip_moment(train: subprocess.Popen[str], tmpdir: Path) -> int:
    """The latest of PIP_MOMENTS that pip has reached (-1: pip not started yet)."""
    names = [name for _, dirs, files in os.walk(tmpdir) for name in (*dirs, *files)]
    for index in range(len(PIP_MOMENTS) - 1, 0, -1):
        if any(name.startswith(PIP_MOMENTS[index]) for name in names):
            return index
    return 0 if pip_pid(train) is not None else -1


def is_frozen(pid: int) -> bool:
    """Whether `pid` is stopped (SIGSTOP) or gone."""
    return state(pid) in (None, "T", "t", "Z", "X")


def pending(pid: int, sig: int) -> bool:
    """Whether `sig` waits to be delivered to `pid` (thread or process pending set), or it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except FileNotFoundError:
        return True
    masks = [int(line.split()[1], 16) for line in status if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & (1 << (sig - 1)) for mask in masks)


def freeze_at_moment(train: subprocess.Popen[str], tmpdir: Path, moment: int) -> int:
    """pip's pid, stopped (SIGSTOP) at `moment` or just after it: pip is frozen for each look at TMPDIR, so
    a loaded machine that does not run this test for a second cannot let pip run past the moment (and the
    job start) between two looks."""

    def reached() -> int:
        if train.poll() is not None:
            raise AssertionError(
                f"train exited ({train.returncode}) before pip reached {PIP_MOMENTS[moment]}"
            )
        pid = pip_pid(train)
        if pid is None:
            raise NotYet("pip not started yet")
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: True if is_frozen(pid) else None, what=f"pip ({pid}) to stop", timeout=60)
        if pip_moment(train, tmpdir) >= moment:
            return pid
        os.kill(pid, signal.SIGCONT)
        raise NotYet(f"pip not at {PIP_MOMENTS[moment]} yet")

    return wait_until(
        reached, what=f"pip to reach {PIP_MOMENTS[moment]}", timeout=60, initial=0.001, maximum=0.002
    )


def test_a_job_whose_requirements_installed_leaves_nothing_in_tmpdir(train_job, local_pip, tmp_path):
    job = train_job("open('ran', 'w').write('ran')\n")
    (job.code / "requirements.txt").write_text("smhvdtiny==1.0\n")
    stderr = end(start(job, local_pip), 120)
    assert (tmp_path / "target" / "smhvdtiny" / "m199.py").is_file(), stderr
    assert (job.code / "ran").exists(), stderr
    assert not list((tmp_path / "tmp").iterdir())


@pytest.mark.parametrize(
    "moment",
    [pytest.param(i, id=f"{PIP_MOMENTS[i]}{run}") for i in range(len(PIP_MOMENTS)) for run in "ab"],
)
def test_a_stop_at_any_moment_of_pip_leaves_nothing_in_tmpdir(train_job, local_pip, tmp_path, moment):
    """pip removes its pip-* directories only when it exits normally or on KeyboardInterrupt: a SIGTERM (and
    the SIGKILL after the grace) skips that; the step's own TMPDIR, removed by `train`, takes them."""
    job = train_job(SCRIPT)
    (job.code / "requirements.txt").write_text("smhvdtiny==1.0\n")
    train = start(job, local_pip)
    pip = freeze_at_moment(train, tmp_path / "tmp", moment)
    stopped = stop(train, signal.SIGTERM, frozen_pip=pip)
    assert_stopped(job, train, stopped, signal.SIGTERM, "pip install -r requirements.txt")
    left = sorted(str(p.relative_to(tmp_path / "tmp")) for p in (tmp_path / "tmp").rglob("*"))
    assert not left, left[:10]


def test_what_a_train_killed_during_pip_left_in_tmpdir_is_removed_by_the_next_one(
    train_job, local_pip, tmp_path
):
    """SIGKILL to `train` (the launcher below it SIGKILLs pip at once, frozen or not: proc/keeper.py; nothing
    cleans up) leaves the step's TMPDIR: the next train's first step removes it, and that train leaves
    nothing."""
    job = train_job(SCRIPT)
    (job.code / "requirements.txt").write_text("smhvdtiny==1.0\n")
    train = start(job, local_pip)
    pip = freeze_at_moment(train, tmp_path / "tmp", PIP_MOMENTS.index("pip-unpack-"))
    train.kill()
    train.communicate()
    wait_until(lambda: None if is_alive(pip) else True, what="pip to die", timeout=30)
    assert list((tmp_path / "tmp").iterdir())  # what the killed train left
    job = train_job("open('ran', 'w').write('ran')\n")
    stderr = end(start(job, local_pip), 120)
    assert (job.code / "ran").exists(), stderr
    assert not list((tmp_path / "tmp").iterdir())


def test_sigusr1_during_preparation_is_harmless(train_job, silent_server):
    job = train_job(SCRIPT)
    (job.code / "requirements.txt").write_text("smhvd-no-such-package==1.0\n")
    train = start(job, pip_env(silent_server))
    wait_for_client(silent_server)
    pip = pip_pid(train)
    for _ in range(3):
        train.send_signal(signal.SIGUSR1)
    with pytest.raises(subprocess.TimeoutExpired):
        train.wait(timeout=1.0)  # still preparing: SIGUSR1's default action would have ended it (138)
    assert pip is not None and is_alive(pip)
    stopped = stop(train, signal.SIGTERM)
    assert "SIGUSR1: no rank is running yet" in stopped[2]
    assert_stopped(job, train, stopped, signal.SIGTERM, "pip install -r requirements.txt")


def test_a_stop_during_the_code_download_ends_it_at_once(train_job, silent_server):
    job = train_job(SCRIPT, {"sagemaker_submit_directory": "s3://jobs/j1/sourcedir.tar.gz"})
    env = {
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{silent_server.getsockname()[1]}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    train = start(job, env)
    wait_for_client(silent_server)
    stopped = stop(train, signal.SIGTERM)
    assert_stopped(
        job, train, stopped, signal.SIGTERM, "fetching the code from s3://jobs/j1/sourcedir.tar.gz"
    )


# Stand-ins for libfabric's fi_info (no EFA device here). HANGING forks a helper that records its pid, then
# waits; LEAVING prints EFA's provider line and bytes that are not UTF-8, and exits leaving its helper behind.
HANGING_FI_INFO = """\
#!/bin/bash
sleep 300 &
echo $! > "$FI_INFO_HELPER.tmp" && mv "$FI_INFO_HELPER.tmp" "$FI_INFO_HELPER"
sleep 301
"""
LEAVING_FI_INFO = """\
#!/bin/bash
sleep 300 >/dev/null 2>&1 &
echo $! > "$FI_INFO_HELPER"
printf 'provider: efa\\n    caps: [ FI_MSG, FI_RMA ]\\n\\xff\\xfe\\n'
"""


@pytest.fixture
def fake_fi_info(tmp_path: Path) -> Iterator[Callable[[str], dict[str, str]]]:
    """make(script) -> the environment that puts it first on PATH as `fi_info`; the helper it forks is
    killed at the end if the launcher left it (tests leave nothing behind, whatever the launcher did)."""
    helper = tmp_path / "helper.pid"

    def make(text: str) -> dict[str, str]:
        bin_dir = tmp_path / "fake-bin"
        bin_dir.mkdir()
        (bin_dir / "fi_info").write_text(text)
        (bin_dir / "fi_info").chmod(0o755)
        return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FI_INFO_HELPER": str(helper)}

    yield make
    if helper.exists() and is_alive(pid := int(helper.read_text())):
        os.kill(pid, signal.SIGKILL)


def test_a_stop_during_the_efa_probe_ends_fi_info_and_its_child(train_job, tmp_path, fake_fi_info):
    job = train_job(SCRIPT)
    train = start(job, fake_fi_info(HANGING_FI_INFO))
    wait_for_file(tmp_path / "helper.pid")
    stopped = stop(train, signal.SIGTERM)
    helper = int((tmp_path / "helper.pid").read_text())
    assert helper in stopped[0]
    assert_stopped(job, train, stopped, signal.SIGTERM, "the EFA probe (fi_info)")


def test_a_probe_is_data_and_leaves_nothing_behind(train_job, tmp_path, fake_fi_info):
    """fi_info printing bytes that are not UTF-8 is read (EFA found), and the helper it left is killed."""
    job = train_job("import sys; print('the job ran', file=sys.stderr)\n")
    train = start(job, fake_fi_info(LEAVING_FI_INFO))
    stderr = end(train, 120)
    assert train.returncode == 0, stderr
    assert "EFA: libfabric's efa provider answers" in stderr
    assert "the job ran" in stderr
    assert not is_alive(int((tmp_path / "helper.pid").read_text()))
