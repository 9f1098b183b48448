"""Which network NCCL will use (smhvd.preflight.nccl_net): the rules as pure functions, and the plugin found
by the real dynamic loader. The plugin here is a library this test compiles, holding the start-up text that
aws-ofi-nccl's library holds; the real plugin is loaded in the built GPU image
(tests/images/test_gpu_image.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smhvd.preflight.nccl_net import (
    NcclNet,
    cell,
    conf_files,
    cudart_error,
    detect,
    from_fact,
    memlock_reason,
    nccl_setting,
    plugin_names,
    report,
    socket_reason,
)
from support.ci import unavailable

PLUGIN = NcclNet("/opt/amazon/ofi-nccl/lib/libnccl-net.so", "1.21.1", None, provider=True, efa_devices=4)
NO_PLUGIN = "libnccl-net.so: cannot open shared object file: No such file or directory"


def test_nccl_loads_libnccl_net_unless_told_another_name():
    assert plugin_names({}) == ("libnccl-net.so",)
    assert plugin_names({"NCCL_NET_PLUGIN": "ofi"}) == ("ofi", "libnccl-net-ofi.so")
    assert plugin_names({"NCCL_NET_PLUGIN": "/x/libp.so"}) == ("/x/libp.so", "libnccl-net-/x/libp.so.so")


@pytest.mark.parametrize(
    ("net", "network", "reason", "text"),
    [
        (PLUGIN, "OFI", None, "OFI (aws-ofi-nccl 1.21.1, 4 EFA)"),
        (
            dataclasses.replace(PLUGIN, efa_devices=0, provider=False),  # libfabric cannot tell why
            "Socket",
            "no EFA device",
            "Socket (aws-ofi-nccl 1.21.1, efa provider untried, 0 EFA)",
        ),
        (
            NcclNet(None, None, NO_PLUGIN, provider=True, efa_devices=4),
            "Socket",
            f"no NCCL network plugin loads ({NO_PLUGIN})",
            "Socket (no plugin, efa provider, 4 EFA)",
        ),
        (
            dataclasses.replace(PLUGIN, provider=False, provider_listed=True),
            "Socket",
            "libfabric's efa provider does not answer",
            "Socket (aws-ofi-nccl 1.21.1, efa provider not answering, 4 EFA)",
        ),
        (  # a missing provider reads differently from a missing device (fi_info -l lists it without one)
            dataclasses.replace(PLUGIN, provider=False, provider_listed=False),
            "Socket",
            "libfabric has no efa provider (`fi_info -l` lists none)",
            "Socket (aws-ofi-nccl 1.21.1, no efa provider, 4 EFA)",
        ),
        (
            dataclasses.replace(PLUGIN, provider=False, provider_listed=True, efa_devices=0),
            "Socket",
            "no EFA device",
            "Socket (aws-ofi-nccl 1.21.1, efa provider, untried, 0 EFA)",
        ),
        (
            dataclasses.replace(PLUGIN, plugin="/x/libnccl-net.so", plugin_version=None),
            "OFI",
            None,
            "OFI (libnccl-net.so, 4 EFA)",  # another plugin: named by its file
        ),
    ],
)
def test_nccl_goes_over_efa_only_with_plugin_provider_and_device_and_says_what_is_missing(
    net, network, reason, text
):
    assert net.network == network
    assert socket_reason(net, "ml.p4d.24xlarge") == reason
    assert cell(net) == text


def test_sockets_are_a_finding_only_on_instance_types_with_efa():
    no_efa = NcclNet(None, None, NO_PLUGIN, provider=False, efa_devices=0)
    assert socket_reason(no_efa, "ml.c5.18xlarge") is None
    assert socket_reason(no_efa, None) is None  # SDK local mode: no instance type
    assert socket_reason(no_efa, "ml.p5.48xlarge") == "no EFA device"


def test_a_probe_report_comes_back_whole_through_json_and_anything_else_is_refused():
    fact = json.loads(json.dumps(dataclasses.asdict(PLUGIN)))
    assert from_fact(fact) == PLUGIN
    for bad in (
        None,
        [],
        {**fact, "extra": 1},
        {k: v for k, v in fact.items() if k != "provider"},
        {**fact, "efa_devices": -1},
        {**fact, "efa_devices": True},
        {**fact, "efa_devices": "4"},
        {**fact, "provider": "yes"},
        {**fact, "plugin": 3},
    ):
        assert from_fact(bad) is None, bad


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with libnccl-net.so and libnccl-net-other.so: real shared libraries, the first holding the
    text by which aws-ofi-nccl's library names its version."""
    cc = shutil.which("cc")
    if cc is None:
        unavailable("no C compiler (cc) to build a stand-in plugin library")
    where = tmp_path_factory.mktemp("plugin")
    source = where / "plugin.c"
    source.write_text(
        'const char *banner = "NET/OFI Initializing aws-ofi-nccl 9.8.7";\nint ncclNetPlugin_v8;\n'
    )
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(where / "libnccl-net.so"), str(source)], check=True)
    source.write_text("int ncclNetPlugin_v8;\n")
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(where / "libnccl-net-other.so"), str(source)], check=True
    )
    return where


