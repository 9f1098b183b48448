"""A rank that says it runs with a file, not a line of output (under a flood, or while the launcher's loop is
busy, when a line comes through is what a test measures, not how it knows the ranks started)."""

from __future__ import annotations

from pathlib import Path

# The first lines of a job script: `ready-<rank>` in the job's output data directory.
SAY_READY = """import os, pathlib
_ready = pathlib.Path(os.environ["SM_OUTPUT_DATA_DIR"]) / ("ready-" + os.environ["OMPI_COMM_WORLD_RANK"])
_ready.parent.mkdir(parents=True, exist_ok=True)
_ready.write_text("")
"""


def ranks_ready(output_data: Path, ranks: int) -> list[str] | None:
    """The ranks' ready files once all `ranks` wrote theirs (for wait_until), else None."""
    found = sorted(path.name for path in output_data.glob("ready-*"))
    return found if len(found) == ranks else None
