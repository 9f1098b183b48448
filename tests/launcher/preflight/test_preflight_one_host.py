"""The pre-flight on one host, through `train`: never silent, never in the way. A healthy one-host job gets
one pre-flight line, a launcher line (its `[smhvd ...]` prefix), and the rank's own output is untouched; a job
without MPI says in one line that the pre-flight did not run."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

SCRIPT = "import sys; print('out of rank'); print('err of rank', file=sys.stderr)"


def preflight_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "pre-flight" in line]


@pytest.mark.parametrize("policy", ["warn", "fail"])
def test_a_healthy_one_host_job_gets_one_launcher_line(train_job, policy: str) -> None:
    hps = {"sagemaker_preflight": policy, "sagemaker_mpi_num_of_processes_per_host": 2}
    job = train_job(SCRIPT, hps | {"launcher_tag_output": False})
    result = job.run(timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = preflight_lines(result.stderr)
    assert len(lines) == 2, lines  # the verdict, and the summary's mention
    assert lines[0].startswith("[smhvd ") and "pre-flight: all 1 host(s) fine" in lines[0]
    assert "pre-flight: ok" in lines[1] and "job summary" in lines[1]
    rank_lines = [line for line in result.stderr.splitlines() if not line.startswith("[smhvd ")]
    assert rank_lines == ["err of rank", "err of rank"], rank_lines  # the script's own, byte for byte


def test_without_mpi_one_line_says_the_pre_flight_did_not_run(train_job) -> None:
    job = train_job(SCRIPT, {"sagemaker_mpi_enabled": False, "sagemaker_preflight": "fail"})
    result = job.run(timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = preflight_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("[smhvd "), lines
    assert "pre-flight: not run (sagemaker_preflight=fail, but sagemaker_mpi_enabled is false" in lines[0]
    assert "out of rank" in result.stdout
