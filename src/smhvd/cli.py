"""`train`: the command SageMaker runs in the container (`docker run IMAGE train`).

The one place where errors become exit codes and failure-file text.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from smhvd.config.paths import SageMakerPaths
from smhvd.errors import EX_SOFTWARE, EX_USAGE, LauncherError, Stopped
from smhvd.report import failure

log = logging.getLogger("smhvd")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="train",
        description="Run a SageMaker training job with Horovod over Open MPI, configured from /opt/ml.",
    )
    parser.add_argument(
        "mode",
        nargs="?",
        default="train",
        choices=["train"],
        help="what SageMaker asks for (`docker run IMAGE train`); only training is supported",
    )
    parser.add_argument(
        "--base-dir",
        type=Path,
        default=None,
        help="the SageMaker root (env SAGEMAKER_BASE_DIR, default /opt/ml)",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("SMHVD_LOG_LEVEL") or None,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="launcher log level (env SMHVD_LOG_LEVEL; default: the SDK's sagemaker_container_log_level "
        "hyperparameter, else INFO)",
    )
    return parser.parse_args(argv)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[smhvd %(asctime)s] %(levelname)s %(message)s", "%H:%M:%S"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def _stop_before_start(signum: int, _frame: object) -> None:
    raise Stopped(f"stopped by {signal.Signals(signum).name} before the job started")


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse already printed the usage line
        return EX_USAGE if exc.code else 0
    configure_logging(args.log_level or "INFO")
    paths = SageMakerPaths(args.base_dir) if args.base_dir else SageMakerPaths.from_env()
    if args.base_dir:
        os.environ["SAGEMAKER_BASE_DIR"] = str(args.base_dir)
    from .launch import launch  # imported here so that `train --help` is instant

    # As PID 1 in a container, a signal without a handler is ignored: until a role installs its own
    # handling (signals.SignalWatch), a stop request aborts the preparation (code download, pip).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_before_start)
    try:
        return launch(paths, log_level_from_job=args.log_level is None)
    except Stopped as exc:
        log.warning("%s", exc)
        return exc.exit_code
    except LauncherError as exc:
        log.error("%s", exc)
        failure.write_failure(paths.failure_file, failure.compose(str(exc)))
        return exc.exit_code
    except Exception as exc:  # an internal error must still leave a reason for SageMaker
        log.exception("internal error")
        failure.write_failure(paths.failure_file, failure.compose(f"launcher internal error: {exc!r}"))
        return EX_SOFTWARE


if __name__ == "__main__":
    sys.exit(main())
