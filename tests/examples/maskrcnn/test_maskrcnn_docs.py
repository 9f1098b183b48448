"""docs/maskrcnn.md states the defaults of our own Mask R-CNN keys (those with no tensorpack key) as
"`key` (value)": each numeric one is the code's (mrcnn.config.Config), so that a changed default cannot leave
the page behind (it said max_checkpoints 10 while the code kept 3)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from mrcnn.config import Config

PAGE = Path(__file__).resolve().parents[3] / "docs" / "maskrcnn.md"


def stated_defaults() -> dict[str, str]:
    """`key` (value) pairs of the page's paragraph on our keys with no tensorpack key."""
    text = PAGE.read_text()
    start = text.index("Our keys with no tensorpack key")
    paragraph = text[start : text.index("\n\n", start)]
    return dict(re.findall(r"`(\w+)` \(([^)]+)\)", paragraph))


def test_every_numeric_default_the_page_states_is_the_codes() -> None:
    stated = stated_defaults()
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    numeric = {key: value for key, value in stated.items() if re.fullmatch(r"[0-9.]+", value)}
    assert "max_checkpoints" in numeric and len(numeric) >= 4, stated  # the paragraph was found and read
    assert {key: float(value) for key, value in numeric.items()} == {
        key: float(defaults[key])
        for key in numeric  # type: ignore[arg-type]
    }
    assert f"`max_checkpoints` ({defaults['max_checkpoints']}) kept" in PAGE.read_text()
