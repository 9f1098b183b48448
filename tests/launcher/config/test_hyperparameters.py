import ast
import dataclasses
from pathlib import Path

import pytest

from smhvd.config.hyperparameters import (
    SDK_SENT_KEYS,
    decode_hyperparameters,
    is_reserved,
    key_warnings,
    split_hyperparameters,
    to_env_value,
    to_script_args,
)
from smhvd.config.launcher_options import (
    GROUPS,
    HorovodOptions,
    LauncherOptions,
    LauncherOwnOptions,
    MpiOptions,
    ProgramOptions,
    all_declarations,
    parse_launcher_options,
    split_mpi_options,
)
from smhvd.env_options import env_declarations
from smhvd.errors import ConfigError
from smhvd.option_spec import declarations, key_of
from smhvd_dev.mltree import sdk_encode


def test_sdk_encoded_values_decode_to_python_values():
    raw = sdk_encode({"epochs": 2, "lr": 0.1, "flag": True, "name": "x y", "layers": [1, 2], "cfg": {"a": 1}})
    assert raw["name"] == '"x y"'
    assert decode_hyperparameters(raw) == {
        "epochs": 2,
        "lr": 0.1,
        "flag": True,
        "name": "x y",
        "layers": [1, 2],
        "cfg": {"a": 1},
    }
    # Hand-written files without JSON encoding still work: the raw string is kept.
    assert decode_hyperparameters({"name": "plain text", "n": 3}) == {"name": "plain text", "n": 3}


def test_launcher_keys_never_reach_the_script():
    decoded = decode_hyperparameters(
        sdk_encode(
            {
                "sagemaker_program": "train.py",
                "sagemaker_mpi_enabled": True,
                "horovod_timeline": True,
                "launcher_peer_timeout_seconds": 30,
                "epochs": 3,
            }
        )
    )
    reserved, user = split_hyperparameters(decoded)
    assert user == {"epochs": 3}
    assert set(reserved) == {
        "sagemaker_program",
        "sagemaker_mpi_enabled",
        "horovod_timeline",
        "launcher_peer_timeout_seconds",
    }


def test_script_args_follow_the_toolkit_format():
    assert to_script_args(
        {"lr": 0.1, "b": 64, "epochs": 2, "flag": True, "cfg": {"y": 2, "x": "1"}, "text": "a b"}
    ) == [
        "-b",
        "64",
        "--cfg",
        "x=1,y=2",
        "--epochs",
        "2",
        "--flag",
        "True",
        "--lr",
        "0.1",
        "--text",
        "a b",
    ]
    assert to_env_value("text") == "text"
    assert to_env_value([1, 2]) == "[1,2]"


def test_a_list_is_one_argument_per_item():
    """tensorpack's `--config A=1 B=2` (argparse nargs='+') from {"config": ["A=1", "B=2"]}: the toolkit's
    str(list) would reach the script as one unusable argument."""
    assert to_script_args({"config": ["TRAINER=horovod", "MODE_MASK=True"], "n": 1}) == [
        "--config",
        "TRAINER=horovod",
        "MODE_MASK=True",
        "-n",
        "1",
    ]
    # scalars as the toolkit formats them; a nested list or object stays one argument, as JSON
    assert to_script_args({"xs": [1, 0.5, True, None, "a b", [1, 2], {"k": "v"}]}) == [
        "--xs", "1", "0.5", "True", "", "a b", "[1,2]", '{"k":"v"}',
    ]  # fmt: skip
    assert to_script_args({"empty": []}) == ["--empty"]
    assert to_env_value(True) == "true"


def test_settings_defaults():
    s = parse_launcher_options({})
    assert s.mpi.enabled is True
    assert s.mpi.processes_per_host is None and s.mpi.num_processes is None
    assert s.mpi.custom_options == ()
    assert s.launcher.peer_timeout == 600 and s.launcher.leader_timeout == 900
    assert s.launcher.forward_aws_credentials is False
    assert s.horovod == HorovodOptions()


