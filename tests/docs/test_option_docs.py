"""The launcher options' tables in README.md and docs/configuration.md are what their declarations say
(src/smhvd/config/launcher_options.py, src/smhvd/env_options.py); `python -m smhvd_dev.option_docs` rewrites
them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from smhvd.config.launcher_options import all_declarations
from smhvd.env_options import env_declarations
from smhvd_dev import option_docs

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_tables_are_the_declarations(capsys: pytest.CaptureFixture[str]) -> None:
    assert option_docs.main(["--check"]) == 0, (
        capsys.readouterr().err + " (run python -m smhvd_dev.option_docs)"
    )


def copy_of_pages(tmp_path: Path) -> Path:
    for page in option_docs.PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / page, tmp_path / page)
    return tmp_path


def test_a_row_edited_by_hand_is_found_and_rewritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = copy_of_pages(tmp_path)
    page = repo / "docs" / "configuration.md"
    original = page.read_text()
    page.write_text(
        original.replace(
            "| `launcher_peer_timeout_seconds` | 600 |", "| `launcher_peer_timeout_seconds` | 60 |"
        )
    )
    assert option_docs.main(["--check", "--repo", str(repo)]) == 1
    assert capsys.readouterr().err == (
        "docs/configuration.md: every launcher option table differs from the declarations\n"
    )
    assert option_docs.main(["--repo", str(repo)]) == 0
    assert page.read_text() == original
    assert option_docs.main(["--check", "--repo", str(repo)]) == 0


def test_every_option_has_a_row_and_the_readme_the_ones_set_most() -> None:
    full = option_docs.all_options_table()
    short = option_docs.readme_table()
    for d in all_declarations():
        assert f"| `{d.option.key}` |" in full
        assert (f"| `{d.option.key}` |" in short) == (d.option.readme is not None)
        for variable in d.option.sets:
            assert f"`{variable.name}`" in full


def test_every_environment_option_has_a_row_and_a_changed_one_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = option_docs.env_table()
    assert [line.split(" | ")[0] for line in rows.splitlines()[2:]] == [
        f"| `{d.option.key}`" for d in env_declarations()
    ]
    repo = copy_of_pages(tmp_path)
    page = repo / "docs" / "configuration.md"
    page.write_text(page.read_text().replace("| `SMHVD_SSH_PORT` | 22 |", "| `SMHVD_SSH_PORT` | 2222 |"))
    assert option_docs.main(["--check", "--repo", str(repo)]) == 1
    assert capsys.readouterr().err == (
        "docs/configuration.md: the launcher's environment variables table differs from the declarations\n"
    )


def test_a_page_without_markers_is_an_error_not_a_silent_pass(tmp_path: Path) -> None:
    repo = copy_of_pages(tmp_path)
    (repo / "README.md").write_text("# no table here\n")
    assert option_docs.main(["--check", "--repo", str(repo)]) == 1
