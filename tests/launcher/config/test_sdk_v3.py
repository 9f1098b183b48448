"""SDK v3 (ModelTrainer) jobs: the sm_drivers channel read into typed values, and run by `train`.

The files below are byte for byte what sagemaker 3.27.0 / sagemaker-train 1.27.0 writes (generated with the
real package: ModelTrainer._write_source_code_json, _write_distributed_json and, in local container mode,
_LocalContainer._write_config_files); tests/images/test_sdk_v3_local.py runs the real SDK end to end.
"""

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from smhvd.config import sdk_v3
from smhvd.config.hyperparameters import decode_hyperparameters, split_hyperparameters, to_script_args
from smhvd.config.instance_groups import Placement
from smhvd.config.job import Hardware, load_job, with_sdk_v3
from smhvd.config.launcher_options import MAX_PROCESSES_PER_HOST, OUTPUT_REFUSED, parse_launcher_options
from smhvd.config.paths import SageMakerPaths
from smhvd.config.sdk_v3 import Distributed, SourceCode, V3Job
from smhvd.environment import training_env
from smhvd.errors import ConfigError, SourceError
from smhvd.sourcecode import fetch_source, resolve_source
from support.ci import need_root
from support.jobs import bare_job
from tests.conftest import TRAIN

# SourceCode(source_dir="/tmp/v3gen/src", entry_script="train.py", requirements="requirements.txt")
SOURCECODE_JSON = (
    '{"source_dir": "/tmp/v3gen/src", "requirements": "requirements.txt", "entry_script": "train.py", '
    '"command": null, "args": null, "ignore_patterns": [".env", ".git", "__pycache__", ".DS_Store", '
    '".cache", ".ipynb_checkpoints"]}'
)
# MPI(process_count_per_node=2,
#     mpi_additional_options=["-x", "FOO=a b", "--mca", "btl_tcp_if_include", "eth0"])
DISTRIBUTED_MPI_JSON = (
    '{"process_count_per_node": 2, "mpi_additional_options": ["-x", "FOO=a b", "--mca", '
    '"btl_tcp_if_include", "eth0"]}'
)
DISTRIBUTED_MPI_DEFAULT_JSON = '{"process_count_per_node": null, "mpi_additional_options": null}'  # MPI()
DISTRIBUTED_TORCHRUN_JSON = '{"process_count_per_node": null, "smp": null}'  # Torchrun()
DISTRIBUTED_NONE_JSON = "{}"  # no distributed=
# hyperparameters={"epochs": 1, "lr": 0.1, "name": "x y", "flag": True, "d": {"a": 1}, "n": None,
#                  "l": [1, "a"]}
HYPERPARAMETERS_JSON = (
    '{"epochs": "1", "lr": "0.1", "name": "x y", "flag": "true", "d": "{\\"a\\": 1}", "n": "null", '
    '"l": "[1, \\"a\\"]"}'
)
# what v3's drivers pass the script for them (common.utils.hyperparameters_to_cli_args)
V3_CLI_ARGS = ["--epochs", "1", "--lr", "0.1", "--name", "x y", "--flag", "true", "--d", '{"a": 1}']
V3_CLI_ARGS += ["--n", "null", "--l", '[1, "a"]']
# what this launcher passes: the same, but a list is one argument per item (argparse nargs='+')
CLI_ARGS = [*V3_CLI_ARGS[:-1], "1", "a"]


