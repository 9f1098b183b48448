"""`python -m smhvd.s3_download S3_URI FILE [REGION]`: download one object (the training code's .tar.gz).

sourcecode.py runs this as a child process: boto3 downloads in threads that a signal cannot interrupt, and an
endpoint that stops answering holds them for minutes, so a stop during the download ends this process (and
every thread with it) instead. The endpoint is boto3's own choice (AWS_ENDPOINT_URL_S3 is honoured).
Exit 0, or 66 with one line on stderr saying why.
"""

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
