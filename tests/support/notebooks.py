"""The project's notebooks as programs: their code cells in order, parameters assigned as papermill would."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "examples" / "notebooks"


def notebook_program(path: Path, parameters: dict[str, object]) -> str:
    """The notebook's code cells as one program, `parameters` assigned right after its `parameters` cell."""
    cells = json.loads(path.read_text())["cells"]
    parts = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        parts.append("".join(cell["source"]))
        if "parameters" in cell["metadata"].get("tags", []):
            parts.append("\n".join(f"{name} = {value!r}" for name, value in parameters.items()))
    return "\n\n".join(parts) + "\n"
