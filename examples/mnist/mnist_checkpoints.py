"""Per-epoch checkpoint directories, written atomically, and finding the latest one to resume from.

Layout: <checkpoint-dir>/epoch-0003/{state.*, meta.json}. A checkpoint is built in a hidden temporary
directory next to its final place and renamed into place, so a kill at any moment leaves either the previous
complete checkpoints or the new complete one, never a half-written one (SageMaker managed spot training relies
on this: it syncs /opt/ml/checkpoints to S3 and restores it when the job restarts).
Framework-free: the caller passes a function that writes the model state into a directory.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

META_FILE = "meta.json"
STATE_PREFIX = "state"
_NAME = re.compile(r"^epoch-(\d{4,})$")
_TEMP_PREFIX = ".tmp-"


def checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch:04d}"


def latest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    """(epochs completed, path) of the newest complete checkpoint, or None when there is none."""
    if not directory.is_dir():
        return None
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match and (entry / META_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return max(found) if found else None


def read_meta(checkpoint: Path) -> dict[str, Any]:
    meta = json.loads((checkpoint / META_FILE).read_text())
    if not isinstance(meta, dict) or not isinstance(meta.get("epoch"), int):
        raise TypeError(f"{checkpoint / META_FILE}: expected a JSON object with an integer 'epoch'")
    return meta


def save(
    directory: Path, epoch: int, write_state: Callable[[Path], None], meta: dict[str, Any], keep: int = 2
) -> Path:
    """Write checkpoint `epoch` (write_state gets the state prefix path), then keep only the `keep` newest."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{checkpoint_name(epoch)}-", dir=directory))
    try:
        write_state(temporary / STATE_PREFIX)
        (temporary / META_FILE).write_text(json.dumps({**meta, "epoch": epoch}, indent=1, sort_keys=True))
        final = directory / checkpoint_name(epoch)
        if final.exists():  # a rerun of an epoch after resuming from an older checkpoint: move the old aside
            final.replace(Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}old-", dir=directory)) / "old")
        temporary.replace(final)
    finally:
        remove_temporaries(directory)
    prune(directory, keep)
    return final


def prune(directory: Path, keep: int) -> None:
    """Delete all but the `keep` newest complete checkpoints."""
    complete = sorted(
        (int(m.group(1)), entry)
        for entry in directory.iterdir()
        if (m := _NAME.match(entry.name)) and (entry / META_FILE).is_file()
    )
    for _, old in complete[: max(0, len(complete) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def remove_temporaries(directory: Path) -> None:
    """Leftovers of writes interrupted by a kill (never visible as checkpoints)."""
    if directory.is_dir():
        for entry in directory.iterdir():
            if entry.name.startswith(_TEMP_PREFIX):
                shutil.rmtree(entry, ignore_errors=True)
