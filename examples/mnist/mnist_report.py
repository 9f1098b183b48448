"""What rank 0 prints and writes: the per-epoch metric line, the CSV and PNG training curves, metrics.json.

The metric line is one `key=value` per field, so SageMaker `metric_definitions` regexes stay simple, e.g.
`{"Name": "validation:accuracy", "Regex": "val_accuracy=([0-9.]+)"}`.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Column order of the CSV and of the metric line; "epoch" counts from 1.
EPOCH_FIELDS = (
    "epoch",
    "train_loss",
    "train_accuracy",
    "val_loss",
    "val_accuracy",
    "images_per_sec",
    "epoch_seconds",
    "learning_rate",
    "rank_cpu_cores",
)

METRIC_DEFINITIONS = (
    {"Name": "train:loss", "Regex": r"train_loss=([0-9.eE+-]+)"},
    {"Name": "train:accuracy", "Regex": r"train_accuracy=([0-9.]+)"},
    {"Name": "validation:loss", "Regex": r"val_loss=([0-9.eE+-]+)"},
    {"Name": "validation:accuracy", "Regex": r"val_accuracy=([0-9.]+)"},
    {"Name": "train:images_per_sec", "Regex": r"images_per_sec=([0-9.]+)"},
    {"Name": "train:rank_cpu_cores", "Regex": r"rank_cpu_cores=([0-9.]+)"},
    {"Name": "test:accuracy", "Regex": r"test_accuracy=([0-9.]+)"},
    {"Name": "test:loss", "Regex": r"test_loss=([0-9.eE+-]+)"},
)


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) >= 1e-4 or value == 0.0 else f"{value:.4e}"
    return str(value)


def epoch_line(row: Mapping[str, Any]) -> str:
    """`epoch=2 train_loss=0.0612 train_accuracy=0.981 ...`: fields in EPOCH_FIELDS order."""
    return " ".join(f"{key}={_format(row[key])}" for key in EPOCH_FIELDS if key in row)


def final_line(test_accuracy: float, test_loss: float) -> str:
    return f"test_accuracy={test_accuracy:.4f} test_loss={test_loss:.4f}"


def write_atomically(path: Path, text: str) -> None:
    """Readers (the demo, SageMaker's upload) never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w") as stream:
            stream.write(text)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_metrics_json(path: Path, metrics: Mapping[str, Any]) -> None:
    write_atomically(path, json.dumps(dict(metrics), indent=1, sort_keys=True) + "\n")


def write_history_csv(path: Path, history: Sequence[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=EPOCH_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in history:
            writer.writerow({key: row.get(key, "") for key in EPOCH_FIELDS})
    temporary.replace(path)


def plot_history(path: Path, history: Sequence[Mapping[str, Any]], title: str) -> None:
    """Loss and accuracy per epoch, train against validation (matplotlib's Agg backend: no display)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    epochs = [row["epoch"] for row in history]
    figure, (loss_axes, accuracy_axes) = pyplot.subplots(1, 2, figsize=(10, 4))
    for axes, metric in ((loss_axes, "loss"), (accuracy_axes, "accuracy")):
        axes.plot(epochs, [row[f"train_{metric}"] for row in history], marker="o", label="train")
        axes.plot(epochs, [row[f"val_{metric}"] for row in history], marker="o", label="validation")
        axes.set_xlabel("epoch")
        axes.set_ylabel(metric)
        axes.grid(visible=True, alpha=0.3)
        axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(temporary, dpi=100)
    pyplot.close(figure)
    temporary.replace(path)
