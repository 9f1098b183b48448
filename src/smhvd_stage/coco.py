"""smhvd-stage-coco: validate a local COCO 2017 directory and sync it + pretrained weights to S3.

    smhvd-stage-coco /data/coco s3://BUCKET/coco2017 --weights ImageNet-R50-AlignPadding.npz

Layout read:    DIR/train2017/, DIR/val2017/, DIR/annotations/instances_{train,val}2017.json
Layout written: s3://BUCKET/PREFIX/{train,val,annotations,pretrained}/, last PREFIX/annotations/_manifest.json
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import manifest as M
from .checksums import Md5Cache, default_cache_path
from .download import COCO_BASE_URL, download_coco
from .errors import INTERRUPTED, NO_PERMISSION, USAGE, StageError
from .layout import validate
from .progress import human
from .remote import parse_s3_uri
from .stage import stage

PROG = "smhvd-stage-coco"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Validate a COCO 2017 directory and sync it and pretrained weights to S3 "
        "(resumable, idempotent; prints the estimator inputs).",
    )
    p.add_argument("source", type=Path, help="directory with train2017/, val2017/, annotations/")
    p.add_argument("destination", help="s3://BUCKET/PREFIX")
    p.add_argument("--weights", type=Path, help="tensorpack ImageNet-pretrained ResNet .npz -> pretrained/")
    p.add_argument(
        "--endpoint-url",
        default=None,
        help="S3-compatible endpoint (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)",
    )
    p.add_argument("--region", default=None, help="AWS region (default: the AWS configuration's)")
    p.add_argument("--jobs", type=positive_int, default=8, help="parallel transfers and checksums (8)")
    p.add_argument(
        "--download",
        action="store_true",
        help="first fetch the official COCO 2017 archives into SOURCE and unpack them (resumable)",
    )
    p.add_argument(
        "--coco-base-url",
        default=COCO_BASE_URL,
        help=f"where --download fetches zips/train2017.zip etc. (default {COCO_BASE_URL}; a mirror)",
    )
    p.add_argument("--dry-run", action="store_true", help="validate, checksum and compare; upload nothing")
    p.add_argument(
        "--checksum-cache",
        type=Path,
        default=None,
        help=f"MD5 cache file (default {default_cache_path()}); 'none' disables it",
    )
    return p


def s3_client(endpoint_url: str | None, region: str | None, jobs: int) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise StageError(
            "boto3 is not installed: pip install 'sagemaker-horovod-launcher[stage]'", USAGE
        ) from None
    config = Config(
        max_pool_connections=jobs + 2,
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
    )
    # boto3 reads AWS_ENDPOINT_URL_S3 itself (botocore >= 1.31.61) when endpoint_url is None.
    return boto3.session.Session(region_name=region).client("s3", endpoint_url=endpoint_url, config=config)


def run(args: argparse.Namespace) -> int:
    bucket, prefix = parse_s3_uri(args.destination)

    def log(line: str) -> None:
        print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    if args.download:
        download_coco(args.source, args.coco_base_url, sys.stderr, log)
    layout = validate(args.source, args.weights)
    for s in layout.splits:
        log(s.describe())
    if layout.weights is not None:
        log(layout.weights.describe())
    log(f"{len(layout.files)} files, {human(sum(f.size for f in layout.files))} to stage")
    cache_path = args.checksum_cache or default_cache_path()
    cache = Md5Cache(None if str(cache_path) == "none" else cache_path)
    client = s3_client(args.endpoint_url, args.region, args.jobs)
    result = stage(
        layout,
        client,
        bucket,
        prefix,
        jobs=args.jobs,
        cache=cache,
        log=log,
        progress_stream=sys.stderr,
        dry_run=args.dry_run,
    )
    verb, done = ("dry run, would stage", "to upload") if args.dry_run else ("staged", "uploaded")
    log(
        f"{verb} {result.files} files in {result.seconds:.1f}s: {result.uploaded} {done} "
        f"({human(result.uploaded_bytes)}), {result.files - result.uploaded} already there"
    )
    if not args.dry_run:
        print(M.inputs_text(result.channels))
    return 0


def _terminate(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # stop like Ctrl-C: what is uploaded stays, no manifest
        signal.signal(sig, _terminate)
    try:
        return run(args)
    except StageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted, no manifest written: run the same command to resume", file=sys.stderr)
        return INTERRUPTED
    except PermissionError as e:
        print(f"{PROG}: error: {e.filename}: permission denied", file=sys.stderr)
        return NO_PERMISSION


if __name__ == "__main__":
    sys.exit(main())