def test_custom_mpi_options_are_split_like_a_shell_not_on_spaces():
    assert split_mpi_options('--mca btl_tcp_if_exclude "lo,docker0" -x NCCL_DEBUG=INFO -x "A=b c"') == (
        "--mca",
        "btl_tcp_if_exclude",
        "lo,docker0",
        "-x",
        "NCCL_DEBUG=INFO",
        "-x",
        "A=b c",
    )
    with pytest.raises(
        ConfigError, match="sagemaker_mpi_custom_mpi_options: expected options quoted as in a shell"
    ):
        split_mpi_options('-x "A=b')


@pytest.mark.parametrize(
    ("hps", "message"),
    [
        ({"sagemaker_mpi_enabled": "yes"}, "sagemaker_mpi_enabled: expected true or false, got 'yes'"),
        (
            {"sagemaker_mpi_num_of_processes_per_host": 0},
            "sagemaker_mpi_num_of_processes_per_host: expected an integer >= 1, got 0",
        ),
        (
            {"sagemaker_mpi_num_of_processes_per_host": 1.5},
            "sagemaker_mpi_num_of_processes_per_host: expected an integer >= 1, got 1.5",
        ),
        (
            {"sagemaker_mpi_num_processes": "many"},
            "sagemaker_mpi_num_processes: expected an integer >= 1, got 'many'",
        ),
        (
            {"launcher_peer_timeout_seconds": -3},
            "launcher_peer_timeout_seconds: expected a number >= 1, got -3",
        ),
        (
            {"horovod_fusion_threshold_mb": True},
            "horovod_fusion_threshold_mb: expected a number >= 0, got True",
        ),
        (
            {"horovod_log_level": "loud"},
            "horovod_log_level: expected trace | debug | info | warning | error | fatal",
        ),
        ({"horovod_timline": True}, "horovod_timline: expected a known key (horovod_autotune"),
        (
            {"launcher_peer_timeout": 3},
            "launcher_peer_timeout: expected a known key (launcher_drop_mpi_defaults",
        ),
    ],
)
def test_bad_settings_name_the_key(hps, message):
    with pytest.raises(ConfigError) as err:
        parse_launcher_options(hps)
    assert str(err.value).startswith("hyperparameters.json: " + message)


def test_horovod_knobs_become_horovod_variables(tmp_path):
    s = parse_launcher_options(
        decode_hyperparameters(
            sdk_encode(
                {
                    "horovod_timeline": True,
                    "horovod_autotune": "true",
                    "horovod_fusion_threshold_mb": 32,
                    "horovod_cycle_time_ms": 2.5,
                    "horovod_stall_check_seconds": 0,
                    "horovod_log_level": "DEBUG",
                }
            )
        )
    )
    assert s.horovod.env(tmp_path) == {
        "HOROVOD_TIMELINE": str(tmp_path / "horovod_timeline.json"),
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": str(tmp_path / "horovod_autotune_log.csv"),
        "HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024),
        "HOROVOD_CYCLE_TIME": "2.5",
        "HOROVOD_STALL_CHECK_DISABLE": "1",
        "HOROVOD_LOG_LEVEL": "debug",
    }
    assert parse_launcher_options(
        {"horovod_stall_check_seconds": 120, "horovod_stall_shutdown_seconds": 600}
    ).horovod.env(tmp_path) == {
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "120",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600",
    }


def test_each_option_is_declared_once_with_a_reserved_key():
    declared = all_declarations()
    keys = [d.option.key for d in declared]
    assert len(keys) == len(set(keys)) and all(is_reserved(key) for key in keys)
    # every field of the options is a declared hyperparameter, but what the loader sets (SDK v3's files)
    fields = {(group.__name__, f.name) for group in GROUPS for f in dataclasses.fields(group)}
    loader_set = {("ProgramOptions", "requirements"), ("ProgramOptions", "origin")}
    assert {(g.__name__, d.field) for g in GROUPS for d in declarations(g)} == fields - loader_set
    # without hyperparameters, every option is its declared default
    assert parse_launcher_options({}) == LauncherOptions(
        ProgramOptions(), MpiOptions(), LauncherOwnOptions(), HorovodOptions()
    )


