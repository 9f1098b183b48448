"""EFA (Elastic Fabric Adapter): decided from the machine, not from a list of instance types.

At start each host asks libfabric whether its efa provider is usable (`fi_info -p efa -t FI_EP_RDM`); when
it is, the ranks get (docs/configuration.md; a value already in the environment wins):
- FI_PROVIDER=efa: Open MPI's ofi MTL takes EFA or fails loudly, not libfabric's slow tcp provider;
- FI_EFA_FORK_SAFE=1: data loaders fork, and memory registered with EFA must survive a fork on kernels before
  5.13 (aws-ofi-nccl sets it for NCCL; MPI, all of the CPU image's Horovod traffic, has no plugin to);
- OMPI_MCA_pml=cm and OMPI_MCA_mtl=ofi: the images' Debian Open MPI turns its ofi MTL off (`mtl = ^ofi`),
  which a variable outranks; `cm` alone, so that a failing EFA stops the job instead of falling back to TCP.
Nothing else, as aws-ofi-nccl's EFA guide has it for libfabric >= 1.18 and the plugin >= 1.7: no
FI_EFA_USE_DEVICE_RDMA, no NCCL_PROTO=simple (the plugin sets it where needed), no NCCL_NET_PLUGIN (the
loader cache has libnccl-net.so). EFA_INSTANCE_TYPES serves one warning: such an instance that finds no EFA.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from smhvd.proc.steps import run_step

PROBE_ARGV = ("fi_info", "-p", "efa", "-t", "FI_EP_RDM", "-v")
PROBE_TIMEOUT = 15.0
# Instance types with EFA that SageMaker trains on (AWS documentation, Nov 2026).
EFA_INSTANCE_TYPES = frozenset(
    (
        "ml.g4dn.8xlarge ml.g4dn.12xlarge ml.g4dn.16xlarge ml.g5.48xlarge ml.g6.48xlarge ml.p3dn.24xlarge "
        "ml.p4d.24xlarge ml.p4de.24xlarge ml.p5.48xlarge ml.p5e.48xlarge ml.p5en.48xlarge ml.trn1.32xlarge "
        "ml.trn1n.32xlarge"
    ).split()
)
_PROVIDER = re.compile(r"^\s*(?:provider|prov_name):\s*efa\b", re.MULTILINE)  # plain or -v output
# fi_getinfo's -FI_ENODATA: the efa provider is there and found no device (a provider missing reads the same).
NO_DEVICE = "libfabric's efa provider finds no EFA device"


@dataclass(frozen=True)
class EfaProbe:
    present: bool
    detail: str  # what the probe saw, in words, for the log line


def read_probe(returncode: int | None, stdout: str, stderr: str) -> EfaProbe:
    """Interpret `fi_info -p efa -t FI_EP_RDM -v` (returncode None: fi_info is not installed). Pure."""
    if returncode is None:
        return EfaProbe(False, "fi_info not found (no libfabric)")
    if returncode == 0 and _PROVIDER.search(stdout):
        return EfaProbe(True, "libfabric's efa provider answers")
    last = (stderr.strip().splitlines() or stdout.strip().splitlines() or ["no output"])[-1].strip()
    return EfaProbe(False, NO_DEVICE if "fi_getinfo: -61" in last else f"fi_info -p efa: {last[:200]}")


def probe() -> EfaProbe:
    """Run fi_info as a step (proc/steps.py): bounded, stopped with whatever it starts, nothing of it left
    running afterwards; its output is data (bytes that are not UTF-8 are replaced, never an error)."""
    try:
        result = run_step(PROBE_ARGV, timeout=PROBE_TIMEOUT)
    except FileNotFoundError:
        return read_probe(None, "", "")
    except OSError as exc:
        return EfaProbe(False, f"fi_info failed: {exc}")
    if result.returncode is None:
        return EfaProbe(False, f"fi_info did not finish within {PROBE_TIMEOUT:g}s (ended)")
    return read_probe(result.returncode, *result.text())


def efa_env(found: EfaProbe, env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add for the ranks (never one the environment already sets). Pure."""
    if not found.present:
        return {}
    wanted = {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1", "OMPI_MCA_pml": "cm", "OMPI_MCA_mtl": "ofi"}
    return {k: v for k, v in wanted.items() if k not in env}


def options_set(tokens: Sequence[str]) -> dict[str, str]:
    """The variables the user's mpirun options set for the ranks (`-x NAME=VALUE`, the last one wins; mpirun
    gives them over the environment's). Pure."""
    found: dict[str, str] = {}
    for flag, value in itertools.pairwise(tokens):
        if flag == "-x" and "=" in value:
            name, _, given = value.partition("=")
            found[name] = given
    return found


def ranks_line(found: EfaProbe, added: Mapping[str, str], options: Sequence[str]) -> str:
    """The start-up `EFA:` line: what the probe saw and what the ranks will really get, the user's mpirun
    options (`-x FI_PROVIDER=tcp` in custom_mpi_options) over what the launcher adds. Pure."""
    if not found.present:
        return f"EFA: none ({found.detail})"
    user = options_set(options)
    kept = {k: v for k, v in added.items() if k not in user}
    shown = " ".join(f"{k}={v}" for k, v in sorted(kept.items())) or "nothing (the environment sets them)"
    line = f"EFA: {found.detail}; ranks get {shown}"
    overrides = {k: user[k] for k in sorted(user) if k in added or k == "FI_PROVIDER"}
    if overrides:
        line += "; custom_mpi_options sets " + " ".join(f"{k}={v}" for k, v in overrides.items())
        if overrides.get("FI_PROVIDER", "efa") != "efa":
            line += f" (the ranks' libfabric uses {overrides['FI_PROVIDER']}, not EFA)"
    return line


def expected_but_missing(found: EfaProbe, instance_type: str | None) -> bool:
    return not found.present and instance_type in EFA_INSTANCE_TYPES
