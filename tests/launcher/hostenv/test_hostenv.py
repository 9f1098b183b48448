"""Each host's own environment for its ranks (hostenv/: what `train` holds, what a rank may trust), and the
interface a host really has (job)."""

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from smhvd.config.hardware import parse_route_device
from smhvd.config.job import with_usable_interface
from smhvd.config.sagemaker_files import parse_resource_config
from smhvd.env_options import FETCH_TIMEOUT, read_env_options
from smhvd.environment import host_env
from smhvd.errors import ConfigError, HostEnvError, HostEnvUnavailable
from smhvd.hostenv import client as hostenv_client
from smhvd.hostenv import server as hostenv
from smhvd.hostenv import trust
from smhvd.proc import processes
from smhvd.wire import HOSTENV_SERVED_FROM
from smhvd_dev.mltree import write_ml_tree
from support.ci import need_root
from support.jobs import bare_job
from tests.conftest import TRAIN


@contextlib.contextmanager
def served(path, env):
    """What `train` does for its ranks: its directory claimed, `env` held there while the block runs."""
    with hostenv.claimed(path), hostenv.serving(path, env):
        yield


def test_merge_host_env_below_the_leaders_forwarded_values_and_own_host_values_on_top():
    served = {  # what the worker's train computed for its ranks
        "USER_FLAG": "worker",
        "AWS_ENDPOINT_URL_S3": "http://s3.local",
        "HOROVOD_CYCLE_TIME": "1",
        "SM_CURRENT_HOST": "algo-2",
        "SM_NUM_CPUS": "4",
    }
    received = {  # what orted gave the rank: mpirun's forwarded names, ORTE's own variables
        "HOROVOD_CYCLE_TIME": "5",
        "SM_CURRENT_HOST": "algo-1",
        "SM_NUM_CPUS": "8",
        "OMPI_COMM_WORLD_RANK": "1",
    }
    assert hostenv_client.merge(received, served) == {
        "USER_FLAG": "worker",
        "AWS_ENDPOINT_URL_S3": "http://s3.local",
        "HOROVOD_CYCLE_TIME": "5",
        "SM_CURRENT_HOST": "algo-2",
        "SM_NUM_CPUS": "4",
        "OMPI_COMM_WORLD_RANK": "1",
    }


def test_every_variable_host_env_sets_is_a_host_key_a_rank_takes_from_its_own_host():
    """hostenv_client.HOST_KEYS (low, for the rank) names what environment.host_env sets: a key it missed
    would reach every rank with the leader's value."""
    resources = parse_resource_config(
        {
            "current_host": "algo-2",
            "hosts": ["algo-1", "algo-2"],
            "network_interface_name": "eth0",
            "current_instance_type": "ml.p4d.24xlarge",
        }
    )
    env = host_env(resources, {}, cpus=4, gpus=1, training_env={})
    assert set(env) <= hostenv_client.HOST_KEYS
    assert "SM_NETWORK_INTERFACE_NAME" in env and "SM_CURRENT_INSTANCE_TYPE" in env  # every optional one too


def free_port() -> int:
    return 20000 + (os.getpid() * 7 + threading.get_ident()) % 40000


@pytest.fixture
def port():
    port = free_port()
    yield port
    path = trust.directory(port)
    if path.exists() or path.is_symlink():
        subprocess.run(["rm", "-rf", str(path)], check=False)


SERVER = """
import sys, time
from smhvd.hostenv import server, trust
place = trust.directory(int(sys.argv[1]))
with server.claimed(place), server.serving(place, {"SM_CURRENT_HOST": "algo-2", "A": "1"}):
    print("serving", flush=True)
    time.sleep(3600)  # holds it, answering nothing: ranks read what it holds
"""


@pytest.fixture
def server(port, tmp_path):
    """A `train` stand-in in its own process (a rank checks the server's pid; a train keeps its place only
    while a process of that name runs), serving this port."""
    (tmp_path / "train").write_text(SERVER)
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "train"), str(port)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "serving"
    yield proc
    proc.kill()
    proc.wait()


def test_a_served_environment_reaches_this_hosts_ranks_and_is_gone_after_the_block(port):
    env = {"A": "1", "MULTI": "line\nbreak", "UNICODE": "\u00e9"}
    with served(trust.directory(port), env):
        path = trust.directory(port)
        assert trust.private_dir_problem(path, os.geteuid()) is None  # 0700, ours
        assert sorted(os.listdir(path)) == [trust.ENV_FD, trust.PID_FILE]  # the environment is not on disk
        assert hostenv_client.fetch(trust.directory(port)) == env
        assert hostenv_client.fetch(trust.directory(port)) == env  # every rank asks once
    assert not path.exists()
    with pytest.raises(HostEnvUnavailable, match=r"timed out after 0.3s waiting for this host's environment"):
        hostenv_client.fetch(
            trust.directory(port), timeout=0.3
        )  # nobody serves: a rank fails, never runs with another's identity


