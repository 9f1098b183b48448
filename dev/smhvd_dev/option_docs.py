"""Write the launcher options' tables in README.md and docs/configuration.md from their declarations.

`python -m smhvd_dev.option_docs` rewrites each table between its two markers (the rest of the page is left
as it is); `--check` only says which page differs (exit 1). tests/docs/test_option_docs.py runs the check,
so a declaration changed in src/smhvd/config/launcher_options.py without the docs fails there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from smhvd.config.launcher_options import all_declarations
from smhvd.config.option_spec import Declared

REPO = Path(__file__).resolve().parents[2]
COMMAND = "python -m smhvd_dev.option_docs"
END = "<!-- end of generated table -->"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _sets(d: Declared) -> str:
    names = ", ".join(f"`{v.name}`" for v in d.option.sets)
    return f" (sets {names})" if names else ""


def table(declared: Sequence[Declared], meaning: Callable[[Declared], str]) -> str:
    lines = [_row(("hyperparameter", "default", "meaning")), "|---|---|---|"]
    lines += [_row((f"`{d.option.key}`", d.default_text, meaning(d))) for d in declared]
    return "\n".join(lines)


def all_options_table() -> str:
    """Every option, its doc line and what it sets on the ranks (docs/configuration.md)."""
    return table(all_declarations(), lambda d: d.option.doc + _sets(d))


def readme_table() -> str:
    """The options set most, each with its short line (README.md)."""
    declared = [d for d in all_declarations() if d.option.readme]
    return table(declared, lambda d: d.option.readme or "")


# page -> (what its table is, how it is made)
TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "docs/configuration.md": ("every launcher option", all_options_table),
    "README.md": ("the launcher options set most", readme_table),
}


def begin_marker(what: str) -> str:
    return f"<!-- generated table ({what}): {COMMAND} writes it from src/smhvd/config/launcher_options.py -->"


def with_table(text: str, what: str, generated: str, page: str) -> str:
    """The page with the table between its markers replaced by `generated`."""
    begin = begin_marker(what)
    start = text.find(begin)
    end = text.find(END, start)
    if start < 0 or end < 0:
        raise ValueError(f"{page}: no table markers ({begin} ... {END})")
    return text[: start + len(begin)] + "\n\n" + generated + "\n\n" + text[end:]


def expected(page: str, text: str) -> str:
    what, make = TABLES[page]
    return with_table(text, what, make(), page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say which page differs (exit 1)")
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stale = []
    for page in TABLES:
        path = args.repo / page
        text = path.read_text()
        try:
            new = expected(page, text)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 1
        if new != text:
            stale.append(page)
            if not args.check:
                path.write_text(new)
    if stale:
        verb = "differs from the declarations" if args.check else "rewritten"
        print("\n".join(f"{page}: options table {verb}" for page in stale), file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
