"""Hyperparameters: decode the SDK's JSON-encoded values ("2", "true", "\\"text\\""; a value that is not JSON
is kept as the raw string, as the toolkit does), split launcher keys from script arguments, which follow the
toolkit's format but for lists (docs/configuration.md).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Collection, Iterable, Mapping

from smhvd.config.sagemaker_files import shown_key
from smhvd.errors import ConfigError

SOURCE = "hyperparameters.json"
# Keys with these prefixes configure the launcher; they never reach the script's command line.
SAGEMAKER_PREFIX = "sagemaker_"
RESERVED_PREFIXES = (SAGEMAKER_PREFIX, "horovod_", "launcher_")
# All hyperparameters travel together in single variables (SM_HPS, SM_TRAINING_ENV), which Linux limits to
# 128 KiB (MAX_ARG_STRLEN): half of that leaves room for the rest of SM_TRAINING_ENV.
MAX_TOTAL_BYTES = 64 * 1024
MAX_DEPTH = 100  # nesting of a decoded value (lists, objects)
# `sagemaker_` keys that the SageMaker Python SDK v2 sends (its framework estimators'
# distribution=, the tuner) and the sagemaker-training toolkit (4.9.0: sagemaker_training/params.py,
# environment.py) reads, which concern other containers: they pass without a word. The `sagemaker_` keys the
# launcher reads are not here: they are its option declarations (config/launcher_options.py). Any other
# `sagemaker_` key is a warning (key_warnings).
SDK_SENT_KEYS = frozenset(
    {
        "sagemaker_distributed_dataparallel_custom_mpi_options",
        "sagemaker_distributed_dataparallel_enabled",
        "sagemaker_enable_cloudwatch_metrics",
        "sagemaker_estimator_class_name",
        "sagemaker_estimator_module",
        "sagemaker_instance_type",
        "sagemaker_multi_worker_mirrored_strategy_enabled",
        "sagemaker_network_interface_name",
        "sagemaker_parameter_server_enabled",
        "sagemaker_pytorch_ddp_enabled",
        "sagemaker_pytorch_xla_multi_worker_enabled",
        "sagemaker_s3_output",
        "sagemaker_torch_distributed_enabled",
    }
)


def decode_value(value: object, key: str = "") -> object:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except RecursionError:
        raise ConfigError(SOURCE, shown_key(key), f"a value nested at most {MAX_DEPTH} deep") from None
    except ValueError:
        return value


def decode_hyperparameters(raw: Mapping[str, object]) -> dict[str, object]:
    """Decoded values; every key and value checked to be something a command line and an environment carry."""
    decoded = {key: decode_value(value, key) for key, value in raw.items()}
    for key, value in decoded.items():
        check_value(key, value)
    check_size(decoded)
    return decoded


def carriable(text: str) -> bool:
    """No NUL (it ends a C string: exec fails) and valid Unicode (a lone surrogate cannot be encoded)."""
    if "\0" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_value(key: str, value: object) -> None:
    """Refuse what no process can receive as an argument or variable: one ConfigError naming the key."""
    expected = "text without NUL characters or lone surrogates (it becomes an argument and a variable)"
    if not carriable(key):
        raise ConfigError(SOURCE, shown_key(key), f"a name of {expected}")
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:  # iterative: a value may be nested almost to the recursion limit
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(SOURCE, shown_key(key), f"a value nested at most {MAX_DEPTH} deep")
        if isinstance(item, str) and not carriable(item):
            raise ConfigError(SOURCE, shown_key(key), expected, item)
        if isinstance(item, Mapping):
            stack += [(k, depth + 1) for k in item] + [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, depth + 1) for v in item]


def check_size(decoded: Mapping[str, object]) -> None:
    """All hyperparameters together fit in one environment variable; the error names the largest."""
    sizes = {key: len(json.dumps({key: value})) for key, value in decoded.items()}
    total = sum(sizes.values())
    if total > MAX_TOTAL_BYTES:
        largest = max(sizes, key=lambda k: sizes[k])
        raise ConfigError(
            SOURCE,
            shown_key(largest),
            f"hyperparameters of at most {MAX_TOTAL_BYTES} bytes in all (each rank gets them in one "
            "environment variable, which Linux limits to 128 KiB; SageMaker allows 2500 characters a value), "
            f"got {total} bytes, {sizes[largest]} of them this one",
        )


def is_reserved(key: str) -> bool:
    return key.startswith(RESERVED_PREFIXES)


def closest_key(key: str, known: Iterable[str]) -> str:
    """The known key most like `key` (difflib's ratio; the first in sorted order on a tie). Pure."""
    return max(sorted(known), key=lambda k: difflib.SequenceMatcher(None, key, k).ratio())


def key_warnings(keys: Iterable[str], read: Collection[str]) -> list[str]:
    """One line for each `sagemaker_` key that the launcher does not read (`read`: its declared keys) and the
    SDKs are not known to send (SDK_SENT_KEYS), naming the closest known key: a typo such as
    sagemaker_prefligh would otherwise leave its option at its default without a word. Pure."""
    known = set(read) | SDK_SENT_KEYS
    return [
        f"{SOURCE}: {shown_key(key)}: not a key the launcher reads or the SageMaker SDKs send, ignored "
        f"(the closest known key: {closest_key(key, known)})"
        for key in sorted(keys)
        if key.startswith(SAGEMAKER_PREFIX) and key not in known
    ]


def split_hyperparameters(decoded: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object]]:
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


def list_item(item: object, scalar: Callable[[object], str]) -> str:
    """One argument of a list value: scalars as `scalar` formats them, a nested list or object as JSON."""
    if isinstance(item, list | Mapping):
        return json.dumps(item, sort_keys=True, separators=(",", ":"))
    return scalar(item)


def option_args(flag: str, value: object, scalar: Callable[[object], str]) -> list[str]:
    """`flag value`, or `flag item item ...` for a list (an empty list leaves the flag alone)."""
    if isinstance(value, list):
        return [flag, *(list_item(item, scalar) for item in value)]
    return [flag, scalar(value)]


def to_script_args(user: Mapping[str, object]) -> list[str]:
    args: list[str] = []
    for key in sorted(user):
        args += option_args(f"--{key}" if len(key) > 1 else f"-{key}", user[key], format_value)
    return args


def to_env_value(value: object) -> str:
    """SM_HP_<NAME> values: strings as they are, everything else as compact JSON (the toolkit's format)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
