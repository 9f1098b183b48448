"""What the SageMaker Python SDK sets, honoured by `train` on one host (real mpirun, real ranks)."""

import pytest

pytestmark = pytest.mark.integration

QUIET = "import sys; print('script ran', file=sys.stderr)\n"


def _levels(stderr: str) -> set[str]:
    """Levels of the launcher's own log lines ("[smhvd HH:MM:SS] LEVEL message")."""
    return {
        line.split("] ", 1)[1].split(" ", 1)[0] for line in stderr.splitlines() if line.startswith("[smhvd ")
    }


@pytest.mark.parametrize(
    ("container_log_level", "env", "seen", "unseen"),
    [
        ("10", {}, {"DEBUG", "INFO"}, set()),  # logging.DEBUG from container_log_level=logging.DEBUG
        ("30", {}, set(), {"DEBUG", "INFO"}),
        ("10", {"SMHVD_LOG_LEVEL": "INFO"}, {"INFO"}, {"DEBUG"}),  # the launcher's own setting wins
    ],
)
def test_the_sdk_container_log_level_sets_the_launcher_log_level(
    train_job, container_log_level, env, seen, unseen
):
    job = train_job(QUIET, {"sagemaker_container_log_level": container_log_level})
    result = job.run(env={"SMHVD_LOG_LEVEL": "", **env})
    assert result.returncode == 0, result.stderr
    assert "script ran" in result.stderr
    levels = _levels(result.stderr)
    assert seen <= levels and not (unseen & levels), result.stderr
