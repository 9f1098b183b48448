"""This host's GPUs as a pre-flight check sees them: the CUDA runtime's device count, NCCL's version, and the
bus bandwidth of an NCCL all_reduce over this host's GPUs (or across hosts, given one NCCL id).

Through ctypes, not a framework: importing TensorFlow costs seconds, while the CUDA runtime and NCCL are in
the images already, as NVIDIA's pip wheels (nvidia-cuda-runtime, nvidia-nccl), and loading them costs
milliseconds.

Bus bandwidth is nccl-tests' measure: for an all_reduce of S bytes over n ranks taking t seconds, the
algorithm bandwidth is S/t and the bus bandwidth is S/t * 2(n-1)/n, the rate at which each rank's link
carries bytes. Unlike S/t it stays about the same as ranks are added, so it compares with the hardware's link
speed (NVLink, EFA) at any scale.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CUDART_NAMES = ("libcudart.so.12", "libcudart.so.13", "libcudart.so")
NCCL_NAMES = ("libnccl.so.2", "libnccl.so")
WHEEL_LIB_DIRS = ("nvidia/cuda_runtime/lib", "nvidia/nccl/lib")  # under a sys.path entry (site-packages)

NCCL_FLOAT32 = 7  # ncclDataType_t
NCCL_SUM = 0  # ncclRedOp_t


class GpuError(Exception):
    """A CUDA runtime or NCCL call failed: `function: message` as the library words it."""


class _UniqueId(ctypes.Structure):
    """ncclUniqueId: 128 opaque bytes, passed by value to ncclCommInitRank."""

    _fields_ = (("internal", ctypes.c_char * 128),)


_int_p = ctypes.POINTER(ctypes.c_int)
_void_pp = ctypes.POINTER(ctypes.c_void_p)
_void, _int, _size, _text = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
# Every function used, as (restype, argtypes). Status codes (cudaError_t, ncclResult_t) are C enums: c_int.
_CUDART: dict[str, tuple[type, list[type]]] = {
    "cudaGetDeviceCount": (_int, [_int_p]),
    "cudaGetErrorString": (_text, [_int]),
    "cudaSetDevice": (_int, [_int]),
    "cudaMalloc": (_int, [_void_pp, _size]),
    "cudaMemset": (_int, [_void, _int, _size]),
    "cudaFree": (_int, [_void]),
    "cudaStreamCreate": (_int, [_void_pp]),
    "cudaStreamSynchronize": (_int, [_void]),
    "cudaStreamDestroy": (_int, [_void]),
}
_NCCL: dict[str, tuple[type, list[type]]] = {
    "ncclGetVersion": (_int, [_int_p]),
    "ncclGetErrorString": (_text, [_int]),
    "ncclGetUniqueId": (_int, [ctypes.POINTER(_UniqueId)]),
    "ncclCommInitRank": (_int, [_void_pp, _int, _UniqueId, _int]),
    "ncclCommDestroy": (_int, [_void]),
    "ncclGroupStart": (_int, []),
    "ncclGroupEnd": (_int, []),
    # sendbuff, recvbuff, count, datatype, op, comm, stream
    "ncclAllReduce": (_int, [_void, _void, _size, _int, _int, _void, _void]),
}


@dataclass(frozen=True)
class GpuRuntime:
    """The CUDA runtime and NCCL, loaded, with every function's types declared."""

    cudart: ctypes.CDLL
    nccl: ctypes.CDLL
    cudart_path: Path
    nccl_path: Path


@dataclass(frozen=True)
class Bandwidth:
    """One all_reduce measurement; seconds is the mean time of one all_reduce, GB/s is 1e9 bytes/s."""

    gpus: int  # this process's GPUs
    ranks: int  # all ranks, every host's
    size_bytes: int
    seconds: float
    algbw_gbps: float
    busbw_gbps: float


