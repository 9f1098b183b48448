"""The launcher's own environment variables, each declared once as the hyperparameter options are
(option_spec.py). `train` reads them all at start (a bad value: 78 before anything else), a rank its own.
Low on purpose: the rank imports this.
"""
# ruff: noqa: RUF009 (option() is a dataclasses.field with the declaration in its metadata, not a default)

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from smhvd.errors import ConfigError
from smhvd.option_spec import ENVIRONMENT, Declared, declarations, integer, number, option, read_options

# logging's levels, written out: the rank reads these options too, and `logging` would cost it 8 modules.
LOG_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
LOG_LEVEL_EXPECTED = "DEBUG, INFO, WARNING, ERROR or CRITICAL (any case) or a number from 0 to 50"
DEFAULT_SSH_PORT = 22
FETCH_TIMEOUT = 60.0  # seconds a rank waits for its host's environment
MIN_FETCH_TIMEOUT = 0.1
MAX_FETCH_TIMEOUT = 86400.0


def log_level(text: str) -> int:
    """A logging level: a name in any case (WARN for WARNING) or a number from 0 to 50. Pure."""
    name = text.strip().upper()
    name = "WARNING" if name == "WARN" else name
    if name in LOG_LEVELS:
        return LOG_LEVELS[name]
    if re.fullmatch(r"[0-9]{1,2}", name) and int(name) <= LOG_LEVELS["CRITICAL"]:
        return int(name)
    raise ValueError(f"expected {LOG_LEVEL_EXPECTED}, got {text!r}")


def _log_level(value: object, key: str) -> int | None:
    """The reader of SMHVD_LOG_LEVEL: `log_level`, None when empty (then not set)."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return log_level(value)
    except ValueError:
        raise ConfigError(ENVIRONMENT, key, LOG_LEVEL_EXPECTED, value) from None


def _timeout(value: object, key: str) -> float | None:
    """The reader of SMHVD_HOSTENV_TIMEOUT: a number within its bounds; empty is refused, not read as unset
    (`SMHVD_HOSTENV_TIMEOUT=$UNSET` is a mistake: a rank would not wait as long as it was asked to)."""
    if value == "":
        raise ConfigError(ENVIRONMENT, key, _TIMEOUT_EXPECTED, value)
    found = _timeout_number(value, key)
    return None if found is None else float(found)


_TIMEOUT_EXPECTED = f"a number from {MIN_FETCH_TIMEOUT:g} to {MAX_FETCH_TIMEOUT:g}"
_timeout_number = number(MIN_FETCH_TIMEOUT, MAX_FETCH_TIMEOUT, ENVIRONMENT)


@dataclass(frozen=True)
class EnvOptions:
    log_level: int | None = option(
        "SMHVD_LOG_LEVEL",
        None,
        _log_level,
        "the launcher's log level: DEBUG, INFO, WARNING (or WARN), ERROR, CRITICAL in any case, or a number "
        "from 0 to 50; `0` logs every record (Python's NOTSET); anything else: exit 78 (`train --log-level` "
        "wins over it)",
        shown_default="`sagemaker_container_log_level`, else 20 (INFO)",
    )
    ssh_port: int = option(
        "SMHVD_SSH_PORT",
        DEFAULT_SSH_PORT,
        integer(1, 65535, ENVIRONMENT),
        "the port of the sshd each host starts for mpirun, and of the ssh that reaches it; the same on every "
        "host; not a port number 1-65535: exit 78",
    )
    hostenv_timeout: float = option(
        "SMHVD_HOSTENV_TIMEOUT",
        FETCH_TIMEOUT,
        _timeout,
        "seconds a rank waits for its host's environment from its `train` (below); anything but a number "
        f"from {MIN_FETCH_TIMEOUT:g} to {MAX_FETCH_TIMEOUT:g}: exit 78 at start",
    )


def read_env_options(env: Mapping[str, str]) -> EnvOptions:
    """The launcher's variables in `env`, each read and bounded (ConfigError naming the first bad one); an
    empty one is not set, as an empty hyperparameter is, but SMHVD_HOSTENV_TIMEOUT's (refused). Pure."""
    return read_options(EnvOptions, env)


def env_declarations() -> list[Declared]:
    """Every environment option, in the order of the docs table."""
    return declarations(EnvOptions)
