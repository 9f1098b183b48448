from pathlib import Path

import pytest

from smhvd.config.launcher_options import parse_launcher_options
from smhvd.errors import ConfigError
from smhvd.mpi.command import MpiPlan, build_mpirun_argv, env_mca_keys, forwarded_names, overridden_names

PROGRAM = ("/venv/bin/python", "-m", "smhvd.rank", "--", "/venv/bin/python", "train.py", "--epochs", "2")


def one_host(**kw):
    return MpiPlan(
        num_processes=2, hostfile=Path("/run/h"), workdir=Path("/opt/ml/code"), program=PROGRAM, **kw
    )


def test_one_host_argv():
    assert build_mpirun_argv(one_host(forward=("PATH", "SM_HOSTS"))) == [
        "mpirun",
        "--allow-run-as-root",
        "--tag-output",
        "-np",
        "2",
        "--hostfile",
        "/run/h",
        "-wdir",
        "/opt/ml/code",
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "--mca",
        "orte_abort_on_non_zero_status",
        "1",
        "--mca",
        "odls_base_sigkill_timeout",
        "0",
        "-x",
        "PATH",
        "-x",
        "SM_HOSTS",
        *PROGRAM,
    ]


def test_multi_host_argv_uses_the_interface_and_ssh_config():
    plan = MpiPlan(
        num_processes=4,
        hostfile=Path("/run/h"),
        workdir=Path("/c"),
        program=("p",),
        interface="eth0",
        ssh_config=Path("/run/ssh_config"),
        yield_when_idle=True,
        forward=("PATH",),
        hosts=("algo-1", "algo-2"),
    )
    assert build_mpirun_argv(plan) == [
        "mpirun",
        "--allow-run-as-root",
        "--tag-output",
        "-np",
        "4",
        "--hostfile",
        "/run/h",
        "-wdir",
        "/c",
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "--mca",
        "orte_abort_on_non_zero_status",
        "1",
        "--mca",
        "odls_base_sigkill_timeout",
        "0",
        "--mca",
        "mpi_yield_when_idle",
        "1",
        "--mca",
        "btl_tcp_if_include",
        "eth0",
        "--mca",
        "oob_tcp_if_include",
        "eth0",
        "-x",
        "NCCL_SOCKET_IFNAME=eth0",
        "--mca",
        "plm_rsh_args",
        "-F /run/ssh_config",
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "-x",
        "PATH",
        "p",
    ]


def test_user_options_replace_the_defaults_they_set_and_come_last():
    custom = (
        "--mca",
        "odls_base_sigkill_timeout",
        "5",
        "--bind-to",
        "core",
        "-x",
        "NCCL_SOCKET_IFNAME=ens5",
        "--report-bindings",
    )
    argv = build_mpirun_argv(one_host(custom_options=custom, interface="eth0"))
    assert argv.count("odls_base_sigkill_timeout") == 1
    assert "none" not in argv
    assert "NCCL_SOCKET_IFNAME=eth0" not in argv
    assert argv[-len(PROGRAM) - len(custom) : -len(PROGRAM)] == list(custom)


def user_options(text: str) -> list[str]:
    """What a job's sagemaker_mpi_custom_mpi_options adds to mpirun's argv (between the defaults and the
    program), as the launcher reads it from hyperparameters.json."""
    custom = parse_launcher_options({"sagemaker_mpi_custom_mpi_options": text}).mpi.custom_options
    argv = build_mpirun_argv(one_host(custom_options=custom))
    return argv[argv.index("0") + 1 : -len(PROGRAM)]  # after the last default (odls_base_sigkill_timeout 0)