def test_source_code_as_v3_writes_it():
    assert sdk_v3.parse_source_code(json.loads(SOURCECODE_JSON)) == SourceCode(
        entry_script="train.py",
        command=None,
        requirements="requirements.txt",
        source_dir="/tmp/v3gen/src",
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            DISTRIBUTED_MPI_JSON,
            Distributed("mpi", 2, ("-x", "FOO=a b", "--mca", "btl_tcp_if_include", "eth0")),
        ),
        (DISTRIBUTED_MPI_DEFAULT_JSON, Distributed("mpi", None, ())),
        (DISTRIBUTED_TORCHRUN_JSON, Distributed("other")),
        (DISTRIBUTED_NONE_JSON, Distributed("none")),
    ],
)
def test_distributed_as_v3_writes_it(text, expected):
    assert sdk_v3.parse_distributed(json.loads(text)) == expected


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"process_count_per_node": "two", "mpi_additional_options": None}, "process_count_per_node"),
        ({"process_count_per_node": 0, "mpi_additional_options": None}, "process_count_per_node"),
        ({"process_count_per_node": True, "mpi_additional_options": None}, "process_count_per_node"),
        ({"process_count_per_node": 1.5, "mpi_additional_options": None}, "process_count_per_node"),
        ({"process_count_per_node": [2], "mpi_additional_options": None}, "process_count_per_node"),
        ({"process_count_per_node": 1, "mpi_additional_options": "-x A"}, "mpi_additional_options"),
        ({"process_count_per_node": 1, "mpi_additional_options": [1]}, "mpi_additional_options"),
    ],
)
def test_bad_distributed_names_file_and_key(data, key):
    with pytest.raises(ConfigError) as err:
        sdk_v3.parse_distributed(data, "/x/distributed.json")
    assert err.value.source == "/x/distributed.json" and err.value.key == key


def refusal_of_v2(tokens: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        parse_launcher_options({"sagemaker_mpi_custom_mpi_options": shlex.join(tokens)})
    return err.value


def refusal_of_v3(tokens: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        sdk_v3.parse_distributed(
            {"process_count_per_node": None, "mpi_additional_options": tokens}, "/x/distributed.json"
        )
    return err.value


@pytest.mark.parametrize(
    "tokens",
    [
        ["--xml"],
        ["-x", "A=1", "-timestamp-output"],
        ["--merge-stderr-to-stdout"],
        ["--mca", "orte_xml_output", "1"],
        ["--output-filename=/x"],
        ["-mca", "iof_base_redirect_app_stderr_to_stdout", "1"],
    ],
)
@pytest.mark.parametrize(
    ("refusal", "source", "key"),
    [
        (refusal_of_v2, "hyperparameters.json", "sagemaker_mpi_custom_mpi_options"),
        (refusal_of_v3, "/x/distributed.json", "mpi_additional_options"),
    ],
    ids=["v2", "v3"],
)
def test_one_checker_refuses_output_options_from_either_sdk_naming_the_users_key(
    tokens, refusal, source, key
):
    """The same output-format options are refused (exit 78) from v2's custom_mpi_options and v3's
    mpi_additional_options (before, v3 let --xml through to break the log), each naming the file and the
    key the user wrote, with the same expectation."""
    error = refusal(tokens)
    assert (error.source, error.key) == (source, key)
    assert error.expected == OUTPUT_REFUSED


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"entry_script": "../train.py"}, "entry_script"),
        ({"entry_script": "/abs/train.py"}, "entry_script"),
        ({"entry_script": 3}, "entry_script"),
        ({"entry_script": "t.py", "requirements": "../r.txt"}, "requirements"),
    ],
)
def test_bad_source_code_names_file_and_key(data, key):
    with pytest.raises(ConfigError) as err:
        sdk_v3.parse_source_code(data, "/x/sourcecode.json")
    assert err.value.source == "/x/sourcecode.json" and err.value.key == key


def test_script_args_as_v3_drivers_make_them_but_a_list_is_one_argument_per_item():
    raw = json.loads(HYPERPARAMETERS_JSON)
    _, user = split_hyperparameters(decode_hyperparameters(raw))
    assert sdk_v3.script_args(user) == CLI_ARGS
    # tensorpack's --config as a v3 hyperparameter: a list of KEY=VALUE strings (v3 writes it as JSON text)
    listed = decode_hyperparameters({"config": json.dumps(["TRAINER=horovod", "MODE_MASK=True"])})
    assert sdk_v3.script_args(listed) == ["--config", "TRAINER=horovod", "MODE_MASK=True"]