@contextlib.contextmanager
def held(port: int, pid: int, answer: bytes, sealed: bool = True) -> Iterator[None]:
    """A directory as `train` makes it, naming `pid` and an fd of this process that holds `answer` (a sealed
    memfd, as train's, unless `sealed` is false: then a plain file)."""
    path = trust.directory(port)
    path.mkdir(mode=0o700)
    (path / trust.PID_FILE).write_text(str(pid))
    if sealed:
        fd = os.memfd_create("answer", os.MFD_ALLOW_SEALING)
        os.write(fd, answer)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, hostenv.SEALS)
    else:
        (path / "plain").write_bytes(answer)
        fd = os.open(path / "plain", os.O_RDONLY)
    (path / trust.ENV_FD).write_text(str(fd))
    try:
        yield
    finally:
        os.close(fd)


@pytest.mark.integration  # starts processes
def test_a_garbled_answer_is_refused(port):
    refused = pytest.raises(HostEnvUnavailable, match=r"holds something other than an environment")
    with held(port, os.getpid(), json.dumps({"A": 1}).encode()), refused:  # values must be strings
        hostenv_client.fetch(trust.directory(port), timeout=2)


@pytest.mark.integration  # starts processes
def test_a_train_that_did_not_start_the_rank_is_refused(port):
    """Same user, the pid written in the directory answers, but it is not one of the rank's ancestors (another
    job's train on this host, say): refused before connecting. Its own train (an ancestor) is accepted."""
    env = {"SM_CURRENT_HOST": "algo-1"}
    with held(port, os.getpid(), json.dumps(env).encode()):  # this process holds it
        with pytest.raises(
            HostEnvUnavailable, match=r"served by pid \d+, which did not start this process: refused"
        ):
            hostenv_client.fetch(trust.directory(port), timeout=2, ancestors=processes.ancestors())
        assert hostenv_client.fetch(trust.directory(port), timeout=2, ancestors={os.getpid()}) == env


