"""Hostile and odd values, one function at a time: each is one ConfigError line, or is carried intact."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from smhvd.config.hyperparameters import MAX_TOTAL_BYTES, decode_hyperparameters, to_script_args
from smhvd.config.launcher_options import MAX_PROCESSES_PER_HOST, MPI_DEFAULT_NAMES, parse_launcher_options
from smhvd.config.sagemaker_files import parse_input_data_config, parse_resource_config, read_json
from smhvd.env_options import LOG_LEVELS, log_level
from smhvd.errors import ConfigError
from smhvd.mpi.command import MpiPlan, build_mpirun_argv, default_options
from smhvd.mpi.supervisor import remove_session_dir, session_dirs
from smhvd.rank import program_argv
from smhvd.report.failure import compose, write_failure
from smhvd.roles.leader import mpirun_rank_command, rank_command
from smhvd.wire import RANK_ARGV

HOSTILE_ARGV = [
    "/py",
    "train.py",
    "-a",
    ":",
    "--np",
    "-np",
    "--app",
    "x",
    "-x",
    "A=B",
    "--nl",
    "a\nb",
    "--",
    "",
]


def test_the_programs_argv_travels_in_the_environment_not_on_mpiruns_command_line():
    command, env = mpirun_rank_command(HOSTILE_ARGV, {"PATH": "/bin"})
    assert command[1:] == ["-P", "-m", "smhvd.rank"]
    assert env["PATH"] == "/bin" and set(env) == {"PATH", RANK_ARGV}
    plan = MpiPlan(2, Path("/h"), Path("/w"), tuple(command), forward=(RANK_ARGV,))
    argv = build_mpirun_argv(plan)
    assert argv[-4:] == command and argv[argv.index(RANK_ARGV) - 1] == "-x"
    assert ":" not in argv and "--app" not in argv
    received = dict(env)
    assert program_argv([], received) == HOSTILE_ARGV
    assert RANK_ARGV not in received  # the script never sees it


def test_started_directly_the_wrapper_takes_its_arguments():
    assert rank_command(["/py", "t.py", ":"])[-4:] == ["--", "/py", "t.py", ":"]
    env = {RANK_ARGV: '["ignored"]'}
    assert program_argv(["--", "/py", "-np"], env) == ["/py", "-np"]


@pytest.mark.parametrize(
    ("reserved", "message"),
    [
        (
            {"horovod_fusion_threshold_mb": "Infinity"},
            "horovod_fusion_threshold_mb: expected a number <= 1048576",
        ),
        ({"horovod_fusion_threshold_mb": 1e400}, "horovod_fusion_threshold_mb: expected a number <= 1048576"),
        ({"horovod_fusion_threshold_mb": "-Infinity"}, "horovod_fusion_threshold_mb: expected a number >= 0"),
        ({"horovod_cycle_time_ms": "nan"}, "horovod_cycle_time_ms: expected a number >= 0.01"),
        ({"horovod_stall_check_seconds": 10**400}, "horovod_stall_check_seconds: expected an integer >= 0"),
        (
            {"sagemaker_mpi_num_of_processes_per_host": 10**20},
            f"sagemaker_mpi_num_of_processes_per_host: expected an integer <= {MAX_PROCESSES_PER_HOST}",
        ),
        (
            {"launcher_leader_timeout_seconds": "1e300"},
            "launcher_leader_timeout_seconds: expected a number <= ",
        ),
        ({"launcher_drop_mpi_defaults": "bind_to"}, "launcher_drop_mpi_defaults: expected names of mpirun"),
        ({"launcher_drop_mpi_defaults": ["map-by", "mapby"]}, "got 'mapby'"),
        ({"launcher_x\n": "1"}, "hyperparameters.json: 'launcher_x\\n': expected a known key"),
    ],
)
def test_absurd_launcher_values_are_config_errors(reserved, message):
    with pytest.raises(ConfigError, match="^hyperparameters.json: ") as info:
        parse_launcher_options(reserved)
    assert message in str(info.value) and "\n" not in str(info.value)


# The mpirun defaults a user may drop, as docs/configuration.md lists them: written out, not derived from the
# code under test.
DOCUMENTED_DEFAULTS = {
    "bind-to", "map-by", "orte_abort_on_non_zero_status", "odls_base_sigkill_timeout", "mpi_yield_when_idle",
    "btl_tcp_if_include", "oob_tcp_if_include", "NCCL_SOCKET_IFNAME", "plm_rsh_args", "plm_rsh_no_tree_spawn",
    "plm_rsh_num_concurrent",
}  # fmt: skip


def test_every_default_name_can_be_dropped_and_nothing_else():
    hosts = tuple(f"algo-{i}" for i in range(1, 130))
    every = MpiPlan(1, Path(), Path(), (), "eth0", Path(), yield_when_idle=True, hosts=hosts)
    given = {name for name, _ in default_options(every)} | {"NCCL_SOCKET_IFNAME"}  # -x, not an option
    assert given == MPI_DEFAULT_NAMES == DOCUMENTED_DEFAULTS  # the names the config layer accepts
    settings = parse_launcher_options({"launcher_drop_mpi_defaults": ",".join(sorted(DOCUMENTED_DEFAULTS))})
    assert settings.mpi.drop_defaults == DOCUMENTED_DEFAULTS
    assert (
        parse_launcher_options({"sagemaker_mpi_num_of_processes_per_host": "1024"}).mpi.processes_per_host
        == 1024
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"a": '"x\\u0000y"'}, "a: expected text without NUL characters"),
        ({"a": '{"k": ["ok", "\\u0000"]}'}, "a: expected text without NUL characters"),
        ({"a\x00b": "1"}, "'a\\x00b': expected a name of text"),
        ({"\ud800": "1"}, "'\\ud800': expected a name of text"),
        ({"a": '"\\udc80"'}, "a: expected text without NUL characters or lone surrogates"),
        ({"a": "[" * 100_000}, "a: expected a value nested at most 100 deep"),
        ({"a": "[" * 102 + "]" * 102}, "a: expected a value nested at most 100 deep"),
        ({"a": "x" * 70_000}, f"a: expected hyperparameters of at most {MAX_TOTAL_BYTES} bytes in all"),
        ({f"k{i}": "x" * 2500 for i in range(30)}, "expected hyperparameters of at most"),
    ],
)
def test_values_no_process_can_receive_are_config_errors(raw, message):
    with pytest.raises(ConfigError, match="^hyperparameters.json: ") as info:
        decode_hyperparameters(raw)
    text = str(info.value)
    assert message in text and text.isprintable()


def test_odd_but_carriable_values_pass_intact():
    raw = {
        "sep": '":"',
        "dash": '"-np"',
        "nl": '"a\\nb"',
        "digits": "1" * 5000,
        "inf": "1e400",
        "uni": '"é€"',
    }
    decoded = decode_hyperparameters(raw)
    assert decoded == {
        "sep": ":",
        "dash": "-np",
        "nl": "a\nb",
        "digits": "1" * 5000,
        "inf": float("inf"),
        "uni": "é€",
    }
    assert to_script_args(decoded)[-2:] == ["--uni", "é€"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"a": "\xff"}', "expected UTF-8 text (invalid byte at offset 7)"),
        (b"[" * 100_000 + b"]" * 100_000, "expected JSON nested less deeply"),
        (b'{"n": ' + b"9" * 5000 + b"}", "expected valid JSON (Exceeds the limit (4300 digits)"),
        (b'{"a": 1,}', "expected valid JSON (line 1 column 9"),
    ],
)
def test_unreadable_json_files_are_config_errors(tmp_path, data, message):
    path = tmp_path / "hyperparameters.json"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        read_json(path, required=True)
    assert str(info.value) == f"{path}: {message}" or str(info.value).startswith(f"{path}: {message}")


def test_names_with_a_trailing_newline_are_refused():
    with pytest.raises(ConfigError, match="current_host: expected a host name"):
        parse_resource_config({"current_host": "algo-1\n", "hosts": ["algo-1\n"]})
    with pytest.raises(ConfigError, match=r"hosts\[1\]: expected a host name"):
        parse_resource_config({"current_host": "algo-1", "hosts": ["algo-1", "algo-2\n"]})
    with pytest.raises(ConfigError, match=r"^inputdataconfig.json: 'train\\n': expected a channel name"):
        parse_input_data_config({"train\n": {}})


def test_the_failure_file_always_holds_a_readable_line(tmp_path):
    path = tmp_path / "output" / "failure"
    assert write_failure(path, compose("hyperparameters.json: \ud800: expected a name\nsecond"))
    assert path.read_text() == "hyperparameters.json: \\ud800: expected a name second"
    assert not write_failure(path, "another")  # first writer still wins


TF_NOISE = "".join(
    line + "\n"
    for line in (
        "2026-11-23 10:48:06.081435: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on.",
        "2026-11-23 10:48:06.226630: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow "
        "binary is optimized to use available CPU instructions in performance-critical operations.",
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the "
        "appropriate compiler flags.",
        "2026-11-23 10:48:07.000001: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:9261] "
        "Unable to "
        "register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been "
        "registered",
        "2026-11-23 10:48:07.100000: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: "
        "Could not find TensorRT",
    )
)


def test_framework_startup_noise_is_dropped_from_the_reason_only():
    error = (
        "2026-11-23 10:48:09.000000: E tensorflow/core/framework/op_kernel.cc:1] OOM when allocating\n"
        'Traceback (most recent call last):\n  File "train.py", line 3\nValueError: ' + "x" * 700 + "\n"
    )
    reason = compose("rank 0 on algo-1 exited with code 1", TF_NOISE + error)
    lines = reason.splitlines()
    assert lines[0] == "rank 0 on algo-1 exited with code 1"
    assert lines[1].endswith("OOM when allocating")  # an error line of TensorFlow's is evidence, kept
    assert lines[2] == "Traceback (most recent call last):"
    assert "cpu_feature_guard" not in reason and "TensorRT" not in reason and "cuDNN" not in reason


def test_a_session_directory_is_removed_by_the_pid_that_made_it(tmp_path):
    top = tmp_path / f"ompi.algo-1.{os.getuid()}"
    (top / "pid.123" / "0").mkdir(parents=True)
    (top / "pid.123" / "contact.txt").write_text("x")
    (top / "pid.456").mkdir()
    env = {"TMPDIR": str(tmp_path)}
    assert session_dirs(123, env) == [top / "pid.123"]
    remove_session_dir(123, env)
    assert sorted(p.name for p in top.iterdir()) == ["pid.456"]  # another job's directory stays
    remove_session_dir(456, env)
    assert list(tmp_path.iterdir()) == []  # and the emptied top directory goes too
    assert json.dumps(session_dirs(1, {})) == "[]"


LEVELS = [("debug", 10), ("DEBUG", 10), ("Info", 20), ("warn", 30), ("WARNING", 30), ("error", 40)]
LEVELS += [(" critical ", 50), ("debug\n", 10), ("10", 10), ("0", 0), ("5", 5), ("50", 50)]


@pytest.mark.parametrize(("text", "level"), LEVELS)
def test_log_levels_by_name_in_any_case_or_by_number(text, level):
    assert log_level(text) == level


def test_the_level_names_are_loggings() -> None:
    """env_options.py writes logging's levels out (the rank reads it, and does not import logging)."""
    assert {name: logging.getLevelName(name) for name in LOG_LEVELS} == LOG_LEVELS