def write_v3_tree(
    base: Path,
    *,
    sourcecode: str = SOURCECODE_JSON,
    distributed: str = DISTRIBUTED_MPI_JSON,
    hyperparameters: str = HYPERPARAMETERS_JSON,
    hosts: tuple[str, ...] = ("algo-1", "algo-2"),
) -> SageMakerPaths:
    """An /opt/ml tree as v3's local container mode makes it for algo-1 (config files, the two channels)."""
    paths = SageMakerPaths(base)
    paths.config_dir.mkdir(parents=True)
    resource = {
        "current_host": hosts[0],
        "hosts": list(hosts),
        "network_interface_name": "ethwe",
        "current_instance_type": "local_cpu",
    }
    paths.resource_config.write_text(json.dumps(resource))
    paths.hyperparameters.write_text(hyperparameters)
    paths.input_data_config.write_text(json.dumps({"code": {"TrainingInputMode": "File"}, "sm_drivers": {}}))
    drivers = paths.channel_dir("sm_drivers")
    drivers.mkdir(parents=True)
    (drivers / "sm_train.sh").write_text("\n#!/bin/bash\nexit 99\n")
    (drivers / "sourcecode.json").write_text(sourcecode)
    (drivers / "distributed.json").write_text(distributed)
    paths.channel_dir("code").mkdir()
    return paths


def test_a_job_left_to_v3_runs_its_own_sm_train_without_our_hook():
    argv, env = sdk_v3.hand_back_command({"BASH_ENV": "/usr/local/lib/smhvd/sdk-v3-bash-env.sh", "A": "1"})
    assert argv == ["/bin/bash", "-c", sdk_v3.SM_TRAIN_COMMAND] and env == {"A": "1"}


def test_load_reads_the_drivers_channel(tmp_path):
    paths = write_v3_tree(tmp_path / "ml")
    assert sdk_v3.load(paths) == V3Job(
        drivers_dir=paths.channel_dir("sm_drivers"),
        code_dir=paths.channel_dir("code"),
        source=SourceCode("train.py", None, "requirements.txt", "/tmp/v3gen/src"),
        distributed=Distributed("mpi", 2, ("-x", "FOO=a b", "--mca", "btl_tcp_if_include", "eth0")),
    )


def test_no_drivers_channel_is_not_a_v3_job(tmp_path):
    paths = write_v3_tree(tmp_path / "ml")
    (paths.channel_dir("sm_drivers") / "sm_train.sh").unlink()
    assert sdk_v3.load(paths) is None


def test_a_broken_drivers_file_is_a_config_error(tmp_path):
    paths = write_v3_tree(tmp_path / "ml", distributed="{not json")
    with pytest.raises(ConfigError, match="distributed.json"):
        sdk_v3.load(paths)


def test_apply_spreads_processes_per_node_over_every_host(tmp_path):
    paths = write_v3_tree(tmp_path / "ml")
    v3 = sdk_v3.load(paths)
    assert v3 is not None
    job = with_sdk_v3(bare_job(paths, {"sagemaker_mpi_custom_mpi_options": "--bind-to core"}), v3)
    assert job.options.mpi.enabled
    assert (job.processes_per_host, job.num_processes) == (2, 4)  # v3's own driver: mpirun -np 2
    assert job.options.mpi.custom_options == (
        "--bind-to",
        "core",
        "-x",
        "FOO=a b",
        "--mca",
        "btl_tcp_if_include",
        "eth0",
    )
    assert job.options.program.program == "train.py"
    assert job.options.program.submit_directory == str(paths.channel_dir("code"))


def test_apply_without_distributed_runs_the_script_once_per_host(tmp_path):
    paths = write_v3_tree(tmp_path / "ml", distributed=DISTRIBUTED_NONE_JSON)
    v3 = sdk_v3.load(paths)
    assert v3 is not None and v3.unsupported is None
    job = with_sdk_v3(bare_job(paths), v3)
    assert not job.options.mpi.enabled
    assert "SM_DISTRIBUTED_CONFIG" not in job.script_env