DETECT = (
    "import json, dataclasses, os; from smhvd.preflight import nccl_net as n;"
    " print(json.dumps(dataclasses.asdict(n.detect(os.environ, True, 2))))"
)


def detect_in_a_process(env: dict[str, str]) -> NcclNet | None:
    """detect() in a fresh process: the loader reads LD_LIBRARY_PATH when a process starts, as in a rank."""
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NCCL_NET_PLUGIN")}
    proc = subprocess.run(
        [sys.executable, "-c", DETECT],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return from_fact(json.loads(proc.stdout))


@pytest.mark.integration
def test_the_plugin_is_found_where_the_loader_finds_it_with_its_version(plugin_dir: Path):
    found = detect_in_a_process({"LD_LIBRARY_PATH": str(plugin_dir)})
    assert found is not None
    assert (found.plugin, found.plugin_version, found.plugin_error, found.cudart_error) == (
        str(plugin_dir / "libnccl-net.so"),
        "9.8.7",
        None,
        None,
    )
    assert found.network == "OFI"
    other = detect_in_a_process({"LD_LIBRARY_PATH": str(plugin_dir), "NCCL_NET_PLUGIN": "other"})
    assert other is not None
    assert (other.plugin, other.plugin_version) == (str(plugin_dir / "libnccl-net-other.so"), None)


def test_no_plugin_is_socket_with_the_loaders_words():
    found = detect({"NCCL_NET_PLUGIN": "absent-for-this-test"}, provider=True, efa_devices=2)
    assert found.plugin is None and found.network == "Socket"
    assert found.plugin_error == (
        "absent-for-this-test: cannot open shared object file: No such file or directory; "
        "libnccl-net-absent-for-this-test.so: cannot open shared object file: No such file or directory"
    )


# Issue 51 item 4: the row said `OFI (aws-ofi-nccl 1.21.1, 4 EFA)` whenever the plugin loaded, the efa
# provider answered and a device existed, whatever the job's own settings, NCCL's version or the CUDA
# runtime said.
@pytest.mark.parametrize(
    ("changed", "reason", "text"),
    [
        (
            {"nccl_setting": "NCCL_NET=Socket (the environment)"},  # -x NCCL_NET=Socket, or environment=
            "NCCL_NET=Socket (the environment) names another network than the plugin's",
            "Socket (NCCL_NET=Socket (the environment); aws-ofi-nccl 1.21.1, efa provider, 4 EFA)",
        ),
        (
            {
                "fi_provider": "tcp",
                "provider": False,
            },  # -x FI_PROVIDER=tcp: was "efa provider does not answer"
            "FI_PROVIDER=tcp is set: libfabric offers the plugin no efa provider",
            "Socket (FI_PROVIDER=tcp; aws-ofi-nccl 1.21.1, efa provider not answering, 4 EFA)",
        ),
        (
            {"nccl_version": "2.16.5"},  # requirements.txt: nvidia-nccl-cu12==2.16.5
            "NCCL 2.16.5 is older than aws-ofi-nccl 1.21.1 needs (2.17.1): NCCL does not use the plugin",
            "Socket (aws-ofi-nccl 1.21.1, efa provider, 4 EFA)",
        ),
        (
            {"cudart_error": "libcudart.so.12: cannot open shared object file"},
            "the plugin's CUDA runtime does not load (libcudart.so.12: cannot open shared object file)",
            "Socket (aws-ofi-nccl 1.21.1, efa provider, 4 EFA)",
        ),
        ({"nccl_version": "2.21.5", "fi_provider": "efa"}, None, "OFI (aws-ofi-nccl 1.21.1, 4 EFA)"),
    ],
)
def test_the_jobs_own_settings_nccls_version_and_the_cuda_runtime_decide_too(
    changed: dict[str, object], reason: str | None, text: str
) -> None:
    net = dataclasses.replace(PLUGIN, **changed)
    assert socket_reason(net, "ml.p4d.24xlarge") == reason
    assert cell(net) == text
    assert from_fact(json.loads(json.dumps(dataclasses.asdict(net)))) == net


def test_nccl_net_comes_from_the_environment_before_nccls_files_and_only_another_network_counts() -> None:
    etc = Path("/etc/nccl.conf")
    conf = [(etc, "# comment\nNCCL_DEBUG=WARN\nNCCL_NET = Socket  # sockets\n")]
    assert nccl_setting({}, conf) == "NCCL_NET=Socket (/etc/nccl.conf)"
    assert nccl_setting({"NCCL_NET": "AWS Libfabric"}, conf) is None  # the environment wins: the plugin
    assert nccl_setting({"NCCL_NET": "socket"}, []) == "NCCL_NET=socket (the environment)"
    assert nccl_setting({}, [(etc, "NCCL_NET=\n")]) is None
    assert conf_files({"HOME": "/root"}) == (Path("/root/.nccl.conf"), etc)
    assert conf_files({"NCCL_CONF_FILE": "/x.conf", "HOME": "/root"}) == (Path("/x.conf"), etc)


def test_a_limit_on_locked_memory_names_a_host_of_an_efa_type_with_the_fix() -> None:
    limited = dataclasses.replace(PLUGIN, memlock_kb=8192)
    assert memlock_reason(limited, "ml.p4d.24xlarge") == (
        "locked memory is limited to 8192 KiB (RLIMIT_MEMLOCK), too little for EFA: start the container with "
        "`--ulimit memlock=-1` (AWS's EFA guides ask for unlimited)"
    )
    assert memlock_reason(PLUGIN, "ml.p4d.24xlarge") is None  # unlimited
    assert memlock_reason(dataclasses.replace(PLUGIN, memlock_kb=64 << 20), "ml.p4d.24xlarge") is None
    assert memlock_reason(limited, "ml.c5.18xlarge") is None
    assert from_fact({**dataclasses.asdict(limited), "memlock_kb": -1}) is None


@pytest.mark.integration
def test_a_cuda_runtime_the_loader_cannot_find_is_said_in_its_words(plugin_dir: Path) -> None:
    assert cudart_error([]) is None
    assert cudart_error(["libcudart.so.99-absent"]) == (
        "libcudart.so.99-absent: cannot open shared object file: No such file or directory"
    )
    assert cudart_error(["libcudart.so.99-absent", str(plugin_dir / "libnccl-net.so")]) is None


@pytest.mark.integration
def test_the_command_prints_the_network_and_why_on_a_cpu_host() -> None:
    """Issue 52 item 3: `python -m smhvd.preflight.nccl_net` printed nothing. Run as documented (this
    machine: no plugin, no EFA device), it says Socket and why, and each input."""
    env = {k: v for k, v in os.environ.items() if k not in ("NCCL_NET", "FI_PROVIDER", "NCCL_NET_PLUGIN")}
    proc = subprocess.run(
        [sys.executable, "-m", "smhvd.preflight.nccl_net"],
        env={**env, "NCCL_NET_PLUGIN": "absent-for-this-test", "FI_PROVIDER": "tcp"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        "NCCL network between hosts: Socket (FI_PROVIDER=tcp is set: libfabric offers the plugin no efa "
        "provider)"
    )
    assert lines[1].startswith("plugin: none loads (absent-for-this-test: cannot open shared object file")
    assert [line.split(":")[0] for line in lines[2:]] == [
        "NCCL", "efa provider", "EFA devices", "NCCL_NET", "FI_PROVIDER", "locked memory (RLIMIT_MEMLOCK)",
    ]  # fmt: skip
    assert "FI_PROVIDER: tcp" in lines


def test_the_report_says_ofi_with_the_plugins_version_when_everything_is_there() -> None:
    text = report(dataclasses.replace(PLUGIN, nccl_version="2.21.5"))
    assert text.splitlines()[:3] == [
        "NCCL network between hosts: OFI",
        "plugin: /opt/amazon/ofi-nccl/lib/libnccl-net.so (aws-ofi-nccl 1.21.1)",
        "NCCL: 2.21.5",
    ]
