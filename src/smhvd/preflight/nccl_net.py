"""Which network NCCL will use between hosts, read without NCCL or a GPU (the pre-flight's NCCL-network row,
and `python -m smhvd.preflight.nccl_net`, which prints it for this host: docs/preflight.md).

NCCL loads a network plugin through the dynamic loader: NCCL_NET_PLUGIN, then `libnccl-net-<it>.so`, when that
variable is set, else `libnccl-net.so`. The GPU image's is aws-ofi-nccl (docs/images.md), which on AWS uses
libfabric's efa provider only. So NCCL goes over EFA ("OFI") when nothing of the job's own settings turns it
away (NCCL_NET naming another network, in the environment or NCCL's configuration files; FI_PROVIDER naming
another libfabric provider), the plugin loads, NCCL is new enough for it, the CUDA runtime it names resolves,
the host has an EFA device and the efa provider answers (efa.probe); otherwise it falls back to its sockets
transport ("Socket"). EFA pins the job's buffers, so a host of an EFA type also needs locked memory without a
small limit (RLIMIT_MEMLOCK): a finding of its own, as NCCL fails there rather than falling back.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import resource
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from smhvd.mpi import efa
from smhvd.mpi.efa import EFA_INSTANCE_TYPES
from smhvd.preflight.facts import distribution_versions, efa_devices
from smhvd.proc.steps import run_step

_VERSION = re.compile(rb"aws-ofi-nccl (\d+\.\d+[\w.]*)")  # the plugin's own start-up line, in its library
_CUDART = re.compile(rb"libcudart\.so[\d.]*")  # the CUDA runtime the plugin names (linked or opened by name)
_RTLD_DI_LINKMAP = 2
_FACT: dict[str, tuple[type, bool]] = {  # field -> (type, may be None)
    "plugin": (str, True),
    "plugin_version": (str, True),
    "plugin_error": (str, True),
    "provider": (bool, False),
    "efa_devices": (int, False),
    "nccl_version": (str, True),
    "nccl_setting": (str, True),
    "fi_provider": (str, True),
    "cudart_error": (str, True),
    "memlock_kb": (int, True),
    "provider_listed": (bool, True),
}
# The oldest NCCL each aws-ofi-nccl release line works with (its release notes: 1.16 and later, NCCL 2.17.1).
PLUGIN_MIN_NCCL = (((1, 16), (2, 17, 1)),)
OTHER_NETS = ("socket", "ib")  # NCCL_NET values that name a network other than a plugin's
LIST_ARGV = ("fi_info", "-l")
CONF_FILES = (Path("/etc/nccl.conf"),)  # NCCL's system file; NCCL_CONF_FILE or ~/.nccl.conf come before it
# Below this, EFA's registrations cannot fit (engines' defaults: 64 KiB, 8 MiB). AWS's EFA guides ask for
# unlimited; a finite limit above it, set on purpose, passes (a choice: not measured on an instance).
MEMLOCK_FLOOR_KB = 1 << 20
MEMLOCK_FIX = "start the container with `--ulimit memlock=-1` (AWS's EFA guides ask for unlimited)"


@dataclass(frozen=True)
class NcclNet:
    plugin: str | None  # the plugin library NCCL would load (its path); None: none loads
    plugin_version: str | None  # aws-ofi-nccl's version, read from that library
    plugin_error: str | None  # why none loads, in the loader's words
    provider: bool  # libfabric's efa provider answers (efa.probe)
    efa_devices: int  # RDMA devices whose driver is efa
    nccl_version: str | None = None  # the NCCL installed (its wheel's version), None: not known
    nccl_setting: str | None = None  # NCCL_NET naming another network, and where it was set
    fi_provider: str | None = None  # FI_PROVIDER the ranks get, when it is set
    cudart_error: str | None = None  # the plugin names a CUDA runtime the loader cannot load: its words
    memlock_kb: int | None = None  # the soft RLIMIT_MEMLOCK in KiB; None: unlimited
    provider_listed: bool | None = None  # `fi_info -l` lists efa (with or without a device); None: unknown

    @property
    def network(self) -> str:
        return "OFI" if fallback(self) is None else "Socket"


class _LinkMap(ctypes.Structure):
    _fields_ = (("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p))  # the head of glibc's link_map


def plugin_names(env: Mapping[str, str]) -> tuple[str, ...]:
    """The names NCCL loads its network plugin by, in its order. Pure."""
    name = env.get("NCCL_NET_PLUGIN", "")
    return (name, f"libnccl-net-{name}.so") if name else ("libnccl-net.so",)


def conf_files(env: Mapping[str, str]) -> tuple[Path, ...]:
    """NCCL's configuration files, the first read first (a variable already set is never replaced: the
    environment wins over every file). Pure."""
    user = env.get("NCCL_CONF_FILE") or (f"{env['HOME']}/.nccl.conf" if env.get("HOME") else "")
    return (*((Path(user),) if user else ()), *CONF_FILES)


def nccl_setting(env: Mapping[str, str], files: Sequence[tuple[Path, str]]) -> str | None:
    """NCCL_NET naming another network than a plugin's, and where it comes from; `files`: (path, text) of
    NCCL's configuration files in conf_files' order. Pure."""
    found = [(env["NCCL_NET"], "the environment")] if "NCCL_NET" in env else []
    for path, text in files:
        for line in text.splitlines():
            name, _, value = line.split("#", 1)[0].partition("=")
            if name.strip() == "NCCL_NET" and value.strip():
                found.append((value.strip(), str(path)))
    if not found or found[0][0].lower() not in OTHER_NETS:
        return None
    value, where = found[0]
    return f"NCCL_NET={value} ({where})"


def _version(text: str | None) -> tuple[int, ...] | None:
    numbers = re.findall(r"\d+", (text or "").split("-")[0].split("+")[0])
    return tuple(int(n) for n in numbers[:3]) if numbers else None


def nccl_minimum(plugin_version: str | None) -> tuple[int, ...] | None:
    """The oldest NCCL the plugin works with, where its release notes say. Pure."""
    plugin = _version(plugin_version)
    known = [least for since, least in PLUGIN_MIN_NCCL if plugin is not None and plugin[:2] >= since]
    return known[-1] if known else None


def fallback(net: NcclNet) -> str | None:
    """Why NCCL falls back to sockets between hosts, the job's own settings first; None: it uses EFA. Pure."""
    least = nccl_minimum(net.plugin_version)
    have = _version(net.nccl_version)
    own = [s for s in _own_settings(net) if s.startswith("FI_PROVIDER=")]
    reasons = (
        (net.nccl_setting is not None, f"{net.nccl_setting} names another network than the plugin's"),
        (bool(own), f"{''.join(own)} is set: libfabric offers the plugin no efa provider"),
        (not net.efa_devices, "no EFA device"),
        (not net.plugin, f"no NCCL network plugin loads ({net.plugin_error})"),
        (
            least is not None and have is not None and have < least,
            f"NCCL {net.nccl_version} is older than aws-ofi-nccl {net.plugin_version} needs "
            f"({'.'.join(map(str, least or ()))}): NCCL does not use the plugin",
        ),
        (net.cudart_error is not None, f"the plugin's CUDA runtime does not load ({net.cudart_error})"),
        (net.provider_listed is False, "libfabric has no efa provider (`fi_info -l` lists none)"),
        (not net.provider, "libfabric's efa provider does not answer"),
    )
    return next((why for applies, why in reasons if applies), None)


