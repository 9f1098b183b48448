#!/usr/bin/env python3
"""Make the installed tensorpack 0.11 (PyPI's last release) run under TensorFlow 2 and NumPy >= 1.24.

tensorpack 0.11 calls a few TensorFlow 1 names through `tf.` that TensorFlow 2 has only under `tf.compat.v1`
(HorovodTrainer.initialize: `tf.global_variables`, which ends every Horovod job before its first step;
AccumGradOptimizer, MultiTowerOfflinePredictor, OnlinePredictor without a session, HookToCallback,
GraphProfiler, CheckGradient, BatchQueueInput), uses NumPy aliases removed in NumPy 1.24 (`np.float`,
`np.object`), and GPUUtilizationTracker asserts a GPU in `_before_train` even after it disabled itself under
MPI; and its `isinstance(v, tfv1.Variable)` checks miss TF 2's resource variables, so frozen variables and
BatchNorm statistics never reach MODEL_VARIABLES. Each edit below is the same call through the name that
exists (or the check with both variable classes); nothing else changes.

The image build and the dev setup run this once after `pip install tensorpack==0.11`, so every script in the
image (tensorpack's own examples included) gets the same library. It checks the version and that every text
it replaces is there exactly as expected, and fails naming the file otherwise: a different tensorpack is never
half-patched. Run again, it finds every edit applied and changes nothing.

usage: patch-tensorpack.py [--check]     (--check: exit 1 unless every edit is applied; change nothing)
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import py_compile
import sys
import warnings
from pathlib import Path

VERSION = "0.11"
MARKER = ".smhvd-tf2-patch"
NEEDS_GPU = '"[GPUUtilizationTracker] needs GPU!"'
EITHER_VARIABLE = "(tf.Variable, tf.compat.v2.Variable)"

# (file under the tensorpack package, text as released, replacement, occurrences)
EDITS: tuple[tuple[str, str, str, int], ...] = (
    (
        "train/trainers.py",
        "self._num_global_variables = len(tf.global_variables())",
        "self._num_global_variables = len(tf.compat.v1.global_variables())",
        1,
    ),
    (
        "predict/base.py",
        "self.sess = tf.get_default_session()",
        "self.sess = tf.compat.v1.get_default_session()",
        1,
    ),
    (
        "predict/multigpu.py",
        "with tf.variable_scope(tf.get_variable_scope(), reuse=idx > 0)",
        "with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=idx > 0)",
        2,
    ),
    ("callbacks/hooks.py", "sess = tf.get_default_session()", "sess = tfv1.get_default_session()", 1),
    ("tfutils/optimizer.py", "G = tf.get_default_graph()", "G = tfv1.get_default_graph()", 1),
    ("callbacks/prof.py", "opt = tf.RunOptions()", "opt = tf.compat.v1.RunOptions()", 1),
    (
        "callbacks/prof.py",
        "opt.trace_level = tf.RunOptions.FULL_TRACE",
        "opt.trace_level = tf.compat.v1.RunOptions.FULL_TRACE",
        1,
    ),
    ("callbacks/prof.py", "evt = tf.Event()", "evt = tf.compat.v1.Event()", 1),
    # GraphProfiler's step hook (and GPUMemoryTracker's, which TF 2 never reaches: it has no MaxBytesInUse op)
    (
        "callbacks/prof.py",
        "tf.train.SessionRunArgs(",
        "tf.compat.v1.train.SessionRunArgs(",
        2,
    ),
    (
        "callbacks/prof.py",
        "    def _before_train(self):\n        assert gpu_available_in_session(), " + NEEDS_GPU,
        "    def _before_train(self):\n        if self._enabled:\n"
        "            assert gpu_available_in_session(), " + NEEDS_GPU,
        1,
    ),
    # tfv1.Variable is the TF 1 class: a TF 2 resource variable is not one, so frozen variables and
    # BatchNorm's moving statistics never reached MODEL_VARIABLES (freeze_variables warned for each).
    ("tfutils/varreplace.py", "if isinstance(v, tf.Variable):", f"if isinstance(v, {EITHER_VARIABLE}):", 1),
    ("models/batch_norm.py", "if isinstance(v, tf.Variable):", f"if isinstance(v, {EITHER_VARIABLE}):", 2),
    (
        "tfutils/model_utils.py",
        "(tf.Tensor, tf.Variable)",
        "(tf.Tensor, tf.Variable, tf.compat.v2.Variable)",
        2,
    ),
    ("tfutils/summary.py", "(tf.Tensor, tf.Variable)", "(tf.Tensor, tf.Variable, tf.compat.v2.Variable)", 1),
    ("tfutils/gradproc.py", "grad = tf.check_numerics(", "grad = tf.debugging.check_numerics(", 1),
    ("input_source/input_source.py", "self.queue = tf.FIFOQueue(", "self.queue = tfv1.FIFOQueue(", 1),
    ("tfutils/symbolic_functions.py", "return tf.Print(", "return tfv1.Print(", 1),
    ("tfutils/symbolic_functions.py", "tf.log(", "tf.math.log(", 2),
    (
        "dataflow/image.py",
        "np.issubdtype(coords.dtype, np.float)",
        "np.issubdtype(coords.dtype, np.floating)",
        1,
    ),
    ("dataflow/serialize.py", "dtype=np.object)", "dtype=object)", 1),
)


class PatchError(Exception):
    pass


def package_dir() -> Path:
    spec = importlib.util.find_spec("tensorpack")  # finds the package without importing it (or TensorFlow)
    if spec is None or spec.origin is None:
        raise PatchError("tensorpack is not installed in this environment")
    return Path(spec.origin).parent


def plan(root: Path) -> dict[Path, str]:
    """The patched text of every file that needs an edit; {} when all are applied. PatchError on anything
    that is neither the released text nor the patched one."""
    version = importlib.metadata.version("tensorpack")
    if version != VERSION:
        raise PatchError(f"tensorpack {version} is installed; this patch is for tensorpack {VERSION} only")
    texts: dict[Path, str] = {}
    changed: set[Path] = set()
    for relative, old, new, count in EDITS:
        path = root / relative
        text = texts.setdefault(path, path.read_text())
        found = text.count(old)
        if found == 0 and text.count(new) >= count:
            continue  # applied already (the new text may also stand elsewhere in the released file)
        if found != count:
            raise PatchError(f"{path}: expected {count} occurrence(s) of {old!r}, found {found}")
        texts[path] = text.replace(old, new)
        changed.add(path)
    return {path: texts[path] for path in sorted(changed)}


def main(argv: list[str]) -> int:
    check_only = argv == ["--check"]
    if argv and not check_only:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    try:
        root = package_dir()
        pending = plan(root)
    except (PatchError, OSError) as e:
        print(f"patch-tensorpack: {e}", file=sys.stderr)
        return 1
    if check_only:
        if pending:
            print(f"patch-tensorpack: not applied to {', '.join(str(p) for p in pending)}", file=sys.stderr)
            return 1
        return 0
    for path, text in pending.items():
        path.write_text(text)
        for cached in (path.parent / "__pycache__").glob(path.stem + ".*.pyc"):
            cached.unlink()
        with warnings.catch_warnings():  # tensorpack's own docstrings have invalid escapes: compile them now,
            warnings.simplefilter("ignore")  # once, not at every first import of a user's job
            py_compile.compile(str(path), doraise=True)
    (root / MARKER).write_text(
        f"tensorpack {VERSION}: {len(EDITS)} edits (docker/scripts/patch-tensorpack.py)\n"
    )
    print(f"patch-tensorpack: {len(pending)} file(s) patched, {len(EDITS)} edits in place ({root})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
