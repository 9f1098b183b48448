"""Every default a table in docs/configuration.md states is the code's (for Horovod's: the pinned Horovod's):
the mpirun defaults table, Horovod's defaults, and the variables the launcher reads. The launcher_* options
table is checked where those options are declared."""

from __future__ import annotations

import logging
import re
import shlex
from dataclasses import replace
from pathlib import Path

from smhvd.config.paths import DEFAULT_BASE_DIR
from smhvd.env_options import EnvOptions
from smhvd.mpi.command import OMPI_RSH_CONCURRENT, MpiPlan, default_options
from smhvd.option_spec import declarations

REPO = Path(__file__).resolve().parents[2]
CONFIGURATION = REPO / "docs" / "configuration.md"
SOURCE = REPO / "src" / "smhvd"

# Horovod's defaults for the options it leaves to Horovod, read in Horovod 0.28.1's source:
# horovod/common/operations.cc (SetTensorFusionThresholdBytes(128 * 1024 * 1024), SetCycleTimeMs(1)) and
# stall_inspector.h (stall_warning_time_seconds = 60). A new pin means reading them again.
HOROVOD_VERSION = "0.28.1"
HOROVOD_DEFAULTS = {
    "horovod_fusion_threshold_mb": "Horovod's (128)",
    "horovod_cycle_time_ms": "Horovod's (1 ms)",
    "horovod_stall_check_seconds": "Horovod's (60)",
}


def table(text: str, header: str) -> dict[str, list[str]]:
    """The rows of the markdown table whose header row starts with `header`, by their first cell (without
    backticks); each row's other cells as written."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        first, *rest = (cell.strip() for cell in line.strip("|").split(" | "))
        rows[first.strip("`")] = rest
    return rows


def code(cell: str) -> str:
    """A cell that is one code span, without its backticks."""
    match = re.fullmatch(r"`([^`]+)`", cell)
    assert match, f"expected one `code` span, got {cell!r}"
    return match.group(1)


def test_the_mpirun_defaults_table_is_what_the_launcher_passes_and_when() -> None:
    rows = table(CONFIGURATION.read_text(), "| name | option | when | why |")
    base = MpiPlan(1, Path(), Path(), ())
    multi = replace(base, interface="IFACE", ssh_config=Path("SSHCONFIG"), hosts=("algo-1", "algo-2"))
    many = tuple(f"algo-{i}" for i in range(1, OMPI_RSH_CONCURRENT + 2))
    plans = {  # each condition of the table's "when" column, with the plan that meets it and the one before
        "always": (base, None),
        "ranks per host >= cores": (replace(base, yield_when_idle=True), base),
        "several hosts": (multi, base),
        f"more than {OMPI_RSH_CONCURRENT} hosts": (replace(multi, hosts=many), multi),
    }
    when = {}
    for condition, (plan, before) in plans.items():
        earlier = {name for name, _ in default_options(before)} if before else set()
        when |= {name: condition for name, _ in default_options(plan) if name not in earlier}
    every = replace(multi, yield_when_idle=True, hosts=many)
    shown = {
        name: shlex.join(argv)
        .replace("IFACE", "<interface>")
        .replace("SSHCONFIG", "<ssh config>")
        .replace(str(len(every.hosts)), "<hosts>")
        for name, argv in default_options(every)
    }
    assert list(rows) == list(shown)  # every default, in the order mpirun gets them
    for name, (option, condition, _why) in rows.items():
        assert code(option) == shown[name], name
        assert condition.startswith(when[name]), f"{name}: {condition!r}, the code: {when[name]!r}"


def test_horovods_defaults_are_those_of_the_pinned_horovod() -> None:
    pinned = (REPO / "requirements" / "horovod.txt").read_text()
    assert f"horovod=={HOROVOD_VERSION}\n" in pinned, "Horovod's pin changed: read its defaults again (above)"
    rows = table(CONFIGURATION.read_text(), "| hyperparameter | default | meaning |")
    assert {key: rows[key][0] for key in HOROVOD_DEFAULTS} == HOROVOD_DEFAULTS


def test_the_variables_table_gives_the_codes_defaults() -> None:
    rows = table(CONFIGURATION.read_text(), "| variable | default | meaning |")
    assert code(rows["SAGEMAKER_BASE_DIR"][0]) == str(DEFAULT_BASE_DIR)
    # The launcher's own (SMHVD_*) are the table after it, written from their declarations (env_options.py)
    # and checked by test_option_docs.py; what no declaration says, the default log level, is checked here.
    assert declarations(EnvOptions)[0].default_text.endswith(f"else {logging.INFO} (INFO)")


def test_every_smhvd_variable_the_launcher_uses_is_named_in_the_docs() -> None:
    used = {
        name
        for path in SOURCE.rglob("*.py")
        for name in re.findall(r"\bSMHVD_[A-Z][A-Z_]*[A-Z]\b", path.read_text())
    }
    docs = CONFIGURATION.read_text()
    assert used >= {"SMHVD_LOG_LEVEL", "SMHVD_SSH_PORT", "SMHVD_HOSTENV"}  # the search finds them
    assert sorted(name for name in used if f"`{name}`" not in docs) == []