def socket_reason(net: NcclNet, instance_type: str | None) -> str | None:
    """Why NCCL on a host of an EFA instance type would use sockets; None when it uses EFA or the type has no
    EFA. Pure."""
    return fallback(net) if instance_type in EFA_INSTANCE_TYPES else None


def memlock_reason(net: NcclNet, instance_type: str | None) -> str | None:
    """Why a host of an EFA instance type cannot pin what EFA registers: a limit on locked memory. Pure."""
    if instance_type not in EFA_INSTANCE_TYPES or net.memlock_kb is None:
        return None
    if net.memlock_kb >= MEMLOCK_FLOOR_KB:
        return None
    limit = f"{net.memlock_kb} KiB (RLIMIT_MEMLOCK)"
    return f"locked memory is limited to {limit}, too little for EFA: {MEMLOCK_FIX}"


def cell(net: NcclNet) -> str:
    """The table's text: `OFI (aws-ofi-nccl 1.21.1, 4 EFA)`, or `Socket` and what the host has. Pure."""
    plugin = net.plugin and Path(net.plugin).name
    plugin = f"aws-ofi-nccl {net.plugin_version}" if net.plugin_version else plugin
    if net.network == "OFI":
        return f"OFI ({plugin}, {net.efa_devices} EFA)"
    provider = _provider_text(net)
    head = "".join(f"{s}; " for s in _own_settings(net))
    return f"Socket ({head}{plugin or 'no plugin'}, {provider}, {net.efa_devices} EFA)"


def _provider_text(net: NcclNet) -> str:
    """The efa provider in a cell: libfabric answers the same with no provider and with no device, so
    `fi_info -l` (which lists it without a device) tells the two apart. Pure."""
    if net.provider:
        return "efa provider"
    if net.provider_listed is False:
        return "no efa provider"
    if not net.efa_devices:
        return "efa provider untried" if net.provider_listed is None else "efa provider, untried"
    return "efa provider not answering"


def _own_settings(net: NcclNet) -> list[str]:
    """The job's own settings that turn NCCL away from EFA. Pure."""
    provider = net.fi_provider
    other = provider is not None and "efa" not in provider.split(",")
    return [s for s in (net.nccl_setting, f"FI_PROVIDER={provider}" if other else None) if s]


