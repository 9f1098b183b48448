"""The one writer of a SageMaker /opt/ml tree, laid out as the platform and the Python SDK lay it out.

Used by the demos, the tests, the benchmarks, the simulated cluster (one tree per host) and
`bin/local-train.sh` (through `python -m smhvd_dev.mltree`, standard library only). The files' contents are
pure functions (`resource_config`, `input_data_config`, `sdk_encode`); `write_ml_tree` only writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from smhvd.config.paths import SageMakerPaths

GROUP_NAME = "homogeneousCluster"
DEFAULT_INSTANCE_TYPE = "ml.c5.xlarge"
CHANNEL_DEFAULTS: dict[str, str] = {
    "TrainingInputMode": "File",
    "S3DistributionType": "FullyReplicated",
    "RecordWrapperType": "None",
}


class TreeError(Exception):
    """A tree that cannot be written as asked; the message names the input."""


def sdk_encode(hyperparameters: Mapping[str, object]) -> dict[str, str]:
    """JSON-encode every value, as the SageMaker Python SDK does ("2", "true", "\\"text\\"")."""
    return {key: json.dumps(value) for key, value in hyperparameters.items()}


def resource_config(
    current_host: str,
    hosts: Sequence[str],
    instance_type: str = DEFAULT_INSTANCE_TYPE,
    interface: str = "eth0",
) -> dict[str, object]:
    """resourceconfig.json in SageMaker's current format. The instance group lists the hosts in reverse, as
    SageMaker lists them unsorted, so that nothing may rely on their order."""
    return {
        "current_host": current_host,
        "current_instance_type": instance_type,
        "current_group_name": GROUP_NAME,
        "hosts": list(hosts),
        "instance_groups": [
            {
                "instance_group_name": GROUP_NAME,
                "instance_type": instance_type,
                "hosts": list(reversed(hosts)),
            }
        ],
        "network_interface_name": interface,
    }


def input_data_config(
    channels: Iterable[str], given: Mapping[str, object] | None = None
) -> dict[str, object]:
    """inputdataconfig.json: the given entries, and a File-mode entry for every channel they do not name."""
    result = dict(given or {})
    for name in channels:
        result.setdefault(name, dict(CHANNEL_DEFAULTS))
    return result


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link channel files (data is read-only by convention, and large); copy across filesystems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_ml_tree(
    base: Path,
    *,
    current_host: str = "algo-1",
    hosts: Sequence[str] = ("algo-1",),
    hyperparameters: Mapping[str, object] | None = None,
    encoded_hyperparameters: Mapping[str, str] | None = None,
    channels: Mapping[str, Path | None] | None = None,
    input_config: Mapping[str, object] | None = None,
    code_dir: Path | None = None,
    copy_channels: bool = False,
    network_interface_name: str = "eth0",
    instance_type: str = DEFAULT_INSTANCE_TYPE,
) -> SageMakerPaths:
    """Create the config files and the directories SageMaker creates.

    `hyperparameters` are SDK-encoded here; `encoded_hyperparameters` are already JSON text and win. A
    channel whose source is None is an empty directory (to mount over); otherwise it is a symlink to the
    source, or with `copy_channels` a hard-linked copy (a simulated host sees only its own tree). `code_dir`
    is copied to code/.
    """
    paths = SageMakerPaths(base)
    for name, source in (channels or {}).items():
        if not name or "/" in name:
            raise TreeError(f"channel name: expected a plain name, got {name!r}")
        if source is not None and not source.is_dir():
            raise TreeError(f"channel {name}: {source} is not a directory")
    if code_dir is not None and not code_dir.is_dir():
        raise TreeError(f"code directory {code_dir} is not a directory")
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    files = {
        paths.resource_config: resource_config(current_host, hosts, instance_type, network_interface_name),
        paths.hyperparameters: {**sdk_encode(hyperparameters or {}), **(encoded_hyperparameters or {})},
        paths.input_data_config: input_data_config(channels or {}, input_config),
    }
    for path, content in files.items():
        path.write_text(json.dumps(content, indent=1) + "\n")
    for name, source in (channels or {}).items():
        target = paths.channel_dir(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source is None:
            target.mkdir(exist_ok=True)
        elif copy_channels:
            shutil.copytree(source, target, copy_function=_link_or_copy, dirs_exist_ok=True)
        elif not target.exists():
            target.symlink_to(source.resolve(), target_is_directory=True)
    if code_dir is not None:
        shutil.copytree(code_dir, paths.base / "code", dirs_exist_ok=True)
    for directory in (paths.model_dir, paths.output_data_dir, paths.checkpoint_dir, paths.base / "code"):
        directory.mkdir(parents=True, exist_ok=True)
    return paths


def sdk_defaults(job_name: str) -> dict[str, object]:
    """The reserved hyperparameters an SDK estimator with `distribution={"mpi": {"enabled": True}}` adds."""
    return {
        "sagemaker_mpi_enabled": True,
        "sagemaker_mpi_custom_mpi_options": "",
        "sagemaker_container_log_level": 20,
        "sagemaker_job_name": job_name,
    }


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _read_hyperparameters(path: Path) -> dict[str, object]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TreeError(f"--hyperparameters {path}: not valid JSON ({exc})") from exc
    if not isinstance(loaded, dict):
        raise TreeError(f"--hyperparameters {path}: expected a JSON object, got {type(loaded).__name__}")
    return loaded


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m smhvd_dev.mltree ROOT ...`: the tree of one host for `bin/local-train.sh` (channels and code
    are empty directories that the container engine mounts over)."""
    parser = argparse.ArgumentParser(prog="python -m smhvd_dev.mltree", description=main.__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument(
        "--hyperparameters", type=Path, help="a JSON object of the estimator's hyperparameters"
    )
    parser.add_argument("--channel", action="append", default=[], help="a channel name; repeatable")
    parser.add_argument("--hp", action="append", default=[], type=_key_value, help="KEY=text; repeatable")
    parser.add_argument(
        "--hp-json", action="append", default=[], type=_key_value, help="KEY=JSON; repeatable"
    )
    parser.add_argument("--instance-type", default="local")
    parser.add_argument("--current-host", default="algo-1", help="this tree's host (default algo-1)")
    parser.add_argument(
        "--hosts", default=None, help="every host of the job, comma-separated (default: the current host)"
    )
    parser.add_argument("--job-name", default=None, help="sagemaker_job_name (default: ROOT's name)")
    args = parser.parse_args(argv)
    hosts = tuple(args.hosts.split(",")) if args.hosts else (args.current_host,)
    if args.current_host not in hosts:
        print(
            f"mltree: --current-host {args.current_host}: not one of --hosts {','.join(hosts)}",
            file=sys.stderr,
        )
        return 2
    try:
        hps = sdk_defaults(args.job_name or args.root.name)
        if args.hyperparameters is not None:
            hps |= _read_hyperparameters(args.hyperparameters)
        hps |= dict(args.hp)
        for key, text in args.hp_json:
            try:
                hps[key] = json.loads(text)
            except ValueError as exc:
                raise TreeError(f"--hp-json {key}: not valid JSON ({exc})") from exc
        write_ml_tree(
            args.root,
            current_host=args.current_host,
            hosts=hosts,
            hyperparameters=hps,
            channels=dict.fromkeys(args.channel),
            instance_type=args.instance_type,
        )
    except TreeError as exc:
        print(f"mltree: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
