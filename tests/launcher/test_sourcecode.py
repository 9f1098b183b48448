import io
import tarfile
from pathlib import Path

import pytest

from smhvd.config.launcher_options import ProgramOptions
from smhvd.config.paths import SageMakerPaths
from smhvd.errors import ConfigError, SourceError
from smhvd.sourcecode import (
    SCRIPT_RUNNER,
    extract_archive,
    fetch_source,
    program_command,
    program_path,
    resolve_source,
)


def settings(program="train.py", submit=None):
    return ProgramOptions(
        program=program, submit_directory=submit, region=None, job_name=None, log_level=None
    )


def make_tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_resolve_each_kind(tmp_path):
    paths = SageMakerPaths(tmp_path / "ml")
    code = tmp_path / "src"
    code.mkdir()
    assert resolve_source(settings(submit=str(code)), paths, {}).code_dir == code
    archive = make_tar(tmp_path / "sourcedir.tar.gz", {"train.py": b"print(1)"})
    for location in (str(archive), f"file://{archive}"):
        source = resolve_source(settings(submit=location), paths, {})
        assert (source.kind, source.code_dir) == ("archive", paths.code_dir)
    s3 = resolve_source(settings(submit="s3://bucket/jobs/sourcedir.tar.gz"), paths, {})
    assert (s3.kind, s3.location) == ("s3", "s3://bucket/jobs/sourcedir.tar.gz")
    env_program = resolve_source(settings(program=None), paths, {"SAGEMAKER_PROGRAM": "entry.sh"})
    assert (env_program.program, env_program.code_dir) == ("entry.sh", paths.code_dir)


@pytest.mark.parametrize(
    ("program", "submit", "message"),
    [
        (None, None, "sagemaker_program: expected the training script's file name"),
        ("../etc/passwd", None, "sagemaker_program: expected a path relative to the code directory"),
        ("t.py", "s3://bucket", "sagemaker_submit_directory: expected s3://bucket/key"),
        ("t.py", "https://example.com/x.tar.gz", "sagemaker_submit_directory: expected a local directory"),
        ("t.py", "/no/such/dir", "sagemaker_submit_directory: expected an existing directory or .tar.gz"),
    ],
)
def test_bad_sources(tmp_path, program, submit, message):
    with pytest.raises(ConfigError, match=message):
        resolve_source(settings(program, submit), SageMakerPaths(tmp_path), {})


def test_archive_is_unpacked_and_program_checked(tmp_path):
    paths = SageMakerPaths(tmp_path / "ml")
    archive = make_tar(tmp_path / "s.tar.gz", {"pkg/train.py": b"print(1)", "requirements.txt": b""})
    source = resolve_source(settings(program="pkg/train.py", submit=str(archive)), paths, {})
    fetch_source(source, None)
    assert program_path(source) == paths.code_dir / "pkg" / "train.py"
    assert program_command(paths.code_dir / "pkg" / "train.py", paths.code_dir, "/py") == [
        "/py",
        str(SCRIPT_RUNNER),
        "pkg/train.py",  # as the user named it: the rank runs in the code directory
    ]
    missing = resolve_source(settings(program="nope.py", submit=str(archive)), paths, {})
    with pytest.raises(ConfigError, match=r"sagemaker_program: expected a file in .*/code, got 'nope.py'"):
        program_path(missing)


def test_unsafe_or_broken_archives_are_refused(tmp_path):
    evil = make_tar(tmp_path / "evil.tar.gz", {"../escape.py": b"x"})
    with pytest.raises(SourceError, match=r"unsafe path in archive: ../escape.py"):
        extract_archive(evil, tmp_path / "out", "evil.tar.gz")
    assert not (tmp_path / "escape.py").exists()
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tar")
    with pytest.raises(SourceError, match="not a readable tar archive"):
        extract_archive(junk, tmp_path / "out2", "junk.tar.gz")
