"""Execute one notebook of this directory in a Jupyter kernel of the running Python (the SDK's venv), as
papermill does: the values of --parameters (a JSON object) are assigned in a cell inserted right after the
cell tagged `parameters`. Each cell's printed output is shown as the cell ends; the executed notebook, outputs
included, is written to --out. Exit 1 when a cell fails (its error shown).

    build/sdk/v2/bin/python examples/notebooks/run_notebook.py examples/notebooks/mnist_sdk_v2.ipynb \\
        --out build/notebooks/mnist_sdk_v2.ipynb

bin/run-notebooks.sh (`make notebooks`) makes the venvs, the image and PATH this needs, and runs both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

CELL_TIMEOUT = 1800  # seconds: a local-mode training cell on a busy 2-core machine


def with_parameters(book: Any, parameters: dict[str, object], source: Path) -> None:
    """Insert the assignments after the `parameters` cell (exactly one: the notebooks' own test says so)."""
    tagged = [i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", [])]
    if len(tagged) != 1:
        raise SystemExit(f"{source}: expected one cell tagged 'parameters', found {len(tagged)}")
    lines = ["# Parameters (run_notebook.py --parameters)"]
    lines += [f"{name} = {value!r}" for name, value in parameters.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines), metadata={"tags": ["injected-parameters"]})
    book.cells.insert(tagged[0] + 1, cell)


def show(cell: Any, **_: object) -> None:
    """Print what a cell printed, as it ends (nbclient's on_cell_executed hook)."""
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            stream = sys.stdout if output.name == "stdout" else sys.stderr
            stream.write(output.text)
        elif output.output_type == "execute_result" and "text/plain" in output.data:
            print(output.data["text/plain"])
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the executed notebook (outputs included)")
    parser.add_argument(
        "--parameters", type=Path, help="a JSON object: NAME -> value, set after `parameters`"
    )
    args = parser.parse_args(argv)
    book = nbformat.read(args.notebook, as_version=4)
    if args.parameters:
        parameters = json.loads(args.parameters.read_text())
        if not isinstance(parameters, dict):
            raise SystemExit(f"--parameters {args.parameters}: expected a JSON object of NAME: value")
        with_parameters(book, parameters, args.notebook)
    client = NotebookClient(
        book,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",  # this interpreter's own kernel (ipykernel in the same venv)
        resources={"metadata": {"path": str(args.notebook.resolve().parent)}},  # ../mnist resolves
        on_cell_executed=show,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        client.execute()
    except CellExecutionError as error:
        print(f"{args.notebook.name}: a cell failed:\n{error}", file=sys.stderr)
        return 1
    finally:
        nbformat.write(book, args.out)
    print(f"{args.notebook.name}: every cell ran; executed notebook: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
