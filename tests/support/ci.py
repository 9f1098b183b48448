"""What CI means to the tests, one rule: CI set to 1, true or yes (any case). Under CI nothing is skipped for
want of a tool or a privilege: a fixture installs what is missing, and what cannot be had fails the test."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> NoReturn:
    """Skip the test for `reason` (a missing tool or privilege), or under CI fail it."""
    if in_ci():
        pytest.fail(f"{reason} (under CI nothing is skipped)")
    pytest.skip(reason)


def need_root(what_for: str) -> None:
    """Skip the test unless it runs as root (`what_for` says why it must), or under CI fail it."""
    if os.geteuid() != 0:
        unavailable(f"needs root ({what_for})")
