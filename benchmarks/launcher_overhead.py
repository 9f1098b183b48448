"""Launcher overhead on one host, np=2: `train` start -> rank 0 script start, script end -> `train` exit.

The same trivial script is also run under a bare `mpirun -np 2` as the floor: the difference is what the
launcher itself costs (config parsing, env, the rank wrapper's extra interpreter). Prints medians of N runs.
Usage: python benchmarks/launcher_overhead.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from smhvd_dev.mltree import write_ml_tree

SCRIPT = """
import json, os, sys, time
start = time.time()
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
out = sys.argv[sys.argv.index("--out") + 1]
end = time.time()
with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
    json.dump({"start": start, "end": end}, f)
"""


def one_run(argv: list[str], env: dict[str, str], out: Path) -> tuple[float, float]:
    for old in out.glob("rank-*.json"):
        old.unlink()
    t0 = time.time()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t1 = time.time()
    ranks = [json.loads(p.read_text()) for p in out.glob("rank-*.json")]
    assert len(ranks) == 2, f"expected 2 ranks, got {len(ranks)}"
    rank0_start = min(r["start"] for r in ranks)
    last_end = max(r["end"] for r in ranks)
    return rank0_start - t0, t1 - last_end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        code = root / "code"
        code.mkdir()
        (code / "bench.py").write_text(SCRIPT)
        out = root / "out"
        out.mkdir()
        paths = write_ml_tree(
            root / "ml",
            hyperparameters={
                "sagemaker_program": "bench.py",
                "sagemaker_submit_directory": str(code),
                "sagemaker_mpi_num_of_processes_per_host": 2,
                "out": str(out),
            },
        )
        train = str(Path(sys.executable).parent / "train")
        env = {**os.environ, "SAGEMAKER_BASE_DIR": str(paths.base)}
        mpirun = [
            "mpirun",
            "--allow-run-as-root",
            "-np",
            "2",
            "--bind-to",
            "none",
            sys.executable,
            str(code / "bench.py"),
            "--out",
            str(out),
        ]
        rows = {"train (this launcher)": [train], "bare mpirun (floor)": mpirun}
        results = {}
        for name, argv in rows.items():
            one_run(argv, env, out)  # warm the page cache
            samples = [one_run(argv, env, out) for _ in range(args.runs)]
            results[name] = (
                statistics.median(s[0] for s in samples),
                statistics.median(s[1] for s in samples),
            )
    print(f"np=2 on one host, median of {args.runs} runs")
    print(f"{'':24} {'start -> rank 0 running':>24} {'script end -> exit':>20}")
    for name, (start, end) in results.items():
        print(f"{name:24} {start:>22.3f} s {end:>18.3f} s")
    (t_start, t_end), (m_start, m_end) = results.values()
    print(f"launcher's own cost: +{t_start - m_start:.3f} s at start, +{t_end - m_end:.3f} s at exit")


if __name__ == "__main__":
    main()