@pytest.mark.parametrize(
    ("text", "options"),
    [
        # SageMaker's Horovod samples: the toolkit's own option, passed to the ranks as a variable
        ("-verbose --NCCL_DEBUG=INFO", ["-verbose", "-x", "NCCL_DEBUG=INFO"]),
        ("--NCCL_DEBUG WARN -verbose", ["-x", "NCCL_DEBUG=WARN", "-verbose"]),
        ("--NCCL_DEBUG", ["-x", "NCCL_DEBUG=INFO"]),
        ("--NCCL_DEBUG --report-bindings", ["-x", "NCCL_DEBUG=INFO", "--report-bindings"]),
        (
            "--NCCL_DEBUG=WARN --bind-to core --NCCL_DEBUG TRACE",
            ["--bind-to", "core", "-x", "NCCL_DEBUG=TRACE"],
        ),
        # mpirun's own form keeps working and wins over the toolkit's
        ("-x NCCL_DEBUG=WARN --NCCL_DEBUG=INFO", ["-x", "NCCL_DEBUG=WARN"]),
        ("--NCCL_DEBUG=INFO -x NCCL_DEBUG", ["-x", "NCCL_DEBUG"]),
        ("-x NCCL_DEBUG_SUBSYS=INIT --NCCL_DEBUG", ["-x", "NCCL_DEBUG_SUBSYS=INIT", "-x", "NCCL_DEBUG=INFO"]),
    ],
)
def test_the_toolkits_nccl_debug_option_becomes_a_variable_for_the_ranks(text, options):
    assert user_options(text) == options


def test_the_toolkits_nccl_debug_option_needs_a_value_after_its_equals_sign():
    with pytest.raises(
        ConfigError, match="sagemaker_mpi_custom_mpi_options: expected a value after --NCCL_DEBUG="
    ):
        user_options("-verbose --NCCL_DEBUG=")


def test_defaults_can_be_dropped_by_name():
    argv = build_mpirun_argv(one_host(drop_defaults=frozenset({"odls_base_sigkill_timeout", "map-by"})))
    assert "odls_base_sigkill_timeout" not in argv and "--map-by" not in argv
    assert "--bind-to" in argv


def test_overridden_names():
    assert overridden_names(
        ["-mca", "btl", "^tcp", "--map-by", "ppr:1:node", "-x", "A", "--gmca", "k", "v"]
    ) == {"btl", "map-by", "A", "k"}


def test_forwarded_names_allow_list_never_credentials_unless_asked():
    env = {
        "PATH": "/bin",
        "SM_HOSTS": "[]",
        "HOROVOD_TIMELINE": "x",
        "NCCL_DEBUG": "INFO",
        "OMP_NUM_THREADS": "1",
        "HOME": "/root",
        "SECRET_THING": "s",
        "AWS_REGION": "us-west-2",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_SESSION_TOKEN": "t",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/creds",
        "MY_APP_FLAG": "1",
    }
    assert forwarded_names(env) == (
        "AWS_REGION",
        "HOROVOD_TIMELINE",
        "NCCL_DEBUG",
        "OMP_NUM_THREADS",
        "PATH",
        "SM_HOSTS",
    )
    with_creds = forwarded_names(env, ["MY_APP_*"], aws_credentials=True)
    assert {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "MY_APP_FLAG",
    } <= set(with_creds)
    assert "SECRET_THING" not in with_creds and "HOME" not in with_creds


def hosts(count: int) -> tuple[str, ...]:
    return tuple(f"algo-{i}" for i in range(1, count + 1))


def two_hosts(**kw):
    kw.setdefault("hosts", hosts(2))
    return MpiPlan(
        num_processes=2,
        hostfile=Path("/run/h"),
        workdir=Path("/c"),
        program=("p",),
        interface="eth0",
        ssh_config=Path("/run/ssh_config"),
        **kw,
    )


def mca(argv):
    """{key: value} of the --mca options in argv."""
    return {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}


def test_an_exclude_list_replaces_the_default_include_list_of_the_same_transport():
    # The line users copy from AWS examples: with our include list beside it, Open MPI refuses both and the
    # ranks cannot reach each other.
    argv = build_mpirun_argv(two_hosts(custom_options=("--mca", "btl_tcp_if_exclude", "lo")))
    assert "btl_tcp_if_include" not in argv
    assert mca(argv)["oob_tcp_if_include"] == "eth0"  # the other transport keeps its default
    assert argv[-4:] == ["--mca", "btl_tcp_if_exclude", "lo", "p"]

    argv = build_mpirun_argv(two_hosts(custom_options=("-mca", "oob_tcp_if_exclude", "lo,docker0")))
    assert "oob_tcp_if_include" not in argv and mca(argv)["btl_tcp_if_include"] == "eth0"


