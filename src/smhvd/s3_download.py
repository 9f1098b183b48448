"""`python -m smhvd.s3_download S3_URI FILE [REGION]`: download the code's .tar.gz, as a child process:
boto3's threads cannot be interrupted by a signal, and a stop must end the download at once. Exit 0, or 66
with one line on stderr saying why (AWS_ENDPOINT_URL_S3 is honoured)."""

from __future__ import annotations

import os
import sys
from urllib.parse import urlparse

from smhvd.errors import EX_NOINPUT, EX_USAGE


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m smhvd.s3_download S3_URI FILE [REGION]", file=sys.stderr)
        return EX_USAGE
    uri, target = args[0], args[1]
    region = (args[2] if len(args) == 3 else "") or os.environ.get("AWS_REGION") or "us-east-1"
    parsed = urlparse(uri)
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        print("boto3 is not installed", file=sys.stderr)
        return EX_NOINPUT
    try:
        boto3.client("s3", region_name=region).download_file(parsed.netloc, parsed.path.lstrip("/"), target)
    except (BotoCoreError, ClientError, OSError) as exc:
        print(" ".join(str(exc).split()), file=sys.stderr)
        return EX_NOINPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
