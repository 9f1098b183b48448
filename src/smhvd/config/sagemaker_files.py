"""Parse SageMaker's /opt/ml/input/config/*.json into validated, typed, frozen values (pure, but `read_json`);
every error names the file, the key and what was expected."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from smhvd.errors import ConfigError
from smhvd.option_spec import text

# A host name goes into ssh and mpirun argv: letters, digits, dot, dash, underscore; never a leading dash.
# Always matched with fullmatch: `$` would also match before a final newline ("algo-1\n").
_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_CHANNEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Linux: one name in a path at most NAME_MAX bytes, a whole path at most PATH_MAX (ENAMETOOLONG otherwise).
NAME_MAX = 255
PATH_MAX = 4096


@dataclass(frozen=True)
class InstanceGroup:
    name: str
    instance_type: str
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class ResourceConfig:
    current_host: str
    hosts: tuple[str, ...]  # sorted (the job's leader is Job.leader: the first of the MPI hosts)
    network_interface_name: str | None
    current_instance_type: str | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()


@dataclass(frozen=True)
class Channel:
    name: str
    content_type: str | None
    input_mode: str
    distribution: str | None
    raw: Mapping[str, object]


def read_json(path: Path, *, required: bool) -> object:
    """Load one JSON file; a missing optional file reads as an empty object."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if required:
            raise ConfigError(path, None, "the file to exist (written by SageMaker)") from None
        return {}
    except OSError as exc:
        raise ConfigError(path, None, "a readable file", exc.strerror) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, f"UTF-8 text (invalid byte at offset {exc.start})") from None
    return parse_json(text, path)