def test_a_source_dir_tarball_is_unpacked_by_the_launcher(tmp_path):
    source = json.loads(SOURCECODE_JSON) | {"source_dir": "/home/me/code.tar.gz"}
    paths = write_v3_tree(tmp_path / "ml", sourcecode=json.dumps(source))
    v3 = sdk_v3.load(paths)
    assert v3 is not None
    job = with_sdk_v3(bare_job(paths), v3)
    assert job.options.program.submit_directory == str(paths.channel_dir("code") / "code.tar.gz")


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_an_unreadable_code_archive_is_named_by_the_key_the_user_wrote(tmp_path, sdk):
    """A v3 user wrote source_dir: the error names it, not v2's sagemaker_submit_directory (it did)."""
    source = json.loads(SOURCECODE_JSON) | {"source_dir": "/home/me/code.tar.gz"}
    paths = write_v3_tree(tmp_path / "ml", sourcecode=json.dumps(source))
    archive = paths.channel_dir("code") / "code.tar.gz"
    archive.write_bytes(b"not a tar")
    if sdk == "v3":
        v3 = sdk_v3.load(paths)
        assert v3 is not None
        program, key = with_sdk_v3(bare_job(paths), v3).options.program, "source_dir"
    else:
        hps = {"sagemaker_program": "train.py", "sagemaker_submit_directory": str(archive)}
        program = bare_job(paths, hps).options.program
        key = "sagemaker_submit_directory"
    with pytest.raises(SourceError) as err:
        fetch_source(resolve_source(program, paths, {}), None)
    assert str(err.value).startswith(f"{key}: {archive}: not a readable tar archive ("), err.value


def test_env_for_scripts_written_for_v3(tmp_path):
    paths = write_v3_tree(tmp_path / "ml", hosts=("algo-2", "algo-1"))
    v3 = sdk_v3.load(paths)
    assert v3 is not None
    env = with_sdk_v3(bare_job(paths), v3).script_env
    assert env["SM_MASTER_ADDR"] == "algo-1" and env["SM_HOST_COUNT"] == "2"
    assert env["SM_ENTRY_SCRIPT"] == "train.py"
    assert env["SM_SOURCE_DIR"] == str(paths.channel_dir("code"))
    assert json.loads(env["SM_DISTRIBUTED_CONFIG"]) == json.loads(DISTRIBUTED_MPI_JSON)


def test_master_addr_is_the_jobs_leader_with_instance_groups(tmp_path):
    """MPI over the 'gpu' group (algo-2, algo-3): the job's leader, and v3's SM_MASTER_ADDR, is algo-2, not
    the first of every host (algo-1, in the 'data' group)."""
    paths = write_v3_tree(tmp_path / "ml", hosts=("algo-1", "algo-2", "algo-3"))
    job = dataclasses.replace(
        bare_job(paths),
        placement=Placement(("algo-2", "algo-3"), current_group="data", distribution_groups=("gpu",)),
    )
    v3 = sdk_v3.load(paths)
    assert v3 is not None
    assert job.leader == "algo-2"
    assert with_sdk_v3(job, v3).script_env["SM_MASTER_ADDR"] == "algo-2"


@pytest.mark.parametrize(
    ("sourcecode", "distributed", "reason"),
    [
        ({"command": "python a.py", "entry_script": None}, DISTRIBUTED_NONE_JSON, "SourceCode.command"),
        ({}, DISTRIBUTED_TORCHRUN_JSON, "not MPI"),
    ],
)
def test_what_the_launcher_leaves_to_v3(tmp_path, sourcecode, distributed, reason):
    text = json.dumps(json.loads(SOURCECODE_JSON) | sourcecode)
    v3 = sdk_v3.load(write_v3_tree(tmp_path / "ml", sourcecode=text, distributed=distributed))
    assert v3 is not None and reason in (v3.unsupported or "")


