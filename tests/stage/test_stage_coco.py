"""smhvd-stage-coco against a real S3-compatible server (moto) on 127.0.0.1, run as users run it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from smhvd.proc.waiting import wait_until
from support.s3 import endpoint, s3_client, stage_coco

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHANNELS = ("train", "val", "annotations", "pretrained")


@pytest.fixture(scope="module")
def s3_server(s3_port):
    """The moto server's port."""
    return s3_port


def s3(port: int):
    return s3_client(endpoint(port))


_buckets = iter(range(1000))


@pytest.fixture
def bucket(s3_server):
    name = f"stage-{next(_buckets)}"
    s3(s3_server).create_bucket(Bucket=name)
    return name


def keys(port: int, bucket: str) -> dict[str, int]:
    pages = s3(port).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def write_coco(root: Path, n_train: int = 6) -> Path:
    """A tiny COCO 2017 layout: colour and grayscale JPEGs, polygon and crowd-RLE annotations, an image
    without annotations; plus a tensorpack-style weights .npz. Returns the weights path."""
    import cv2

    rng = np.random.default_rng(0)
    cats = [{"id": 1, "name": "circle", "supercategory": "shape"}, {"id": 3, "name": "square"}]
    for split, count in (("train2017", n_train), ("val2017", 3)):
        (root / split).mkdir(parents=True)
        images, anns = [], []
        for i in range(1, count + 1):
            name = f"{i:012d}.jpg"
            shape = (48, 64) if i == 2 else (48, 64, 3)  # image 2: grayscale
            cv2.imwrite(str(root / split / name), rng.integers(0, 255, shape, dtype=np.uint8))
            images.append({"id": i, "file_name": name, "height": 48, "width": 64})
            if i == 3:  # image 3: no annotations
                continue
            poly = [8.0, 8.0, 30.0, 8.0, 30.0, 30.0, 8.0, 30.0]
            anns.append(
                {"id": 10 * i, "image_id": i, "category_id": 1, "bbox": [8, 8, 22, 22], "area": 484.0}
                | {"iscrowd": 0, "segmentation": [poly]}
            )
            if i == 1:  # a crowd region in uncompressed RLE, as COCO has them
                rle = {"counts": [100, 20, 48 * 64 - 120], "size": [48, 64]}
                anns.append(
                    {"id": 10 * i + 1, "image_id": i, "category_id": 3, "bbox": [2, 2, 1, 20]}
                    | {"area": 20.0, "iscrowd": 1, "segmentation": rle}
                )
        (root / "annotations").mkdir(exist_ok=True)
        data = {"info": {}, "licenses": [], "images": images, "annotations": anns, "categories": cats}
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(data))
    (root / "annotations" / "captions_train2017.json").write_text("{}")  # as downloaded: not staged
    weights = root.parent / "ImageNet-R50-AlignPadding.npz"
    np.savez(
        weights,
        **{"conv0/W": np.ones((7, 7, 3, 8), np.float32), "group0/block0/conv1/W": np.zeros((1, 1, 8, 8))},
    )
    return weights


@pytest.fixture
def coco(tmp_path):
    root = tmp_path / "coco"
    weights = write_coco(root)
    return root, weights


def expected_keys(prefix: str, n_train: int = 6) -> set[str]:
    out = {f"{prefix}train/{i:012d}.jpg" for i in range(1, n_train + 1)}
    out |= {f"{prefix}val/{i:012d}.jpg" for i in range(1, 4)}
    out |= {f"{prefix}annotations/instances_train2017.json", f"{prefix}annotations/instances_val2017.json"}
    return out | {f"{prefix}pretrained/ImageNet-R50-AlignPadding.npz"}


def stage(tmp_path, *args: str, port: int | None, creds: bool = True, timeout: float = 60):
    return stage_coco(tmp_path, *args, port=port, creds=creds, timeout=timeout)


def one_error_line(result, code: int) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip().endswith(errors[0])
    return errors[0]


def uploaded_count(stderr: str) -> int:
    m = re.search(r"(\d+) to upload", stderr)
    assert m, stderr
    return int(m.group(1))


