"""What a simulated cluster looks like: typed, frozen settings and the pure functions deriving names,
addresses and the files every host sees."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from pathlib import Path

from smhvd_sim.system import ClusterError

MIN_HOSTS = 2
MAX_HOSTS = 64  # link names fit 15 characters up to 999, the /24 holds 244; 64 is what was run
INTERFACE = "eth0"
DEFAULT_ML_PATH = Path("/opt/ml")
DEFAULT_INSTANCE_TYPE = "ml.c5.xlarge"
SUBNET_BASE = ipaddress.IPv4Network("10.231.0.0/16")
LINK_PREFIX = "smhvd"


@dataclass(frozen=True)
class ClusterSpec:
    """Everything the caller chooses about one cluster; hosts are algo-1..algo-N."""

    hosts: int
    workdir: Path
    hyperparameters: dict[str, str] = field(default_factory=dict)
    inputdataconfig: dict[str, object] = field(default_factory=dict)
    channels: dict[str, Path] = field(default_factory=dict)
    code_dir: Path | None = None
    ml_path: Path = DEFAULT_ML_PATH
    instance_type: str = DEFAULT_INSTANCE_TYPE
    private_tmp: bool = True
    ssh_client_config: bool = False
    extra_binds: tuple[tuple[Path, Path], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    path_prefix: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not MIN_HOSTS <= self.hosts <= MAX_HOSTS:
            raise ClusterError(f"hosts: expected {MIN_HOSTS} to {MAX_HOSTS}, got {self.hosts}")
        if not self.ml_path.is_absolute():
            raise ClusterError(f"ml_path: expected an absolute path, got {self.ml_path}")
        for name in self.channels:
            if not name or "/" in name:
                raise ClusterError(f"channel name: expected a plain name, got {name!r}")
        for key, value in self.hyperparameters.items():
            if not isinstance(value, str):
                raise ClusterError(f"hyperparameters[{key!r}]: expected a JSON-encoded string, got {value!r}")

    @property
    def host_names(self) -> list[str]:
        return host_names(self.hosts)


@dataclass(frozen=True)
class HostAddress:
    """One host's place on the cluster's network."""

    name: str
    index: int
    address: ipaddress.IPv4Interface
    outer_link: str


def host_names(count: int) -> list[str]:
    """algo-1..algo-N, as SageMaker names the instances of a training job."""
    return [f"algo-{index}" for index in range(1, count + 1)]


def subnet_for(slot: int) -> ipaddress.IPv4Network:
    """The /24 of cluster slot ``slot`` (0-255) inside 10.231.0.0/16."""
    if not 0 <= slot <= 255:
        raise ClusterError(f"subnet slot: expected 0 to 255, got {slot}")
    return list(SUBNET_BASE.subnets(new_prefix=24))[slot]


def bridge_name(cluster_id: str) -> str:
    """The bridge joining the hosts; link names have at most 15 characters."""
    return f"{LINK_PREFIX}{cluster_id}"


def host_addresses(count: int, cluster_id: str, slot: int) -> list[HostAddress]:
    """Addresses .11, .12, ... of the slot's /24, and the outer veth end's name of every host."""
    subnet = subnet_for(slot)
    return [
        HostAddress(
            name=name,
            index=index,
            address=ipaddress.IPv4Interface(f"{subnet.network_address + 10 + index}/{subnet.prefixlen}"),
            outer_link=f"{LINK_PREFIX}{cluster_id}h{index}",
        )
        for index, name in enumerate(host_names(count), start=1)
    ]


def hosts_file(addresses: list[HostAddress]) -> str:
    """/etc/hosts as every host sees it: loopback and each algo-K at its eth0 address."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{host.address.ip}\t{host.name}" for host in addresses]
    return "\n".join(lines) + "\n"


def encode_hyperparameter(value: str) -> str:
    """A command-line value as the SageMaker SDK writes it: JSON text stays as it is, anything else
    becomes a JSON string (``2`` -> ``2``, ``true`` -> ``true``, ``mnist.py`` -> ``"mnist.py"``)."""
    try:
        json.loads(value)
    except json.JSONDecodeError:
        return json.dumps(value)
    return value
