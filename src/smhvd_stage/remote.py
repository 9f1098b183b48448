"""What the bucket holds, compared with the plan; S3 errors turned into one-line StageErrors.

Which checksum to compare: the ETag of an object written by one PutObject (without SSE-KMS/SSE-C) is the
hex MD5 of its bytes, so a listing alone (size + ETag) proves an object equals the local file. A multipart
ETag ("<md5 of part md5s>-N", e.g. from `aws s3 sync`) or an encrypted object's ETag is not an MD5: for
those the tool reads the `md5` user metadata it stores on every object it writes (one HEAD each), and
re-uploads when it is absent. Every object this tool writes is a single PUT with Content-MD5, so S3 itself
rejects a body that arrived corrupted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .checksums import StagedFile
from .errors import NO_PERMISSION, UNAVAILABLE, USAGE, StageError

MD5_HEX = re.compile(r"^[0-9a-f]{32}$")
DENIED = {
    "AccessDenied",
    "403",
    "Forbidden",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
}


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """s3://BUCKET[/PREFIX] -> (bucket, "PREFIX/" or "")."""
    m = re.fullmatch(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(/.*)?", uri)
    if m is None:
        raise StageError(f"{uri!r}: expected s3://BUCKET/PREFIX (a valid bucket name)", USAGE)
    prefix = (m.group(2) or "").strip("/")
    if "//" in prefix:
        raise StageError(f"{uri!r}: empty path segment in the prefix", USAGE)
    return m.group(1), f"{prefix}/" if prefix else ""


def s3_uri(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def stage_error(exc: BaseException, what: str) -> StageError:
    """One line for any boto3/botocore failure, with the exit code the user's next step depends on."""
    from botocore.exceptions import (
        ClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return StageError(
            f"{what}: no AWS credentials found (set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or run on a machine with a role)",
            NO_PERMISSION,
        )
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        message = str(err.get("Message", "")) or code
        if code in DENIED:
            return StageError(f"{what}: access denied ({code}: {message})", NO_PERMISSION)
        if code in {"NoSuchBucket", "404"} and "bucket" in what:
            return StageError(f"{what}: no such bucket", UNAVAILABLE)
        return StageError(f"{what}: {code}: {message}", UNAVAILABLE)
    return StageError(f"{what}: {exc}", UNAVAILABLE)


@dataclass(frozen=True)
class RemoteObject:
    size: int
    etag: str  # without quotes


def list_prefix(client: Any, bucket: str, prefix: str) -> dict[str, RemoteObject]:
    """Every object under the prefix: key relative to the prefix -> size and ETag."""
    out: dict[str, RemoteObject] = {}
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) :]] = RemoteObject(int(obj["Size"]), str(obj["ETag"]).strip('"'))
    return out


@dataclass(frozen=True)
class Diff:
    upload: tuple[StagedFile, ...]  # absent or different
    same: tuple[StagedFile, ...]  # size and ETag (= MD5) match
    check: tuple[StagedFile, ...]  # same size, ETag is not an MD5: decide by the stored md5 metadata
    extra: tuple[str, ...]  # keys under the prefix that are not in the plan (left alone)


def diff(files: Sequence[StagedFile], remote: Mapping[str, RemoteObject], ignore: set[str]) -> Diff:
    upload, same, check = [], [], []
    for f in files:
        obj = remote.get(f.key)
        if obj is None or obj.size != f.size:
            upload.append(f)
        elif obj.etag == f.md5:
            same.append(f)
        elif MD5_HEX.match(obj.etag):
            upload.append(f)  # a single-part object with other content
        else:
            check.append(f)
    planned = {f.key for f in files} | ignore
    extra = tuple(sorted(k for k in remote if k not in planned))
    return Diff(tuple(upload), tuple(same), tuple(check), extra)


def head(client: Any, bucket: str, key: str) -> tuple[int, str | None, str] | None:
    """(size, md5 metadata, ETag) of an object, None when it does not exist."""
    from botocore.exceptions import ClientError

    try:
        r = client.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
            return None
        raise
    meta = r.get("Metadata") or {}
    return int(r["ContentLength"]), meta.get("md5"), str(r.get("ETag", "")).strip('"')


def matches(f: StagedFile, found: tuple[int, str | None, str] | None) -> bool:
    """An object equals a planned file: same size and MD5 (stored metadata, or a single-part ETag)."""
    if found is None:
        return False
    size, md5, etag = found
    return size == f.size and (md5 == f.md5 or (md5 is None and etag == f.md5))