def test_first_run_uploads_everything_second_run_nothing(tmp_path, s3_server, bucket, coco):
    root, weights = coco
    dest = f"s3://{bucket}/datasets/coco2017"
    first = stage(tmp_path, str(root), dest, "--weights", str(weights), port=s3_server)
    assert first.returncode == 0, first.stderr
    prefix = "datasets/coco2017/"
    assert set(keys(s3_server, bucket)) == expected_keys(prefix) | {prefix + "annotations/_manifest.json"}
    assert "train: 6 images (1 without annotations), 6 annotations (1 crowd), 2 categories" in first.stderr
    assert "val: 3 images (1 without annotations), 3 annotations (1 crowd), 2 categories" in first.stderr
    assert "pretrained: ImageNet-R50-AlignPadding.npz, 2 arrays" in first.stderr
    assert uploaded_count(first.stderr) == 12
    inputs = first.stdout.strip()
    assert inputs.startswith("inputs = {")
    namespace: dict[str, object] = {}
    exec(inputs, namespace)  # what a user pastes into a notebook
    assert namespace["inputs"] == {c: f"s3://{bucket}/{prefix}{c}/" for c in CHANNELS}

    client = s3(s3_server)
    body = client.get_object(Bucket=bucket, Key="datasets/coco2017/train/000000000001.jpg")["Body"].read()
    assert body == (root / "train2017" / "000000000001.jpg").read_bytes()
    manifest = json.loads(
        client.get_object(Bucket=bucket, Key=prefix + "annotations/_manifest.json")["Body"].read()
    )
    assert set(manifest["files"]) == {k[len(prefix) :] for k in expected_keys(prefix)}
    assert manifest["channels"] == namespace["inputs"]
    head = client.head_object(Bucket=bucket, Key=prefix + "annotations/instances_val2017.json")
    assert head["Metadata"]["md5"] == manifest["files"]["annotations/instances_val2017.json"]["md5"]

    before = client.head_object(Bucket=bucket, Key=prefix + "annotations/_manifest.json")["LastModified"]
    again = stage(tmp_path, str(root), dest, "--weights", str(weights), port=s3_server)
    assert again.returncode == 0, again.stderr
    assert uploaded_count(again.stderr) == 0
    assert "12 of 12 files already there" in again.stderr
    assert "_manifest.json: up to date, nothing to do" in again.stderr
    assert again.stdout == first.stdout
    assert (
        client.head_object(Bucket=bucket, Key=prefix + "annotations/_manifest.json")["LastModified"] == before
    )

    # One image changes: only it is uploaded, and the manifest is rewritten to match.
    (root / "val2017" / "000000000002.jpg").write_bytes(b"\xff\xd8 not the same image")
    third = stage(tmp_path, str(root), dest, "--weights", str(weights), port=s3_server)
    assert third.returncode == 0, third.stderr
    assert uploaded_count(third.stderr) == 1
    manifest = json.loads(
        client.get_object(Bucket=bucket, Key=prefix + "annotations/_manifest.json")["Body"].read()
    )
    assert manifest["files"]["val/000000000002.jpg"]["size"] == len(b"\xff\xd8 not the same image")


