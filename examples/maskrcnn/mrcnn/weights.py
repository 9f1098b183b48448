"""Pretrained backbone weights from an .npz, matched to the model's variables by name, with a report.

Tensorpack's ImageNet ResNet files name arrays like the variables here (`conv0/W`, `group0/block0/conv1/W`,
`.../bn/mean/EMA`), sometimes with TensorFlow's `:0` suffix; a classifier head (`linear/W`) goes unused. A
file of which no name matches is an error (loading nothing would silently train from scratch), and so is a
matching name whose array cannot fit the variable (another ResNet depth or width).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .data import DataError

Shape = tuple[int, ...]


def canonical(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name


def read_npz(path: Path) -> dict[str, NDArray[Any]]:
    """Every array of the file by canonical name; a file NumPy cannot read is a DataError naming it."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {canonical(k): z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"pretrained weights {path}: not a readable NumPy .npz ({e})") from None


def check_readable(path: Path) -> int:
    """The number of arrays, from the archive's directory only (cheap: nothing is decompressed)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            names = z.files
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"pretrained weights {path}: not a readable NumPy .npz ({e})") from None
    if not names:
        raise DataError(f"pretrained weights {path}: the .npz holds no arrays")
    return len(names)


@dataclass(frozen=True)
class WeightsMatch:
    matched: tuple[str, ...]  # names in both, with arrays that fit
    unused: tuple[str, ...]  # in the file only
    missing: tuple[str, ...]  # model variables the file does not provide (they keep their initialisation)
    misfit: tuple[tuple[str, Shape, Shape], ...]  # (name, file shape, variable shape): sizes differ


def match_weights(file_shapes: Mapping[str, Shape], model_shapes: Mapping[str, Shape]) -> WeightsMatch:
    """Compare by canonical name. An array with the variable's number of elements fits (tensorpack reshapes
    it, e.g. a (1, 1, C, K) kernel stored as (C, K))."""
    f = {canonical(k): tuple(v) for k, v in file_shapes.items()}
    m = {canonical(k): tuple(v) for k, v in model_shapes.items()}
    common = sorted(f.keys() & m.keys())
    misfit = tuple((n, f[n], m[n]) for n in common if int(np.prod(f[n])) != int(np.prod(m[n])))
    bad = {n for n, _, _ in misfit}
    return WeightsMatch(
        matched=tuple(n for n in common if n not in bad),
        unused=tuple(sorted(f.keys() - m.keys())),
        missing=tuple(sorted(m.keys() - f.keys())),
        misfit=misfit,
    )


def _some(names: tuple[str, ...], n: int = 4) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def report(path: Path, match: WeightsMatch) -> str:
    total = len(match.matched) + len(match.unused) + len(match.misfit)
    line = f"pretrained {path.name}: {len(match.matched)} of {total} arrays loaded by name"
    if match.matched:
        line += f" ({_some(match.matched)})"
    if match.unused:
        line += f"; {len(match.unused)} unused ({_some(match.unused)})"
    if match.missing:
        line += f"; {len(match.missing)} model variables not in the file keep their initialisation"
        line += f" ({_some(match.missing)})"
    return line


def check(path: Path, match: WeightsMatch, model_names: tuple[str, ...]) -> None:
    if match.misfit:
        name, fs, ms = match.misfit[0]
        raise DataError(
            f"pretrained weights {path}: array {name!r} has shape {fs}, the model's variable has {ms} "
            f"({len(match.misfit)} such arrays; check resnet_blocks / resnet_width)"
        )
    if not match.matched:
        raise DataError(
            f"pretrained weights {path}: no array name matches a model variable (the file has "
            f"{_some(match.unused, 3) or 'no arrays'}; the model has {_some(model_names, 3)}): "
            "expected a tensorpack-format ResNet .npz"
        )


def pretrained_init(path: Path, log: Callable[[str], None]) -> Any:
    """A tensorpack SessionInit that loads the matching arrays, logs the report, and fails clearly."""
    import tensorflow as tf
    from tensorpack.tfutils.sessinit import DictRestore, SessionInit
    from tensorpack.tfutils.varmanip import is_training_name

    arrays = read_npz(path)

    class _PretrainedInit(SessionInit):  # type: ignore[misc]  # tensorpack has no type information: Any
        def _run_init(self, sess: Any) -> None:
            variables = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            model = {
                v.op.name: tuple(v.shape.as_list())
                for v in variables
                if not is_training_name(v.name) and not v.op.name.startswith("global_step")
            }
            match = match_weights({k: a.shape for k, a in arrays.items()}, model)
            log(report(path, match))
            check(path, match, tuple(sorted(model)))
            DictRestore({n: arrays[n] for n in match.matched})._run_init(sess)

    return _PretrainedInit()
