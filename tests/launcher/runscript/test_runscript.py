"""The script runner (src/smhvd/runscript/run.py) against plain `python SCRIPT`: every observable a script
has is compared with what the same interpreter gives it without the runner, in the same code directory (none
with a fixed value). The one intended difference, exit handlers skipped after a failure, is asserted on its
own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from smhvd.sourcecode import SCRIPT_RUNNER, program_command

pytestmark = pytest.mark.integration

OBSERVABLES = """
    import sys
    LOADED = sorted(sys.modules)  # before the script imports anything
    import json, os
    me = sys.modules["__main__"]
    print(json.dumps({
        "loaded_at_start": LOADED,
        "globals": sorted(globals()),
        "package": repr(__package__),
        "builtins": type(__builtins__).__name__,
        "file": __file__,
        "cached": repr(__cached__),
        "spec": repr(__spec__),
        "doc": repr(__doc__),
        "loader": [type(__loader__).__name__, __loader__.name, __loader__.path],
        "main_is_this_module": me.__dict__ is globals(),
        "argv": sys.argv,
        "path0": sys.path[0],
        "flags": list(sys.flags),
        "code_filename": sys._getframe().f_code.co_filename,
        "cwd": os.getcwd(),
    }))
"""

PICKLED_AT_EXIT = """
    import atexit, pickle, sys

    class Checkpoint:
        def __init__(self, step):
            self.step = step

    def save():
        data = pickle.dumps(Checkpoint(7))
        print("saved", pickle.loads(data).step, len(data) > 0)

    atexit.register(save)
    print("trained")
"""

SPAWNED_CHILD = """
    import multiprocessing, sys

    def child_view():
        return [list(sys.flags), sys.modules["__main__"].__name__, sys.modules["__main__"].__file__]

    if __name__ == "__main__":
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            print(pool.apply(child_view))
"""

PEP_366 = """
    if __package__ is None:
        print("run as a script: set up the package path here")
    import builtins
    print(__builtins__ is builtins)
"""

# Modules a user may well name as the standard library's, none of them loaded at the interpreter's start: the
# runner itself must not break on them (it did: `typing.py` made every rank exit 1 before the script started).
SHADOWING = {
    "typing.py": "NAME = 'the user typing'\n",
    "pkgutil.py": "NAME = 'the user pkgutil'\n",
    "weakref.py": "NAME = 'the user weakref'\n",
    "signal.py": "NAME = 'the user signal'\n",
    "contextlib.py": "NAME = 'the user contextlib'\n",
}
USES_SHADOWING = """
    import typing, pkgutil, signal
    print(typing.NAME, pkgutil.NAME, signal.NAME)
"""

FAILURES = {
    "raises": "def load():\n    raise KeyError('shard 7')\nload()\n",
    "syntax-error": "print('never')\nif True print(1)\n",
    "exit-message": "import sys\nsys.exit('no data in the channel')\n",
    "exit-3": "import sys\nsys.exit(3)\n",
    "exit-0": "import sys\nprint('done')\nsys.exit(0)\n",
    "unicode-and-encoding": "# -*- coding: latin-1 -*-\nprint('caf\xe9')\n",
}


def _write(code: Path, name: str, text: str) -> None:
    path = code / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name == "train.py" and "coding: latin-1" in text:
        path.write_bytes(text.encode("latin-1"))
    else:
        path.write_text(textwrap.dedent(text))


def run_both(
    code: Path, program: str = "train.py", args: tuple[str, ...] = ("--epochs", "3")
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The script as the launcher runs it (program_command, in the code directory) and as `python PROGRAM`."""
    runner = program_command(code / program, code, sys.executable)
    plain = [sys.executable, program]
    results = [
        subprocess.run([*argv, *args], cwd=code, capture_output=True, text=True, timeout=60, check=False)
        for argv in (runner, plain)
    ]
    return results[0], results[1]


def assert_same(ran: subprocess.CompletedProcess[str], plain: subprocess.CompletedProcess[str]) -> None:
    assert (ran.returncode, ran.stdout, ran.stderr) == (plain.returncode, plain.stdout, plain.stderr)


