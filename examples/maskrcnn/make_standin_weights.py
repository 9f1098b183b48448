"""Write an offline STAND-IN for a published tensorpack model: its array names and shapes, seeded values.

    python make_standin_weights.py --out DIR/standin-COCO-R50FPN-MaskRCNN-Standard.npz [--seed 0]
    python make_standin_weights.py --out FILE --arrays FACTS.json

This is not a model. It lets a job's plumbing be tried without downloading anything: every array of the
published file is there with its name and shape (so tensorpack's `--load` and this directory's
`--pretrained`/`--eval-only` accept it as the real one), but the values are random numbers scaled to keep
activations finite through the network. A model started from it detects nothing useful: evaluation finds no
detections above the score threshold (tensorpack's example then prints no AP at all), and training from it
is training from scratch. For real results use the published file (tensorpack's model zoo) instead.

The names and shapes come from a fact file in published/ (default: COCO-R50FPN-MaskRCNN-Standard.json, the 307
arrays of tensorpack's COCO-R50FPN-MaskRCNN-Standard.npz). The output is the same bytes for the same facts and
seed (one NumPy generator in the file's order; fixed zip timestamps), written to a temporary name and then
renamed, so an interrupted run leaves no partial file under FILE.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

PUBLISHED_DIR = Path(__file__).resolve().parent / "published"
DEFAULT_FACTS = PUBLISHED_DIR / "COCO-R50FPN-MaskRCNN-Standard.json"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the zip format's earliest date: no build time in the bytes

Shapes = dict[str, tuple[int, ...]]


class FactsError(ValueError):
    """A fact file that cannot be used (the message names the file and key)."""


def load_shapes(path: Path = DEFAULT_FACTS) -> Shapes:
    """The fact file's {"arrays": {name: [dim, ...]}}, in its order; FactsError names what is wrong."""
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise FactsError(f"{path}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise FactsError(f"{path}: not JSON ({e})") from None
    arrays = doc.get("arrays") if isinstance(doc, dict) else None
    if not isinstance(arrays, dict) or not arrays:
        raise FactsError(f'{path}: key "arrays": expected an object of array name -> shape, non-empty')
    shapes: Shapes = {}
    for name, shape in arrays.items():
        if not isinstance(shape, list) or not all(type(d) is int and d > 0 for d in shape):
            raise FactsError(
                f'{path}: key "arrays.{name}": expected a list of positive integers, not {shape!r}'
            )
        shapes[name] = tuple(shape)
    return shapes


def seeded_array(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """float32 values by the variable's role: He-scaled kernels, BN statistics near 1, small biases."""
    if name.endswith("/W"):
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else shape[0]
        value = rng.normal(0, np.sqrt(2.0 / fan_in), shape)
    elif name.endswith("variance/EMA"):
        value = rng.uniform(0.5, 2.0, shape)
    elif name.endswith("gamma"):
        value = rng.uniform(0.3, 0.7, shape)
    else:
        value = rng.normal(0, 0.05, shape)
    return value.astype(np.float32)


def seeded_arrays(shapes: Shapes, seed: int = 0) -> Iterator[tuple[str, np.ndarray[Any, Any]]]:
    """Every array in the facts' order from one generator: the same seed gives the same values."""
    rng = np.random.default_rng(seed)
    for name, shape in shapes.items():
        yield name, seeded_array(name, shape, rng)


def write_npz(out: Path, arrays: Iterator[tuple[str, np.ndarray[Any, Any]]]) -> tuple[int, int]:
    """An uncompressed .npz as np.savez writes it, one array in memory at a time; (arrays, parameters)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    count = params = 0
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for name, value in arrays:
                with z.open(zipfile.ZipInfo(f"{name}.npy", ZIP_TIME), "w", force_zip64=True) as member:
                    # NumPy's own .npy writer (what np.savez uses); it has no type hints
                    np.lib.format.write_array(member, value, allow_pickle=False)  # type: ignore[no-untyped-call]
                count += 1
                params += value.size
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return count, params


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the .npz to write (replaced if it exists)")
    p.add_argument("--seed", type=int, default=0, help="default 0")
    p.add_argument(
        "--arrays", type=Path, default=DEFAULT_FACTS, help=f"fact file (default: {DEFAULT_FACTS.name})"
    )
    a = p.parse_args(argv)
    if a.out.suffix != ".npz":
        p.error(f"--out {a.out}: expected a file name ending in .npz")
    try:
        shapes = load_shapes(a.arrays)
    except FactsError as e:
        print(f"make_standin_weights: error: {e}", file=sys.stderr)
        return 2
    count, params = write_npz(a.out, seeded_arrays(shapes, a.seed))
    print(
        f"wrote {a.out}: a STAND-IN (seeded values, not a trained model) with the {count} arrays of"
        f" {a.arrays.stem} ({params:,} parameters, {a.out.stat().st_size / 1e6:.0f} MB), seed {a.seed},"
        f" sha256 {sha256(a.out)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
