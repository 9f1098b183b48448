"""Fetch the official COCO 2017 archives into a directory and unpack them there (when the network allows).

Resumable: a finished archive (its size equals the server's Content-Length) is not fetched again, a partial
one (`NAME.part`) continues with an HTTP Range request where the server honours it, and an archive counts as
unpacked only once its marker file is written after the last member.
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from .errors import DATA_ERROR, IO_ERROR, UNAVAILABLE, StageError
from .progress import Progress

COCO_BASE_URL = "http://images.cocodataset.org/"
ARCHIVES = ("zips/train2017.zip", "zips/val2017.zip", "annotations/annotations_trainval2017.zip")
CHUNK = 1 << 20
TIMEOUT = 60


def _open(url: str, start: int = 0) -> tuple[object, int | None, bool]:
    """(response, total size or None, whether it resumes at `start`)."""
    headers = {"Range": f"bytes={start}-"} if start else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (http(s) URLs of a mirror the user names)
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT)  # noqa: S310
    except urllib.error.HTTPError as e:
        if e.code == 416 and start:  # asked past the end: the partial file is complete or stale
            return _open(url, 0)
        raise StageError(f"{url}: cannot download (HTTP {e.code} {e.reason})", UNAVAILABLE) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise StageError(f"{url}: cannot download ({reason})", UNAVAILABLE) from None
    resumed = start > 0 and response.status == 206
    length = response.headers.get("Content-Length")
    total = int(length) + (start if resumed else 0) if length is not None else None
    return response, total, resumed


def fetch(url: str, target: Path, progress_stream: TextIO) -> bool:
    """Download `url` to `target` unless it is already complete; returns whether anything was fetched."""
    part = target.with_name(target.name + ".part")
    start = part.stat().st_size if part.exists() else 0
    response, total, resumed = _open(url, start)
    with response:  # type: ignore[attr-defined]
        if target.exists() and total is not None and target.stat().st_size == total:
            return False
        done = start if resumed else 0
        progress = Progress(f"downloading {target.name}:", 1, total or 0, progress_stream, lines=False)
        progress.advance(done, files=0)
        try:
            with part.open("ab" if resumed else "wb") as out:
                while chunk := response.read(CHUNK):  # type: ignore[attr-defined]
                    out.write(chunk)
                    done += len(chunk)
                    progress.advance(len(chunk), files=0)
        except OSError as e:
            raise StageError(f"{url}: download interrupted ({e}); run again to resume", UNAVAILABLE) from None
        finally:
            progress.close()
    if total is not None and done != total:
        raise StageError(f"{url}: got {done} of {total} bytes; run again to resume", UNAVAILABLE)
    part.replace(target)
    return True


def unpack(archive: Path, root: Path) -> bool:
    """Extract into root once (a marker records completion); returns whether anything was extracted."""
    marker = root / f".{archive.name}.unpacked"
    if marker.exists() and marker.stat().st_mtime >= archive.stat().st_mtime:
        return False
    try:
        with zipfile.ZipFile(archive) as z:
            bad = next((n for n in z.namelist() if n.startswith("/") or ".." in Path(n).parts), None)
            if bad is not None:
                raise StageError(f"{archive}: refusing member {bad!r} outside the directory", DATA_ERROR)
            z.extractall(root)
    except zipfile.BadZipFile as e:
        raise StageError(f"{archive}: not a zip archive ({e}); delete it and run again", DATA_ERROR) from None
    except OSError as e:
        raise StageError(f"{archive}: cannot extract ({e.strerror})", IO_ERROR) from None
    marker.touch()
    return True


def download_coco(root: Path, base_url: str, progress_stream: TextIO, log: Callable[[str], None]) -> None:
    """The three official archives into root/_archives, unpacked into root (train2017/, val2017/,
    annotations/)."""
    archives = root / "_archives"
    try:
        archives.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StageError(f"{archives}: cannot create ({e.strerror})", IO_ERROR) from None
    if shutil.disk_usage(archives).free < 1 << 20:
        raise StageError(f"{archives}: no free space", IO_ERROR)
    for name in ARCHIVES:
        url = base_url.rstrip("/") + "/" + name
        target = archives / Path(name).name
        fetched = fetch(url, target, progress_stream)
        unpacked = unpack(target, root)
        log(
            f"{url}: {'downloaded' if fetched else 'already downloaded'}, "
            f"{'unpacked' if unpacked else 'already unpacked'} into {root}"
        )
