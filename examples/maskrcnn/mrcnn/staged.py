"""The manifest `smhvd-stage-coco` writes last into the annotations channel: when it is there, every file it
lists for the channels this job has must be present with its size before anything starts (a prefix that
was staged only in part has no manifest; one that was changed afterwards fails here, naming the file)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from .data import DataError

MANIFEST = "_manifest.json"
FORMAT = "smhvd-stage-coco/1"


def check_manifest(annotations_dir: Path | None, channels: Mapping[str, Path | None]) -> str | None:
    """A one-line report, or None when there is no manifest (data not staged by the tool: not checked)."""
    if annotations_dir is None or not (annotations_dir / MANIFEST).is_file():
        return None
    path = annotations_dir / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise DataError(f"{path}: unreadable staging manifest ({e})") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(files, dict):
        raise DataError(f"{path}: not a {FORMAT} manifest")
    checked: dict[str, int] = {}
    for key, entry in sorted(files.items()):
        channel, _, rel = key.partition("/")
        base = channels.get(channel)
        if base is None:
            continue
        f = base / rel
        size = f.stat().st_size if f.is_file() else None
        if size != entry.get("size"):
            found = "missing" if size is None else f"{size} bytes"
            raise DataError(
                f"{f}: {found}, but the staging manifest {path} lists {key} with {entry.get('size')} bytes"
            )
        checked[channel] = checked.get(channel, 0) + 1
    counts = ", ".join(f"{n} {c}" for c, n in sorted(checked.items()))
    return f"staging manifest {path}: every listed file present with its size ({counts or 'none checked'})"
