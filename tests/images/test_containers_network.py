"""Containers of the CPU image on one container network, as SageMaker runs a multi-instance job: by hand (the
test starts each container) and through `bin/local-train.sh --hosts N`, the command a user types.

Each container is one instance: its own /opt/ml tree (resourceconfig.json naming it algo-K among algo-1..N),
the name algo-K as a network alias on a podman bridge network (netavark + aardvark-dns resolve it), a hostname
that is NOT algo-K in the test's own containers (SageMaker and the SDK's local mode do not promise one;
local-train.sh sets it), `train` as the command, and a user variable given only through the container's
environment (the estimator's `environment=`). What a user relies on: the Horovod job spans every container,
each rank sees its own host's SM_CURRENT_HOST and the environment of its container, every container exits 0 at
the end; when a rank on the last host crashes, every container exits within seconds with that rank's code, the
failure file names the rank and its host, and local-train.sh exits with that code and shows every host's.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from smhvd_dev.mltree import write_ml_tree

from .helpers import REPO, BuiltImage, record_timing, run

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(900)]

USER_VARIABLE = ("MYVAR", "set-only-in-the-container-environment")

# Every rank: Horovod init + an allreduce across all containers, then a record named after its rank.
# --mode crash: the rank(s) on --crash_host exit 3 a moment later; the others wait (mpirun must end them).
PROBE = """
import argparse, json, os, socket, sys, time
import tensorflow as tf
import horovod.tensorflow as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["ok", "crash"], default="ok")
parser.add_argument("--crash_host", default="")
args = parser.parse_args()
hvd.init()
total = float(hvd.allreduce(tf.constant(float(hvd.rank())), op=hvd.Sum))
record = {
    "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "sum_of_ranks": total, "hostname": socket.gethostname(),
    "sm_current_host": os.environ.get("SM_CURRENT_HOST"), "myvar": os.environ.get("MYVAR"),
    "time": time.time(),
}
out = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"rank-{hvd.rank()}.json")
with open(out + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(out + ".tmp", out)
print(f"rank {hvd.rank()} on {os.environ.get('SM_CURRENT_HOST')} done", flush=True)
if args.mode == "crash":
    if os.environ.get("SM_CURRENT_HOST") == args.crash_host:
        time.sleep(1.0)
        with open(out + ".crash", "w") as f:
            f.write(str(time.time()))
        marker = f"probe-crash-marker: rank {hvd.rank()} on {args.crash_host} gives up"
        print(marker, file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(300)
"""


@dataclass(frozen=True)
class Instance:
    alias: str  # algo-K: the SageMaker host name, a network alias
    hostname: str  # the container's hostname: deliberately something else
    container: str
    ml: Path  # its /opt/ml


def podman_time(text: str) -> float:
    """Epoch seconds from podman's `2026-11-23 10:41:07.123456789 +0000 UTC` timestamps."""
    date, clock, offset = text.split()[:3]
    whole, _, frac = clock.partition(".")
    parsed = datetime.strptime(f"{date} {whole} {offset}", "%Y-%m-%d %H:%M:%S %z")
    return parsed.timestamp() + float(f"0.{frac or 0}")


class Job:
    """N containers of one image on one network, each a SageMaker instance; removed at teardown."""

    def __init__(self, image: str, network: str, env: dict[str, str], root: Path) -> None:
        self.image, self.network, self.env, self.root = image, network, env, root
        self.instances: list[Instance] = []

    def start(self, hosts: int, hyperparameters: dict[str, object]) -> float:
        aliases = [f"algo-{k}" for k in range(1, hosts + 1)]
        tag = f"{self.network}-{len(self.instances)}"
        for alias in aliases:
            ml = self.root / alias / "ml"
            write_ml_tree(
                ml,
                current_host=alias,
                hosts=aliases,
                hyperparameters=hyperparameters,
                network_interface_name="eth0",
            )
            (ml / "code").mkdir(exist_ok=True)  # the writer makes code/, as SageMaker does
            (ml / "code" / "probe.py").write_text(PROBE)
            hostname = "box-" + alias.removeprefix("algo-")  # not the alias, as on SageMaker
            self.instances.append(Instance(alias, hostname, f"{tag}-{alias}", ml))
        start = time.monotonic()
        for inst in self.instances[-hosts:]:
            run(
                [
                    "podman",
                    "run",
                    "--detach",
                    "--name",
                    inst.container,
                    "--network",
                    self.network,
                    "--network-alias",
                    inst.alias,
                    "--hostname",
                    inst.hostname,
                    "--shm-size",
                    "256m",
                    "--volume",
                    f"{inst.ml}:/opt/ml",
                    "--env",
                    "=".join(USER_VARIABLE),
                    self.image,
                    "train",
                ],
                self.env,
                120,
            )
        return start

    def wait(self, timeout: float) -> dict[str, int]:
        """Each container's exit code (bounded: fails naming the containers still running)."""
        deadline = time.monotonic() + timeout
        codes: dict[str, int] = {}
        for inst in self.instances:
            left = max(1.0, deadline - time.monotonic())
            try:
                proc = run(["podman", "wait", inst.container], self.env, left)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{inst.container} still running after {timeout:.0f} s:\n{self.logs()}")
            codes[inst.alias] = int(proc.stdout.strip())
        return codes

    def finished_at(self, inst: Instance) -> float:
        out = run(["podman", "inspect", "--format", "{{.State.FinishedAt}}", inst.container], self.env, 60)
        return podman_time(out.stdout.strip())

    def logs(self) -> str:
        parts = []
        for inst in self.instances:
            proc = subprocess.run(
                ["podman", "logs", inst.container],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            parts.append(f"--- {inst.alias} ({inst.container})\n{(proc.stdout + proc.stderr)[-3000:]}")
        return "\n".join(parts)

    def records(self, inst: Instance) -> dict[str, dict[str, object]]:
        data = inst.ml / "output" / "data"
        return {p.name: json.loads(p.read_text()) for p in sorted(data.glob("rank-*.json"))}

    def remove(self) -> None:
        names = [inst.container for inst in self.instances]
        if names:
            subprocess.run(
                ["podman", "rm", "--force", "--time", "0", *names],
                env=self.env,
                capture_output=True,
                timeout=120,
                check=False,
            )


@pytest.fixture
def job(cpu_image: BuiltImage, podman_network: str, engine_env: dict[str, str], tmp_path: Path):
    j = Job(cpu_image.immutable, podman_network, engine_env, tmp_path)
    try:
        yield j
    finally:
        j.remove()


def hyperparameters(processes_per_host: int, **script: object) -> dict[str, object]:
    # What the SDK sends for distribution={"mpi": {"enabled": True, "processes_per_host": N,
    # "custom_mpi_options": "--mca btl_tcp_if_exclude lo"}} and entry_point="probe.py" (code at /opt/ml/code).
    return {
        "sagemaker_program": "probe.py",
        "sagemaker_submit_directory": "/opt/ml/code",
        "sagemaker_mpi_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": processes_per_host,
        "sagemaker_mpi_custom_mpi_options": "--mca btl_tcp_if_exclude lo",
        "sagemaker_container_log_level": 20,
        "sagemaker_job_name": "containers-network-test",
        **script,
    }


@pytest.mark.parametrize(("hosts", "per_host"), [(3, 1)])  # 2 x 2: through bin/local-train.sh, below
def test_horovod_job_across_containers_on_a_network(job: Job, hosts: int, per_host: int) -> None:
    start = job.start(hosts, hyperparameters(per_host, mode="ok"))
    codes = job.wait(timeout=300)
    seconds = time.monotonic() - start
    record_timing(f"containers-{hosts}x{per_host}-job", seconds)
    assert codes == {inst.alias: 0 for inst in job.instances}, job.logs()

    size = hosts * per_host
    ends = [job.finished_at(inst) for inst in job.instances]
    record_timing(f"containers-{hosts}x{per_host}-exit-spread", max(ends) - min(ends))
    for k, inst in enumerate(job.instances):
        ranks = range(k * per_host, (k + 1) * per_host)  # --map-by slot: hosts filled in order
        records = job.records(inst)
        assert sorted(records) == [f"rank-{r}.json" for r in ranks], job.logs()
        for local_rank, rank in enumerate(ranks):
            rec = records[f"rank-{rank}.json"]
            assert rec["size"] == size
            assert rec["sum_of_ranks"] == size * (size - 1) / 2  # the allreduce spanned every container
            assert (rec["local_rank"], rec["local_size"]) == (local_rank, per_host)
            assert rec["sm_current_host"] == inst.alias, rec
            assert rec["hostname"] == inst.hostname, rec  # the rank ran in this container
            assert rec["myvar"] == USER_VARIABLE[1], f"{inst.alias}: rank {rank} saw MYVAR={rec['myvar']!r}"
        assert not (inst.ml / "output" / "failure").exists(), (inst.ml / "output" / "failure").read_text()
    # Every container ends with the job, not a polling interval later (the toolkit's workers sleep 30 s; the
    # spread itself is recorded above: a bound that only such a wait reaches).
    assert max(ends) - min(ends) < 25.0, ends


# --- bin/local-train.sh --hosts 2 --processes-per-host 2: the same probe, as a user runs a multi-host job ---

LOCAL_TRAIN = REPO / "bin" / "local-train.sh"


def local_train(
    image: str, env: dict[str, str], tmp_path: Path, *command: str, **script: object
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`bin/local-train.sh --hosts 2 --processes-per-host 2` with the probe as the user's code, nothing else
    (the launcher's own mpirun defaults: the interface resourceconfig.json names)."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "probe.py").write_text(PROBE)
    hps = tmp_path / "hyperparameters.json"
    hps.write_text(json.dumps({"sagemaker_job_name": "local-train-hosts-test", **script}))
    argv = [
        "bash", str(LOCAL_TRAIN), "--hosts", "2", "--processes-per-host", "2", "--source", str(code),
        "--entry-point", "probe.py", "--hyperparameters", str(hps), "--env", "=".join(USER_VARIABLE),
        "--work", str(tmp_path / "job"), image, *command,
    ]  # fmt: skip
    start = time.monotonic()
    # bounded: the ranks left waiting by a crash sleep 300 s, so a job not ended by it fails here
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400, check=False)
    return proc, time.monotonic() - start


def left_by(env: dict[str, str], stderr: str) -> list[str]:
    """The containers and the network of the run whose first line names its network, if still there."""
    found = re.search(r"^local-train\.sh: 2 hosts \(algo-1 algo-2\) on network (\S+);", stderr, re.MULTILINE)
    assert found, stderr
    network = found.group(1)
    ps = ["podman", "ps", "-a", "--format", "{{.Names}}", "--filter", f"name=^{network}-algo-"]
    left = run(ps, env, 60).stdout.split()
    networks = run(["podman", "network", "ls", "--format", "{{.Name}}"], env, 60).stdout.split()
    return left + [f"network {network}"] * (network in networks)


def test_local_train_runs_2_hosts_x_2_processes(
    cpu_image: BuiltImage, engine_env: dict[str, str], tmp_path: Path
) -> None:
    proc, seconds = local_train(cpu_image.immutable, engine_env, tmp_path, mode="ok")
    record_timing("local-train-2x2-job", seconds)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    for k, alias in enumerate(("algo-1", "algo-2")):
        tree = tmp_path / "job" / alias
        config = json.loads((tree / "input" / "config" / "resourceconfig.json").read_text())
        assert (config["current_host"], config["hosts"]) == (alias, ["algo-1", "algo-2"])
        data = tree / "output" / "data"
        records = {p.name: json.loads(p.read_text()) for p in sorted(data.glob("rank-*.json"))}
        ranks = (2 * k, 2 * k + 1)  # --map-by slot: hosts filled in order
        assert sorted(records) == [f"rank-{r}.json" for r in ranks], log[-5000:]
        for local_rank, rank in enumerate(ranks):
            rec = records[f"rank-{rank}.json"]
            assert (rec["size"], rec["sum_of_ranks"]) == (4, 6.0)  # the allreduce spanned both containers
            assert (rec["local_rank"], rec["local_size"]) == (local_rank, 2)
            assert (rec["sm_current_host"], rec["hostname"]) == (alias, alias), rec
            assert rec["myvar"] == USER_VARIABLE[1]
        assert f"{alias} | " in proc.stdout  # each host's output, prefixed with its name
        assert f"local-train.sh: {alias} exited 0" in proc.stderr.splitlines()
        assert not (tree / "output" / "failure").exists()
    assert proc.stderr.splitlines()[-1].startswith("local-train.sh: exit 0; model: ")
    assert left_by(engine_env, proc.stderr) == []  # containers and network removed


def test_local_train_reports_a_crash_on_algo_2_on_every_host(
    cpu_image: BuiltImage, engine_env: dict[str, str], tmp_path: Path
) -> None:
    proc, seconds = local_train(cpu_image.immutable, engine_env, tmp_path, mode="crash", crash_host="algo-2")
    record_timing("local-train-2x2-crash", seconds)
    log = proc.stdout + proc.stderr
    # README: every host exits with the failing rank's code, and so does the command.
    assert proc.returncode == 3, log[-5000:]
    lines = proc.stderr.splitlines()
    for alias in ("algo-1", "algo-2"):
        failure = tmp_path / "job" / alias / "output" / "failure"
        headline = failure.read_text().splitlines()[0]
        assert re.fullmatch(r"rank [23] on algo-2 exited with code 3", headline), (alias, headline)
        assert f"local-train.sh: {alias} exited 3; {failure}: {headline}" in lines, log[-3000:]
    leader_failure = (tmp_path / "job" / "algo-1" / "output" / "failure").read_text()
    assert "probe-crash-marker: rank" in leader_failure and "on algo-2 gives up" in leader_failure
    assert any(line.startswith("local-train.sh: the job failed (exit 3): rank ") for line in lines), log[
        -3000:
    ]
    assert lines[-1].startswith("local-train.sh: exit 3; model: ")
    assert left_by(engine_env, proc.stderr) == []


def test_local_train_preflight_checks_both_hosts(
    cpu_image: BuiltImage, engine_env: dict[str, str], tmp_path: Path
) -> None:
    """README: `--hosts 2 ... preflight` checks two containers as two hosts (the network between them too)."""
    proc, seconds = local_train(cpu_image.immutable, engine_env, tmp_path, "preflight")
    record_timing("local-train-2-hosts-preflight", seconds)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert "pre-flight: all 2 host(s) fine" in log, log[-5000:]
    assert "WARNING pre-flight" not in log, log[-5000:]  # two containers of 64 MB /dev/shm: enough for CPU
    assert not list((tmp_path / "job").glob("algo-*/output/data/rank-*.json"))  # no script ran
