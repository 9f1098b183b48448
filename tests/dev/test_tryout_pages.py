"""The two pages' "try it locally" commands (docs/maskrcnn.md, docs/tensorpack-example.md) keep their files
apart and out of the repository's root, and the tensorpack page gives the commands that make the example it
runs. (tests/images/test_maskrcnn_tryout.py runs the same commands, read from the pages the same way.)"""

from __future__ import annotations

import re
from pathlib import Path

from images.test_maskrcnn_tryout import PAGE_INPUTS, TWO_LINES, page_job

DOCS = Path(__file__).resolve().parents[2] / "docs"
# A fenced block, indented too (the page's steps are a numbered list)
INDENTED_BASH = re.compile(r"^( *)```bash\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def test_each_page_writes_its_own_hyperparameters_file_under_the_scratch_dir() -> None:
    files = {}
    for page in ("maskrcnn.md", "tensorpack-example.md"):
        _, args = page_job(DOCS / page)
        hps = args[args.index("--hyperparameters") + 1]
        assert hps.startswith(
            f"{PAGE_INPUTS}/"
        ), f"{page}: --hyperparameters {hps} is not under {PAGE_INPUTS}/"
        flat = " ".join((DOCS / page).read_text().split())
        assert (
            f"save this as `{hps}`" in flat or f"save the hyperparameters as `{hps}`" in flat
        ), f"{page}: the text does not say to save the hyperparameters as {hps}"
        files[page] = hps
    assert len(set(files.values())) == 2, files


def test_the_tensorpack_page_makes_the_example_its_job_runs() -> None:
    page = DOCS / "tensorpack-example.md"
    _, args = page_job(page)
    source = args[args.index("--source") + 1]
    assert source == f"{PAGE_INPUTS}/FasterRCNN"
    steps = next(body for _, body in INDENTED_BASH.findall(page.read_text()) if "git clone" in body)
    assert f"cp -r {PAGE_INPUTS}/tensorpack/examples/FasterRCNN {source}" in steps
    assert f"cd {source}" in steps
    for name, before, after in TWO_LINES:  # the table's two lines, as the test of the image tier changes them
        escaped = before.replace(".", "\\.")
        assert f"sed -i 's/{escaped}/{after}/' {name}" in steps, (name, steps)
    assert "echo scipy==1.13.1 > requirements.txt" in steps