@pytest.mark.integration  # starts processes
def test_ancestors_are_the_chain_of_parents():
    code = (
        "import json, os; from smhvd.proc.processes import ancestors;"
        " print(json.dumps([os.getpid(), sorted(ancestors())]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    child, found = json.loads(out.stdout)
    assert {os.getpid(), os.getppid()} <= set(found) and child not in found


@pytest.mark.integration  # starts processes
def test_what_the_named_process_does_not_hold_sealed_is_refused(port):
    """Same user: the directory names an fd that is a plain file (anyone of that user could have written it),
    or a process that holds no such fd: refused, never read as an environment."""
    forged = b'{"PYTHONPATH": "/evil"}'
    with (
        held(port, os.getpid(), forged, sealed=False),
        pytest.raises(HostEnvUnavailable, match=rf"fd \d+ of pid {os.getpid()} is not what train holds"),
    ):
        hostenv_client.fetch(trust.directory(port), timeout=2)
    subprocess.run(["rm", "-rf", str(trust.directory(port))], check=True)
    with subprocess.Popen(["sleep", "30"]) as other:
        with (
            held(port, other.pid, forged),
            pytest.raises(
                HostEnvUnavailable, match=rf"timed out after 1s .*\(last: pid {other.pid} holds no fd \d+\)"
            ),
        ):
            hostenv_client.fetch(trust.directory(port), timeout=1)
        other.kill()


def _as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    """The system's Python as uid/gid 65534 (the venv's may live where that user cannot reach)."""
    return subprocess.run(
        ["/usr/bin/python3", "-c", code], user=65534, group=65534, capture_output=True, text=True,
        check=False, cwd="/", env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.mark.integration  # starts processes
def test_another_user_can_neither_read_nor_take_the_place(port, server):
    need_root("to act as another user")
    path = trust.directory(port)
    fd = (path / trust.ENV_FD).read_text()
    probe = _as_nobody(
        f"for name in ({str(path / trust.PID_FILE)!r}, '/proc/{server.pid}/fd/{fd}'):\n"
        "    try:\n        print(open(name).read())\n"
        "    except OSError as e:\n        print(type(e).__name__)\n"
    )
    assert probe.stdout.split() == ["PermissionError", "PermissionError"], probe.stdout + probe.stderr
    assert hostenv_client.fetch(trust.directory(port))["SM_CURRENT_HOST"] == "algo-2"


@pytest.mark.integration  # starts processes
def test_a_process_of_the_same_user_that_is_no_rank_can_read_what_train_holds_as_it_can_its_environ(
    port, server
):
    """The boundary docs/architecture.md states (issue 53.5): the uid, not the job. Any process of the same
    user (here one no `train` started: not a rank, not a descendant) reads the environment through
    /proc/PID/fd, credentials included when they are forwarded, as it reads `train`'s own /proc/PID/environ
    (the container's credentials); what only ranks get is the check that the environment is their own
    train's, not its secrecy."""
    fd = (trust.directory(port) / trust.ENV_FD).read_text()
    reader = (
        "import json, sys\n"
        "held = json.load(open(f'/proc/{sys.argv[1]}/fd/{sys.argv[2]}'))\n"
        "environ = open(f'/proc/{sys.argv[1]}/environ', 'rb').read()\n"
        "print(held['SM_CURRENT_HOST'], b'PATH=' in environ)\n"
    )
    stranger = subprocess.run(
        [sys.executable, "-c", reader, str(server.pid), fd], capture_output=True, text=True, check=False
    )
    assert stranger.stdout.split() == ["algo-2", "True"], stranger.stderr
    with pytest.raises(HostEnvUnavailable, match=r"which did not start this process: refused"):  # not a rank
        hostenv_client.fetch(trust.directory(port), timeout=1, ancestors=[os.getpid()])


@pytest.mark.integration  # starts processes
@pytest.mark.parametrize("how", ["other user", "group writable", "symlink"])
def test_a_place_taken_first_is_refused_by_train_and_by_ranks(port, tmp_path, how):
    """A squatter's directory (or a symlink to one): `train` refuses to serve there, a rank to trust it."""
    need_root("to act as another user")
    path = trust.directory(port)
    if how == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.mkdir(mode=0o700)
        if how == "other user":
            os.chown(path, 65534, 65534)
        else:
            path.chmod(0o770)
    refused = pytest.raises(HostEnvError, match=r"cannot serve this host's environment to its ranks: ")
    with refused, served(trust.directory(port), {"A": "1"}):
        pass
    with pytest.raises(HostEnvUnavailable, match=r"this host's environment is not trusted: "):
        hostenv_client.fetch(trust.directory(port), timeout=2)


@pytest.mark.integration  # starts processes
def test_a_live_train_keeps_its_place_and_a_stale_one_is_taken_over(port, server):
    with (
        pytest.raises(HostEnvError, match=rf"is in use by pid {server.pid}"),
        served(trust.directory(port), {"A": "2"}),
    ):
        pass
    assert hostenv_client.fetch(trust.directory(port))["A"] == "1"  # the refused second one removed nothing
    server.kill()  # gone without cleaning up: its directory and pid stay behind
    server.wait()
    with served(trust.directory(port), {"A": "3"}):
        assert hostenv_client.fetch(trust.directory(port))["A"] == "3"


@pytest.mark.integration  # starts processes
def test_a_place_whose_pid_is_now_another_kind_of_process_is_taken_over(port):
    path = trust.directory(port)
    path.mkdir(mode=0o700)
    with subprocess.Popen(["sleep", "60"]) as other:  # alive, but not a train
        (path / trust.PID_FILE).write_text(str(other.pid))
        with served(path, {"A": "4"}):
            assert hostenv_client.fetch(path)["A"] == "4"
        other.kill()


@pytest.mark.integration  # starts processes
def test_a_trains_pid_written_before_that_process_started_is_stale(port, server):
    path = trust.directory(port)
    hour_ago = time.time() - 3600
    os.utime(path / trust.PID_FILE, (hour_ago, hour_ago))  # the pid was written before this train started
    with served(path, {"A": "5"}):
        assert hostenv_client.fetch(path)["A"] == "5"


@pytest.mark.integration  # starts processes
def test_leaders_directories_left_by_killed_trains_are_reclaimed_and_no_other(server):
    dead = subprocess.run(["true"], check=True)  # a pid that is gone
    del dead
    made = {}
    for name, pid, age in (("gone", 999_999_999, 0.0), ("live", server.pid, 0.0), ("fresh", None, 0.0),
                           ("old", None, 3600.0)):  # fmt: skip
        path = hostenv.leader_directory()
        path.mkdir(mode=0o700)
        if pid is not None:
            (path / trust.PID_FILE).write_text(str(pid))
        (path / trust.ENV_FD).touch()
        when = time.time() - age
        os.utime(path, (when, when))
        made[name] = path
    removed = hostenv.reclaim_leaders_leftovers()
    try:
        assert {p for p in removed if p in made.values()} == {made["gone"], made["old"]}
        assert made["live"].is_dir() and made["fresh"].is_dir()
        assert not made["gone"].exists() and not made["old"].exists()
    finally:
        for path in made.values():
            subprocess.run(["rm", "-rf", str(path)], check=False)


def test_entries_of_the_wrong_kind_are_one_line_naming_them(tmp_path):
    path = tmp_path / "place"
    path.mkdir(mode=0o700)
    (path / trust.ENV_FD).mkdir()  # a directory where train writes its fd's number
    wrong = pytest.raises(HostEnvError, match=rf"cannot serve this host's environment: .*/{trust.ENV_FD}: ")
    with wrong, served(path, {"A": "1"}):
        pass
    missing = pytest.raises(HostEnvError, match=r"cannot create .*/missing/place: No such file or directory")
    with missing, served(tmp_path / "missing" / "place", {"A": "1"}):
        pass


@pytest.mark.integration  # starts processes
def test_100_ranks_asking_a_stopped_train_all_get_its_environment(port, server):
    """A stopped (or busy) `train` answers nothing, and need not: each rank reads what it holds."""
    os.kill(server.pid, signal.SIGSTOP)
    results: list[object] = []

    def ask():
        try:
            results.append(hostenv_client.fetch(trust.directory(port), timeout=30)["SM_CURRENT_HOST"])
        except HostEnvUnavailable as exc:
            results.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    os.kill(server.pid, signal.SIGCONT)
    assert results == ["algo-2"] * 100


def test_a_rank_on_the_leaders_host_asks_the_leaders_directory_elsewhere_its_workers(port, tmp_path):
    leaders = hostenv.leader_directory()
    with served(leaders, {"SM_CURRENT_HOST": "algo-1"}):
        assert hostenv_client.rank_directory({HOSTENV_SERVED_FROM: str(leaders)}, port) == leaders
        assert hostenv_client.fetch(leaders)["SM_CURRENT_HOST"] == "algo-1"
    gone = {HOSTENV_SERVED_FROM: str(leaders)}  # on a worker's host the leader's directory does not exist
    assert hostenv_client.rank_directory(gone, port) == trust.directory(port)
    elsewhere = {HOSTENV_SERVED_FROM: str(tmp_path)}  # only a directory where the leader makes them counts
    assert hostenv_client.rank_directory(elsewhere, port) == trust.directory(port)


@pytest.mark.integration  # starts processes
def test_a_rank_without_its_hosts_environment_fails_in_one_line(port):
    env = {
        **os.environ,
        HOSTENV_SERVED_FROM: "1",
        "SMHVD_SSH_PORT": str(port),
        "SMHVD_HOSTENV_TIMEOUT": "0.5",
    }
    env["OMPI_COMM_WORLD_RANK"] = "3"
    proc = subprocess.run(
        [sys.executable, "-m", "smhvd.rank", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 69
    assert proc.stderr.startswith("smhvd.rank: timed out after 0.5s waiting for this host's environment")
    assert proc.stderr.count("\n") == 1


@pytest.mark.integration  # starts processes
@pytest.mark.parametrize(
    ("env", "error"),
    [({"SMHVD_HOSTENV_TIMEOUT": "0.5"}, HostEnvUnavailable), ({"SMHVD_SSH_PORT": "port"}, ConfigError)],
)
def test_a_rank_exits_with_the_code_errors_py_gives_what_stopped_it(port, env, error):
    """One error, one exit code: the rank mapped every launcher error to 69, whatever errors.py said (the
    host environment's error was 73 in `train` and 69 in a rank; a bad SMHVD_SSH_PORT 78 in `train`)."""
    base = {**os.environ, HOSTENV_SERVED_FROM: "1", "SMHVD_SSH_PORT": str(port), "OMPI_COMM_WORLD_RANK": "3"}
    done = subprocess.run(
        [sys.executable, "-m", "smhvd.rank", "--", "true"],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == error.exit_code, done.stderr
    assert done.stderr.startswith("smhvd.rank: ") and done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "device"),
    [
        ("10.89.0.3 dev eth0 src 10.89.0.2 uid 0 \\    cache ", "eth0"),
        ("local 127.0.0.1 dev lo table local src 127.0.0.1 uid 0", "lo"),
        ("10.1.2.3 via 10.0.0.1 dev ens5 src 10.0.0.7 uid 0", "ens5"),
        ("RTNETLINK answers: Network is unreachable", None),
        ("", None),
    ],
)
def test_route_device(text, device):
    assert parse_route_device(text) == device


def _job(tmp_path, interface, instance_type="ml.c5.xlarge"):
    paths = write_ml_tree(
        tmp_path / "ml",
        current_host="algo-2",
        hosts=("algo-1", "algo-2", "algo-3"),
        network_interface_name=interface,
        instance_type=instance_type,
    )
    return bare_job(paths)


def test_a_named_interface_the_host_has_is_kept(tmp_path):
    job = _job(tmp_path, "eth0")
    assert with_usable_interface(job, {"lo", "eth0"}, lambda host: pytest.fail("no lookup needed")) is job


def test_a_missing_interface_becomes_the_one_routing_to_the_other_hosts(tmp_path, caplog):
    job = _job(tmp_path, "ethwe")
    asked = []

    def route(host):
        asked.append(host)
        return {"algo-1": None, "algo-3": "eth0"}[host]  # algo-1 does not resolve yet

    fixed = with_usable_interface(job, {"lo", "eth0"}, route)
    assert fixed == dataclasses.replace(
        job, resources=dataclasses.replace(job.resources, network_interface_name="eth0")
    )
    assert asked == ["algo-1", "algo-3"]  # never the host itself
    assert "network_interface_name 'ethwe' is not an interface of this host; using eth0" in caplog.text
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_in_an_sdks_local_mode_the_missing_interface_is_no_warning(tmp_path, caplog):
    """SDK v3's local mode names 'ethwe' in every run: docs/sdk.md says so once; the log does at DEBUG."""
    caplog.set_level(logging.DEBUG)
    job = _job(tmp_path, "ethwe", instance_type="local_cpu")
    fixed = with_usable_interface(job, {"lo", "eth0"}, lambda host: "eth0")
    assert fixed.resources.network_interface_name == "eth0"
    said = [r.levelname for r in caplog.records if "network_interface_name 'ethwe'" in r.getMessage()]
    assert said == ["DEBUG"]


def test_without_a_route_the_job_is_unchanged_for_validation_to_report(tmp_path):
    job = _job(tmp_path, "ethwe")
    assert with_usable_interface(job, {"lo", "eth0"}, lambda host: None, wait=0.05) is job
    assert with_usable_interface(job, {"lo", "eth0"}, lambda host: "docker0", wait=0.05) is job


READ_ONLY_RUN = (
    'mount --make-rprivate / && mount --bind /run /run && mount -o remount,bind,ro /run && exec "$@"'
)


@pytest.mark.integration
def test_train_with_a_read_only_run_exits_73_in_one_line_naming_the_directory(train_job):
    """/run read-only (in a mount namespace of the test's own): the leader cannot make its directory."""
    need_root("a mount namespace")
    job = train_job("print('never runs')", {"sagemaker_mpi_num_of_processes_per_host": 2})
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", READ_ONLY_RUN, "sh", str(TRAIN)],
        env={**os.environ, "SAGEMAKER_BASE_DIR": str(job.paths.base)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 73, result.stderr[-2000:]
    assert "never runs" not in result.stdout and "Traceback" not in result.stderr
    error = [line for line in result.stderr.splitlines() if "cannot create" in line]
    assert len(error) == 1 and re.search(
        r"cannot create /run/smhvd-hostenv-0-job-\w+: Read-only file system", error[0]
    )


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "nan", "inf", "1e9", "0.05", ""])
def test_a_bad_hostenv_timeout_is_a_configuration_error_not_a_silent_default(raw):
    """Empty too (issue 53.5): `SMHVD_HOSTENV_TIMEOUT=$UNSET` is a mistake, not "the default"."""
    with pytest.raises(ConfigError, match=r"^environment: SMHVD_HOSTENV_TIMEOUT: expected a number "):
        read_env_options({"SMHVD_HOSTENV_TIMEOUT": raw})
    assert read_env_options({"SMHVD_HOSTENV_TIMEOUT": "2.5"}).hostenv_timeout == 2.5
    assert read_env_options({}).hostenv_timeout == FETCH_TIMEOUT


@pytest.mark.integration  # starts `train`
def test_an_empty_hostenv_timeout_stops_train_with_78_naming_it_before_anything_runs(train_job):
    job = train_job("import pathlib; pathlib.Path('ran').touch()\n")
    done = job.run(env={"SMHVD_HOSTENV_TIMEOUT": ""})
    assert done.returncode == 78, done.stderr
    assert "SMHVD_HOSTENV_TIMEOUT: expected a number from 0.1 to 86400, got ''" in done.stderr
    assert (job.failure() or "").startswith("environment: SMHVD_HOSTENV_TIMEOUT: expected a number")
    assert not (job.code / "ran").exists()