def test_mca_parameters_from_the_environment_replace_defaults_too():
    env = {"OMPI_MCA_btl_tcp_if_exclude": "lo", "OMPI_MCA_mpi_yield_when_idle": "0", "PATH": "/bin"}
    assert env_mca_keys(env) == {"btl_tcp_if_exclude", "mpi_yield_when_idle"}
    argv = build_mpirun_argv(two_hosts(yield_when_idle=True, env_mca=env_mca_keys(env)))
    assert set(mca(argv)) == {
        "orte_abort_on_non_zero_status",
        "odls_base_sigkill_timeout",
        "oob_tcp_if_include",
        "plm_rsh_args",
        "plm_rsh_no_tree_spawn",
    }


@pytest.mark.parametrize(
    "custom",
    [
        ("--rankfile", "/opt/ml/code/ranks"),
        ("-rf", "/opt/ml/code/ranks"),
        ("-N", "2"),
        ("--npernode", "2"),
        ("-pernode",),
        ("--bynode",),
        ("--ppr", "1:node"),
        ("--mca", "rmaps_base_mapping_policy", "node"),
    ],
)
def test_any_mapping_directive_replaces_the_default_mapping(custom):
    argv = build_mpirun_argv(one_host(custom_options=custom))
    assert "--map-by" not in argv and "--bind-to" in argv


@pytest.mark.parametrize(
    "custom", [("--bind-to-core",), ("-bind-to-socket",), ("--mca", "hwloc_base_binding_policy", "core")]
)
def test_any_binding_directive_replaces_the_default_binding(custom):
    argv = build_mpirun_argv(one_host(custom_options=custom))
    assert "--bind-to" not in argv and "--map-by" in argv


def test_values_of_user_options_are_not_taken_for_option_names():
    argv = build_mpirun_argv(two_hosts(custom_options=("--mca", "plm_rsh_args", "-p 2222 -o map-by")))
    assert "--map-by" in argv and mca(argv)["plm_rsh_args"] == "-p 2222 -o map-by"


def test_above_open_mpis_128_concurrent_launches_every_host_is_launched_at_once():
    # Open MPI starts at most plm_rsh_num_concurrent (128) orteds at a time; larger jobs get all at once.
    assert "plm_rsh_num_concurrent" not in mca(build_mpirun_argv(two_hosts(hosts=hosts(128))))
    assert mca(build_mpirun_argv(two_hosts(hosts=hosts(200))))["plm_rsh_num_concurrent"] == "200"
    own = build_mpirun_argv(
        two_hosts(hosts=hosts(200), custom_options=("--mca", "plm_rsh_num_concurrent", "16"))
    )
    assert own.count("plm_rsh_num_concurrent") == 1 and mca(own)["plm_rsh_num_concurrent"] == "16"
    dropped = build_mpirun_argv(
        two_hosts(hosts=hosts(200), drop_defaults=frozenset({"plm_rsh_num_concurrent"}))
    )
    assert "plm_rsh_num_concurrent" not in dropped


@pytest.mark.integration
def test_the_samples_custom_mpi_options_run_and_every_rank_gets_nccl_debug(train_job):
    # SageMaker's Horovod samples pass exactly this; mpirun alone refuses "--NCCL_DEBUG=INFO" (exit 1)
    job = train_job(
        """
        import os
        rank = os.environ["OMPI_COMM_WORLD_RANK"]
        open(os.path.join(os.environ["SM_MODEL_DIR"], rank), "w").write(os.environ["NCCL_DEBUG"])
        """,
        {
            "sagemaker_mpi_num_of_processes_per_host": 2,
            "sagemaker_mpi_custom_mpi_options": "-verbose --NCCL_DEBUG=INFO",
        },
    )
    result = job.run()
    assert result.returncode == 0, result.stderr
    assert {p.name: p.read_text() for p in job.paths.model_dir.iterdir()} == {"0": "INFO", "1": "INFO"}