class CuttingProxy:
    """A TCP proxy to the S3 server that drops every connection for good once `limit` request bytes have
    passed: the network going away in the middle of an upload (requests cut mid-body never complete)."""

    def __init__(self, target_port: int, limit: int) -> None:
        self.target_port, self.limit, self.sent = target_port, limit, 0
        self.cut = threading.Event()
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.sockets += [client, upstream]
            threading.Thread(target=self.pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self.pump, args=(upstream, client, False), daemon=True).start()

    def pump(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(65536):
                if counted:
                    with self.lock:
                        self.sent += len(data)
                        if self.sent > self.limit:
                            self.cut.set()
                    if self.cut.is_set():
                        dst.sendall(data[: len(data) // 2])  # a torn request
                        break
                if self.cut.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        if self.cut.is_set():
            with self.lock:
                for s in self.sockets:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.cut.set()
        self.listener.close()


def test_interrupted_upload_is_completed_by_the_next_run(tmp_path, s3_server, bucket):
    root = tmp_path / "coco"
    weights = write_coco(root, n_train=30)
    total = sum(p.stat().st_size for p in root.rglob("*.jpg"))
    dest = f"s3://{bucket}/coco"
    proxy = CuttingProxy(s3_server, limit=total // 2)
    try:
        cut = stage(tmp_path, str(root), dest, "--weights", str(weights), "--jobs", "2", port=proxy.port)
    finally:
        proxy.close()
    assert proxy.cut.is_set()
    line = one_error_line(cut, 69)
    assert re.search(r"s3://stage-\d+/coco/\S+: (upload of|verify|list)", line), line
    present = set(keys(s3_server, bucket))
    wanted = expected_keys("coco/", n_train=30)
    assert "coco/annotations/_manifest.json" not in present  # nothing a later run or a job would trust
    assert 0 < len(present) < len(wanted), present
    assert present < wanted

    done = stage(tmp_path, str(root), dest, "--weights", str(weights), port=s3_server)
    assert done.returncode == 0, done.stderr
    assert uploaded_count(done.stderr) == len(wanted - present)
    assert set(keys(s3_server, bucket)) == wanted | {"coco/annotations/_manifest.json"}
    assert stage(tmp_path, str(root), dest, "--weights", str(weights), port=s3_server).returncode == 0


def test_missing_image_is_one_line_and_nothing_is_uploaded(tmp_path, s3_server, bucket, coco):
    root, weights = coco
    (root / "val2017" / "000000000003.jpg").unlink()
    result = stage(tmp_path, str(root), f"s3://{bucket}/coco", "--weights", str(weights), port=s3_server)
    line = one_error_line(result, 66)
    assert line == (
        "smhvd-stage-coco: error: val2017/000000000003.jpg: missing (referenced by "
        "annotations/instances_val2017.json); 1 of 3 referenced images missing"
    )
    assert keys(s3_server, bucket) == {}


def test_broken_json_is_one_line_and_nothing_is_uploaded(tmp_path, s3_server, bucket, coco):
    root, weights = coco
    path = root / "annotations" / "instances_train2017.json"
    path.write_text(path.read_text()[:-40])
    result = stage(tmp_path, str(root), f"s3://{bucket}/coco", "--weights", str(weights), port=s3_server)
    line = one_error_line(result, 65)
    assert line.startswith("smhvd-stage-coco: error: annotations/instances_train2017.json: not valid JSON (")
    assert keys(s3_server, bucket) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "not valid JSON (nested too deeply)"),
        ('{"images": [{"id": ' + "7" * 5000 + "}]}", "not valid JSON (Exceeds the limit (4300 digits)"),
    ],
    ids=["nested-100000", "5000-digits"],
)
def test_hostile_json_is_one_line_and_65(tmp_path, coco, text, message):
    root, weights = coco
    (root / "annotations" / "instances_val2017.json").write_text(text)
    result = stage(tmp_path, str(root), "s3://bkt/coco", "--weights", str(weights), port=None)
    line = one_error_line(result, 65)
    assert line.startswith(f"smhvd-stage-coco: error: annotations/instances_val2017.json: {message}"), line


@pytest.mark.parametrize(
    "cache",
    [
        "cut-short",  # entries of every wrong shape, as a run killed mid-write or an older format leaves them
        '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"a": [' + "9" * 5000 + "]}",
        '{"a": [1, 2',
        "\udcff\udcfe",  # the bytes ff fe (written with surrogateescape): not UTF-8
    ],
    ids=["cut-short-entries", "nested-100000", "5000-digits", "truncated", "not-utf8"],
)
def test_a_broken_checksum_cache_is_rebuilt(tmp_path, s3_server, bucket, coco, cache):
    root, weights = coco
    files = [*sorted(p.resolve() for p in root.rglob("*") if p.is_file()), weights.resolve()]
    cache_file = tmp_path / "md5.json"  # where stage() keeps it
    if cache == "cut-short":  # each file's true size and mtime, then a cut-short or odd rest
        rests: list[list[object]] = [[], ["0123abcd"], [None], [12345], ["f" * 32, "extra"]]
        entries: dict[str, object] = {}
        for i, path in enumerate(files):
            st = path.stat()
            entries[str(path)] = [st.st_size, st.st_mtime_ns, *rests[i % len(rests)]]
        entries["elsewhere"] = {"size": 1}
        cache = json.dumps(entries)
    cache_file.write_bytes(cache.encode("utf-8", "surrogateescape"))
    argv = [str(root), f"s3://{bucket}/coco", "--weights", str(weights), "--dry-run"]
    result = stage(tmp_path, *argv, port=s3_server)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    rebuilt = json.loads(cache_file.read_text())
    staged = [p for p in files if "captions" not in p.name]
    assert {str(p) for p in staged} <= set(rebuilt)
    for path in staged:
        st = path.stat()
        assert rebuilt[str(path)] == [st.st_size, st.st_mtime_ns, hashlib.md5(path.read_bytes()).hexdigest()]


def test_broken_weights_is_one_line(tmp_path, s3_server, bucket, coco):
    root, weights = coco
    weights.write_bytes(b"not a zip")
    result = stage(tmp_path, str(root), f"s3://{bucket}/coco", "--weights", str(weights), port=s3_server)
    assert one_error_line(result, 65).endswith(
        "ImageNet-R50-AlignPadding.npz: not a NumPy .npz archive " "(File is not a zip file)"
    )


def test_no_such_bucket_is_one_line(tmp_path, s3_server, coco):
    root, weights = coco
    result = stage(tmp_path, str(root), "s3://no-such-bucket/coco", "--weights", str(weights), port=s3_server)
    assert (
        one_error_line(result, 69) == "smhvd-stage-coco: error: s3://no-such-bucket: bucket: no such bucket"
    )


def test_unreachable_endpoint_is_one_line(tmp_path, coco):
    root, weights = coco
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    result = stage(tmp_path, str(root), "s3://bkt/coco", "--weights", str(weights), port=port)
    assert "Could not connect" in one_error_line(result, 69)


def test_no_credentials_is_one_line(tmp_path, s3_server, bucket, coco):
    root, weights = coco
    result = stage(tmp_path, str(root), f"s3://{bucket}/coco", port=s3_server, creds=False)
    line = one_error_line(result, 77)
    assert line.startswith(f"smhvd-stage-coco: error: s3://{bucket}: bucket: no AWS credentials found")


def test_usage_errors(tmp_path, coco):
    root, _weights = coco
    assert one_error_line(stage(tmp_path, str(root), "bkt/coco", port=None), 2).endswith(
        "'bkt/coco': expected s3://BUCKET/PREFIX (a valid bucket name)"
    )
    assert stage(tmp_path, str(root), port=None).returncode == 2
    result = stage(tmp_path, str(tmp_path / "nope"), "s3://bkt/x", port=None)
    assert one_error_line(result, 66).endswith(
        "nope: no such directory (expected train2017/, val2017/, annotations/)"
    )


def test_wrapper_script_dry_run_uploads_nothing(tmp_path, s3_server, bucket, coco):
    root, weights = coco
    env = {**os.environ, "AWS_ENDPOINT_URL_S3": endpoint(s3_server), "PYTHON": sys.executable}
    env |= {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    argv = [str(REPO / "bin" / "stage-coco.sh"), str(root), f"s3://{bucket}/coco", "--weights", str(weights)]
    argv += ["--dry-run", "--checksum-cache", "none"]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert uploaded_count(result.stderr) == 12
    assert "dry run, would stage 12 files in " in result.stderr
    assert ": 12 to upload (" in result.stderr
    assert keys(s3_server, bucket) == {}
    assert subprocess.run([argv[0]], capture_output=True, check=False).returncode == 2


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_a_stopped_run_leaves_no_manifest_and_a_rerun_resumes(sig, tmp_path, s3_server, bucket):
    root = tmp_path / "coco"
    weights = write_coco(root, n_train=300)
    dest = f"s3://{bucket}/coco"
    env = {**os.environ, "AWS_ENDPOINT_URL_S3": endpoint(s3_server), "AWS_DEFAULT_REGION": "us-east-1"}
    env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    argv = [
        sys.executable,
        "-m",
        "smhvd_stage.coco",
        str(root),
        dest,
        "--weights",
        str(weights),
        "--jobs",
        "1",
    ]
    proc = subprocess.Popen(
        [*argv, "--checksum-cache", "none"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 (Ctrl-C as in a terminal)
    )
    wait_until(lambda: keys(s3_server, bucket) or None, what="the first upload", timeout=60, maximum=0.05)
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.rstrip().splitlines()[-1] == (
        "smhvd-stage-coco: interrupted, no manifest written: run the same command to resume"
    )
    present = set(keys(s3_server, bucket))
    assert "coco/annotations/_manifest.json" not in present
    assert 0 < len(present) < 306

    done = stage(tmp_path, str(root), dest, "--weights", str(weights), port=s3_server)
    assert done.returncode == 0, done.stderr
    assert uploaded_count(done.stderr) == 306 - len(present)
    assert "coco/annotations/_manifest.json" in keys(s3_server, bucket)


def test_verification_catches_an_object_that_differs(tmp_path, s3_server, bucket, coco):
    from smhvd_stage.checksums import Md5Cache, checksum_all
    from smhvd_stage.errors import SOFTWARE, StageError
    from smhvd_stage.layout import validate
    from smhvd_stage.stage import _verify_prefix

    root, weights = coco
    assert (
        stage(tmp_path, str(root), f"s3://{bucket}/v", "--weights", str(weights), port=s3_server).returncode
        == 0
    )
    files = checksum_all(validate(root, weights).files, Md5Cache(None), jobs=2)
    client = s3(s3_server)
    _verify_prefix(client, bucket, "v/", files, jobs=2)
    client.put_object(Bucket=bucket, Key="v/val/000000000001.jpg", Body=b"something else")
    with pytest.raises(StageError) as e:
        _verify_prefix(client, bucket, "v/", files, jobs=2)
    assert e.value.code == SOFTWARE
    assert str(e.value).startswith(f"s3://{bucket}/v/val/000000000001.jpg: verify failed: expected ")
    assert str(e.value).endswith("found 14 bytes, ETag 6c7ba9c5a141421e1c03cb9807c97c74; 1 objects differ")


@pytest.fixture
def coco_mirror(tmp_path):
    """The official archive layout (zips/train2017.zip, zips/val2017.zip,
    annotations/annotations_trainval2017.zip) on a local HTTP server; yields its base URL."""
    import functools
    import zipfile
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    source = tmp_path / "official"
    write_coco(source)
    www = tmp_path / "www"
    for archive, top in (
        ("zips/train2017.zip", "train2017"),
        ("zips/val2017.zip", "val2017"),
        ("annotations/annotations_trainval2017.zip", "annotations"),
    ):
        (www / archive).parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(www / archive, "w") as z:
            for path in sorted((source / top).iterdir()):
                z.write(path, f"{top}/{path.name}")

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(www)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_download_the_official_archives_then_stage(tmp_path, s3_server, bucket, coco_mirror):
    dest = tmp_path / "coco"
    (dest / "_archives").mkdir(parents=True)
    (dest / "_archives" / "val2017.zip.part").write_bytes(b"PK\x03\x04 an interrupted download")
    weights = tmp_path / "ImageNet-R50-AlignPadding.npz"  # written next to the mirror's source by write_coco
    argv = [
        str(dest),
        f"s3://{bucket}/coco",
        "--weights",
        str(weights),
        "--download",
        "--coco-base-url",
        coco_mirror,
    ]
    first = stage(tmp_path, *argv, port=s3_server)
    assert first.returncode == 0, first.stderr
    assert f"{coco_mirror}zips/val2017.zip: downloaded, unpacked into {dest}" in first.stderr
    assert set(keys(s3_server, bucket)) == expected_keys("coco/") | {"coco/annotations/_manifest.json"}
    assert not (dest / "_archives" / "val2017.zip.part").exists()
    again = stage(tmp_path, *argv, port=s3_server)
    assert again.returncode == 0, again.stderr
    assert (
        f"{coco_mirror}zips/train2017.zip: already downloaded, already unpacked into {dest}" in again.stderr
    )
    assert uploaded_count(again.stderr) == 0


def test_download_failure_is_one_line(tmp_path, coco_mirror):
    result = stage(tmp_path, str(tmp_path / "c"), "s3://bkt/c", "--download", "--coco-base-url",
                   coco_mirror + "nothing/", port=None)  # fmt: skip
    line = one_error_line(result, 69)
    url = f"{coco_mirror}nothing/zips/train2017.zip"
    assert line == f"smhvd-stage-coco: error: {url}: cannot download (HTTP 404 File not found)"
