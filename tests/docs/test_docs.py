"""README.md and docs/ name only what exists: every relative link, repository path, `make` target and Python
module they mention is checked here, so that a rename cannot leave a page stale."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP = ("src", "dev", "docs", "bin", "docker", "examples", "tests", "benchmarks", "requirements", "mk", ".ci")
PATH = re.compile(rf"^(?:{'|'.join(re.escape(t) for t in TOP)})/[\w./-]*$")
MODULE = re.compile(r"^(?:smhvd|smhvd_stage|smhvd_sim|smhvd_dev)(?:\.\w+)*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
MAKE = re.compile(r"\bmake ([a-z][\w-]*[a-z0-9])(?![\w*-])")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def resolves(dotted: str) -> bool:
    """A module, or a module's top-level function, class or name (read from its source, not imported)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:i]))
        except (ImportError, AttributeError, ValueError):
            continue
        if spec is None:
            continue
        rest = parts[i:]
        if not rest:
            return True
        if len(rest) == 1 and spec.origin and Path(spec.origin).is_file():
            source = Path(spec.origin).read_text()
            return bool(re.search(rf"^(?:def|class) {rest[0]}\b|^{rest[0]}\s*[:=]", source, re.MULTILINE))
        return False
    return False


def make_targets() -> set[str]:
    text = "\n".join(p.read_text() for p in [REPO / "Makefile", *sorted((REPO / "mk").glob("*.mk"))])
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z0-9_-]+):", text, re.MULTILINE)}


def mentioned_paths(text: str) -> set[str]:
    found = set()
    for span in CODE.findall(text):
        for raw in re.split(r"[\s,()]+", span):
            token = raw.rstrip(":.;")
            if PATH.match(token) and not re.search(r"[*<>]|\.\.\.", token):
                found.add(token.split("#")[0])
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_path_target_and_module_named_exists(page: Path) -> None:
    text = page.read_text()
    problems = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            problems.append(f"link {target}")
    for path in sorted(mentioned_paths(text)):
        if not (REPO / path).exists():
            problems.append(f"path {path}")
    targets = make_targets()
    code = "\n".join(CODE.findall(text) + FENCE.findall(text))  # commands, not prose ("make one ...")
    for target in sorted(set(MAKE.findall(code))):
        if target not in targets:
            problems.append(f"make {target}")
    for span in CODE.findall(text):
        for token in re.findall(r"(?:python -m )?([\w.]+)", span):
            if MODULE.match(token) and not resolves(token):
                problems.append(f"module {token}")
    assert problems == [], f"{page.relative_to(REPO)} names what does not exist: {problems}"


def test_the_readme_is_a_users_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 360
    assert "## Contents" in text
    for page in (REPO / "docs").glob("*.md"):
        assert f"docs/{page.name}" in text, f"docs/{page.name} is not linked from the README"


LAUNCHER = REPO / "src" / "smhvd"
# `module.name` in the launcher's own text: a module named by its last part (`trust.directory`), its path
# (`hostenv/client.fetch`) or in full (`smhvd.hostenv.client.fetch`).
REFERENCE = re.compile(r"(?<![\w./])((?:smhvd\.)?[a-z_]+(?:[./][a-z_]+)*)\.([A-Za-z_]\w*)(?![\w(])")
NOT_NAMES = frozenset({"py", "json", "txt", "md", "gz", "sock", "pid", "tmp", "log"})  # file suffixes


def launcher_modules() -> dict[str, list[Path]]:
    """Each module of the launcher under its last name, its path and its dotted name."""
    found: dict[str, list[Path]] = {}
    for path in LAUNCHER.rglob("*.py"):
        parts = path.relative_to(LAUNCHER).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        for name in {parts[-1], "/".join(parts), ".".join(("smhvd", *parts))} if parts else ():
            found.setdefault(name, []).append(path)
    return found


def launcher_text(path: Path) -> list[str]:
    """The docstrings and comments of one module."""
    source = path.read_text()
    docs = [
        ast.get_docstring(node) or ""
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    return docs + [line[line.index("#") :] for line in source.splitlines() if "#" in line]


def test_the_launchers_own_text_names_only_what_exists() -> None:
    """A docstring or comment that names `module.name` (`trust.directory`, `hostenv/client.fetch`) names a
    function, class, constant or submodule that module has (issue 46: roles/sshd.py named a gone
    `hostenv_client.ssh_port`)."""
    modules = launcher_modules()
    stale = []
    for path in sorted(LAUNCHER.rglob("*.py")):
        for text in launcher_text(path):
            for module, name in REFERENCE.findall(text):
                if (
                    module not in modules
                    or name in NOT_NAMES
                    or {f"{module}/{name}", f"{module}.{name}"} & set(modules)
                ):
                    continue
                defines = re.compile(rf"^\s*(?:async def|def|class) {name}\b|^\s*{name}\s*[:=]", re.MULTILINE)
                if not any(defines.search(source.read_text()) for source in modules[module]):
                    stale.append(f"{path.relative_to(REPO)}: {module}.{name}")
    assert stale == []


LOCAL_PULL = re.compile(r"\bpodman (?:pull|run)\b.*\b(?:127\.0\.0\.1|localhost):\d+/")
PROJECT_PODMAN = 'eval "$(bin/daemonless-env.sh --export)"'


def code_blocks(text: str) -> list[list[str]]:
    """The lines of each code block of a Markdown page: fenced, or indented by four spaces."""
    blocks: list[list[str]] = []
    fenced, current = False, None
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            current = [] if fenced else None
            if fenced:
                blocks.append(current)
            continue
        if fenced and current is not None:
            current.append(line)
        elif line.startswith("    ") and line.strip():
            if current is None:
                current = []
                blocks.append(current)
            current.append(line.strip())
        elif line.strip():
            current = None
    return blocks


def test_a_podman_line_for_a_registry_on_this_machine_works_in_a_fresh_shell():
    """Issue 52: docs/images.md's `podman pull 127.0.0.1:5010/...` failed in a fresh shell (`http: server
    gave HTTP response to HTTPS client`): the registry is plain HTTP to the project's podman configuration
    only. Each such line carries --tls-verify=false, or its block selects that configuration first (the image
    tier pulls with it: tests/images/test_cpu_image.py)."""
    unusable = [
        f"{page.name}: {line}"
        for page in PAGES
        for block in code_blocks(page.read_text())
        for i, line in enumerate(block)
        if LOCAL_PULL.search(line)
        and "--tls-verify=false" not in line
        and not any(PROJECT_PODMAN in earlier for earlier in block[:i])
    ]
    assert unusable == []
    assert code_blocks("    a\n    b\ntext\n```\nc\n```\n") == [["a", "b"], ["c"]]
