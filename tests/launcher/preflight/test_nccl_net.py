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

from smhvd.preflight.nccl_net import NcclNet, cell, detect, from_fact, plugin_names, socket_reason
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
            dataclasses.replace(PLUGIN, efa_devices=0),
            "Socket",
            "no EFA device",
            "Socket (aws-ofi-nccl 1.21.1, efa provider, 0 EFA)",
        ),
        (
            NcclNet(None, None, NO_PLUGIN, provider=True, efa_devices=4),
            "Socket",
            f"no NCCL network plugin loads ({NO_PLUGIN})",
            "Socket (no plugin, efa provider, 4 EFA)",
        ),
        (
            dataclasses.replace(PLUGIN, provider=False),
            "Socket",
            "libfabric's efa provider does not answer",
            "Socket (aws-ofi-nccl 1.21.1, no efa provider, 4 EFA)",
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
    assert found == NcclNet(str(plugin_dir / "libnccl-net.so"), "9.8.7", None, provider=True, efa_devices=2)
    assert found.network == "OFI"
    other = detect_in_a_process({"LD_LIBRARY_PATH": str(plugin_dir), "NCCL_NET_PLUGIN": "other"})
    assert other == NcclNet(
        str(plugin_dir / "libnccl-net-other.so"), None, None, provider=True, efa_devices=2
    )


def test_no_plugin_is_socket_with_the_loaders_words():
    found = detect({"NCCL_NET_PLUGIN": "absent-for-this-test"}, provider=True, efa_devices=2)
    assert found.plugin is None and found.network == "Socket"
    assert found.plugin_error == (
        "absent-for-this-test: cannot open shared object file: No such file or directory; "
        "libnccl-net-absent-for-this-test.so: cannot open shared object file: No such file or directory"
    )