def test_a_loaded_v3_job_is_one_job_whichever_sdk_wrote_it(tmp_path):
    """load_job reads v3's files into the job: the script's arguments (SM_USER_ARGS too) follow v3's drivers'
    rule, v3's variables are in the training environment, and the requirements file is the one v3 names."""
    paths = write_v3_tree(tmp_path / "ml", hosts=("algo-1",))
    v3 = sdk_v3.load(paths)
    assert v3 is not None
    job = load_job(paths, Hardware(cpus=2, gpus=0), v3=v3)
    assert job.script_args == tuple(CLI_ARGS)
    env = training_env(job, paths.channel_dir("code"), "train.py", str(paths.channel_dir("code")))
    assert json.loads(env["SM_USER_ARGS"]) == CLI_ARGS  # v2's rule would sort the keys, -l and -n, True
    assert env["SM_MASTER_ADDR"] == "algo-1" and env["SM_ENTRY_SCRIPT"] == "train.py"
    assert json.loads(env["SM_DISTRIBUTED_CONFIG"]) == json.loads(DISTRIBUTED_MPI_JSON)
    assert job.options.program.requirements == "requirements.txt"
    assert job.options.program.origin.requirements_named_by == (
        str(paths.channel_dir("sm_drivers") / "sourcecode.json"),
        "requirements",
    )


def test_the_preflight_policy_and_its_thresholds_come_from_v3s_hyperparameters(tmp_path):
    """v3 jobs set the pre-flight as v2 jobs do, with the same keys in `hyperparameters`; the keys are the
    launcher's, never the script's arguments."""
    hps = {"epochs": "1", "sagemaker_preflight": "fail", "launcher_preflight_min_ratio": "0.3"}
    paths = write_v3_tree(tmp_path / "ml", hosts=("algo-1",), hyperparameters=json.dumps(hps))
    job = load_job(paths, Hardware(cpus=2, gpus=0), v3=sdk_v3.load(paths))
    assert (job.options.preflight.policy, job.options.preflight.min_ratio) == ("fail", 0.3)
    assert job.script_args == ("--epochs", "1")


def test_sm_user_args_of_a_v2_job_keep_the_toolkits_rule(tmp_path):
    paths = write_v3_tree(tmp_path / "ml", hosts=("algo-1",))
    job = load_job(paths, Hardware(cpus=2, gpus=0))  # the same hyperparameters, no v3 files read
    env = training_env(job, paths.code_dir, "train.py", str(paths.code_dir))
    assert (
        json.loads(env["SM_USER_ARGS"]) == list(job.script_args) == to_script_args(job.user_hyperparameters)
    )
    assert json.loads(env["SM_USER_ARGS"]) != CLI_ARGS and "SM_MASTER_ADDR" not in env
    assert job.options.program.origin.requirements_named_by is None  # requirements.txt only if present


# The script records how it was run; `train` (cli.main) runs it from a v3 tree with one host.
RECORDER = """
import json, os, sys
out = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "run.json")
keys = ("SM_ENTRY_SCRIPT", "SM_MASTER_ADDR", "SM_HOST_COUNT", "SM_CURRENT_HOST")
record = {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in keys}}
record["user_args"] = json.loads(os.environ["SM_USER_ARGS"])
json.dump(record, open(out, "w"))
"""


