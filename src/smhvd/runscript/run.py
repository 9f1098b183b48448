"""`python .../smhvd/runscript/run.py SCRIPT ARGS`: run a Python training script as `python SCRIPT ARGS` does,
except that a script that fails ends its process at once.

A failing rank's exit handlers (MPI_Finalize, Horovod's shutdown) would wait for the other ranks, which wait
in a collective for it: the job would hang until max_run. Here the traceback is printed (sys.excepthook), the
streams flushed, and the process exits with the script's code, skipping exit handlers (as `python -m mpi4py`
does). Everything else is what `python SCRIPT` gives the script (tests/launcher/runscript/test_runscript.py
compares each), so this file is run by its path, not with `-m`, and imports only what the interpreter loaded
at start: a user's `typing.py` or `signal.py` shadows nothing here.
"""

# No `from __future__ import annotations`: it imports __future__ before the note below (hence the quoted
# annotations).
import sys

_LOADED_BEFORE = frozenset(sys.modules)  # what the interpreter had loaded before this module's own imports

import builtins  # noqa: E402  (after the note of what was loaded before)
import io  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from importlib.machinery import SourceFileLoader  # noqa: E402

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType, ModuleType, TracebackType

USAGE = 64
INFLIGHT_FD = "SMHVD_INFLIGHT_FD"  # wire.INFLIGHT_FD (wire itself imports more than the interpreter had)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  (not contextlib: only what the interpreter had loaded is imported here)
            stream.flush()
        except Exception:  # noqa: S110  (a closed or broken stream: nothing more can be said)
            pass


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


def script_frames(tb: "TracebackType | None", script: str) -> "TracebackType | None":
    """The traceback from the script's own first frame on (this module's left out, as `python SCRIPT` shows
    it); None when the script never ran (a syntax error: the error alone)."""
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    return tb


def _print_exception(failure: BaseException) -> None:
    """As Python prints an uncaught exception itself (its own hook, which imports nothing)."""
    sys.__excepthook__(type(failure), failure, failure.__traceback__)


def report(failure: BaseException, script: str) -> int | None:
    """Print an uncaught exception as Python does, through sys.excepthook; when the hook itself raises, its
    error and then the original. The status a hook's sys.exit asked for, else None."""
    trimmed = script_frames(failure.__traceback__, script)
    failure = failure.with_traceback(trimmed)
    try:
        sys.excepthook(type(failure), failure, trimmed)
    except SystemExit as stop:
        _print_exception(failure)  # the hook exited without a word: the cause
        return sys_exit_status(stop.code) or 1
    except BaseException as broken:
        print("Error in sys.excepthook:", file=sys.stderr)
        _print_exception(broken)
        print("\nOriginal exception was:", file=sys.stderr)
        _print_exception(failure)
    return None


def forget_own_imports(loaded_before: frozenset[str] = _LOADED_BEFORE) -> None:
    """Take the modules this one imported out of sys.modules (it keeps its references): the script imports
    its own (a `signal.py` beside it) as it would under `python SCRIPT`."""
    for name in set(sys.modules) - loaded_before - {"__main__"}:
        del sys.modules[name]


def main_module(path: str) -> "ModuleType":
    """A fresh `__main__` for the script at `path` (absolute), with the globals `python SCRIPT` gives it."""
    module = type(sys)("__main__")
    module.__dict__.update(
        __annotations__={},
        __builtins__=builtins,
        __file__=path,
        __cached__=None,
        __loader__=SourceFileLoader("__main__", path),
    )
    return module


def compile_script(path: str) -> "CodeType":
    """The script's code, read and compiled as the interpreter does for `python SCRIPT` (its encoding
    declaration honoured). OSError when it cannot be read, SyntaxError when it does not compile."""
    with io.open_code(path) as file:
        source = file.read()
    return compile(source, path, "exec", dont_inherit=True)


def start_inflight() -> None:
    """In-flight is on (docs/inflight.md): this rank's steps recorded to the pipe its rank wrapper gave it,
    and the frameworks it measures with no code patched when the script imports them. The variable is taken
    out of the environment and the pipe is not inherited: the script's own children see neither."""
    fd = os.environ.pop(INFLIGHT_FD, "")
    if not fd.isdigit():
        return
    # only what the interpreter had loaded, and these:
    from smhvd.inflight import hooks, record

    if record.start(int(fd)) is not None:
        hooks.install()


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write(f"usage: python {__file__} SCRIPT [ARGS...]\n")
        _exit_now(USAGE)
    given = argv[0]
    # os.path, not pathlib: only what the interpreter loaded at start (see above)
    script = os.path.abspath(given)  # noqa: PTH100  (__file__ and code names: absolute, links kept)
    sys.argv = list(argv)
    here = os.path.dirname(os.path.realpath(given))  # noqa: PTH120  (sys.path[0]: the real directory)
    if sys.flags.safe_path:
        sys.path.insert(0, here)  # as `python SCRIPT` sets it
    else:
        sys.path[0] = here  # this file's own folder until now
    try:
        code = compile_script(script)
    except OSError as unreadable:
        reason = f"[Errno {unreadable.errno}] {unreadable.strerror}"
        print(f"{sys.executable}: can't open file {script!r}: {reason}", file=sys.stderr)
        _exit_now(2)
        return
    except BaseException as failure:  # a syntax error: reported as Python reports it, before anything ran
        _exit_now(report(failure, script) or 1)
        return
    module = main_module(script)
    forget_own_imports()
    start_inflight()
    sys.modules["__main__"] = module  # for good: exit handlers and pickle find the script's own classes
    try:
        exec(code, module.__dict__)  # noqa: S102  (the user's script, as `python SCRIPT` runs it)
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
