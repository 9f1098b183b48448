"""Write the launcher options' tables in README.md and docs/configuration.md from their declarations.

`python -m smhvd_dev.option_docs` rewrites each table between its two markers (the rest of the page is left
as it is); `--check` only says which page differs (exit 1). tests/docs/test_option_docs.py runs the check,
so a declaration changed in src/smhvd/config/launcher_options.py (the hyperparameters) or
src/smhvd/env_options.py (the environment variables) without the docs fails there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from smhvd.config.launcher_options import all_declarations
from smhvd.env_options import env_declarations
from smhvd.option_spec import Declared

REPO = Path(__file__).resolve().parents[2]
COMMAND = "python -m smhvd_dev.option_docs"
END = "<!-- end of generated table -->"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _sets(d: Declared) -> str:
    names = ", ".join(f"`{v.name}`" for v in d.option.sets)
    return f" (sets {names})" if names else ""


def table(
    declared: Sequence[Declared], meaning: Callable[[Declared], str], key: str = "hyperparameter"
) -> str:
    lines = [_row((key, "default", "meaning")), "|---|---|---|"]
    lines += [_row((f"`{d.option.key}`", d.default_text, meaning(d))) for d in declared]
    return "\n".join(lines)


def all_options_table() -> str:
    """Every option, its doc line and what it sets on the ranks (docs/configuration.md)."""
    return table(all_declarations(), lambda d: d.option.doc + _sets(d))


def readme_table() -> str:
    """The options set most, each with its short line (README.md)."""
    declared = [d for d in all_declarations() if d.option.readme]
    return table(declared, lambda d: d.option.readme or "")


def env_table() -> str:
    """The launcher's own environment variables (docs/configuration.md)."""
    return table(env_declarations(), lambda d: d.option.doc, key="variable")


@dataclass(frozen=True)
class Table:
    page: str
    what: str  # names the table in its markers and messages
    declared_in: str
    make: Callable[[], str]

    @property
    def begin(self) -> str:
        return f"<!-- generated table ({self.what}): {COMMAND} writes it from {self.declared_in} -->"


OPTIONS = "src/smhvd/config/launcher_options.py"
ENV_OPTIONS = "src/smhvd/env_options.py"
TABLES = (
    Table("docs/configuration.md", "every launcher option", OPTIONS, all_options_table),
    Table("docs/configuration.md", "the launcher's environment variables", ENV_OPTIONS, env_table),
    Table("README.md", "the launcher options set most", OPTIONS, readme_table),
)
PAGES = tuple(dict.fromkeys(t.page for t in TABLES))


def with_table(text: str, table: Table) -> str:
    """The page with the table between its markers replaced by what the declarations make."""
    start = text.find(table.begin)
    end = text.find(END, start)
    if start < 0 or end < 0:
        raise ValueError(f"{table.page}: no table markers ({table.begin} ... {END})")
    return text[: start + len(table.begin)] + "\n\n" + table.make() + "\n\n" + text[end:]


def stale_tables(page: str, text: str) -> tuple[str, list[str]]:
    """The page with each of its tables as the declarations make it, and what the tables that differed are."""
    stale = []
    for table in (t for t in TABLES if t.page == page):
        new = with_table(text, table)
        if new != text:
            stale.append(table.what)
        text = new
    return text, stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say which page differs (exit 1)")
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        path = args.repo / page
        text = path.read_text()
        try:
            new, differing = stale_tables(page, text)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 1
        stale += [f"{page}: {what} table" for what in differing]
        if differing and not args.check:
            path.write_text(new)
    if stale:
        verb = "differs from the declarations" if args.check else "rewritten"
        print("\n".join(f"{table} {verb}" for table in stale), file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