@pytest.mark.integration  # starts processes
def test_train_runs_a_v3_job_without_distributed(tmp_path):
    source = json.dumps({"source_dir": "/somewhere/src", "entry_script": "rec.py", "requirements": None})
    paths = write_v3_tree(
        tmp_path / "ml", sourcecode=source, distributed=DISTRIBUTED_NONE_JSON, hosts=("algo-1",)
    )
    (paths.channel_dir("code") / "rec.py").write_text(RECORDER)
    (paths.channel_dir("code") / "requirements.txt").write_text("no-such-package-smhvd==0\n")  # not asked for
    result = subprocess.run(
        [str(TRAIN), "--base-dir", str(paths.base)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    run = json.loads((paths.output_data_dir / "run.json").read_text())
    assert run["argv"] == CLI_ARGS
    assert run["user_args"] == CLI_ARGS  # SM_USER_ARGS: the arguments the script was given
    assert run["cwd"] == str(paths.channel_dir("code"))
    assert run["env"] == {
        "SM_ENTRY_SCRIPT": "rec.py",
        "SM_MASTER_ADDR": "algo-1",
        "SM_HOST_COUNT": "1",
        "SM_CURRENT_HOST": "algo-1",
    }


# v3's own driver stands at a fixed path: the test puts one of its own there, in a mount namespace of its own.
FAKE_V3_DRIVER = 'echo "v3 driver ran with BASH_ENV=${BASH_ENV-unset} in $PWD"; exit 7\n'
OWN_OPT = (
    'mount --make-rprivate / && mount -t tmpfs none /opt && mkdir -p "$(dirname "$1")" '
    '&& cp "$2" "$1" && shift 2 && exec "$@"'
)


@pytest.mark.integration  # starts processes
def test_train_hands_a_command_job_back_to_v3s_script_and_its_exit_code(tmp_path):
    """SourceCode.command: `train` execs v3's own driver (at v3's /opt/ml path), without BASH_ENV; the
    job's exit code is the driver's."""
    need_root("a mount namespace")
    source = json.dumps({"source_dir": "/somewhere/src", "command": "python a.py", "entry_script": None})
    paths = write_v3_tree(tmp_path / "ml", sourcecode=source, distributed=DISTRIBUTED_NONE_JSON)
    driver = tmp_path / "sm_train.sh"
    driver.write_text(FAKE_V3_DRIVER)
    place = "/opt/ml/input/data/sm_drivers/sm_train.sh"
    train = [sys.executable, "-m", "smhvd", "--base-dir", str(paths.base)]
    proc = subprocess.run(
        ["unshare", "--mount", "sh", "-c", OWN_OPT, "sh", place, str(driver), *train],
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "BASH_ENV": str(tmp_path / "unread")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "left to v3's sm_train.sh: SourceCode.command" in proc.stderr
    assert proc.returncode == 7, proc.stderr[-2000:]
    assert "v3 driver ran with BASH_ENV=unset" in proc.stdout, proc.stdout


BASH_ENV_FILE = Path(__file__).resolve().parents[3] / "docker" / "scripts" / "sdk-v3-bash-env.sh"


@pytest.mark.integration  # starts processes
@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (sdk_v3.SM_TRAIN_COMMAND, "train ran, BASH_ENV=unset"),  # v3's command: handed to `train`
        ("echo other", "other"),  # any other shell: untouched
        (sdk_v3.SM_TRAIN_COMMAND + " ", "chmod"),  # not exactly v3's command: runs as written (and fails)
    ],
)
def test_the_images_bash_env_hands_exactly_v3s_command_to_train(tmp_path, command, expected):
    fake = tmp_path / "bin" / "train"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "train ran, BASH_ENV=${BASH_ENV-unset}"\n')
    fake.chmod(0o755)
    proc = subprocess.run(
        ["/bin/bash", "-c", command],
        env={"PATH": f"{fake.parent}:/usr/bin:/bin", "BASH_ENV": str(BASH_ENV_FILE)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert expected in out
    assert ("train ran" in out) == (command == sdk_v3.SM_TRAIN_COMMAND)


def refused_by_train(paths: SageMakerPaths, env: dict[str, str] | None = None) -> tuple[str, str]:
    """`train` on the tree must refuse it as the README promises: exit 78, one ERROR line, the failure file
    saying the same, nothing started. Returns (the ERROR line, the failure file)."""
    with subprocess.Popen(
        [str(Path(sys.executable).parent / "train"), "--base-dir", str(paths.base)],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a launcher that wrongly starts the job: its whole session is killed below
    ) as proc:
        try:
            stderr = proc.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("train did not refuse the job") from None
    assert proc.returncode == 78, stderr
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert "starting" not in stderr and not (paths.output_data_dir / "run.json").exists()
    failure = paths.failure_file.read_text()
    assert "\n" not in failure and failure in errors[0]
    return errors[0], failure


LONG = "a" * 300 + ".py"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("sourcecode", "distributed", "message"),
    [
        (
            {},
            {"process_count_per_node": 100000},
            "distributed.json: process_count_per_node: expected an integer <= 1024, got 100000",
        ),
        (
            {"entry_script": LONG},
            {},
            "sourcecode.json: entry_script: expected a path relative to source_dir "
            "(names of at most 255 bytes between slashes, not 303)",
        ),
        (
            {"requirements": "r" * 300},
            {},
            "sourcecode.json: requirements: expected a path relative to source_dir "
            "(names of at most 255 bytes",
        ),
        ({"entry_script": "nope.py"}, {}, "sourcecode.json: entry_script: expected a file in "),
        ({"requirements": "missing.txt"}, {}, "sourcecode.json: requirements: expected a file in "),
        (
            {"entry_script": "a\x00.py"},
            {},
            "sourcecode.json: entry_script: expected a path relative to source_dir",
        ),
        (
            {"entry_script": "\udcff.py"},
            {},
            "sourcecode.json: entry_script: expected a path relative to source_dir",
        ),
        (
            {"source_dir": "/home/me/" + "c" * 300 + ".tar.gz"},
            {},
            "sourcecode.json: source_dir: expected a .tar.gz of a valid file name "
            "(names of at most 255 bytes",
        ),
        (
            {},
            {"mpi_additional_options": ["-x", "A=\x00"]},
            "distributed.json: mpi_additional_options[1]: expected an argument without NUL",
        ),
        (
            {},
            {"mpi_additional_options": ["-x", "A=" + "x" * 200_000]},
            "distributed.json: mpi_additional_options: expected mpirun arguments of at most 65536 bytes",
        ),
        (
            {},
            {"mpi_additional_options": ["-x", "A=1", "--xml"]},
            "distributed.json: mpi_additional_options: expected no option that changes how mpirun writes",
        ),
        (
            {},
            {"mpi_additional_options": ["--mca", "orte_timestamp_output", "1"]},
            "distributed.json: mpi_additional_options: expected no option that changes how mpirun writes",
        ),
    ],
    ids=[
        "np-100000",
        "long-entry-script",
        "long-requirements",
        "missing-entry-script",
        "missing-requirements",
        "nul-entry-script",
        "surrogate-entry-script",
        "long-tarball-name",
        "nul-mpi-option",
        "mpi-options-of-200-KB",
        "xml-output",
        "timestamp-output-mca",
    ],
)
def test_v3_values_are_bounded_and_errors_name_the_v3_file_and_key(
    tmp_path, sourcecode, distributed, message
):
    source = {"source_dir": "/somewhere/src", "entry_script": "rec.py", "requirements": None} | sourcecode
    dist = {"process_count_per_node": 1, "mpi_additional_options": None} | distributed
    paths = write_v3_tree(
        tmp_path / "ml", sourcecode=json.dumps(source), distributed=json.dumps(dist), hosts=("algo-1",)
    )
    (paths.channel_dir("code") / "rec.py").write_text(RECORDER)
    line, failure = refused_by_train(paths)
    assert message in line, line
    assert failure.startswith(str(paths.channel_dir("sm_drivers")))  # the full path of the v3 file


@pytest.mark.integration
@pytest.mark.parametrize(
    "name", ["OMPI_MCA_orte_xml_output", "OMPI_MCA_iof_base_redirect_app_stderr_to_stdout"]
)
def test_an_output_format_switched_from_the_environment_is_refused_as_the_option_is(tmp_path, name):
    """OMPI_MCA_orte_xml_output=1 in the job's environment is --xml: refused (78) naming the variable, as the
    options are from either SDK, not a job whose every rank line lands on stderr as raw XML."""
    paths = write_v3_tree(tmp_path / "ml", distributed=DISTRIBUTED_NONE_JSON, hosts=("algo-1",))
    line, failure = refused_by_train(paths, {name: "1"})
    assert f"environment: {name}: expected no option that changes how mpirun writes" in line, line
    assert failure.startswith(f"environment: {name}: ")


@pytest.mark.integration
def test_a_missing_code_channel_names_the_v3_file(tmp_path):
    paths = write_v3_tree(tmp_path / "ml", distributed=DISTRIBUTED_NONE_JSON, hosts=("algo-1",))
    paths.channel_dir("code").rmdir()
    line, _ = refused_by_train(paths)
    assert "sourcecode.json: source_dir: expected an existing directory or .tar.gz" in line


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (0, "an integer >= 1"),
        (True, "an integer >= 1"),
        (2.5, "an integer >= 1"),
        (1025, "an integer <= 1024"),
    ],
)
def test_process_count_per_node_is_read_as_the_processes_per_host_hyperparameter(count, expected):
    """One reader for both (option_spec.integer): the same values pass, the same errors, each naming its
    file."""
    with pytest.raises(ConfigError) as v3_error:
        sdk_v3.parse_distributed(
            {"process_count_per_node": count, "mpi_additional_options": None}, "/x/distributed.json"
        )
    assert (
        str(v3_error.value)
        == f"/x/distributed.json: process_count_per_node: expected {expected}, got {count!r}"
    )
    with pytest.raises(ConfigError) as v2_error:
        parse_launcher_options({"sagemaker_mpi_num_of_processes_per_host": count})
    assert v2_error.value.expected == expected
    for same in (2, 2.0, "2"):  # as the hyperparameter takes them
        parsed = sdk_v3.parse_distributed({"process_count_per_node": same, "mpi_additional_options": None})
        assert parsed.process_count_per_node == 2 and type(parsed.process_count_per_node) is int


