"""The launcher's mpirun defaults, declared once: each one's name (what `launcher_drop_mpi_defaults` takes and
what a user's option, or one Open MPI refuses beside it, replaces: `overridden_names`), its arguments and when
it applies (mpi/command.default_options fills `{interface}`, `{ssh_config}`, `{hosts}`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

# When a default applies: always; when the ranks fill a host's cores; when the hosts' interface is known;
# when mpirun starts orted over ssh; with more hosts than Open MPI's own 128 concurrent ssh sessions.
When = Literal["always", "ranks_fill_cores", "interface", "ssh", "many_hosts"]


@dataclass(frozen=True)
class MpiDefault:
    name: str
    argv: tuple[str, ...]
    when: When = "always"
    # Besides its own name, the names among the user's options (without dashes, MCA keys) that replace it:
    # the MCA parameter behind the same option, and what Open MPI 4.1 refuses beside it ("Conflicting
    # directives for mapping/binding policy"; include/exclude interface lists are mutually exclusive).
    conflicts: frozenset[str] = frozenset()


MPI_DEFAULTS = (
    # hosts' cores are the scripts' business (and TF's threads)
    MpiDefault(
        "bind-to",
        ("--bind-to", "none"),
        conflicts=frozenset({"hwloc_base_binding_policy", "bind-to-core", "bind-to-socket", "bind-to-none"}),
    ),
    MpiDefault(
        "map-by",
        ("--map-by", "slot"),
        conflicts=frozenset(
            (
                "rmaps_base_mapping_policy rankfile rmaps_rank_file_path ppr npernode pernode npersocket "
                "bynode byslot bycore bysocket byboard rmaps_base_bynode"
            ).split()
        ),
    ),
    MpiDefault("orte_abort_on_non_zero_status", ("--mca", "orte_abort_on_non_zero_status", "1")),
    # abort in ms, not 1-3 s
    MpiDefault("odls_base_sigkill_timeout", ("--mca", "odls_base_sigkill_timeout", "0")),
    MpiDefault("mpi_yield_when_idle", ("--mca", "mpi_yield_when_idle", "1"), "ranks_fill_cores"),
    MpiDefault(
        "btl_tcp_if_include",
        ("--mca", "btl_tcp_if_include", "{interface}"),
        "interface",
        frozenset({"btl_tcp_if_exclude"}),
    ),
    MpiDefault(
        "oob_tcp_if_include",
        ("--mca", "oob_tcp_if_include", "{interface}"),
        "interface",
        frozenset({"oob_tcp_if_exclude"}),
    ),
    # NCCL picks its own interface otherwise (docker0 or lo on some hosts); a forwarded value wins.
    MpiDefault("NCCL_SOCKET_IFNAME", ("-x", "NCCL_SOCKET_IFNAME={interface}"), "interface"),
    MpiDefault("plm_rsh_args", ("--mca", "plm_rsh_args", "-F {ssh_config}"), "ssh"),
    # Flat launch: mpirun itself starts every orted (tree spawn needs every worker to ssh to the others; up
    # to 64 hosts Open MPI's routing radix makes it flat anyway), at most plm_rsh_num_concurrent ssh sessions
    # at a time: above Open MPI's 128, every host at once, as horovodrun sets for large clusters. Measured
    # (flat, tree, capped): docs/benchmarks.md.
    MpiDefault("plm_rsh_no_tree_spawn", ("--mca", "plm_rsh_no_tree_spawn", "1"), "ssh"),
    MpiDefault("plm_rsh_num_concurrent", ("--mca", "plm_rsh_num_concurrent", "{hosts}"), "many_hosts"),
)
MPI_DEFAULT_NAMES = frozenset(d.name for d in MPI_DEFAULTS)


_MCA_FLAGS = ("--mca", "-mca", "--gmca", "-gmca")
# mpirun spellings of one option (single or double dash is the same option).
_FLAG_ALIASES = {"rf": "rankfile", "N": "npernode"}


def user_names(custom: Sequence[str]) -> set[str]:
    """What the user's own options set: option names (no dashes), MCA keys, and `-x` variable names."""
    names: set[str] = set()
    i = 0
    while i < len(custom):
        flag = custom[i]
        nxt = custom[i + 1] if i + 1 < len(custom) else ""
        if flag in _MCA_FLAGS:  # --mca KEY VALUE: the value may start with '-' (plm_rsh_args "-p 2222")
            names.add(nxt)
            i += 3
            continue
        if flag == "-x":
            names.add(nxt.split("=", 1)[0])
            i += 2
            continue
        if flag.startswith("-") and len(flag) > 1:
            name = flag.lstrip("-").split("=", 1)[0]
            names.add(_FLAG_ALIASES.get(name, name))
        i += 1
    names.discard("")
    return names


def overridden_names(custom: Sequence[str], env_mca: frozenset[str] = frozenset()) -> set[str]:
    """What the user's own options (and the MCA keys the job's environment sets) replace: the defaults they
    set or conflict with, and every name they set (a `-x NAME` replaces a default variable of that name)."""
    given = user_names(custom) | env_mca
    return {d.name for d in MPI_DEFAULTS if given & (d.conflicts | {d.name})} | given
