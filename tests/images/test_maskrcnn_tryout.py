"""The pages' "try it locally in minutes" commands, run as written in the CPU image: docs/maskrcnn.md's (this
project's Mask R-CNN script) and docs/tensorpack-example.md's (tensorpack's own examples/FasterRCNN), each on
the inputs the page makes (make_coco2017.py's 16 + 4 shapes of 160 px, make_standin_weights.py's stand-in of
tensorpack's COCO model) with the page's hyperparameters, read from the page itself.

What a test adds to the page's command: its own `--work` directory, `--network host` (as the tier's other
jobs) and `--engine podman` (the tier's store; the page leaves the engine to the script's own choice), its own
hyperparameters file for the page's, its inputs' directory for `build/maskrcnn-tryout`, the image under test
for `sagemaker-horovod:cpu`.
tensorpack's example is not part of this repository and cannot be fetched offline: its test runs when
SMHVD_TENSORPACK_EXAMPLE names a copy of tensorpack/examples/FasterRCNN (the test makes the page's two-line
change on its own copy), and is not collected otherwise (a run that cannot have the example skips nothing:
it has no such test).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import REPO, WORK, BuiltImage, record_timing

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(3600)]

PAGE_INPUTS = "build/maskrcnn-tryout"
PAGE_IMAGE = "sagemaker-horovod:cpu"
STANDIN = "standin-COCO-R50FPN-MaskRCNN-Standard.npz"
SECTION = re.compile(r"^## Try", re.MULTILINE)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# tensorpack's example, the page's table: (file, text as published, text after the change)
TWO_LINES = (("common.py", "dtype=np.bool)", "dtype=bool)"), ("data.py", "dtype=np.int)", "dtype=int)"))
SCIPY = "scipy==1.13.1"  # the page's requirements.txt
WHEEL_TARGET = ("--only-binary", ":all:", "--python-version", "3.11", "--platform", "manylinux2014_x86_64")


def page_job(page: Path) -> tuple[dict[str, object], list[str]]:
    """The hyperparameters (the first json block) and the local-train.sh arguments (the first bash block that
    runs it) of the page's "## Try ..." section."""
    text = page.read_text()
    start = SECTION.search(text)
    assert start, f"{page.name}: no '## Try ...' section"
    section = text[start.start() :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    blocks = FENCE.findall(section)
    hps = next(json.loads(body) for lang, body in blocks if lang == "json")
    command = next(body for lang, body in blocks if lang == "bash" and "bin/local-train.sh" in body)
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[0] == "bin/local-train.sh", command
    return hps, argv[1:]


def run_page_job(
    page: Path, image: BuiltImage, env: dict[str, str], inputs: Path, work: Path, replace: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], float]:
    hps, args = page_job(page)
    hps_file = work.parent / f"{work.name}-hps.json"
    hps_file.write_text(json.dumps(hps))
    page_hps = args[args.index("--hyperparameters") + 1]
    # Two pages, two files: neither writes into the repository's root nor over the other's.
    assert page_hps.startswith(f"{PAGE_INPUTS}/"), f"{page.name}: hyperparameters file {page_hps}"
    ours = {page_hps: str(hps_file), PAGE_IMAGE: image.immutable, **replace}
    argv = [ours.get(arg, arg).replace(PAGE_INPUTS, str(inputs)) for arg in args]
    cmd = ["bash", str(REPO / "bin" / "local-train.sh"), *argv[:-1], "--work", str(work)]
    cmd += ["--network", "host", "--engine", "podman", argv[-1]]
    start = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False
    )  # fmt: skip
    seconds = time.monotonic() - start
    WORK.mkdir(parents=True, exist_ok=True)
    log = WORK / f"{work.name}.log"
    log.write_text(proc.stdout + proc.stderr)
    assert (
        proc.returncode == 0
    ), f"{shlex.join(cmd)} exited {proc.returncode} (log {log}):\n{proc.stderr[-4000:]}"
    assert not (work / "output" / "failure").exists()
    return proc, seconds


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make maskrcnn-tryout-inputs` writes (the same two commands, the same arguments)."""
    root = tmp_path_factory.mktemp("tryout-inputs")
    for cmd in (
        ["make_coco2017.py", "--out", str(root / "coco")],
        ["make_standin_weights.py", "--out", str(root / "pretrained" / STANDIN)],
    ):
        script = REPO / "examples" / "maskrcnn" / cmd[0]
        subprocess.run([sys.executable, str(script), *cmd[1:]], check=True, capture_output=True, timeout=300)
    return root


def sizes(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_size for p in directory.rglob("*") if p.is_file()}


def test_the_reference_script_tryout_runs_as_the_page_says(
    cpu_image: BuiltImage, engine_env: dict[str, str], inputs: Path, tmp_path: Path
) -> None:
    work = tmp_path / "maskrcnn-tryout-ours"
    proc, seconds = run_page_job(REPO / "docs" / "maskrcnn.md", cpu_image, engine_env, inputs, work, {})
    log = proc.stdout + proc.stderr
    # Every array of the stand-in that fits is restored; the class outputs are new (3 classes, not 80).
    assert f"weights {STANDIN}: backbone: 265 of 265 arrays loaded" in log
    assert "box outputs: 0 of 4 arrays loaded; 4 re-initialised" in log
    assert re.search(r"COCO bbox AP \d\.\d{4}", log) and re.search(r"COCO segm AP \d\.\d{4}", log), log[
        -3000:
    ]
    evaluation = json.loads((work / "output" / "data" / "eval.json").read_text())
    assert evaluation["images"] == 4 and {"bbox", "segm", "detections"} <= set(evaluation)
    # model.tar.gz would hold the exported weights and config only; the checkpoints stay out of it.
    model, checkpoints = sizes(work / "model"), sizes(work / "checkpoints")
    assert sorted(model) == ["config.json", "model.npz"]
    assert [k for k in checkpoints if k.endswith(".index")] and "stats.json" in checkpoints
    assert "Error in PredictCost()" not in log  # the script turns grappler's memory optimiser off on CPUs
    ckpt = max(v for k, v in checkpoints.items() if ".data-" in k)
    record_timing(
        "maskrcnn-tryout-ours", seconds, checkpoint_bytes=ckpt, checkpoints_bytes=sum(checkpoints.values()),
        model_npz_bytes=model["model.npz"], detections=evaluation["detections"],
    )  # fmt: skip


def tensorpack_example_tryout_runs_as_the_page_says(
    cpu_image: BuiltImage, engine_env: dict[str, str], inputs: Path, tmp_path: Path
) -> None:
    source = os.environ["SMHVD_TENSORPACK_EXAMPLE"]
    example = tmp_path / "FasterRCNN"
    shutil.copytree(source, example, ignore=shutil.ignore_patterns("__pycache__"))
    for name, before, after in TWO_LINES:  # the page's table, applied as a user would
        text = (example / name).read_text()
        assert text.count(before) == 1, f"{name}: expected one '{before}' (the page's table)"
        (example / name).write_text(text.replace(before, after))
    # The page's third row, SciPy (not in the image), in its variant for jobs without PyPI: the wheel in the
    # example's directory. The job then needs no network (this machine's PyPI goes through a proxy whose CA
    # only the host trusts).
    wheels = example / "wheels"
    download = [sys.executable, "-m", "pip", "download", "--no-deps", *WHEEL_TARGET, "-d", str(wheels), SCIPY]
    subprocess.run(download, check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("scipy-*.whl")
    (example / "requirements.txt").write_text(f"wheels/{wheel.name}\n")
    work = tmp_path / "maskrcnn-tryout-tensorpack"
    proc, seconds = run_page_job(
        REPO / "docs" / "tensorpack-example.md",
        cpu_image,
        engine_env,
        inputs,
        work,
        {f"{PAGE_INPUTS}/FasterRCNN": str(example)},
    )
    log = proc.stdout + proc.stderr
    assert "--config MODE_MASK=True MODE_FPN=True TRAINER=horovod" in log
    logdir = work / "checkpoints" / "train_log"
    files = sizes(logdir)
    # rank 0's log file (every rank prints the line): after epochs 4 and 8
    assert (logdir / "log.log").read_text().count("Running evaluation ...") == 2
    assert {"model-20.index", "model-40.index", "stats.json", "log.log"} <= set(files), sorted(files)
    assert (
        sizes(work / "model") == {}
    )  # nothing for model.tar.gz: the checkpoints are under /opt/ml/checkpoints
    stats = json.loads((logdir / "stats.json").read_text())
    scored = [k for entry in stats for k in entry if "mAP" in k]
    summary = (work / "output" / "data" / "job-summary.json").stat().st_size
    assert 1000 <= summary < 10_000, summary  # the page's table: "a few kB"
    record_timing(
        "maskrcnn-tryout-tensorpack", seconds, checkpoint_bytes=files["model-40.data-00000-of-00001"],
        logdir_bytes=sum(files.values()), predictcost_lines=log.count("Error in PredictCost()"),
        c_api_lines=log.count("c_api.cc"), map_keys=len(scored), job_summary_bytes=summary,
    )  # fmt: skip
    assert "c_api.cc" not in log  # TF_CPP_MIN_LOG_LEVEL=2 (the page's --env) hides TensorFlow's C++ warnings


if os.environ.get("SMHVD_TENSORPACK_EXAMPLE"):  # a copy of tensorpack/examples/FasterRCNN (module docstring)
    test_tensorpack_example_tryout_runs_as_the_page_says = tensorpack_example_tryout_runs_as_the_page_says