def test_the_script_sees_what_plain_python_gives_it(tmp_path):
    _write(tmp_path, "pkg/train.py", OBSERVABLES)
    ran, plain = run_both(tmp_path, "pkg/train.py")
    assert plain.returncode == 0, plain.stderr
    assert json.loads(ran.stdout) == json.loads(plain.stdout), ran.stderr
    assert json.loads(ran.stdout)["argv"] == ["pkg/train.py", "--epochs", "3"]  # as given, not absolute


def test_a_linked_script_sees_what_plain_python_gives_it(tmp_path):
    """sys.path[0] is the real directory, __file__ the link's path: both as python sets them."""
    _write(tmp_path / "real", "train.py", OBSERVABLES)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").symlink_to(tmp_path / "real" / "train.py")
    ran, plain = run_both(tmp_path / "code")
    assert plain.returncode == 0, plain.stderr
    assert json.loads(ran.stdout) == json.loads(plain.stdout), ran.stderr


@pytest.mark.parametrize(
    "script", [PICKLED_AT_EXIT, SPAWNED_CHILD, PEP_366], ids=["pickle-at-exit", "spawn-child", "pep-366"]
)
def test_the_script_behaves_as_under_plain_python(tmp_path, script):
    _write(tmp_path, "train.py", script)
    ran, plain = run_both(tmp_path)
    assert plain.returncode == 0 and plain.stdout, plain.stderr
    assert_same(ran, plain)


def test_modules_named_as_the_standard_librarys_shadow_for_the_script_alone(tmp_path):
    for name, text in SHADOWING.items():
        _write(tmp_path, name, text)
    _write(tmp_path, "train.py", USES_SHADOWING)
    ran, plain = run_both(tmp_path)
    assert plain.stdout == "the user typing the user pkgutil the user signal\n"
    assert_same(ran, plain)
    _write(tmp_path, "train.py", "print('started')\n")  # a script that imports none of them
    ran, plain = run_both(tmp_path)
    assert plain.stdout == "started\n"
    assert_same(ran, plain)


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_failures_are_reported_as_plain_python_reports_them(tmp_path, case):
    _write(tmp_path, "train.py", FAILURES[case])
    ran, plain = run_both(tmp_path)
    assert_same(ran, plain)


def test_a_missing_script_is_reported_as_plain_python_reports_it(tmp_path):
    ran, plain = run_both(tmp_path, "absent.py")
    assert plain.returncode == 2
    assert_same(ran, plain)


def test_after_a_failure_the_exit_handlers_are_skipped(tmp_path):
    """The one difference, and the runner's reason to exist: a handler that would wait for the other ranks
    (MPI_Finalize, Horovod's shutdown) never runs after the script failed; after a clean end it does."""
    script = "import atexit, sys\natexit.register(print, 'exit handler ran')\n{end}\n"
    _write(tmp_path, "train.py", script.format(end="raise RuntimeError('broke')"))
    ran, plain = run_both(tmp_path)
    assert "exit handler ran" in plain.stdout
    assert ran.returncode == plain.returncode == 1 and ran.stdout == "" and ran.stderr == plain.stderr
    _write(tmp_path, "train.py", script.format(end="print('done')"))
    assert_same(*run_both(tmp_path))


def test_the_runner_is_a_file_of_the_package_alone_in_its_folder():
    """While the runner starts its folder is first on sys.path: nothing there may shadow a module."""
    assert sorted(p.name for p in SCRIPT_RUNNER.parent.glob("*.py")) == ["__init__.py", "run.py"]


def test_through_train_the_script_runs_as_named_beside_standard_library_names(train_job):
    """End to end: two ranks under mpirun, the code directory holding modules named as the standard library's
    (a `typing.py` made every rank exit 1 before the script started); each rank sees its script as named."""
    job = train_job(
        """
        import sys
        print("argv0", sys.argv[0], "package", __package__, "safe_path", sys.flags.safe_path)
        """,
        {"sagemaker_mpi_num_of_processes_per_host": 2},
    )
    for name, text in SHADOWING.items():
        (job.code / name).write_text(text)
    result = job.run(timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = sorted(line.split(": ", 1)[1] for line in result.stdout.splitlines() if "argv0" in line)
    assert seen == ["argv0 train.py package None safe_path False"] * 2
