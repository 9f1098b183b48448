"""How an option is declared: once, as a field of its frozen options dataclass, and how its value is read.

`timeline: bool = option("horovod_timeline", False, flag, "Horovod timeline ...", sets=(...))`: its key,
type, default, reader and bounds, the variables it sets on every rank, and its docs line. `read_options`
builds the dataclass, `option_env` gives the variables, `declarations` lists them for the docs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from smhvd.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

SOURCE = "hyperparameters.json"
ENVIRONMENT = "environment"  # the source the errors about an environment variable name
T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")
# A reader: the value as the decoded hyperparameters (or the environment) hold it, and its key (for errors) ->
# the typed value, or None for "not set" (the field's default then applies). Bad input is one ConfigError
# naming the source, the key and what was expected.
Reader = Callable[[object, str], Any]
_METADATA_KEY = "smhvd.option"


@dataclass(frozen=True)
class Variable:
    """A variable an option sets on every rank: its name, and its value for the option's value and the
    job's output data directory (None: not set for this value)."""

    name: str
    value: Callable[[Any, Path], str | None]


@dataclass(frozen=True)
class Option:
    key: str  # the hyperparameter (or the environment variable)
    read: Reader
    doc: str  # one line: docs/configuration.md's table
    shown_default: str | None = None  # the docs' default column when the default value does not say it
    sets: tuple[Variable, ...] = ()
    readme: str | None = None  # a shorter line for README.md's table of the options set most

    def value(self, reserved: Mapping[str, object], default: object) -> object:
        if self.key not in reserved:
            return default
        value = self.read(reserved[self.key], self.key)
        return default if value is None else value


@dataclass(frozen=True)
class Declared:
    option: Option
    field: str
    default: object

    @property
    def default_text(self) -> str:
        """The default as the docs tables show it."""
        if self.option.shown_default is not None:
            return self.option.shown_default
        if isinstance(self.default, bool):
            return f"`{str(self.default).lower()}`"
        if isinstance(self.default, int | float):
            return f"{self.default:g}"
        return ""


def option(
    key: str,
    default: T,
    read: Reader,
    doc: str,
    *,
    shown_default: str | None = None,
    sets: tuple[Variable, ...] = (),
    readme: str | None = None,
) -> T:
    declared = Option(key, read, doc, shown_default, sets, readme)
    return dataclasses.field(default=default, metadata={_METADATA_KEY: declared})


def declarations(cls: type[DataclassInstance]) -> list[Declared]:
    """The declared options of an options dataclass, in field order."""
    return [
        Declared(f.metadata[_METADATA_KEY], f.name, f.default)
        for f in dataclasses.fields(cls)
        if _METADATA_KEY in f.metadata
    ]


def key_of(cls: type[DataclassInstance], field: str) -> str:
    """The key declared for `field` of an options dataclass, for code and errors that name an option: the
    declaration is the one place a key is written (KeyError for a field that declares none)."""
    for d in declarations(cls):
        if d.field == field:
            return d.option.key
    raise KeyError(f"{cls.__name__}.{field} declares no option")


def read_options(cls: type[D], reserved: Mapping[str, object]) -> D:
    """The options dataclass from the decoded reserved hyperparameters (or the environment), each value read
    and bounded."""
    values: dict[str, Any] = {d.field: d.option.value(reserved, d.default) for d in declarations(cls)}
    return cls(**values)


def option_env(options: DataclassInstance, output_data_dir: Path) -> dict[str, str]:
    """The variables the options' values set on every rank."""
    env: dict[str, str] = {}
    for d in declarations(type(options)):
        for variable in d.option.sets:
            value = variable.value(getattr(options, d.field), output_data_dir)
            if value is not None:
                env[variable.name] = value
    return env


# Readers. Each takes the decoded value and the key; None and "" mean "not set" where that is the rule.


def flag(value: object, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(SOURCE, key, "true or false", value)


def _number(
    value: object, key: str, *, minimum: float, maximum: float, integer: bool, source: str
) -> float | None:
    """A finite number within [minimum, maximum]; None when the value is null or empty."""
    if value is None or value == "":
        return None
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(source, key, f"{kind} >= {minimum:g}", value)
    try:
        number = float(value)  # "Infinity", "1e400" and 5000-digit strings give inf: refused below
    except (ValueError, OverflowError):
        raise ConfigError(source, key, f"{kind} >= {minimum:g}", value) from None
    if number > maximum:
        raise ConfigError(source, key, f"{kind} <= {maximum:.12g}", value)
    if not math.isfinite(number) or number < minimum or (integer and not number.is_integer()):
        raise ConfigError(source, key, f"{kind} >= {minimum:g}", value)
    return number


def number(minimum: float, maximum: float, source: str = SOURCE) -> Reader:
    """A finite number within [minimum, maximum]."""

    def read(value: object, key: str) -> float | None:
        return _number(value, key, minimum=minimum, maximum=maximum, integer=False, source=source)

    return read


def integer(minimum: int, maximum: int, source: str = SOURCE) -> Reader:
    """An integer within [minimum, maximum] (2.0 and "2" are 2; 1.5 is refused)."""

    def read(value: object, key: str) -> int | None:
        found = _number(value, key, minimum=minimum, maximum=maximum, integer=True, source=source)
        return None if found is None else int(found)

    return read


def text(value: object, key: str, source: str = SOURCE, *, empty_is_none: bool = False) -> str | None:
    """A string, None when null. An empty string is refused, or (empty_is_none: SDK v3's files write "" for a
    field not set) taken as None."""
    if value is None or (empty_is_none and value == ""):
        return None
    if not isinstance(value, str) or not value:
        expected = "a string or null" if empty_is_none else "a non-empty string"
        raise ConfigError(source, key, expected, value)
    return value


def string(value: object, key: str) -> str | None:
    """A non-empty string."""
    return text(value, key)


def choice(*choices: str) -> Reader:
    """One of `choices`, in any case (read in lower case)."""

    def read(value: object, key: str) -> str | None:
        found = string(value, key)
        if found is not None and found.lower() not in choices:
            raise ConfigError(SOURCE, key, " | ".join(choices), found)
        return None if found is None else found.lower()

    return read


def names(value: object, key: str) -> tuple[str, ...]:
    """A list of names, or one string of names separated by commas or spaces."""
    if value is None or value == "":
        return ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if isinstance(value, str):
        return tuple(v for v in value.replace(",", " ").split() if v)
    raise ConfigError(SOURCE, key, "a comma-separated list of names", value)


def names_of(known: frozenset[str], what: str) -> Reader:
    """Names (as `names` reads them), each one of `known` (a typo must not pass silently)."""

    def read(value: object, key: str) -> frozenset[str]:
        found = names(value, key)
        for name in found:
            if name not in known:
                raise ConfigError(SOURCE, key, f"names of {what} ({', '.join(sorted(known))})", name)
        return frozenset(found)

    return read


# What an option sets on the ranks, by its value.


def when_on(text: str = "1") -> Callable[[Any, Path], str | None]:
    return lambda value, _: text if value else None


def output_file(name: str) -> Callable[[Any, Path], str | None]:
    """A file of this name in the job's output data directory (uploaded to S3 with the job's output)."""
    return lambda value, output_data_dir: str(output_data_dir / name) if value else None


def when_given(show: Callable[[Any], str]) -> Callable[[Any, Path], str | None]:
    return lambda value, _: None if value is None else show(value)