def test_v3_and_v2_share_one_cap_on_processes_per_host():
    assert sdk_v3.parse_distributed(
        {"process_count_per_node": MAX_PROCESSES_PER_HOST, "mpi_additional_options": None}
    ) == Distributed("mpi", MAX_PROCESSES_PER_HOST)
    with pytest.raises(ConfigError, match=f"expected an integer <= {MAX_PROCESSES_PER_HOST}"):
        sdk_v3.parse_distributed(
            {"process_count_per_node": MAX_PROCESSES_PER_HOST + 1, "mpi_additional_options": None}
        )
    with pytest.raises(ConfigError, match=f"expected an integer <= {MAX_PROCESSES_PER_HOST}"):
        parse_launcher_options({"sagemaker_mpi_num_of_processes_per_host": str(MAX_PROCESSES_PER_HOST + 1)})


def test_the_whole_job_is_validated_after_v3s_files_are_read(tmp_path):
    """sagemaker_mpi_num_processes beyond what v3's process_count_per_node allows is refused at load."""
    hps = json.dumps({"sagemaker_mpi_num_processes": "8"})
    paths = write_v3_tree(tmp_path / "ml", hyperparameters=hps, hosts=("algo-1",))
    v3 = sdk_v3.load(paths)
    assert v3 is not None
    with pytest.raises(
        ConfigError, match=r"sagemaker_mpi_num_processes: expected at most 2 \(2 per host x 1 hosts\)"
    ):
        load_job(paths, Hardware(cpus=2, gpus=0), v3=v3)


@pytest.mark.integration  # starts processes
@pytest.mark.parametrize("how", ["script", "stdin"])
def test_an_inherited_bash_execution_string_is_not_v3s_shell(tmp_path, how):
    """A parent that exports BASH_EXECUTION_STRING (it holds v3's command in v3's own shell) must not turn
    a later `bash script.sh` into `train`: only a `bash -c` shell sets the variable itself."""
    fake = tmp_path / "bin" / "train"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "train ran"\n')
    fake.chmod(0o755)
    script = tmp_path / "script.sh"
    script.write_text("echo the script ran\n")
    env = {
        "PATH": f"{fake.parent}:/usr/bin:/bin",
        "BASH_ENV": str(BASH_ENV_FILE),
        "BASH_EXECUTION_STRING": sdk_v3.SM_TRAIN_COMMAND,
    }
    argv = ["/bin/bash", str(script)] if how == "script" else ["/bin/bash", "-s"]
    proc = subprocess.run(
        argv,
        input=None if how == "script" else script.read_text(),
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.stdout == "the script ran\n", proc.stdout + proc.stderr
