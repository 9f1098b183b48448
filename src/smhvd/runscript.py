"""`python -m smhvd.runscript SCRIPT ARGS`: run a Python training script as `python SCRIPT ARGS` does, except
that a script that fails ends its process at once.

Why: a rank whose script raises (or calls sys.exit(3)) after MPI is initialised would, as a plain `python`
process, run its exit handlers next, and mpi4py's MPI_Finalize or Horovod's shutdown then wait for the other
ranks, which wait in a collective for this one: the job hangs until SageMaker's max_run. Here the traceback
is printed (through sys.excepthook, as Python would), the standard streams are flushed, and the process exits
with the script's code without running exit handlers, so the rank wrapper sees the failure and mpirun ends
the job on every host within seconds. `python -m mpi4py` does this with MPI_Abort; this works for any
framework.

A script that ends normally, or with sys.exit(0), exits as usual (exit handlers, MPI_Finalize). A
KeyboardInterrupt ends the process by SIGINT, as Python does, so a stop request stays a stop. The script runs
as `__main__` with its own directory first on sys.path and `sys.argv == [SCRIPT, *ARGS]`.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
from pathlib import Path
from types import TracebackType


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing more can be said
            stream.flush()


def _exit_now(status: int) -> None:
    _flush()
    os._exit(status)


def exit_status(code: object) -> int | None:
    """The process status of sys.exit(code); None for a clean exit (0 or None). Pure."""
    if code is None:
        return None
    if isinstance(code, bool) or not isinstance(code, int):
        return 1  # sys.exit("message") prints the message and exits 1
    return None if code == 0 else code & 0xFF


def script_frames(tb: TracebackType | None, script: str) -> TracebackType | None:
    """The traceback from the script's own first frame on (this module's and runpy's left out, as
    `python SCRIPT` shows it); None when the script never ran (a syntax error: the error alone)."""
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    return tb


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: python -m smhvd.runscript SCRIPT [ARGS...]\n")
        _exit_now(64)
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = str(Path(script).resolve().parent)  # as `python SCRIPT` sets it
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        status = exit_status(stop.code)
        if status is None:
            raise  # a clean exit: exit handlers run as usual
        if not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        _exit_now(status)
    except KeyboardInterrupt:
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as failure:  # any failure of the script: report it, then end without waiting
        trimmed = script_frames(failure.__traceback__, script)
        sys.excepthook(type(failure), failure.with_traceback(trimmed), trimmed)  # the hook prints value's own
        _exit_now(1)


if __name__ == "__main__":
    main(sys.argv[1:])
