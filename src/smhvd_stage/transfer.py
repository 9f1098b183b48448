"""Parallel uploads (one PutObject per file, Content-MD5 + `md5` metadata) and their verification by HEAD."""

from __future__ import annotations

import mimetypes
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from .checksums import StagedFile
from .errors import IO_ERROR, SOFTWARE, StageError
from .remote import head, matches, s3_uri, stage_error

T = TypeVar("T")


def run_parallel(items: Sequence[StagedFile], fn: Callable[[StagedFile], T], jobs: int) -> list[T]:
    """fn over items on `jobs` threads; the first failure cancels what has not started and is raised."""
    pool = ThreadPoolExecutor(max_workers=jobs)
    futures: list[Future[T]] = []
    try:
        futures = [pool.submit(fn, item) for item in items]
        done, _pending = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f in done and f.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def put_file(client: Any, bucket: str, key: str, f: StagedFile) -> None:
    content_type = mimetypes.guess_type(f.path.name)[0] or "application/octet-stream"
    try:
        with f.path.open("rb") as body:
            client.put_object(
                Bucket=bucket,
                Key=key,
                Body=body,
                ContentLength=f.size,
                ContentMD5=f.content_md5,
                ContentType=content_type,
                Metadata={"md5": f.md5},
            )
    except OSError as e:
        raise StageError(f"{f.path}: cannot read ({e.strerror})", IO_ERROR) from None
    except Exception as e:
        raise stage_error(e, f"{s3_uri(bucket, key)}: upload of {f.path}") from None


def upload_all(
    client: Any,
    bucket: str,
    prefix: str,
    files: Sequence[StagedFile],
    jobs: int,
    on_done: Callable[[StagedFile], None],
) -> None:
    def one(f: StagedFile) -> None:
        put_file(client, bucket, prefix + f.key, f)
        on_done(f)

    run_parallel(files, one, jobs)


def verify_all(client: Any, bucket: str, prefix: str, files: Sequence[StagedFile], jobs: int) -> None:
    """HEAD every object: its size and stored MD5 must be the local file's."""

    def one(f: StagedFile) -> None:
        key = prefix + f.key
        try:
            found = head(client, bucket, key)
        except Exception as e:
            raise stage_error(e, f"{s3_uri(bucket, key)}: verify") from None
        if not matches(f, found):
            raise StageError(
                f"{s3_uri(bucket, key)}: verify failed: expected {f.size} bytes md5 {f.md5}, found "
                + ("nothing" if found is None else f"{found[0]} bytes md5 {found[1] or found[2]}"),
                SOFTWARE,
            )

    run_parallel(files, one, jobs)
