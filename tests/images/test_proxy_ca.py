"""Behind a proxy that re-signs TLS, a local job's pip installs its requirements.txt from PyPI
(bin/local-train.sh mounts the machine's CA bundle and names it in PIP_CERT, SSL_CERT_FILE...; docs/images.md,
"Behind a proxy that re-signs TLS").

Real on both sides: this machine's HTTPS goes through such a proxy (its CA in
/usr/local/share/ca-certificates), the job runs in the CPU image under test with the launcher's own
`pip install -r requirements.txt`, from PyPI. The control: the same job with those variables set back to the
image's own CA list (the user's --env wins) fails with the launcher's exit code for a requirements install
that failed (70), which shows the proxy is there and the mount is what got through it. Skipped where the
machine has no extra CA (never under CI).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.ci import in_ci

from .helpers import REPO, WORK, BuiltImage

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(900)]

HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
IMAGE_CA_LIST = "/etc/ssl/certs/ca-certificates.crt"  # the image's own (Debian's), without the proxy's CA
CA_VARIABLES = (
    "PIP_CERT",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "AWS_CA_BUNDLE",
)  # what local-train.sh sets
JOB = """
import os, six
open(os.path.join(os.environ["SM_MODEL_DIR"], "six.txt"), "w").write(six.__version__)
"""


def run_job(image: str, env: dict[str, str], tmp: Path, *extra: str) -> tuple[int, Path, str]:
    code = tmp / "code"
    code.mkdir()
    (code / "job.py").write_text(JOB)
    (code / "requirements.txt").write_text("six==1.16.0\n")
    ml = tmp / "ml"
    cmd = [
        "bash",
        str(REPO / "bin" / "local-train.sh"),
        "--engine",
        "podman",
        "--network",
        "host",
        "--source",
        str(code),
        "--entry-point",
        "job.py",
        "--work",
        str(ml),
        "--env",
        "PIP_RETRIES=0",  # the control fails at once, not after pip's five retries
        "--env",
        "PIP_NO_CACHE_DIR=1",
        *extra,
        image,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"proxy-ca-{tmp.name}.log").write_text(proc.stdout + proc.stderr)
    return proc.returncode, ml, proc.stderr


def test_a_local_jobs_pip_installs_from_pypi_through_the_proxy(
    cpu_image: BuiltImage, engine_env: dict[str, str], tmp_path: Path
) -> None:
    if not any(HOST_CA_DIR.glob("*.crt")):
        if in_ci():
            pytest.fail(f"CI runs behind a TLS-re-signing proxy: no *.crt in {HOST_CA_DIR}")
        pytest.skip(f"this machine has no extra CA certificates ({HOST_CA_DIR}/*.crt)")
    (tmp_path / "with").mkdir()
    code, ml, err = run_job(cpu_image.immutable, engine_env, tmp_path / "with")
    assert code == 0, err[-3000:]
    assert "the job trusts this machine's CA bundle" in err
    assert (ml / "model" / "six.txt").read_text() == "1.16.0"

    (tmp_path / "without").mkdir()
    image_cas = [arg for name in CA_VARIABLES for arg in ("--env", f"{name}={IMAGE_CA_LIST}")]
    code, ml, err = run_job(cpu_image.immutable, engine_env, tmp_path / "without", *image_cas)
    assert code == 70, err[-3000:]
    failure = (ml / "output" / "failure").read_text()
    assert "CERTIFICATE_VERIFY_FAILED" in failure or "certificate verify failed" in failure, failure
