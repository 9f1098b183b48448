"""`python -m smhvd.runscript SCRIPT ARGS`: run a Python training script as `python SCRIPT ARGS` does, except
that a script that fails ends its process at once.

Why: a rank whose script raises (or calls sys.exit(3)) after MPI is initialised would, as a plain `python`
process, run its exit handlers next, and mpi4py's MPI_Finalize or Horovod's shutdown then wait for the other
ranks, which wait in a collective for this one: the job hangs until SageMaker's max_run. Here the traceback
is printed (through sys.excepthook, as Python would), the standard streams are flushed, and the process exits
with the script's code without running exit handlers, so the rank wrapper sees the failure and mpirun ends
the job on every host within seconds. `python -m mpi4py` does this with MPI_Abort; this works for any
framework.

A script that ends normally, or with sys.exit(0) (or sys.exit(False)), exits as usual (exit handlers,
MPI_Finalize). A KeyboardInterrupt prints its traceback and ends the process by SIGINT, as Python does, so a
stop request stays a stop. A sys.excepthook that itself raises or exits is reported as Python reports it (its
error, then the original), and the process ends at once all the same. The script runs as `__main__` with its
own directory first on sys.path and `sys.argv == [SCRIPT, *ARGS]`. Run as `python -P -m smhvd.runscript`: the
code directory is not on sys.path while this module imports what it needs (a `signal.py` or `json.py` of the
user's shadows nothing here), only from the script's start on, as under `python SCRIPT`.
"""

from __future__ import annotations

import sys

_LOADED_BEFORE = frozenset(sys.modules)  # what the interpreter had loaded before this module's own imports

import contextlib  # noqa: E402  (after the note of what was loaded before)
import os  # noqa: E402
import runpy  # noqa: E402
import signal  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from types import TracebackType  # noqa: E402


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing more can be said
            stream.flush()


def _exit_now(status: int) -> None:
    _flush()
    os._exit(status)


def sys_exit_status(code: object) -> int | None:
    """The process status `sys.exit(code)` gives; None for a clean exit (0, False, None). Pure."""
    if code is None:
        return None
    if isinstance(code, int):  # bool included: sys.exit(not ok)
        return (code & 0xFF) or None
    return 1  # sys.exit("message") prints the message and exits 1


def script_frames(tb: TracebackType | None, script: str) -> TracebackType | None:
    """The traceback from the script's own first frame on (this module's and runpy's left out, as
    `python SCRIPT` shows it); None when the script never ran (a syntax error: the error alone)."""
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    return tb


def report(failure: BaseException, script: str) -> int | None:
    """Print an uncaught exception as Python does, through sys.excepthook; when the hook itself raises, its
    error and then the original. The status a hook's sys.exit asked for, else None."""
    trimmed = script_frames(failure.__traceback__, script)
    failure = failure.with_traceback(trimmed)
    try:
        sys.excepthook(type(failure), failure, trimmed)
    except SystemExit as stop:
        traceback.print_exception(failure, file=sys.stderr)  # the hook exited without a word: the cause
        return sys_exit_status(stop.code) or 1
    except BaseException as broken:
        print("Error in sys.excepthook:", file=sys.stderr)
        traceback.print_exception(broken, file=sys.stderr)
        print("\nOriginal exception was:", file=sys.stderr)
        traceback.print_exception(failure, file=sys.stderr)
    return None


def forget_own_imports() -> None:
    """Take the modules this one imported out of sys.modules (it keeps its references): the script imports
    its own (a `signal.py` beside it) as it would under `python SCRIPT`."""
    for name in set(sys.modules) - _LOADED_BEFORE - {"__main__", "smhvd"}:
        del sys.modules[name]


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: python -m smhvd.runscript SCRIPT [ARGS...]\n")
        _exit_now(64)
    script = argv[0]
    sys.argv = list(argv)
    here = str(Path(script).resolve().parent)
    if sys.flags.safe_path:
        sys.path.insert(0, here)  # as `python SCRIPT` sets it
    else:
        sys.path[0] = here
    forget_own_imports()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        status = sys_exit_status(stop.code)
        if status is None:
            raise  # a clean exit: exit handlers run as usual
        if not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        _exit_now(status)
    except KeyboardInterrupt as interrupt:
        report(interrupt, script)
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as failure:  # any failure of the script: report it, then end without waiting
        _exit_now(report(failure, script) or 1)


if __name__ == "__main__":
    main(sys.argv[1:])
