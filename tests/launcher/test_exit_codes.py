"""The README's exit-code tables cover every code `train` and `smhvd-stage-coco` define: a code added to
src/smhvd/errors.py or src/smhvd_stage/errors.py without its row fails here."""

from __future__ import annotations

import re
from pathlib import Path

import smhvd.errors
import smhvd_stage.errors

README = Path(__file__).resolve().parents[2] / "README.md"


def tables() -> list[set[int]]:
    """The exit codes of each table in README's "Failures and exit codes" section, in order."""
    text = README.read_text()
    section = text[text.index("## Failures and exit codes") :]
    section = section[: section.index("\n## ", 3)]
    found: list[set[int]] = []
    for block in re.split(r"\n\n+", section):
        if block.startswith("| exit code | meaning |"):
            found.append({int(m) for m in re.findall(r"^\| (\d+) \|", block, re.MULTILINE)})
    return found


def test_every_launcher_code_has_a_row():
    train, _stage = tables()
    codes = {name: value for name, value in vars(smhvd.errors).items() if name.startswith("EX_")}
    assert codes and {name: value for name, value in codes.items() if value not in train} == {}


def test_every_staging_code_has_a_row():
    _train, stage = tables()
    codes = {
        name: value
        for name, value in vars(smhvd_stage.errors).items()
        if name.isupper() and isinstance(value, int)
    }
    assert codes and {name: value for name, value in codes.items() if value not in stage} == {}
    assert 0 in stage
