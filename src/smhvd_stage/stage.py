"""Sync a validated layout to s3://BUCKET/PREFIX: diff, upload, verify, then the manifest last."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from . import manifest as M
from .checksums import Md5Cache, StagedFile, checksum_all
from .errors import SOFTWARE, StageError
from .layout import Layout
from .progress import Progress, human
from .remote import Diff, diff, head, list_prefix, matches, s3_uri, stage_error
from .transfer import run_parallel, upload_all, verify_all


@dataclass(frozen=True)
class Result:
    files: int
    uploaded: int
    uploaded_bytes: int
    extra: int
    manifest_written: bool
    channels: dict[str, str]
    seconds: float


def md5_bytes(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _s3(what: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as e:
        raise stage_error(e, what) from None


def _read_manifest(client: Any, bucket: str, key: str) -> bytes | None:
    from botocore.exceptions import ClientError

    try:
        body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
            return None
        raise
    return body


def _resolve_unsure(client: Any, bucket: str, prefix: str, d: Diff, jobs: int) -> Diff:
    """Objects whose ETag is not an MD5 (multipart, SSE-KMS): equal only if their stored md5 says so."""
    if not d.check:
        return d
    same_flags = run_parallel(d.check, lambda f: matches(f, head(client, bucket, prefix + f.key)), jobs)
    same = tuple(f for f, ok in zip(d.check, same_flags, strict=True) if ok)
    upload = tuple(f for f, ok in zip(d.check, same_flags, strict=True) if not ok)
    return Diff(d.upload + upload, d.same + same, (), d.extra)


def _verify_prefix(client: Any, bucket: str, prefix: str, files: Sequence[StagedFile], jobs: int) -> None:
    """Before the manifest vouches for them: every planned file is in the bucket with its size and MD5.

    One listing per 1000 objects (a single-part PUT's ETag is the MD5 of the bytes S3 stored), a HEAD only
    for objects whose ETag is not an MD5 (SSE-KMS, multipart), where the stored `md5` metadata decides."""
    where = s3_uri(bucket, prefix)
    remote = _s3(f"{where}: verify", lambda: list_prefix(client, bucket, prefix))
    d = _s3(
        f"{where}: verify", lambda: _resolve_unsure(client, bucket, prefix, diff(files, remote, set()), jobs)
    )
    if d.upload:
        f = d.upload[0]
        obj = remote.get(f.key)
        found = "nothing" if obj is None else f"{obj.size} bytes, ETag {obj.etag}"
        raise StageError(
            f"{s3_uri(bucket, prefix + f.key)}: verify failed: expected {f.size} bytes md5 {f.md5}, found "
            f"{found}; {len(d.upload)} objects differ",
            SOFTWARE,
        )


def stage(
    layout: Layout,
    client: Any,
    bucket: str,
    prefix: str,
    *,
    jobs: int,
    cache: Md5Cache,
    log: Callable[[str], None],
    progress_stream: TextIO,
    dry_run: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> Result:
    start = clock()
    where = s3_uri(bucket, prefix)
    _s3(f"s3://{bucket}: bucket", lambda: client.head_bucket(Bucket=bucket))

    total_bytes = sum(f.size for f in layout.files)
    hashing = Progress("checksums", len(layout.files), total_bytes, progress_stream, clock=clock, lines=False)
    files = checksum_all(layout.files, cache, jobs, on_done=lambda f: hashing.advance(f.size))
    hashing.close()

    remote = _s3(f"{where}: list", lambda: list_prefix(client, bucket, prefix))
    d = _s3(
        f"{where}: head",
        lambda: _resolve_unsure(client, bucket, prefix, diff(files, remote, {M.MANIFEST_KEY}), jobs),
    )
    new_manifest = M.build(bucket, prefix, layout, files)
    manifest_key = prefix + M.MANIFEST_KEY
    existing = (
        _s3(f"{s3_uri(bucket, manifest_key)}: read", lambda: _read_manifest(client, bucket, manifest_key))
        if M.MANIFEST_KEY in remote
        else None
    )
    up_bytes = sum(f.size for f in d.upload)
    log(
        f"{where}: {len(d.same)} of {len(files)} files already there, {len(d.upload)} to upload "
        f"({human(up_bytes)})"
    )
    if d.extra:
        log(f"{where}: {len(d.extra)} other objects under the prefix (left alone, not in the manifest)")
    channels = M.channels(bucket, prefix, layout)
    up_to_date = not d.upload and M.same_files(existing, new_manifest)
    if up_to_date:
        log(f"{s3_uri(bucket, manifest_key)}: up to date, nothing to do")
        return Result(len(files), 0, 0, len(d.extra), False, channels, clock() - start)
    if dry_run:  # what a real run would upload, nothing written
        return Result(len(files), len(d.upload), up_bytes, len(d.extra), False, channels, clock() - start)

    if existing is not None:  # the old manifest must not vouch for a prefix that is about to change
        _s3(
            f"{s3_uri(bucket, manifest_key)}: delete",
            lambda: client.delete_object(Bucket=bucket, Key=manifest_key),
        )
    t_upload = clock()
    uploading = Progress("uploaded", len(d.upload), up_bytes, progress_stream, clock=clock)
    try:
        upload_all(client, bucket, prefix, d.upload, jobs, on_done=lambda f: uploading.advance(f.size))
    finally:
        uploading.close()
    t_verify = clock()
    _verify_prefix(client, bucket, prefix, files, jobs)
    log(
        f"{where}: uploaded {len(d.upload)} objects in {t_verify - t_upload:.1f}s; all {len(files)} verified "
        f"(size + md5) in {clock() - t_verify:.1f}s"
    )

    body = M.encode(new_manifest)
    manifest_file = StagedFile(M.MANIFEST_KEY, Path(M.MANIFEST_KEY), len(body), md5_bytes(body))
    _s3(
        f"{s3_uri(bucket, manifest_key)}: write",
        lambda: client.put_object(
            Bucket=bucket,
            Key=manifest_key,
            Body=body,
            ContentMD5=manifest_file.content_md5,
            ContentType="application/json",
            Metadata={"md5": manifest_file.md5},
        ),
    )
    verify_all(client, bucket, prefix, [manifest_file], 1)
    log(f"{s3_uri(bucket, manifest_key)}: written ({len(files)} files)")
    return Result(len(files), len(d.upload), up_bytes, len(d.extra), True, channels, clock() - start)
