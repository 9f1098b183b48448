"""The frameworks in-flight measures with no code: once a module below is imported by the script, its patch
(inflight/tfgraph.py) times each optimizer step's gradient allreduce. A finder first on sys.meta_path lets the
import run as it would and patches the module right after it ran; a module imported already is patched at
once. Imported into the script's process before the script runs: only modules every interpreter has loaded.
"""

import sys
from importlib.machinery import PathFinder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

# module name -> its patch in smhvd.inflight.tfgraph (imported only then: TensorFlow is loaded by then)
PATCHED = {
    "horovod.tensorflow": "patch_horovod",
    "tensorpack.train.trainers": "patch_tensorpack",
}


def _patch(module: "ModuleType") -> None:
    from smhvd.inflight import tfgraph  # (TensorFlow is loaded by now: the module imported it)

    try:
        getattr(tfgraph, PATCHED[module.__name__])(module)
    except Exception as exc:  # a framework version it does not know: the job runs unmeasured
        sys.stderr.write(f"smhvd.inflight: {module.__name__} is not measured ({exc!r})\n")


class _Loader:
    """The module's own loader, and the patch once the module ran."""

    def __init__(self, loader: object) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: "ModuleType") -> None:
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        module.__loader__ = self._loader  # type: ignore[assignment]
        _patch(module)


class AfterImport:
    """A meta path finder that finds nothing itself: it hands PATCHED modules' specs, found by the path
    finder, a loader that patches them."""

    def find_spec(
        self, name: str, path: "Sequence[str] | None", target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        if name not in PATCHED:
            return None
        spec = PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)  # type: ignore[assignment]  # (it stands for the loader it wraps)
        return spec


def install() -> None:
    """Patch what is imported already, and what will be."""
    if not any(isinstance(finder, AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, AfterImport())
    for name in PATCHED:
        module = sys.modules.get(name)
        if module is not None:
            _patch(module)
