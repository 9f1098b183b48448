"""MD5 of local files, in parallel, remembered across runs by (path, size, mtime) so a re-run reads nothing.

MD5 because it is what S3 itself checks (Content-MD5 on PUT) and what a single-part PUT's ETag is."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .errors import IO_ERROR, StageError
from .layout import LocalFile

CHUNK = 1 << 20


@dataclass(frozen=True)
class StagedFile:
    """One entry of the plan: a local file, its key under the prefix, size and MD5 (hex)."""

    key: str
    path: Path
    size: int
    md5: str

    @property
    def content_md5(self) -> str:
        """The base64 form S3's Content-MD5 header wants."""
        return base64.b64encode(bytes.fromhex(self.md5)).decode()


def md5_file(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    try:
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    except OSError as e:
        raise StageError(f"{path}: cannot read ({e.strerror})", IO_ERROR) from None
    return h.hexdigest()


class Md5Cache:
    """A JSON file: absolute path -> [size, mtime_ns, md5]. Only well-formed entries are read: a cache that
    cannot be read or parsed (cut short, nested too deeply, numbers too long), or an entry of any other shape,
    counts as absent, and `save` writes the cache anew from what this run checksummed."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, list[object]] = {}
        if path is not None:
            with contextlib.suppress(OSError, ValueError, RecursionError):
                loaded = json.loads(path.read_text())
                if isinstance(loaded, dict):
                    self.entries = {k: v for k, v in loaded.items() if _well_formed(v)}

    def get(self, path: Path, size: int, mtime_ns: int) -> str | None:
        entry = self.entries.get(str(path))
        if entry is not None and entry[:2] == [size, mtime_ns]:
            return str(entry[2])
        return None

    def put(self, path: Path, size: int, mtime_ns: int, md5: str) -> None:
        self.entries[str(path)] = [size, mtime_ns, md5]

    def save(self) -> None:
        if self.path is None:
            return
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".md5-")
            with os.fdopen(fd, "w") as f:
                json.dump(self.entries, f)
            Path(tmp).replace(self.path)


def _well_formed(entry: object) -> bool:
    """[size, mtime_ns, md5 as 32 hex digits]."""
    if not (isinstance(entry, list) and len(entry) == 3):
        return False
    size, mtime_ns, md5 = entry
    return (
        type(size) is int
        and type(mtime_ns) is int
        and isinstance(md5, str)
        and len(md5) == 32
        and all(c in "0123456789abcdef" for c in md5)
    )


def default_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "smhvd-stage" / "md5.json"


def checksum_all(
    files: Iterable[LocalFile],
    cache: Md5Cache,
    jobs: int,
    on_done: Callable[[LocalFile], None] = lambda _f: None,
) -> tuple[StagedFile, ...]:
    """The plan with checksums; a file that changed size since it was listed is an error (re-run)."""

    def one(f: LocalFile) -> StagedFile:
        try:
            st = f.path.stat()
        except OSError as e:
            raise StageError(f"{f.path}: cannot stat ({e.strerror})", IO_ERROR) from None
        if st.st_size != f.size:
            raise StageError(f"{f.path}: changed while staging ({f.size} -> {st.st_size} bytes)", IO_ERROR)
        md5 = cache.get(f.path.resolve(), st.st_size, st.st_mtime_ns)
        if md5 is None:
            md5 = md5_file(f.path)
            cache.put(f.path.resolve(), st.st_size, st.st_mtime_ns, md5)
        on_done(f)
        return StagedFile(f.key, f.path, f.size, md5)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        result = tuple(pool.map(one, files))
    cache.save()
    return result
