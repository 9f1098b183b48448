"""Domain errors and the exit codes they map to (one place: cli.py turns them into exits).

Exit codes follow sysexits.h so that a launcher failure is never mistaken for a training script's own code:
when the job ran, `train` exits with mpirun's code (the failing rank's code, or 128+N for signal N).
"""

from __future__ import annotations

from pathlib import Path

EX_USAGE = 64  # bad command line
EX_NOINPUT = 66  # training code could not be fetched
EX_UNAVAILABLE = 69  # a peer host never came up, the leader was lost, or a rank has no host environment
EX_MPI_ABORT = 76  # Open MPI announced an abort (e.g. ranks cannot reach each other) and mpirun hung: ended
EX_SOFTWARE = 70  # internal error, or the code's requirements.txt failed to install
EX_CONFIG = 78  # malformed or inconsistent /opt/ml configuration
EX_TEMPFAIL = 75  # the pre-flight named a host (sagemaker_preflight=fail): rerun on new hosts
EX_CANTCREAT = 73  # this host's environment for its ranks could not be served (its directory is taken)
EX_NOT_STARTED = 127  # a rank's program could not be started (not found, not executable)
EX_STOPPED = 128 + 15  # stopped by SIGTERM (how SageMaker stops a job)


def exit_status(returncode: int) -> int:
    """A child's exit as a shell reports it: its code, or 128+N when signal N ended it (Popen's -N). Pure."""
    return returncode if returncode >= 0 else 128 - returncode


class LauncherError(Exception):
    """An error the launcher reports as one line, with a distinct exit code."""

    exit_code = EX_SOFTWARE


class ConfigError(LauncherError):
    """Bad configuration: names the file, the key and what was expected."""

    exit_code = EX_CONFIG

    def __init__(self, source: Path | str, key: str | None, expected: str, got: object = ...) -> None:
        self.source = str(source)
        self.key = key
        self.expected = expected
        where = f"{self.source}: {key}" if key else self.source
        message = f"{where}: expected {expected}"
        if got is not ...:
            message += f", got {_short(got)}"
        super().__init__(message)


class SourceError(LauncherError):
    """The training code (sagemaker_submit_directory; SDK v3: source_dir) could not be fetched or unpacked."""

    exit_code = EX_NOINPUT


class RequirementsError(LauncherError):
    """pip failed on the submitted requirements.txt."""

    exit_code = EX_SOFTWARE


class PeerError(LauncherError):
    """A host of the cluster could not be reached, or was lost."""

    exit_code = EX_UNAVAILABLE


class Stopped(BaseException):
    """A stop (SageMaker's StopTrainingJob: SIGTERM; Ctrl-C; a closed terminal) before the job started: raised
    by the preparation's signal handler (proc/signals.py) or by a role's event loop (peers, pre-flight).
    A BaseException, as KeyboardInterrupt is: no `except Exception` on the way (logging's handlers have one)
    may swallow it, or the stop would be lost. cli.py reports it as a stop (exit 143), not as an error."""

    exit_code = EX_STOPPED


class HostEnvError(LauncherError):
    """`train` cannot hold this host's environment for its ranks (its private directory is taken)."""

    exit_code = EX_CANTCREAT


class HostEnvUnavailable(LauncherError):
    """A rank (or the link's relay) cannot have, or must not trust, what its host's `train` holds."""

    exit_code = EX_UNAVAILABLE


class Ended(LauncherError):
    """The job ended before this worker ran it: the leader said why (its exit code and reason), or its link
    closed. The worker exits with that code and reason."""

    def __init__(self, exit_code: int, reason: str) -> None:
        super().__init__(reason)
        self.exit_code = exit_code


class WaitTimeout(LauncherError):
    """A bounded wait ran out; the message says what was awaited and the last error seen."""

    exit_code = EX_UNAVAILABLE


def exit_for(exc: BaseException) -> tuple[int, str]:
    """`train`'s exit code and failure reason when `exc` ended it: the one place they are decided (cli.py
    reports them; a leader that ends before the job starts tells its workers the same)."""
    if isinstance(exc, LauncherError | Stopped):
        return exc.exit_code, str(exc)
    return EX_SOFTWARE, f"launcher internal error: {exc!r}"


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
