"""``smhvd-cluster``: run a command (by default the launcher's ``train``) on a simulated SageMaker cluster.

    smhvd-cluster run --hosts 2 --code DIR --hp sagemaker_program=train.py --channel train=DATA -- train
    smhvd-cluster cleanup

Exit status of ``run``: 0 when every host exited 0, 1 when one did not, 124 at the timeout, 130 when
interrupted, 2 for bad arguments or when the cluster could not be brought up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from smhvd_sim import registry
from smhvd_sim.cluster import Cluster
from smhvd_sim.jobs import FAULT_KINDS, TIMEOUT_EXIT, Fault, FaultKind, HostResult
from smhvd_sim.spec import (
    DEFAULT_INSTANCE_TYPE,
    DEFAULT_ML_PATH,
    MAX_HOSTS,
    MIN_HOSTS,
    ClusterSpec,
    encode_hyperparameter,
)
from smhvd_sim.system import ClusterError, Interrupted

INTERRUPTED_EXIT = 130
USAGE_EXIT = 2


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _fault(text: str) -> Fault:
    """HOST:KIND@SECONDS, e.g. algo-2:kill@5 or all:term@10 (all: one fault per host)."""
    host, _, rest = text.partition(":")
    kind, _, at = rest.partition("@")
    if kind not in FAULT_KINDS:
        raise argparse.ArgumentTypeError(f"fault {text!r}: kind must be one of {', '.join(FAULT_KINDS)}")
    try:
        seconds = float(at)
    except ValueError:
        raise argparse.ArgumentTypeError(f"fault {text!r}: expected HOST:KIND@SECONDS") from None
    kind_checked: FaultKind = kind  # type: ignore[assignment]
    return Fault(host=host, kind=kind_checked, at=seconds)


def _json_file(path: str) -> dict[str, object]:
    try:
        content = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"{path}: {exc}") from None
    if not isinstance(content, dict):
        raise argparse.ArgumentTypeError(f"{path}: expected a JSON object")
    return content


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smhvd-cluster", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="bring hosts up, run a command on all at once, tear down")
    run.add_argument(
        "--hosts", "-n", type=int, default=2, help=f"number of hosts algo-1..algo-N ({MIN_HOSTS}-{MAX_HOSTS})"
    )
    run.add_argument("--workdir", type=Path, help="host trees and logs (default /tmp/smhvd-cluster/TIME-PID)")
    run.add_argument("--hyperparameters", type=_json_file, default={}, help="hyperparameters.json to give")
    run.add_argument(
        "--hp",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one hyperparameter; VALUE is JSON-encoded unless it is JSON already",
    )
    run.add_argument("--inputdataconfig", type=_json_file, default={}, help="inputdataconfig.json to give")
    run.add_argument(
        "--channel",
        type=_key_value,
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="copy DIR into every host's input/data/NAME",
    )
    run.add_argument("--code", type=Path, help="copy DIR to each host's ML_PATH/code (submit directory)")
    run.add_argument("--ml-path", type=Path, default=DEFAULT_ML_PATH, help="where hosts see their tree")
    run.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE)
    run.add_argument("--env", type=_key_value, action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("--timeout", type=float, default=900.0, help="seconds before every host is stopped")
    run.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL on stop")
    run.add_argument("--down", action="append", default=[], metavar="HOST", help="never start HOST's command")
    run.add_argument(
        "--fault",
        type=_fault,
        action="append",
        default=[],
        metavar="HOST:KIND@SECONDS",
        help=f"inject a fault; KIND: {', '.join(FAULT_KINDS)}; HOST may be 'all'",
    )
    run.add_argument("--ssh-client-config", action="store_true", help="add ~/.ssh/config: no host key checks")
    run.add_argument("--shared-tmp", action="store_true", help="hosts share the machine's /tmp")
    run.add_argument("--quiet", "-q", action="store_true", help="do not echo the hosts' output")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="command to run on every host (default: train)")
    commands.add_parser("cleanup", help="remove what clusters whose tool was killed left (bridges, links)")
    return parser


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    hyperparameters = {str(key): str(value) for key, value in args.hyperparameters.items()}
    hyperparameters.update({key: encode_hyperparameter(value) for key, value in args.hp})
    workdir = args.workdir or Path("/tmp/smhvd-cluster") / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return ClusterSpec(
        hosts=args.hosts,
        workdir=workdir.resolve(),
        hyperparameters=hyperparameters,
        inputdataconfig=args.inputdataconfig,
        channels={name: Path(directory).resolve() for name, directory in args.channel},
        code_dir=args.code.resolve() if args.code else None,
        ml_path=args.ml_path,
        instance_type=args.instance_type,
        private_tmp=not args.shared_tmp,
        ssh_client_config=args.ssh_client_config,
        env=dict(args.env),
    )


def expand_faults(faults: Sequence[Fault], hosts: Sequence[str]) -> list[Fault]:
    """Replace each fault on host 'all' by one per host."""
    return [
        Fault(host=host, kind=fault.kind, at=fault.at)
        for fault in faults
        for host in (hosts if fault.host == "all" else [fault.host])
    ]


def summary(results: dict[str, HostResult]) -> str:
    """One line per host: exit code (or why none), seconds from its start to its exit, log path."""
    lines = [f"{'host':<8} {'exit':>6} {'seconds':>8}  log"]
    for result in results.values():
        if result.timed_out:
            status = "timeout"
        elif result.exit_code is None:
            status = "down"
        else:
            status = str(result.exit_code)
        seconds = "-" if result.seconds is None else f"{result.seconds:.2f}"
        lines.append(f"{result.host:<8} {status:>6} {seconds:>8}  {result.log}")
    return "\n".join(lines)


def exit_status(results: dict[str, HostResult]) -> int:
    if any(result.timed_out for result in results.values()):
        return TIMEOUT_EXIT
    started = [result for result in results.values() if result.exit_code is not None]
    return 0 if started and all(result.exit_code == 0 for result in started) else 1


def cmd_run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    argv = [part for part in args.argv if part != "--"] or ["train"]
    faults = expand_faults(args.fault, spec.host_names)
    try:
        with Cluster(spec) as cluster:
            print(f"smhvd-cluster: {spec.hosts} hosts up in {spec.workdir}", file=sys.stderr, flush=True)
            results = cluster.run(
                argv,
                down=args.down,
                faults=faults,
                timeout=args.timeout,
                grace=args.grace,
                echo=None if args.quiet else sys.stdout,
            )
    except Interrupted as exc:
        print(f"smhvd-cluster: interrupted by {exc}; every host stopped and torn down", file=sys.stderr)
        return INTERRUPTED_EXIT
    print(summary(results), flush=True)
    return exit_status(results)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "cleanup":
            with registry.locked():
                removed = registry.clean_abandoned()
            print(f"smhvd-cluster: removed {len(removed)} abandoned cluster(s) {' '.join(removed)}".rstrip())
            return 0
        return cmd_run(args)
    except ClusterError as exc:
        print(f"smhvd-cluster: error: {exc}", file=sys.stderr)
        return USAGE_EXIT


if __name__ == "__main__":
    sys.exit(main())