ARABIC_TEN = "\u0661\u0660"  # digits int() would accept


@pytest.mark.parametrize("text", ["TRACE", "", "51", "-1", "1e1", "10.0", ARABIC_TEN, "INFO;rm", "x" * 5000])
def test_other_log_levels_are_refused_saying_what_is_accepted(text):
    with pytest.raises(ValueError, match="expected DEBUG, INFO, WARNING, ERROR or CRITICAL"):
        log_level(text)


def test_instance_groups_are_a_partition_of_the_hosts():
    base = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "current_group_name": "a"}

    def groups(*items: tuple[str, list[str]]) -> dict[str, object]:
        entries = [{"instance_group_name": n, "instance_type": "ml.c5.xlarge", "hosts": h} for n, h in items]
        return base | {"instance_groups": entries}

    parse_resource_config(groups(("a", ["algo-1"]), ("b", ["algo-2"])))  # the usual shape
    with pytest.raises(ConfigError, match=r"instance_groups\[1\].hosts: expected hosts of no other group"):
        parse_resource_config(groups(("a", ["algo-1"]), ("b", ["algo-1", "algo-2"])))
    with pytest.raises(
        ConfigError, match=r"instance_groups\[1\].instance_group_name: expected a name no other"
    ):
        parse_resource_config(groups(("a", ["algo-1"]), ("a", ["algo-2"])))
    with pytest.raises(
        ConfigError, match=r"current_group_name: expected the group of current_host \(\['b'\]\)"
    ):
        parse_resource_config(groups(("a", ["algo-2"]), ("b", ["algo-1"])))