def find_library(
    name_patterns: Sequence[str],
    env: Mapping[str, str],
    search_path: Sequence[str] | None = None,
    system: Callable[[str], str | None] = ctypes.util.find_library,
) -> Path | None:
    """The first of `name_patterns` (file names, best first) where the job would load it from: each
    directory of env["LD_LIBRARY_PATH"], then NVIDIA's wheels under each entry of `search_path` (default
    sys.path), then `system` (ctypes.util.find_library, asked "cudart" for "libcudart.so.12"), whose answer is
    a bare name for dlopen to resolve."""
    directories = [Path(d) for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    roots = sys.path if search_path is None else search_path
    directories += [Path(root, sub) for root in roots for sub in WHEEL_LIB_DIRS]
    for directory in directories:
        for name in name_patterns:
            if (directory / name).is_file():
                return directory / name
    for short in dict.fromkeys(n.removeprefix("lib").partition(".so")[0] for n in name_patterns):
        if found := system(short):
            return Path(found)
    return None


def _open(path: Path, functions: Mapping[str, tuple[type, list[type]]]) -> ctypes.CDLL:
    library = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in functions.items():
        function = getattr(library, name)
        function.restype = restype
        function.argtypes = argtypes
    return library


def load(
    env: Mapping[str, str],
    search_path: Sequence[str] | None = None,
    system: Callable[[str], str | None] = ctypes.util.find_library,
) -> GpuRuntime | str:
    """The CUDA runtime and NCCL found as find_library finds them, or a one-line reason why not."""
    paths = []
    for what, names in (("CUDA runtime", CUDART_NAMES), ("NCCL", NCCL_NAMES)):
        path = find_library(names, env, search_path, system)
        if path is None:
            return f"no {what} ({', '.join(names)}) found"
        paths.append(path)
    cudart_path, nccl_path = paths
    try:
        return GpuRuntime(_open(cudart_path, _CUDART), _open(nccl_path, _NCCL), cudart_path, nccl_path)
    except (OSError, AttributeError) as e:  # not loadable, or a function missing
        return f"cannot load the CUDA runtime and NCCL: {e}"


def _cuda(rt: GpuRuntime, function: str, *args: object) -> None:
    code = getattr(rt.cudart, function)(*args)
    if code != 0:
        message = rt.cudart.cudaGetErrorString(code) or b"unknown error"
        raise GpuError(f"{function}: {message.decode(errors='replace')}")


def _nccl(rt: GpuRuntime, function: str, *args: object) -> None:
    code = getattr(rt.nccl, function)(*args)
    if code != 0:
        message = rt.nccl.ncclGetErrorString(code) or b"unknown error"
        raise GpuError(f"{function}: {message.decode(errors='replace')}")


def device_count(rt: GpuRuntime) -> int:
    """How many GPUs the CUDA runtime sees (CUDA_VISIBLE_DEVICES applies); 0 when it reports an error."""
    count = ctypes.c_int(0)
    return count.value if rt.cudart.cudaGetDeviceCount(ctypes.byref(count)) == 0 else 0


def nccl_version_text(code: int) -> str:
    """NCCL's version code as MAJOR.MINOR.PATCH: MAJOR*1000+MINOR*100+PATCH before 2.9, then MAJOR*10000+.."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def nccl_version(rt: GpuRuntime) -> str:
    """The loaded NCCL's version, e.g. "2.28.5"."""
    code = ctypes.c_int(0)
    _nccl(rt, "ncclGetVersion", ctypes.byref(code))
    return nccl_version_text(code.value)


def unique_id(rt: GpuRuntime) -> bytes:
    """A new NCCL id (128 bytes): made by rank 0's process and handed to every other before allreduce."""
    uid = _UniqueId()
    _nccl(rt, "ncclGetUniqueId", ctypes.byref(uid))
    return bytes(uid)  # all 128 bytes: uid.internal would stop at the first NUL


@contextmanager
def _group(rt: GpuRuntime) -> Iterator[None]:
    """ncclGroupStart .. ncclGroupEnd around the calls of one thread that drives several GPUs."""
    _nccl(rt, "ncclGroupStart")
    try:
        yield
    except BaseException:
        rt.nccl.ncclGroupEnd()  # close the group; the error raised inside it is the one to report
        raise
    _nccl(rt, "ncclGroupEnd")


def allreduce(
    rt: GpuRuntime,
    uid: bytes,
    nranks: int,
    first_rank: int,
    devices: int,
    size_bytes: int = 64 << 20,
    iters: int = 5,
    warmup: int = 1,
) -> Bandwidth:
    """Time an in-place float32 sum all_reduce of `size_bytes` on each of this process's `devices` GPUs, which
    are NCCL ranks first_rank .. first_rank+devices-1 of `nranks`; every process of the job calls it with the
    same `uid` (one host alone: unique_id(rt), nranks=devices, first_rank=0). Only the `iters` rounds after
    `warmup` are timed, each to the end of every stream. Raises GpuError when a call fails."""
    if size_bytes < 4 or size_bytes % 4 or devices < 1 or iters < 1 or warmup < 0:
        raise ValueError(
            f"size_bytes={size_bytes} (a positive multiple of 4), devices={devices}, iters={iters}"
        )
    if first_rank < 0 or first_rank + devices > nranks or len(uid) != ctypes.sizeof(_UniqueId):
        raise ValueError(
            f"ranks {first_rank}..{first_rank + devices - 1} of {nranks}, id of {len(uid)} bytes"
        )
    nccl_id = _UniqueId.from_buffer_copy(uid)
    buffers = [ctypes.c_void_p() for _ in range(devices)]
    streams = [ctypes.c_void_p() for _ in range(devices)]
    comms = [ctypes.c_void_p() for _ in range(devices)]
    try:
        _allocate(rt, buffers, streams, size_bytes)
        with _group(rt):
            for device in range(devices):
                _cuda(rt, "cudaSetDevice", device)
                _nccl(
                    rt, "ncclCommInitRank", ctypes.byref(comms[device]), nranks, nccl_id, first_rank + device
                )
        for _ in range(warmup):
            _one_round(rt, buffers, streams, comms, size_bytes)
        start = time.perf_counter()
        for _ in range(iters):
            _one_round(rt, buffers, streams, comms, size_bytes)
        seconds = (time.perf_counter() - start) / iters
    finally:
        failures = _release(rt, comms, streams, buffers)
    if failures:
        raise GpuError(failures[0])
    algbw = size_bytes / seconds / 1e9
    factor = 2 * (nranks - 1) / nranks if nranks > 1 else 1.0
    return Bandwidth(devices, nranks, size_bytes, seconds, algbw, algbw * factor)


def _allocate(
    rt: GpuRuntime, buffers: list[ctypes.c_void_p], streams: list[ctypes.c_void_p], size_bytes: int
) -> None:
    """A zeroed buffer of `size_bytes` and a stream on each device (the handles filled in as made)."""
    for device, (buffer, stream) in enumerate(zip(buffers, streams, strict=True)):
        _cuda(rt, "cudaSetDevice", device)
        _cuda(rt, "cudaMalloc", ctypes.byref(buffer), size_bytes)
        _cuda(rt, "cudaMemset", buffer, 0, size_bytes)
        _cuda(rt, "cudaStreamCreate", ctypes.byref(stream))


def _one_round(
    rt: GpuRuntime,
    buffers: list[ctypes.c_void_p],
    streams: list[ctypes.c_void_p],
    comms: list[ctypes.c_void_p],
    size_bytes: int,
) -> None:
    """One in-place all_reduce on every device, as one NCCL group, to the end of every stream."""
    with _group(rt):
        for buffer, stream, comm in zip(buffers, streams, comms, strict=True):
            _nccl(rt, "ncclAllReduce", buffer, buffer, size_bytes // 4, NCCL_FLOAT32, NCCL_SUM, comm, stream)
    for stream in streams:
        _cuda(rt, "cudaStreamSynchronize", stream)


def _release(
    rt: GpuRuntime,
    comms: list[ctypes.c_void_p],
    streams: list[ctypes.c_void_p],
    buffers: list[ctypes.c_void_p],
) -> list[str]:
    """Destroy what allreduce made (the handles not NULL), every call tried; the failures' messages."""
    failures: list[str] = []

    def attempt(check: Callable[..., None], function: str, argument: object) -> None:
        try:
            check(rt, function, argument)
        except GpuError as e:
            failures.append(str(e))

    for comm in comms:
        if comm:
            attempt(_nccl, "ncclCommDestroy", comm)
    for device, (stream, buffer) in enumerate(zip(streams, buffers, strict=True)):
        if stream or buffer:
            attempt(_cuda, "cudaSetDevice", device)
        if stream:
            attempt(_cuda, "cudaStreamDestroy", stream)
        if buffer:
            attempt(_cuda, "cudaFree", buffer)
    return failures