def parse_json(text: str, source: Path | str) -> object:
    """json.loads, with every way it can fail (syntax, nesting beyond the recursion limit, an integer of
    more digits than Python converts) as one ConfigError naming the source."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            source, None, f"valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise ConfigError(
            source, None, "JSON nested less deeply (it exceeds Python's recursion limit)"
        ) from None
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise ConfigError(source, None, f"valid JSON ({exc})") from None


def shown_key(key: str) -> str:
    """A key as an error message shows it: as it is, or quoted with escapes when it holds a newline, a control
    character or a lone surrogate (which could not even be written to the failure file)."""
    return key if key.isprintable() else ascii(key)


def path_problem(value: str, *, relative: bool) -> str | None:
    """Why `value` cannot name a file (None when it can): a NUL or a lone surrogate (no system call takes
    it), a name longer than NAME_MAX bytes or a path longer than PATH_MAX, or (relative=True) a path that is
    absolute or climbs out with '..'. Pure."""
    if "\0" in value:
        return "no NUL character"
    try:
        encoded = value.encode()
    except UnicodeEncodeError:
        return "valid Unicode (no lone surrogate)"
    if len(encoded) > PATH_MAX:
        return f"at most {PATH_MAX} bytes, not {len(encoded)}"
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > NAME_MAX:
        return f"names of at most {NAME_MAX} bytes between slashes, not {longest}"
    path = PurePosixPath(value)
    if relative and (path.is_absolute() or ".." in path.parts):
        return "not absolute, no '..'"
    return None


def check_path(value: str, source: str, key: str, what: str, *, relative: bool = True) -> str:
    """`value` when it can name a file (path_problem), else one ConfigError naming the file and key."""
    problem = path_problem(value, relative=relative)
    if problem is not None:
        raise ConfigError(source, key, f"{what} ({problem})", value)
    return value


def _object(data: object, source: str) -> Mapping[str, object]:
    if not isinstance(data, dict):
        raise ConfigError(source, None, "a JSON object", type(data).__name__)
    return data


def _host(value: object, source: str, key: str) -> str:
    if not isinstance(value, str) or not _HOST_RE.fullmatch(value):
        raise ConfigError(source, key, "a host name (letters, digits, '.', '-', '_')", value)
    return value


def _host_list(value: object, source: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(source, key, "a non-empty list of host names", value)
    hosts = tuple(_host(h, source, f"{key}[{i}]") for i, h in enumerate(value))
    if len(set(hosts)) != len(hosts):
        raise ConfigError(source, key, "distinct host names", value)
    return hosts


def optional_str(
    data: Mapping[str, object], key: str, source: str, *, empty_is_none: bool = False
) -> str | None:
    """The string at `key`, None when absent or null (option_spec.text says the rest)."""
    return text(data.get(key), key, source, empty_is_none=empty_is_none)


def parse_resource_config(data: object, source: str = "resourceconfig.json") -> ResourceConfig:
    obj = _object(data, source)
    if "current_host" not in obj:
        raise ConfigError(source, "current_host", "the name of this host")
    if "hosts" not in obj:
        raise ConfigError(source, "hosts", "the list of all hosts of the job")
    current = _host(obj["current_host"], source, "current_host")
    hosts = _host_list(obj["hosts"], source, "hosts")
    if current not in hosts:
        raise ConfigError(source, "current_host", f"one of hosts {list(hosts)}", current)
    groups = _instance_groups(obj.get("instance_groups"), hosts, source)
    group_name = obj.get("current_group_name")
    if groups and group_name is not None:
        mine = [g.name for g in groups if current in g.hosts]
        if group_name not in mine:
            raise ConfigError(
                source, "current_group_name", f"the group of current_host ({mine or 'none'})", group_name
            )
    return ResourceConfig(
        current_host=current,
        hosts=tuple(sorted(hosts)),
        network_interface_name=optional_str(obj, "network_interface_name", source),
        current_instance_type=optional_str(obj, "current_instance_type", source),
        instance_groups=groups,
    )


def _instance_groups(value: object, hosts: tuple[str, ...], source: str) -> tuple[InstanceGroup, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(source, "instance_groups", "a list of instance groups", value)
    groups: list[InstanceGroup] = []
    for i, item in enumerate(value):
        key = f"instance_groups[{i}]"
        group = _object(item, f"{source}: {key}")
        name = optional_str(group, "instance_group_name", f"{source}: {key}") or ""
        itype = optional_str(group, "instance_type", f"{source}: {key}") or ""
        members = _host_list(group.get("hosts"), source, f"{key}.hosts")
        stray = [h for h in members if h not in hosts]
        if stray:
            raise ConfigError(source, f"{key}.hosts", f"hosts listed in 'hosts' {list(hosts)}", stray)
        if any(g.name == name for g in groups):
            raise ConfigError(source, f"{key}.instance_group_name", "a name no other group has", name)
        shared = [h for g in groups for h in members if h in g.hosts]
        if shared:
            raise ConfigError(
                source, f"{key}.hosts", "hosts of no other group (a host is in one group)", shared
            )
        groups.append(InstanceGroup(name=name, instance_type=itype, hosts=members))
    return tuple(groups)


def parse_input_data_config(data: object, source: str = "inputdataconfig.json") -> tuple[Channel, ...]:
    obj = _object(data, source)
    channels = []
    for name in sorted(obj):
        if not _CHANNEL_RE.fullmatch(name):
            raise ConfigError(source, shown_key(name), "a channel name (letters, digits, '_', '.', '-')")
        spec = _object(obj[name], f"{source}: {name}")
        mode = spec.get("TrainingInputMode", "File")
        if mode not in ("File", "Pipe", "FastFile"):
            raise ConfigError(source, f"{name}.TrainingInputMode", "File, Pipe or FastFile", mode)
        channels.append(
            Channel(
                name=name,
                content_type=optional_str(spec, "ContentType", source),
                input_mode=str(mode),
                distribution=optional_str(spec, "S3DistributionType", source),
                raw=dict(spec),
            )
        )
    return tuple(channels)


def parse_hyperparameters_file(data: object, source: str = "hyperparameters.json") -> dict[str, object]:
    """The raw map; values are decoded in hyperparameters.py."""
    obj = _object(data, source)
    for key in obj:
        if not key:
            raise ConfigError(source, "''", "non-empty hyperparameter names")
    return dict(obj)
