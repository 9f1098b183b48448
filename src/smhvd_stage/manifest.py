"""The manifest written last under the prefix, and the channel URIs to paste into an estimator.

A prefix is complete only when `annotations/_manifest.json` exists and lists exactly the files (key, size,
MD5). The manifest is deleted before anything under the prefix changes and written only after every upload was
verified, so an interrupted run leaves a prefix without one: nothing that a later run or a job would trust.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .checksums import StagedFile
from .layout import ANNOTATIONS_CHANNEL, PRETRAINED_CHANNEL, Layout

# In the annotations channel, so that a training job receives it and can check its data against it.
MANIFEST_KEY = "annotations/_manifest.json"
FORMAT = "smhvd-stage-coco/1"


def channels(bucket: str, prefix: str, layout: Layout) -> dict[str, str]:
    names = [s.split.channel for s in layout.splits] + [ANNOTATIONS_CHANNEL]
    if layout.weights is not None:
        names.append(PRETRAINED_CHANNEL)
    return {name: f"s3://{bucket}/{prefix}{name}/" for name in names}


def build(bucket: str, prefix: str, layout: Layout, files: Sequence[StagedFile]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "channels": channels(bucket, prefix, layout),
        "counts": {
            s.split.channel: {
                "images": s.index.images,
                "annotations": s.index.annotations,
                "crowd": s.index.crowd,
                "categories": s.index.categories,
                "images_without_annotations": s.index.images_without_annotations,
                "annotation_file": s.split.annotation_file.rsplit("/", 1)[-1],
            }
            for s in layout.splits
        },
        "files": {f.key: {"size": f.size, "md5": f.md5} for f in sorted(files, key=lambda f: f.key)},
    }


def encode(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()


def same_files(existing: bytes | None, manifest: dict[str, Any]) -> bool:
    """Whether an existing manifest describes exactly these files (and channels)."""
    if existing is None:
        return False
    try:
        old = json.loads(existing)
    except (ValueError, RecursionError):  # anything unreadable is not this manifest: it is replaced
        return False
    return isinstance(old, dict) and all(old.get(k) == manifest[k] for k in ("format", "channels", "files"))


def inputs_text(chans: dict[str, str]) -> str:
    """The `inputs=` dict, ready to paste: estimator.fit(inputs=...)."""
    body = "".join(f'    "{name}": "{uri}",\n' for name, uri in chans.items())
    return "inputs = {\n" + body + "}"
