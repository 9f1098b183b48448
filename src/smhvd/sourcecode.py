"""Script mode: find the training code (`sagemaker_submit_directory`: a local directory used in place, a local
.tar.gz or an s3:// one unpacked into <root>/code; absent: <root>/code), fetch and unpack it, install its
requirements.txt."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import urlparse

from smhvd.config.launcher_options import HYPERPARAMETERS_ORIGIN, CodeOrigin, ProgramOptions
from smhvd.config.paths import SageMakerPaths
from smhvd.config.sagemaker_files import check_path, shown_key
from smhvd.errors import ConfigError, RequirementsError, SourceError
from smhvd.proc.steps import last_line, run_step

SourceKind = Literal["directory", "archive", "s3"]


@dataclass(frozen=True)
class Source:
    kind: SourceKind
    location: str  # a directory, an archive path, or an s3:// URI
    program: str
    code_dir: Path  # where the program runs from
    origin: CodeOrigin = HYPERPARAMETERS_ORIGIN  # the file and keys that named them (errors name these)


def resolve_source(program: ProgramOptions, paths: SageMakerPaths, env: Mapping[str, str]) -> Source:
    origin = program.origin
    name = program.program
    if not name and env.get("SAGEMAKER_PROGRAM"):
        name, origin = (
            env["SAGEMAKER_PROGRAM"],
            dataclasses.replace(origin, file="environment", program_key="SAGEMAKER_PROGRAM"),
        )
    if not name:
        raise ConfigError(
            origin.file, origin.program_key, "the training script's file name (or env SAGEMAKER_PROGRAM)"
        )
    check_path(name, origin.file, origin.program_key, "a path relative to the code directory")
    location = program.submit_directory
    if location is None:
        return Source("directory", str(paths.code_dir), name, paths.code_dir, origin)
    where = (origin.file, origin.directory_key)
    if location.startswith("s3://"):
        parsed = urlparse(location)
        if not parsed.netloc or not parsed.path.strip("/"):
            raise ConfigError(*where, "s3://bucket/key", location)
        return Source("s3", location, name, paths.code_dir, origin)
    if location.startswith("file://"):
        location = urlparse(location).path
    if "://" in location:
        raise ConfigError(*where, "a local directory, a local .tar.gz or an s3:// URI", location)
    check_path(location, *where, "a local directory or .tar.gz", relative=False)
    if Path(location).is_dir():
        return Source("directory", location, name, Path(location), origin)
    if Path(location).is_file():
        return Source("archive", location, name, paths.code_dir, origin)
    raise ConfigError(*where, "an existing directory or .tar.gz", location)


def fetch_source(source: Source, region: str | None) -> None:
    """Make source.code_dir hold the code. Nothing to do for a directory used in place."""
    if source.kind == "directory":
        return
    key = source.origin.directory_key  # the key the user wrote (SDK v3: source_dir), for the errors
    with tempfile.TemporaryDirectory(prefix="smhvd-code-") as tmp:
        archive = Path(source.location)
        if source.kind == "s3":
            archive = Path(tmp) / "sourcedir.tar.gz"
            # in a child process (s3_download.py): a stop ends it, and boto3's threads, at once
            argv = [sys.executable, "-m", "smhvd.s3_download", source.location, str(archive), region or ""]
            result = run_step(argv)
            if result.returncode != 0:
                why = last_line(result.stderr, f"exit {result.returncode}")
                raise SourceError(f"{key}: could not download {source.location}: {why}")
        staging = Path(tmp) / "code"
        extract_archive(archive, staging, f"{key}: {source.location}")
        source.code_dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, source.code_dir, dirs_exist_ok=True)


def extract_archive(archive: Path, target: Path, label: str) -> None:
    """Unpack a tar(.gz), refusing members that would land outside the target or are not plain files/dirs.
    `label` begins each error: the setting that named the archive, and where it is."""
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for member in members:
                parts = PurePosixPath(member.name).parts
                if PurePosixPath(member.name).is_absolute() or ".." in parts:
                    raise SourceError(f"{label}: unsafe path in archive: {shown_key(member.name)}")
                if not (member.isfile() or member.isdir()):
                    raise SourceError(
                        f"{label}: only files and directories are allowed, found {shown_key(member.name)}"
                    )
            target.mkdir(parents=True, exist_ok=True)
            tar.extractall(target, members=members)  # noqa: S202  (members validated above)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:  # EOFError: a truncated .tar.gz
        raise SourceError(f"{label}: not a readable tar archive ({exc})") from None


def program_path(source: Source) -> Path:
    path = source.code_dir / source.program
    if not path.is_file():
        raise ConfigError(
            source.origin.file, source.origin.program_key, f"a file in {source.code_dir}", source.program
        )
    return path


# Run by its path (runscript/run.py says why); a file of the installed package, never of the user's code.
SCRIPT_RUNNER = Path(__file__).resolve().parent / "runscript" / "run.py"


def program_command(path: Path, code_dir: Path, python: str = sys.executable) -> list[str]:
    """How to run the entry point, from the code directory: Python scripts with this interpreter under the
    script runner (a failing script ends its rank at once instead of hanging in MPI's finalisation), named as
    the user named them (`train.py`, as `python train.py` sees it), shell scripts with bash."""
    if path.suffix == ".py":
        return [python, str(SCRIPT_RUNNER), os.path.relpath(path, code_dir)]
    if path.suffix == ".sh":
        return ["/bin/bash", str(path)]
    if os.access(path, os.X_OK):
        return [str(path)]
    return [python, str(path)]


def install_requirements(code_dir: Path, *, name: str, named_by: tuple[str, str] | None) -> bool:
    """pip install -r NAME (requirements.txt) when the code has one; True when something was installed.
    `named_by` (file, key): the file was asked for by name there, and its absence is an error naming them.
    pip runs as a step (proc/steps.py): a stop ends it and everything it started at once."""
    requirements = code_dir / name
    if not requirements.is_file():
        if named_by is not None:
            raise ConfigError(*named_by, f"a file in {code_dir}", name)
        return False
    argv = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-r", str(requirements)]
    result = run_step(argv, cwd=code_dir, echo=True, merge_stderr=True)  # shown in the job's log as it comes
    if result.returncode != 0:
        tail = [line.strip() for line in result.text()[0].splitlines() if line.strip()][-3:]
        raise RequirementsError(
            f"{requirements}: pip install failed (exit {result.returncode}): {' | '.join(tail)}"
        )
    return True
