"""The SageMaker filesystem layout under one root (default /opt/ml, env SAGEMAKER_BASE_DIR)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BASE_DIR = Path("/opt/ml")


@dataclass(frozen=True)
class SageMakerPaths:
    base: Path

    @classmethod
    def from_env(cls) -> SageMakerPaths:
        return cls(Path(os.environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR))

    @property
    def input_dir(self) -> Path:
        return self.base / "input"

    @property
    def config_dir(self) -> Path:
        return self.base / "input" / "config"

    @property
    def resource_config(self) -> Path:
        return self.config_dir / "resourceconfig.json"

    @property
    def hyperparameters(self) -> Path:
        return self.config_dir / "hyperparameters.json"

    @property
    def input_data_config(self) -> Path:
        return self.config_dir / "inputdataconfig.json"

    @property
    def data_dir(self) -> Path:
        return self.base / "input" / "data"

    def channel_dir(self, channel: str) -> Path:
        return self.data_dir / channel

    @property
    def code_dir(self) -> Path:
        return self.base / "code"

    @property
    def model_dir(self) -> Path:
        return self.base / "model"

    @property
    def output_dir(self) -> Path:
        return self.base / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.base / "output" / "data"

    @property
    def failure_file(self) -> Path:
        return self.base / "output" / "failure"

    @property
    def checkpoint_dir(self) -> Path:
        return self.base / "checkpoints"
