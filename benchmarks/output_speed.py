"""Rank output through `train` against plain `mpirun --tag-output`: lines/s, MB/s, their ratio, broken lines.

Every rank prints LINES lines of SIZE bytes as fast as it can (an unbuffered print: text and newline in two
writes, as PYTHONUNBUFFERED=1 makes Python do). A side's output time is its wall time minus the same side's
wall time for an empty job (so the launchers' start and end are not counted), median of --repeats runs.
A line counts as broken when it arrived cut, glued to another or not at all. 1 host x 2 ranks runs here;
2 hosts x 2 ranks runs on the simulated cluster (root; plain mpirun reaches algo-2 through a test sshd).
Usage: python benchmarks/output_speed.py [--sizes 100,1000] [--hosts 1,2] [--repeats 3] [--megabytes 20]
Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_common import (
    PYTHON,
    SSHD_CONFIG,
    conditions,
    configure,
    run_sagemaker,
    start_test_sshds,
    stop_test_sshds,
)

from smhvd_dev.mltree import write_ml_tree
from smhvd_sim import Cluster, ClusterSpec

WRITER = """
import argparse, os
parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int)
parser.add_argument("--size", type=int)
args = parser.parse_args()
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
lines, size = args.lines, args.size
for i in range(lines):
    head = f"r{rank} n{i:07d} "
    print(head + "x" * (size - len(head) - 4) + " end")
"""
LINE = re.compile(rb"r(\d+) n(\d{7}) (x*) end")
WRITTEN = re.compile(rb"r\d+ n\d{7} ")
TAG = re.compile(rb"\[[^\]\n]*\]<stdout>: ?")


def broken_lines(text: bytes, ranks: int, lines: int, size: int) -> int:
    """Lines that did not arrive exactly once, whole and tagged."""
    seen: set[tuple[int, int]] = set()
    broken = 0
    for line in text.split(b"\n"):
        if not WRITTEN.search(line):
            continue  # not the writer's (the launcher's own log lines)
        tagged = TAG.match(line)
        found = LINE.fullmatch(line, tagged.end()) if tagged else None
        if found is None or len(line) - tagged.end() != size:
            broken += 1
            continue
        key = (int(found.group(1)), int(found.group(2)))
        if key in seen:
            broken += 1
        seen.add(key)
    return broken + ranks * lines - len(seen)


def timed(run: Callable[[], bytes]) -> tuple[float, bytes]:
    began = time.monotonic()
    output = run()
    return time.monotonic() - began, output


def one_host(code: Path, root: Path, lines: int, size: int) -> dict[str, Callable[[int], bytes]]:
    """The two sides on this machine, each a function of the lines per rank returning the job's log."""
    train = str(Path(sys.executable).parent / "train")

    def ours(n: int) -> bytes:
        paths = write_ml_tree(
            root / f"ml-{size}-{n}",
            hyperparameters={
                "sagemaker_program": "writer.py",
                "sagemaker_submit_directory": str(code),
                "sagemaker_mpi_num_of_processes_per_host": 2,
                "lines": n,
                "size": size,
                "sagemaker_preflight": "off",  # output is measured here, the pre-flight by preflight_cost.py
            },
        )
        env = {**os.environ, "SAGEMAKER_BASE_DIR": str(paths.base), "SMHVD_LOG_LEVEL": "WARNING"}
        return capture([train], env, root)

    def plain(n: int) -> bytes:
        argv = ["mpirun", "--allow-run-as-root", "--tag-output", "-np", "2", "--bind-to", "none"]
        argv += [PYTHON, str(code / "writer.py"), "--lines", str(n), "--size", str(size)]
        return capture(argv, {**os.environ, "PYTHONUNBUFFERED": "1"}, root)

    return {"train": ours, "mpirun --tag-output": plain}


def capture(argv: list[str], env: dict[str, str], root: Path) -> bytes:
    out = root / "log"
    with out.open("wb") as log:
        subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return out.read_bytes()


