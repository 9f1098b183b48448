"""`train`: the command SageMaker runs in the container (`docker run IMAGE train`), and the one place where
errors become exit codes and failure-file text."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
from pathlib import Path

from smhvd.config.paths import SageMakerPaths
from smhvd.env_options import log_level, read_env_options
from smhvd.errors import EX_USAGE, ConfigError, LauncherError, Stopped, exit_for
from smhvd.proc import keeper
from smhvd.proc.signals import PreparationSignals
from smhvd.report import failure

log = logging.getLogger("smhvd")


def _log_level_arg(text: str) -> int:
    try:
        return log_level(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="train",
        description="Run a SageMaker training job with Horovod over Open MPI, configured from /opt/ml.",
    )
    parser.add_argument(
        "mode",
        nargs="?",
        default="train",
        choices=["train", "preflight"],
        help="what SageMaker asks for (`docker run IMAGE train`); `preflight`: check every host (or, without "
        "a SageMaker tree, this machine) and exit 0, or 75 naming what is wrong (docs/preflight.md)",
    )
    parser.add_argument(
        "--base-dir", type=Path, help="the SageMaker root (env SAGEMAKER_BASE_DIR, default /opt/ml)"
    )
    parser.add_argument(
        "--log-level",
        type=_log_level_arg,
        help="launcher log level: DEBUG, INFO, WARNING, ERROR (any case) or a number, 0 for every record "
        "(env SMHVD_LOG_LEVEL; default: the SDK's sagemaker_container_log_level hyperparameter, else INFO)",
    )
    return parser.parse_args(argv)


def set_level(level: int) -> None:
    """The launcher's log level; 0 (logging.NOTSET) logs every record, as it does on Python's root logger (on
    a named logger NOTSET would defer to the root's WARNING: the lowest level would show the least)."""
    log.setLevel(max(level, 1))


def configure_logging(level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[smhvd %(asctime)s] %(levelname)s %(message)s", "%H:%M:%S"))
    log.handlers[:] = [handler]
    set_level(level)
    log.propagate = False


def main(argv: list[str] | None = None) -> int:
    keeper.split()  # the launcher runs in a child, so that nothing of the job outlives this process
    PreparationSignals().install()  # first: a stop or SIGUSR1 may come at any time from here on
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except Stopped as exc:  # before the paths and the log were set up: nothing was started yet
        return exc.exit_code


def _main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage line
        return EX_USAGE if exc.code else 0
    bad_env: ConfigError | None = None
    try:  # every SMHVD_* variable, read once here: a bad one is exit 78 before anything else
        env_level = read_env_options(os.environ).log_level
        # None: neither says (the job's sagemaker_container_log_level then applies, else INFO)
        level = env_level if args.log_level is None else args.log_level
    except ConfigError as exc:  # reported below, once the log and the failure file can say it
        level, bad_env = args.log_level, exc
    configure_logging(logging.INFO if level is None else level)
    paths = SageMakerPaths(args.base_dir) if args.base_dir else SageMakerPaths.from_env()
    if args.base_dir:
        os.environ["SAGEMAKER_BASE_DIR"] = str(args.base_dir)
    if bad_env is not None:
        return _failed(paths, bad_env)
    preflight = args.mode == "preflight"
    if preflight and not paths.resource_config.exists():  # a workstation: this machine as a one-host job
        with tempfile.TemporaryDirectory(prefix="smhvd-preflight-") as tmp:
            alone = SageMakerPaths(Path(tmp))
            alone.config_dir.mkdir(parents=True)
            host = socket.gethostname()
            alone.resource_config.write_text(json.dumps({"current_host": host, "hosts": [host]}))
            os.environ["SAGEMAKER_BASE_DIR"] = tmp
            return _launch(alone, level, preflight=True)
    return _launch(paths, level, preflight=preflight)


def _launch(paths: SageMakerPaths, level: int | None, *, preflight: bool) -> int:
    try:
        from .launch import launch  # imported here so that `train --help` is instant

        return launch(paths, job_log_level=set_level if level is None else None, preflight_only=preflight)
    except Stopped as exc:
        log.warning("%s", exc)
        failure.write_failure(paths.failure_file, failure.compose(str(exc)))
        return exc.exit_code
    except LauncherError as exc:
        return _failed(paths, exc)
    except Exception as exc:  # an internal error must still leave a reason for SageMaker
        log.exception("internal error")
        return _failed(paths, exc)


def _failed(paths: SageMakerPaths, exc: Exception) -> int:
    """The error's exit code and reason (errors.exit_for): its first line in the log, all of it (within
    SageMaker's limit) in the failure file."""
    code, reason = exit_for(exc)
    if code == 0:  # the leader ended a pre-flight-only job well before this worker was ready
        log.info("%s", reason.splitlines()[0] if reason else "job succeeded")
        return 0
    head, _, detail = reason.partition("\n")
    if isinstance(exc, LauncherError):
        log.error("%s", head)
    failure.write_failure(paths.failure_file, failure.compose(head, detail))
    return code


def preflight(argv: list[str] | None = None) -> int:
    """`preflight`: the same as `train preflight` (an image's command: `docker run IMAGE preflight`, or a
    SageMaker job's container entry point, which may be given SageMaker's own `train` after it)."""
    args = sys.argv[1:] if argv is None else argv
    return main(["preflight", *(args[1:] if args[:1] == ["train"] else args)])


if __name__ == "__main__":
    sys.exit(main())