SRC = Path(__file__).resolve().parents[3] / "src" / "smhvd"
DECLARING = {SRC / "config" / "launcher_options.py", SRC / "env_options.py"}


def test_no_option_key_is_written_outside_its_declaration():
    """Code and errors that name an option take its declared key (key_of), so a renamed key cannot leave a
    stale copy behind: no string constant in src/smhvd equal to a key, but in the declaring modules."""
    keys = {d.option.key for d in [*all_declarations(), *env_declarations()]}
    written = sorted(
        f"{path.relative_to(SRC)}:{node.lineno}: {node.value}"
        for path in SRC.rglob("*.py")
        if path not in DECLARING
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in keys
    )
    assert written == []
    assert key_of(MpiOptions, "num_processes") == "sagemaker_mpi_num_processes"
    with pytest.raises(KeyError, match="ProgramOptions.origin declares no option"):
        key_of(ProgramOptions, "origin")


def test_the_variables_an_option_sets_are_the_ones_it_declares(tmp_path):
    declared = {v.name for d in declarations(HorovodOptions) for v in d.option.sets}
    every = HorovodOptions(True, True, True, 1.0, 1.0, 0, 1, "info")
    other = dataclasses.replace(every, stall_check_seconds=5)  # the other branch of the stall check
    assert set(every.env(tmp_path)) | set(other.env(tmp_path)) == declared
    assert HorovodOptions().env(tmp_path) == {}  # Horovod's own defaults: nothing set


READ = {d.option.key for d in all_declarations()}


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("sagemaker_prefligh", "sagemaker_preflight"),
        ("sagemaker_mpi_num_of_process_per_host", "sagemaker_mpi_num_of_processes_per_host"),
        ("sagemaker_mpi_enable", "sagemaker_mpi_enabled"),
        ("sagemaker_programm", "sagemaker_program"),
        ("sagemaker_instance_typ", "sagemaker_instance_type"),  # an SDK key: closest too, still ignored
    ],
)
def test_a_sagemaker_key_typo_is_a_warning_naming_the_closest_known_key(typo, meant):
    assert key_warnings({typo: "1", "sagemaker_program": "train.py", "epochs": 2}, READ) == [
        f"hyperparameters.json: {typo}: not a key the launcher reads or the SageMaker SDKs send, ignored "
        f"(the closest known key: {meant})"
    ]


def test_keys_the_launcher_reads_or_the_sdks_send_pass_without_a_warning():
    assert {"sagemaker_program", "sagemaker_distribution_instance_groups", "sagemaker_preflight"} <= READ
    assert key_warnings({key: "x" for key in READ | SDK_SENT_KEYS}, READ) == []
    others = {"epochs": 1, "horovod_timeline": True, "launcher_x": 1}  # not sagemaker_: not this check's
    assert key_warnings(others, READ) == []
    assert not READ & SDK_SENT_KEYS  # a key is either read (declared) or known to be sent for others


def test_every_sagemaker_key_the_launcher_reads_is_declared_once():
    """The `sagemaker_` keys written as whole strings in src/smhvd are the declarations' and the SDKs' list
    (SDK_SENT_KEYS): a key read anywhere else would be missing from the known keys and warned about."""
    written = sorted(
        f"{path.relative_to(SRC)}:{node.lineno}: {node.value}"
        for path in SRC.rglob("*.py")
        if path not in DECLARING
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("sagemaker_")
        and node.value.isidentifier()
        and node.value not in SDK_SENT_KEYS
        and node.value != "sagemaker_"
    )
    assert written == []