def from_fact(value: object) -> NcclNet | None:
    """A probe's report (`dataclasses.asdict` of a NcclNet, through JSON: untrusted) back; None if not one."""
    if not isinstance(value, dict) or set(value) != set(_FACT):
        return None
    if not all(type(value[k]) is t or (value[k] is None and none) for k, (t, none) in _FACT.items()):
        return None
    negative = any(isinstance(value[k], int) and value[k] < 0 for k in ("efa_devices", "memlock_kb"))
    return None if negative else NcclNet(**value)


def provider_listed() -> bool | None:
    """Whether libfabric lists its efa provider (`fi_info -l`: there with or without a device); None when
    fi_info is missing or fails (bounded, a step: proc/steps.py)."""
    try:
        result = run_step(LIST_ARGV, timeout=efa.PROBE_TIMEOUT)
    except OSError:
        return None
    if result.returncode != 0:
        return None
    return re.search(r"^efa:", result.text()[0], re.MULTILINE) is not None


def detect(
    env: Mapping[str, str],
    provider: bool,
    efa_devices: int,
    nccl_version: str | None = None,
    listed: bool | None = None,
) -> NcclNet:
    """What NCCL would use here: the plugin loaded in this process as NCCL would in a rank (the loader reads
    the environment this process started with: run it as a rank is run), NCCL's configuration files, the
    locked-memory limit; `provider`, `efa_devices`, `nccl_version` and `listed` are the caller's findings."""
    texts = [(path, _read(path)) for path in conf_files(env)]
    base = NcclNet(
        None,
        None,
        None,
        provider,
        efa_devices,
        nccl_version=nccl_version,
        nccl_setting=nccl_setting(env, texts),
        fi_provider=env.get("FI_PROVIDER") or None,
        memlock_kb=_memlock_kb(),
        provider_listed=listed,
    )
    errors = []
    for name in plugin_names(env):
        try:
            library = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
            continue
        path = _loaded_path(library, name)
        data = Path(path).read_bytes() if Path(path).is_file() else b""
        match = _VERSION.search(data)
        version = match.group(1).decode() if match else None
        cudart = cudart_error(sorted({m.decode() for m in _CUDART.findall(data)}))
        return dataclasses.replace(base, plugin=path, plugin_version=version, cudart_error=cudart)
    return dataclasses.replace(base, plugin_error="; ".join(errors)[:300])


def _loaded_path(library: ctypes.CDLL, name: str) -> str:
    link = ctypes.POINTER(_LinkMap)()
    handle = ctypes.c_void_p(library._handle)
    found = ctypes.CDLL(None).dlinfo(handle, _RTLD_DI_LINKMAP, ctypes.byref(link)) == 0
    return os.fsdecode(link.contents.l_name) if found and link.contents.l_name else name


def cudart_error(names: Sequence[str]) -> str | None:
    """None when one of the CUDA runtime names the plugin holds loads here (or it holds none), else the
    loader's words."""
    errors = []
    for name in names:
        try:
            ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
            continue
        return None
    return "; ".join(errors)[:300] or None


def _memlock_kb() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft // 1024


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def report(net: NcclNet) -> str:
    """What `python -m smhvd.preflight.nccl_net` prints: the network and why, then each input. Pure."""
    why = fallback(net)
    plugin = net.plugin or f"none loads ({net.plugin_error})"
    if net.plugin and net.plugin_version:
        plugin += f" (aws-ofi-nccl {net.plugin_version})"
    listed = {True: "in libfabric", False: "not in libfabric (`fi_info -l`)", None: "not listed (no fi_info)"}
    if net.provider:
        provider = "answers"
    elif net.efa_devices:
        provider = f"{listed[net.provider_listed]}; does not answer (`fi_info -p efa`)"
    else:
        provider = f"{listed[net.provider_listed]}; untried: no EFA device"
    lines = [
        f"NCCL network between hosts: {net.network}" + (f" ({why})" if why else ""),
        f"plugin: {plugin}",
        f"NCCL: {net.nccl_version or 'not found (no nvidia-nccl wheel)'}",
        f"CUDA runtime for the plugin: {net.cudart_error or 'loads'}" if net.plugin else "",
        f"efa provider: {provider}",
        f"EFA devices: {net.efa_devices}",
        f"NCCL_NET: {net.nccl_setting or 'no other network named'}",
        f"FI_PROVIDER: {net.fi_provider or 'unset'}",
        f"locked memory (RLIMIT_MEMLOCK): {_memlock_text(net.memlock_kb)}",
    ]
    return "\n".join(line for line in lines if line)


def _memlock_text(kb: int | None) -> str:
    return "unlimited" if kb is None else f"{kb} KiB"


def main() -> int:
    """Print what this image's NCCL would use on this host, and why (docs/preflight.md)."""
    devices = len(efa_devices())
    version = distribution_versions().get("nccl")
    net = detect(os.environ, efa.probe().present, devices, version, provider_listed())
    print(report(net))
    return 0


if __name__ == "__main__":
    sys.exit(main())
