"""What the pre-flight adds to a healthy job on the simulated cluster: the same short job through `train` with
`sagemaker_preflight=off` and `warn`, one rank a host, at 2, 4, 8, 16, 32 hosts, median of N runs each
(alternating, on one cluster a size). Prints the leader's `train` wall time with and without it, the added
seconds, the pre-flight's own time (its verdict's), and every host it named in the healthy runs (each one a
false alarm: nothing was made wrong). Root (network namespaces). Prints figures; asserts nothing.

    make bench-preflight BENCH_PREFLIGHT_ARGS='--hosts 2,4 --repeats 1'
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from smhvd_sim import Cluster, ClusterSpec

JOB = "import os\nprint('rank', os.environ.get('OMPI_COMM_WORLD_RANK'), 'ran')\n"


def run_once(cluster: Cluster, policy: str, ratio: float) -> tuple[float, dict[str, object] | None]:
    hyperparameters = {
        "sagemaker_program": "job.py",
        "sagemaker_mpi_num_of_processes_per_host": 1,
        "sagemaker_preflight": policy,
        "launcher_preflight_min_ratio": ratio,
    }
    for host in cluster.spec.host_names:
        tree = cluster.ml_dir(host)
        (tree / "input" / "config" / "hyperparameters.json").write_text(
            json.dumps({key: json.dumps(value) for key, value in hyperparameters.items()})
        )
        (tree / "output" / "data" / "job-summary.json").unlink(missing_ok=True)
    results = cluster.run(["train"], timeout=600)
    leader = results[cluster.leader]
    bad = {h: r.exit_code for h, r in results.items() if r.exit_code != 0}
    if bad or leader.seconds is None:
        raise SystemExit(f"bench-preflight: the job failed ({bad}); see {leader.log}")
    summary = json.loads(
        (cluster.ml_dir(cluster.leader) / "output" / "data" / "job-summary.json").read_text()
    )
    return leader.seconds, summary.get("preflight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="2,4,8,16,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-ratio", type=float, default=0.5, help="launcher_preflight_min_ratio")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-preflight-") as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        (code / "job.py").write_text(JOB)
        for hosts in (int(h) for h in args.hosts.split(",")):
            spec = ClusterSpec(hosts=hosts, workdir=Path(tmp) / f"c{hosts}", code_dir=code)
            walls: dict[str, list[float]] = {"off": [], "warn": []}
            own: list[float] = []
            first_words: list[float] = []
            named: Counter[str] = Counter()
            with Cluster(spec) as cluster:
                for _ in range(args.repeats):
                    for policy in ("off", "warn"):
                        seconds, verdict = run_once(cluster, policy, args.min_ratio)
                        walls[policy].append(seconds)
                        if verdict is not None:
                            own.append(float(verdict["seconds"]))  # type: ignore[arg-type]
                            if verdict.get("first_word_seconds") is not None:
                                first_words.append(float(verdict["first_word_seconds"]))  # type: ignore[arg-type]
                            for item in verdict["named"]:  # type: ignore[attr-defined]
                                named[f"{item['host']}: {item['reason'][:70]}"] += 1
            off, warn = statistics.median(walls["off"]), statistics.median(walls["warn"])
            launch = max(first_words, default=float("nan"))
            rows.append((hosts, off, warn, warn - off, statistics.median(own), launch, sum(named.values())))
            for what, count in sorted(named.items()):
                print(f"  {hosts} hosts, named in a healthy run ({count}x): {what}", flush=True)
            print(f"{hosts} hosts done at {time.strftime('%H:%M:%S')}", flush=True)
    print(
        f"\npre-flight cost, median of {args.repeats} (leader's train wall, s; min_ratio {args.min_ratio:g})"
    )
    print(
        "(first word, slowest run: mpirun's start -> any probe's first line, i.e. its launch; the pre-flight"
    )
    print(" calls a launch with no word after a third of its bound, 5 to 20 s, stalled)")
    header = (
        f"{'off':>6}  {'warn':>6}  {'added':>6}  {'pre-flight':>10}  {'first word':>10}  {'false alarms':>12}"
    )
    print(f"{'hosts':>5}  {header}")
    for hosts, off, warn, added, own_s, launch, false in rows:
        print(
            f"{hosts:>5}  {off:6.2f}  {warn:6.2f}  {added:+6.2f}  {own_s:10.2f}  {launch:10.2f}  {false:>12}"
        )


if __name__ == "__main__":
    main()
