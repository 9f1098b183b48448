"""Weights from an .npz, matched to the model's variables by name, with a report per part of the model.

Names follow tensorpack's FasterRCNN example (`conv0/W`, `group0/block0/conv1/W`, `.../bn/mean/EMA`,
`fpn/...`, `rpn/...`, `fastrcnn/fc6/W`, `fastrcnn/outputs/class/W`, `maskrcnn/fcn0/W`...), sometimes with
TensorFlow's `:0` suffix, so its ImageNet ResNets and its published COCO models load as they are. Two uses:
- pretrained weights for training (`pretrained_init`): every array that fits is loaded; the class-specific
  outputs (box classifier and regressor, mask predictor) of a model trained on another class count are left
  at their initialisation (fine-tuning); any other array that does not fit, or a file of which no name
  matches, is an error (loading nothing would silently train from scratch);
- a model to evaluate (`model_init`): the file must hold every variable of the model with its shape, or
  predictions would come from random weights.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .config import LR_NAME
from .data import DataError

Shape = tuple[int, ...]

# The parts of the model, in the order they are reported; the name of each variable belongs to the first
# pattern that matches it.
GROUPS: tuple[tuple[str, str], ...] = (
    ("backbone", r"(conv0|group\d+)/"),
    ("FPN", r"fpn/"),
    ("RPN", r"rpn/"),
    ("box head", r"fastrcnn/fc\d+/"),
    ("box outputs", r"fastrcnn/outputs/"),
    ("mask head", r"maskrcnn/(fcn\d+|deconv)/"),
    ("mask outputs", r"maskrcnn/conv/"),
)
# Their shapes depend on the number of classes: another data set re-initialises them.
CLASS_SPECIFIC = frozenset({"box outputs", "mask outputs"})


def canonical(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name


def group_of(name: str) -> str:
    return next((g for g, pattern in GROUPS if re.match(pattern, name)), "other")


def read_npz(path: Path) -> dict[str, NDArray[Any]]:
    """Every array of the file by canonical name; a file NumPy cannot read is a DataError naming it."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {canonical(k): z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"weights {path}: not a readable NumPy .npz ({e})") from None


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

    @property
    def skipped(self) -> tuple[tuple[str, Shape, Shape], ...]:
        """Misfits of the class-specific outputs: left at their initialisation when fine-tuning."""
        return tuple(m for m in self.misfit if group_of(m[0]) in CLASS_SPECIFIC)


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


