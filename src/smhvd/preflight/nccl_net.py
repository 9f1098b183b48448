"""Which network NCCL will use between hosts, read without NCCL or a GPU (the pre-flight's NCCL-network row).

NCCL loads a network plugin through the dynamic loader: NCCL_NET_PLUGIN, then `libnccl-net-<it>.so`, when that
variable is set, else `libnccl-net.so`. The GPU image's is aws-ofi-nccl (docs/images.md), which on AWS uses
libfabric's efa provider only. So NCCL goes over EFA ("OFI") when the plugin loads, the efa provider answers
(efa.probe) and the host has an EFA device; otherwise it falls back to its sockets transport ("Socket").
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from smhvd.mpi.efa import EFA_INSTANCE_TYPES

_VERSION = re.compile(rb"aws-ofi-nccl (\d+\.\d+[\w.]*)")  # the plugin's own start-up line, in its library
_RTLD_DI_LINKMAP = 2
_FACT = {"plugin": str, "plugin_version": str, "plugin_error": str, "provider": bool, "efa_devices": int}


@dataclass(frozen=True)
class NcclNet:
    plugin: str | None  # the plugin library NCCL would load (its path); None: none loads
    plugin_version: str | None  # aws-ofi-nccl's version, read from that library
    plugin_error: str | None  # why none loads, in the loader's words
    provider: bool  # libfabric's efa provider answers (efa.probe)
    efa_devices: int  # RDMA devices whose driver is efa

    @property
    def network(self) -> str:
        return "OFI" if self.plugin and self.provider and self.efa_devices else "Socket"


class _LinkMap(ctypes.Structure):
    _fields_ = (("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p))  # the head of glibc's link_map


def plugin_names(env: Mapping[str, str]) -> tuple[str, ...]:
    """The names NCCL loads its network plugin by, in its order. Pure."""
    name = env.get("NCCL_NET_PLUGIN", "")
    return (name, f"libnccl-net-{name}.so") if name else ("libnccl-net.so",)


def detect(env: Mapping[str, str], provider: bool, efa_devices: int) -> NcclNet:
    """Load the plugin in this process as NCCL would in a rank (the loader reads the environment this process
    started with: run it as a rank is run); `provider` and `efa_devices` are the caller's findings."""
    errors = []
    for name in plugin_names(env):
        try:
            library = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
            continue
        link = ctypes.POINTER(_LinkMap)()
        handle = ctypes.c_void_p(library._handle)
        found = ctypes.CDLL(None).dlinfo(handle, _RTLD_DI_LINKMAP, ctypes.byref(link)) == 0
        path = os.fsdecode(link.contents.l_name) if found and link.contents.l_name else name
        match = _VERSION.search(Path(path).read_bytes()) if Path(path).is_file() else None
        version = match.group(1).decode() if match else None
        return NcclNet(path, version, None, provider, efa_devices)
    return NcclNet(None, None, "; ".join(errors)[:300], provider, efa_devices)


def socket_reason(net: NcclNet, instance_type: str | None) -> str | None:
    """Why NCCL on a host of an EFA instance type would use sockets; None when it uses EFA or the type has no
    EFA. Pure."""
    if instance_type not in EFA_INSTANCE_TYPES or net.network == "OFI":
        return None
    if not net.efa_devices:
        return "no EFA device"
    if not net.plugin:
        return f"no NCCL network plugin loads ({net.plugin_error})"
    return "libfabric's efa provider does not answer"


def cell(net: NcclNet) -> str:
    """The table's text: `OFI (aws-ofi-nccl 1.21.1, 4 EFA)`, or `Socket` and what the host has. Pure."""
    plugin = net.plugin and Path(net.plugin).name
    plugin = f"aws-ofi-nccl {net.plugin_version}" if net.plugin_version else plugin
    if net.network == "OFI":
        return f"OFI ({plugin}, {net.efa_devices} EFA)"
    provider = "efa provider" if net.provider else "no efa provider"
    return f"Socket ({plugin or 'no plugin'}, {provider}, {net.efa_devices} EFA)"


def from_fact(value: object) -> NcclNet | None:
    """A probe's report (`dataclasses.asdict` of a NcclNet, through JSON: untrusted) back; None if not one."""
    if not isinstance(value, dict) or set(value) != set(_FACT):
        return None
    if not all(type(value[k]) is t or (value[k] is None and t is str) for k, t in _FACT.items()):
        return None
    return NcclNet(**value) if value["efa_devices"] >= 0 else None
