"""smhvd-stage-coco's documented exits that test_stage_coco.py does not reach, run as users run it: 74 (a
local file could not be read), 70 (verification: the bucket does not hold what was uploaded) and 77 with
valid keys that are not allowed (test_stage_coco.py has 77 without keys)."""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest

from support.s3 import endpoint, moto_server, s3_client, stage_coco

pytestmark = pytest.mark.integration


def write_small_coco(root: Path) -> None:
    """The smallest COCO 2017 layout the tool accepts: one image per split, one category, no annotations."""
    for split in ("train2017", "val2017"):
        (root / split).mkdir(parents=True)
        (root / split / "000000000001.jpg").write_bytes(b"\xff\xd8 not decoded by the tool \xff\xd9")
        instances = {
            "images": [{"id": 1, "file_name": "000000000001.jpg", "width": 4, "height": 4}],
            "annotations": [],
            "categories": [{"id": 1, "name": "shape"}],
        }
        (root / "annotations").mkdir(exist_ok=True)
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(instances))


def test_an_image_that_cannot_be_read_is_74_and_one_line(tmp_path: Path) -> None:
    """A symbolic link to a disk that is gone (datasets are often link farms): root reads any file, so this
    is how a read fails here. Nothing reaches S3 (no endpoint, no credentials: the tool stops before)."""
    root = tmp_path / "coco"
    write_small_coco(root)
    image = root / "val2017" / "000000000001.jpg"
    image.unlink()
    image.symlink_to(tmp_path / "unmounted" / "000000000001.jpg")
    result = stage_coco(tmp_path, str(root), "s3://bucket/coco", port=None, creds=False)
    assert result.returncode == 74, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"smhvd-stage-coco: error: {image}: cannot stat (No such file or directory)"
    )


def test_the_small_layout_is_valid(tmp_path: Path) -> None:
    """The same tree with its image in place passes every local check and stops only at S3 (no credentials:
    77): the 74 above comes from the link alone."""
    root = tmp_path / "coco"
    write_small_coco(root)
    result = stage_coco(tmp_path, str(root), "s3://bucket/coco", port=None, creds=False)
    assert result.returncode == 77, result.stderr
    assert "smhvd-stage-coco: 4 files, " in result.stderr, result.stderr


class Forwarder(BaseHTTPRequestHandler):
    """Passes every request to the S3 server as it came, and its answer back; `server.before(method, path)`
    runs first (what another client does at that moment)."""

    protocol_version = "HTTP/1.1"
    server: ForwardingServer

    def _forward(self) -> None:
        self.server.before(self.command, self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.target, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        self.send_response_only(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in {"connection", "transfer-encoding"} and not (
                name.lower() == "content-length" and self.command != "HEAD"
            ):
                self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

    def log_message(self, *_args: object) -> None:
        pass


class ForwardingServer(ThreadingHTTPServer):
    def __init__(self, target: int, before: Callable[[str, str], None]) -> None:
        super().__init__(("127.0.0.1", 0), Forwarder)
        self.target = target
        self.before = before


@pytest.fixture
def forwarding(s3_port: int) -> Iterator[Callable[[Callable[[str, str], None]], int]]:
    """start(before) -> the port of a forwarder to the S3 server that calls before(method, path) first."""
    servers: list[ForwardingServer] = []

    def start(before: Callable[[str, str], None]) -> int:
        server = ForwardingServer(s3_port, before)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return int(server.server_address[1])

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_an_object_replaced_before_verification_is_70_and_one_line(
    tmp_path: Path, s3_port: int, forwarding: Callable[[Callable[[str, str], None]], int]
) -> None:
    """Another writer replaces one staged image between its upload and the tool's check of it (the S3 server
    and the tool are real; the forwarder only lets the test act at that moment): the tool must not vouch for
    the prefix."""
    root = tmp_path / "coco"
    write_small_coco(root)
    direct = s3_client(endpoint(s3_port))
    direct.create_bucket(Bucket="replaced")
    victim = "coco/val/000000000001.jpg"
    other = b"another writer's bytes"
    seen: list[str] = []

    def replace_after_upload(method: str, path: str) -> None:
        """The tool verifies by listing the prefix: the object is replaced just before the listing that
        follows its upload."""
        listing = method == "GET" and path.startswith("/replaced?") and "list-type=2" in path
        if method == "PUT" and path == f"/replaced/{victim}":
            seen.append("uploaded")
        elif listing and seen == ["uploaded"]:
            direct.put_object(Bucket="replaced", Key=victim, Body=other)
            seen.append("replaced")

    port = forwarding(replace_after_upload)
    result = stage_coco(tmp_path, str(root), "s3://replaced/coco", port=port)
    assert seen == ["uploaded", "replaced"], (seen, result.stderr)
    assert result.returncode == 70, result.stderr
    assert "Traceback" not in result.stderr
    staged = (root / "val2017" / "000000000001.jpg").read_bytes()
    expected = hashlib.md5(staged, usedforsecurity=False).hexdigest()
    found = hashlib.md5(other, usedforsecurity=False).hexdigest()
    assert result.stderr.splitlines()[-1] == (
        f"smhvd-stage-coco: error: s3://replaced/{victim}: verify failed: expected {len(staged)} bytes md5 "
        f"{expected}, found {len(other)} bytes, ETag {found}; 1 objects differ"
    )
    listed = direct.list_objects_v2(Bucket="replaced", Prefix="coco/")
    assert "coco/annotations/_manifest.json" not in {o["Key"] for o in listed.get("Contents", [])}


def test_keys_without_permission_to_write_are_77_and_one_line(tmp_path: Path) -> None:
    """moto checks IAM after its first 7 requests (made here: two users, each with a policy and a key, and
    the bucket). A read-only user's upload is denied; the same run by a user allowed s3:* stages: the 77
    comes from the policy."""
    root = tmp_path / "coco"
    write_small_coco(root)
    policies = {"reader": ["s3:List*", "s3:Get*", "s3:Head*"], "writer": ["s3:*"]}
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "7"}) as port:
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint(port),
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        keys = {}
        for user, actions in policies.items():
            iam.create_user(UserName=user)
            document = {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
            }
            iam.put_user_policy(UserName=user, PolicyName=user, PolicyDocument=json.dumps(document))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = {
                "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            }
        s3_client(endpoint(port)).create_bucket(Bucket="guarded")
        denied = stage_coco(tmp_path, str(root), "s3://guarded/coco", port=port, env=keys["reader"])
        allowed = stage_coco(tmp_path, str(root), "s3://guarded/coco", port=port, env=keys["writer"])
    assert denied.returncode == 77, denied.stderr
    assert "Traceback" not in denied.stderr
    line = denied.stderr.splitlines()[-1]
    assert line.startswith("smhvd-stage-coco: error: s3://guarded/coco/"), line
    assert ": upload of " in line and line.endswith(": access denied (AccessDenied: Access Denied)"), line
    assert allowed.returncode == 0, allowed.stderr