def two_hosts(cluster: Cluster, size: int) -> dict[str, Callable[[int], bytes]]:
    def ours(n: int) -> bytes:
        args = {"lines": str(n), "size": str(size), "sagemaker_preflight": "off"}  # output, not the checks
        configure(cluster, 2, 2, "writer.py", args)
        run = run_sagemaker(cluster, ["train"], 2, timeout=300.0)
        assert all(code == 0 for code in run.exits.values()), run.exits
        return (cluster.host_dir("algo-1") / "train.log").read_bytes()

    def plain(n: int) -> bytes:
        argv = ["mpirun", "--allow-run-as-root", "--tag-output", "-np", "4", "-H", "algo-1:2,algo-2:2"]
        argv += [
            "--bind-to",
            "none",
            "--mca",
            "plm_rsh_no_tree_spawn",
            "1",
            "-x",
            "PATH",
            "-x",
            "PYTHONUNBUFFERED",
        ]
        argv += [PYTHON, "/opt/ml/code/writer.py", "--lines", str(n), "--size", str(size)]
        log = cluster.host_dir("algo-1") / "plain.log"
        sshds = start_test_sshds(cluster, ["algo-2"])  # on train's port: only while plain mpirun runs
        try:
            process = cluster.start(
                "algo-1", argv, env={"PYTHONUNBUFFERED": "1"}, log=log, end_host_on_exit=True
            )
            code = process.wait(600.0)
            process.finish_output()
        finally:
            stop_test_sshds(cluster, sshds)
        assert code == 0, log.read_text()[-2000:]
        return log.read_bytes()

    return {"train": ours, "mpirun --tag-output": plain}


def measure(
    sides: dict[str, Callable[[int], bytes]], ranks: int, lines: int, size: int, repeats: int
) -> list[str]:
    rows = []
    figures: dict[str, float] = {}
    for name, side in sides.items():
        empty = statistics.median(timed(functools.partial(side, 0))[0] for _ in range(repeats))
        runs = [timed(functools.partial(side, lines)) for _ in range(repeats)]
        seconds = max(1e-3, statistics.median(t for t, _ in runs) - empty)
        broken = [broken_lines(out, ranks, lines, size) for _, out in runs]
        total = ranks * lines
        figures[name] = seconds
        rate = f"{total / seconds:10.0f} lines/s  {total * size / seconds / 1e6:7.1f} MB/s"
        rows.append(
            f"  {name:22} {seconds:7.2f} s  {rate}  broken {'/'.join(map(str, broken))} of {total}"
            f"  (empty job {empty:.2f} s)"
        )
    ratio = figures["train"] / figures["mpirun --tag-output"]
    rows.append(f"  output time, train / mpirun --tag-output: {ratio:.2f}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--hosts", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--megabytes", type=float, default=20.0, help="output of the whole job per size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    hosts = [int(h) for h in args.hosts.split(",")]
    print(conditions())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        code = root / "code"
        code.mkdir()
        (code / "writer.py").write_text(WRITER)
        if 1 in hosts:
            for size in sizes:
                lines = int(args.megabytes * 1e6 / size / 2)
                print(f"\n1 host x 2 ranks, {lines} lines of {size} bytes per rank, median of {args.repeats}")
                print("\n".join(measure(one_host(code, root, lines, size), 2, lines, size, args.repeats)))
        if 2 in hosts:
            (root / "sshd_config").write_text(SSHD_CONFIG)
            spec = ClusterSpec(
                hosts=2,
                workdir=root / "cluster",
                code_dir=code,
                ssh_client_config=True,
                extra_binds=((root / "sshd_config", Path("/etc/ssh/sshd_config")),),
            )
            with Cluster(spec) as cluster:
                for size in sizes:
                    lines = int(args.megabytes * 1e6 / size / 4)
                    what = f"{lines} lines of {size} bytes per rank, median of {args.repeats}"
                    print(f"\n2 hosts x 2 ranks, {what}")
                    print("\n".join(measure(two_hosts(cluster, size), 4, lines, size, args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
