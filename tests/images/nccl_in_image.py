"""Run inside the GPU image by test_gpu_image.py (mounted, not collected): what NCCL and its network plugin do
there without a GPU or an EFA device. Prints one JSON object:

- nccl_version: ncclGetVersion of the venv's NCCL;
- exports: which plugin entry points (net, collective net, tuner; by version) the plugin library defines;
- nccl_loads: NCCL itself, in a fresh process, asked for a unique id (ncclGetUniqueId loads the network
  plugin, no GPU needed) with NCCL_DEBUG=INFO and the loader's log (LD_DEBUG=files): the libraries it
  initialised and NCCL's own lines;
- plugin_init: the plugin's own initialisation, called through its ncclNetPlugin_v8 table as NCCL 2.21 calls
  it, with a logger that keeps what the plugin says, and the code it returns;
- nccl_net: the launcher's reading of the network (smhvd.preflight.nccl_net) on this host.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from smhvd.mpi import efa
from smhvd.preflight import nccl_net
from smhvd.preflight.facts import distribution_versions, efa_devices

NCCL = str(Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
UNIQUE_ID = f"""
import ctypes
nccl = ctypes.CDLL({NCCL!r})
print("ncclGetUniqueId returned", nccl.ncclGetUniqueId(ctypes.create_string_buffer(128)), flush=True)
"""

# NCCL's logger is printf-like (ncclDebugLogger_t: level, flags, file, line, format, ...). A callback cannot
# be variadic: it takes the first arguments as machine words (integers and pointers arrive in the same
# registers and stack slots either way) and formats them here.
ARGS = 8
HEAD = (ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p)
Logger = ctypes.CFUNCTYPE(None, *HEAD, *[ctypes.c_void_p] * ARGS)
SPEC = re.compile(rb"%[-+ #0]*\d*(?:\.\d+)?(hh|h|ll|l|z|j|t)?([diouxXscp%])")


def render(fmt: bytes, args: tuple[int | None, ...]) -> str:
    words = list(args)

    def one(match: re.Match[bytes]) -> bytes:
        if match.group(2) == b"%":
            return b"%"
        word = (words.pop(0) if words else 0) or 0
        if match.group(2) == b"s":
            return ctypes.string_at(word) if word else b"(null)"
        if match.group(2) in b"di":
            word = (ctypes.c_long if match.group(1) else ctypes.c_int)(word).value
        return str(word).encode()

    return SPEC.sub(one, fmt).decode(errors="replace").rstrip()


class NetV8(ctypes.Structure):
    """The head of ncclNet_v8_t (NCCL's src/include/nccl_net.h): its name, then init(logger)."""

    _fields_ = (("name", ctypes.c_char_p), ("init", ctypes.CFUNCTYPE(ctypes.c_int, Logger)))


def main() -> None:
    version = ctypes.c_int()
    ctypes.CDLL(NCCL).ncclGetVersion(ctypes.byref(version))

    env = {**os.environ, "NCCL_DEBUG": "INFO", "LD_DEBUG": "files"}
    argv = [sys.executable, "-c", UNIQUE_ID]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    initialised = re.findall(r"calling init: (\S+)", run.stderr)

    plugin = ctypes.CDLL("libnccl-net.so")  # by name, through the loader's cache, as NCCL loads it
    kinds = ("ncclNetPlugin_v", "ncclCollNetPlugin_v", "ncclTunerPlugin_v")
    exports = sorted(f"{k}{v}" for k in kinds for v in range(1, 16) if hasattr(plugin, f"{k}{v}"))
    said: list[str] = []

    @Logger
    def log(level, flags, file, line, fmt, *args):  # type: ignore[no-untyped-def]
        said.append(f"{level} {render(fmt or b'', args)}")

    table = NetV8.in_dll(plugin, "ncclNetPlugin_v8")
    code = table.init(log)

    # as the pre-flight's probe and `python -m smhvd.preflight.nccl_net` read it (nccl_net.main)
    nccl = distribution_versions().get("nccl")
    net = nccl_net.detect(
        os.environ, efa.probe().present, len(efa_devices()), nccl, nccl_net.provider_listed()
    )
    print(
        json.dumps(
            {
                "nccl_version": version.value,
                "exports": exports,
                "nccl_loads": {
                    "returncode": run.returncode,
                    "initialised": initialised,
                    "nccl_lines": [line for line in run.stdout.splitlines() if "NCCL" in line],
                },
                "plugin_init": {"code": code, "said": said},
                "nccl_net": {**dataclasses.asdict(net), "network": net.network, "cell": nccl_net.cell(net)},
            }
        )
    )


if __name__ == "__main__":
    main()
