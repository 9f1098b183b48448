"""What failed, in one line, with the evidence (the failing rank's stderr tail) after it, in
`/opt/ml/output/failure`, written once: the first writer wins (a reason the script wrote itself is kept)."""

from __future__ import annotations

import os
import re
from pathlib import Path

FAILURE_LIMIT = 1024  # SageMaker shows the first 1024 characters as FailureReason
# ANSI escape sequences (colours, cursor moves): the failure reason is shown as plain text.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# Frameworks' start-up chatter, which says nothing about a failure and would fill the 1024 characters:
# TensorFlow's C++ log lines at levels I and W (`2026-01-01 10:00:00.123456: I tensorflow/...cc:113] ...`),
# its cuDNN/cuFFT/cuBLAS "Unable to register ... factory" errors, and the line cpu_feature_guard continues on.
STARTUP_NOISE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] \S+\.cc:\d+\] .*"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: E \S+\.cc:\d+\] Unable to register cu\w+ factory: .*"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\."
)


def compose(headline: str, detail: str = "", limit: int = FAILURE_LIMIT) -> str:
    """One headline, then as much of the end of `detail` as fits (without start-up noise and colours),
    starting at a line boundary if possible."""
    headline = " ".join(headline.split())[:limit]
    lines = _ANSI.sub("", detail).splitlines(keepends=True)
    detail = "".join(line for line in lines if not STARTUP_NOISE.fullmatch(line.strip())).strip()
    room = limit - len(headline) - 1
    if not detail or room <= 0:
        return headline
    if len(detail) > room:
        cut = detail[-room:]
        newline = cut.find("\n")
        detail = cut[newline + 1 :] if 0 <= newline < len(cut) // 2 else cut
    return f"{headline}\n{detail}"


def write_failure(path: Path, text: str) -> bool:
    """Write the failure reason unless one is there already; True when this call wrote it. What UTF-8 cannot
    hold (a lone surrogate) is written as a backslash escape, so the file is never left empty."""
    data = text.encode("utf-8", errors="backslashreplace")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    except OSError:
        return False  # a failure we cannot record must not hide the one we are reporting
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return True