def _some(names: tuple[str, ...] | list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def _classes(match: WeightsMatch, names: tuple[str, ...]) -> str:
    """'81 classes in the file, the model has 4' from the box classifier's bias, when it is among `names`."""
    for name, file_shape, model_shape in match.misfit:
        if name == "fastrcnn/outputs/class/b" and name in names:
            return f": {file_shape[0]} classes (with background) in the file, {model_shape[0]} in the model"
    return ""


def report_lines(path: Path, match: WeightsMatch) -> list[str]:
    """One line per part of the model (as tensorpack's --load reports): loaded, re-initialised, not in the
    file; then the file's arrays that no variable uses."""
    lines = []
    by_group: dict[str, dict[str, list[str]]] = {}
    for kind, names in (
        ("loaded", list(match.matched)),
        ("skipped", [n for n, _, _ in match.skipped]),
        ("misfit", [n for n, _, _ in match.misfit if group_of(n) not in CLASS_SPECIFIC]),
        ("missing", list(match.missing)),
    ):
        for name in names:
            by_group.setdefault(group_of(name), {}).setdefault(kind, []).append(name)
    for group in [g for g, _ in GROUPS] + ["other"]:
        kinds = by_group.get(group)
        if not kinds:
            continue
        total = sum(len(v) for v in kinds.values())
        parts = [f"{len(kinds.get('loaded', []))} of {total} arrays loaded"]
        if "skipped" in kinds:
            skipped = tuple(kinds["skipped"])
            parts.append(f"{len(skipped)} re-initialised for another class count{_classes(match, skipped)}")
        if "misfit" in kinds:
            parts.append(f"{len(kinds['misfit'])} of another shape ({_some(kinds['misfit'])})")
        if "missing" in kinds:
            parts.append(f"{len(kinds['missing'])} not in the file keep their initialisation")
        lines.append(f"weights {path.name}: {group}: " + "; ".join(parts))
    if match.unused:
        lines.append(f"weights {path.name}: {len(match.unused)} arrays unused ({_some(match.unused)})")
    return lines


def check_pretrained(path: Path, match: WeightsMatch, model_names: tuple[str, ...]) -> None:
    """Pretrained weights for training: everything but the class-specific outputs must fit."""
    wrong = [m for m in match.misfit if group_of(m[0]) not in CLASS_SPECIFIC]
    if wrong:
        name, fs, ms = wrong[0]
        raise DataError(
            f"pretrained weights {path}: array {name!r} has shape {fs}, the model's variable has {ms} "
            f"({len(wrong)} such arrays; check resnet_blocks / resnet_width / fpn_channels / frcnn_fc_dim / "
            "mask_channels)"
        )
    if not match.matched:
        raise DataError(
            f"pretrained weights {path}: no array name matches a model variable (the file has "
            f"{_some(match.unused) or 'no arrays'}; the model has {_some(model_names)}): "
            "expected a tensorpack-format ResNet or Mask R-CNN .npz"
        )


def check_complete(path: Path, match: WeightsMatch) -> None:
    """A model to evaluate: every variable in the file with its shape, or predictions would be random."""
    if match.misfit:
        name, fs, ms = match.misfit[0]
        raise DataError(
            f"model {path}: array {name!r} has shape {fs}, the model's variable has {ms} ({len(match.misfit)}"
            f" such arrays{_classes(match, tuple(n for n, _, _ in match.misfit))}; the model must be built "
            "with the preset/--config it was trained with, on data with its classes)"
        )
    if match.missing:
        raise DataError(
            f"model {path}: {len(match.missing)} of the model's variables are not in the file "
            f"({_some(match.missing)}): they would predict from random initial values; expected a model "
            "this script exported (model.npz) or a tensorpack Mask R-CNN .npz of the same configuration"
        )


def is_model_variable(name: str) -> bool:
    """A weight of the model, not training state: no step counter, learning rate, or optimizer slot
    (Momentum, AccumGrad and its counter)."""
    from tensorpack.tfutils.varmanip import is_training_name

    name = canonical(name)
    return not is_training_name(name) and not name.startswith("global_step") and name != LR_NAME


def _variables() -> dict[str, Any]:
    """The graph's model variables by name."""
    import tensorflow as tf

    return {
        v.op.name: v
        for v in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        if is_model_variable(v.op.name)
    }


def npz_init(path: Path, log: Callable[[str], None], complete: bool) -> Any:
    """A tensorpack SessionInit that loads `path`'s matching arrays and logs the report; `complete`: the
    file must provide the whole model (evaluation), else it is pretrained weights (training)."""
    from tensorpack.tfutils.sessinit import DictRestore, SessionInit

    arrays = read_npz(path)

    class _NpzInit(SessionInit):  # type: ignore[misc]  # tensorpack has no type information: Any
        def _run_init(self, sess: Any) -> None:
            variables = _variables()
            model = {name: tuple(v.shape.as_list()) for name, v in variables.items()}
            match = match_weights({k: a.shape for k, a in arrays.items()}, model)
            for line in report_lines(path, match):
                log(line)
            if complete:
                check_complete(path, match)
            else:
                check_pretrained(path, match, tuple(sorted(model)))
            DictRestore({n: arrays[n] for n in match.matched})._run_init(sess)

    return _NpzInit()


def pretrained_init(path: Path, log: Callable[[str], None]) -> Any:
    return npz_init(path, log, complete=False)


def model_init(path: Path, log: Callable[[str], None]) -> Any:
    return npz_init(path, log, complete=True)
