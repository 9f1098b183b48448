"""Hyperparameters: decode the SDK's JSON-encoded values, split launcher keys from script arguments.

The SageMaker Python SDK JSON-encodes every value ("2", "true", "\\"text\\""). A value that is not valid JSON
is kept as the raw string, as the sagemaker-training toolkit does, so hand-written files work too.
Script arguments follow the toolkit's format so that scripts written for it run unchanged:
sorted keys, `--key value` (`-k value` for one-letter keys), dicts as `k=v,k=v`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

# Keys with these prefixes configure the launcher; they never reach the script's command line.
RESERVED_PREFIXES = ("sagemaker_", "horovod_", "launcher_")


def decode_value(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def decode_hyperparameters(raw: Mapping[str, object]) -> dict[str, object]:
    return {key: decode_value(value) for key, value in raw.items()}


def is_reserved(key: str) -> bool:
    return key.startswith(RESERVED_PREFIXES)


def split_hyperparameters(
    decoded: Mapping[str, object],
) -> tuple[dict[str, object], dict[str, object]]:
    """(launcher keys, user keys)."""
    reserved = {k: v for k, v in decoded.items() if is_reserved(k)}
    user = {k: v for k, v in decoded.items() if not is_reserved(k)}
    return reserved, user


def format_value(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return str(value)


def to_script_args(user: Mapping[str, object]) -> list[str]:
    args: list[str] = []
    for key in sorted(user):
        args += [f"--{key}" if len(key) > 1 else f"-{key}", format_value(user[key])]
    return args


def to_env_value(value: object) -> str:
    """SM_HP_<NAME> values: strings as they are, everything else as compact JSON (the toolkit's format)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
