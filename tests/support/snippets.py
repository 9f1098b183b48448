"""The code blocks of the project's pages that tests run as a user would type them."""

from __future__ import annotations

import re
from pathlib import Path


def doc_snippet(page: Path, name: str, replace: dict[str, str] | None = None) -> str:
    """The fenced block right after `<!-- snippet: NAME -->` in `page`, each `replace` key (which must occur)
    swapped for its value: what a test may change of what the user types (the image's name)."""
    found = re.search(
        rf"^<!-- snippet: {re.escape(name)} -->\n```\w*\n(.*?)^```$",
        page.read_text(),
        re.MULTILINE | re.DOTALL,
    )
    assert found, f"{page}: no block marked <!-- snippet: {name} -->"
    code = found.group(1)
    for old, new in (replace or {}).items():
        assert old in code, f"{page}: snippet {name} no longer has {old!r}"
        code = code.replace(old, new)
    return code
