"""Containers of the CPU image on one container network, as SageMaker runs a multi-instance job.

Each container is one instance: its own /opt/ml tree (resourceconfig.json naming it algo-K among algo-1..N),
the name algo-K as a network alias on a podman bridge network (netavark + aardvark-dns resolve it), a hostname
that is NOT algo-K (SageMaker and the SDK's local mode do not promise one), `train` as the command, and a user
variable given only through the container's environment (the estimator's `environment=`). What a user relies
on: the Horovod job spans every container, each rank sees its own host's SM_CURRENT_HOST and the environment
of its container, every container exits 0 at the end; when a rank on the last host crashes, every container
exits within seconds with that rank's code and the failure file names the rank and its host.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from smhvd_dev.mltree import write_ml_tree

from .helpers import BuiltImage, record_timing, run, wait_until

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


@pytest.mark.parametrize(("hosts", "per_host"), [(2, 2), (3, 1)])
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


def test_crash_on_the_last_host_ends_every_container(job: Job) -> None:
    hosts = 3
    last = f"algo-{hosts}"
    job.start(hosts, hyperparameters(1, mode="crash", crash_host=last))
    crash_file = job.instances[-1].ml / "output" / "data" / f"rank-{hosts - 1}.json.crash"

    def crashed() -> bool:
        if crash_file.exists():
            return True
        leader = job.instances[0].container
        state = run(["podman", "inspect", "--format", "{{.State.Status}}", leader], job.env, 60).stdout
        assert state.strip() == "running", f"{leader} is {state.strip()} before the crash:\n{job.logs()}"
        return False

    wait_until(f"the rank on {last} to crash", crashed, timeout=240)
    crashed_at = float(crash_file.read_text())
    codes = job.wait(timeout=60)  # the other ranks sleep 300 s: ended by the crash, or this times out
    ends = {inst.alias: job.finished_at(inst) for inst in job.instances}
    slowest = max(ends.values()) - crashed_at
    record_timing("containers-3-crash-to-last-exit", slowest)
    # README: every host exits with the failing rank's code (mpirun's), at once.
    assert codes == {inst.alias: 3 for inst in job.instances}, job.logs()
    for inst in job.instances:
        failure = (inst.ml / "output" / "failure").read_text()
        assert f"rank {hosts - 1} on {last} exited with code 3" in failure, (inst.alias, failure)
    leader_failure = (job.instances[0].ml / "output" / "failure").read_text()
    assert f"probe-crash-marker: rank {hosts - 1} on {last} gives up" in leader_failure
