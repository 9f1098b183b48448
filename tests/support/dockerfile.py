"""docker/Dockerfile's declared versions, read by the tests that check an image or a build against them."""

from __future__ import annotations

import re
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "docker" / "Dockerfile"


def dockerfile_arg(name: str) -> str:
    """The default of `ARG NAME=VALUE` in docker/Dockerfile (declared there once: what an image must have)."""
    values = re.findall(rf"^ARG {re.escape(name)}=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert len(values) == 1, f"docker/Dockerfile declares ARG {name}= {len(values)} times"
    return values[0]
