"""The GPU pre-flight check (smhvd.preflight.gpu) against a fake CUDA runtime and NCCL (support/fake_gpu.c),
compiled once with `cc` and loaded into this process under both names the check looks for. The fake reads
its FAKE_* variables at call time, so each test sets them in its own environment (os.environ is the C one).

Tests that need the compiled fake are integration tests (compiling starts a process); the rest are pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from smhvd.preflight import gpu
from support.fake_gpu import NAMES, build_fake_gpu

CUDART, NCCL = NAMES
needs_fake = pytest.mark.integration
# The fake sleeps 7 to 12 ms a round at this rate and size, so that a loaded machine's scheduling delays are
# a small part of a round (at 50 GB/s and 64 MiB, 2 ms a round, one run in ten measured 30% low).
BUSBW_GBPS, SIZE = 5, 32 << 20


def no_system(name: str) -> str | None:
    """A system with no CUDA runtime or NCCL installed (stands in for ctypes.util.find_library)."""
    return None


@pytest.fixture(scope="module")
def fake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with the fake compiled once, as libcudart.so.12 and libnccl.so.2 (links to one file)."""
    return build_fake_gpu(tmp_path_factory.mktemp("fake_gpu"))


@pytest.fixture(autouse=True)
def _no_fake_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FAKE_GPU_DRIVER_DIR", "FAKE_GPU_COUNT", "FAKE_NCCL_BUSBW_GBPS", "FAKE_NCCL_FAIL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def rt(fake_dir: Path) -> gpu.GpuRuntime:
    loaded = gpu.load({"LD_LIBRARY_PATH": str(fake_dir)}, search_path=[], system=no_system)
    assert isinstance(loaded, gpu.GpuRuntime), loaded
    return loaded


def wheels(site: Path, target: Path) -> Path:
    """A site-packages with NVIDIA's wheels' layout, their libraries linked to `target`'s."""
    for sub, name in (("nvidia/cuda_runtime/lib", CUDART), ("nvidia/nccl/lib", NCCL)):
        (site / sub).mkdir(parents=True)
        (site / sub / name).symlink_to(target / name)
    return site


# ---- finding and loading ----


@needs_fake
def test_load_finds_both_through_ld_library_path(fake_dir: Path, tmp_path: Path) -> None:
    env = {"LD_LIBRARY_PATH": f"{tmp_path / 'missing'}::{fake_dir}"}
    loaded = gpu.load(env, search_path=[], system=no_system)
    assert isinstance(loaded, gpu.GpuRuntime), loaded
    assert (loaded.cudart_path, loaded.nccl_path) == (fake_dir / CUDART, fake_dir / NCCL)


@needs_fake
def test_load_finds_nvidia_wheels_after_ld_library_path(fake_dir: Path, tmp_path: Path) -> None:
    site = wheels(tmp_path / "site-packages", fake_dir)
    loaded = gpu.load({}, search_path=[str(tmp_path / "empty"), str(site)], system=no_system)
    assert isinstance(loaded, gpu.GpuRuntime), loaded
    assert (loaded.cudart_path, loaded.nccl_path) == (
        site / "nvidia/cuda_runtime/lib" / CUDART,
        site / "nvidia/nccl/lib" / NCCL,
    )
    first = gpu.load({"LD_LIBRARY_PATH": str(fake_dir)}, search_path=[str(site)], system=no_system)
    assert isinstance(first, gpu.GpuRuntime), first
    assert (first.cudart_path, first.nccl_path) == (fake_dir / CUDART, fake_dir / NCCL)


def test_find_library_asks_the_system_last_by_short_name(tmp_path: Path) -> None:
    asked: list[str] = []

    def system(name: str) -> str | None:
        asked.append(name)
        return {"cudart": "libcudart.so.12"}.get(name)

    env = {"LD_LIBRARY_PATH": str(tmp_path)}
    assert gpu.find_library(gpu.CUDART_NAMES, env, [str(tmp_path)], system) == Path("libcudart.so.12")
    assert gpu.find_library(gpu.NCCL_NAMES, env, [str(tmp_path)], system) is None
    assert asked == ["cudart", "nccl"]


def test_load_says_which_library_is_missing(tmp_path: Path) -> None:
    assert gpu.load({}, search_path=[], system=no_system) == (
        "no CUDA runtime (libcudart.so.12, libcudart.so.13, libcudart.so) found"
    )
    (tmp_path / "libcudart.so.13").write_bytes(b"")
    assert gpu.load({"LD_LIBRARY_PATH": str(tmp_path)}, search_path=[], system=no_system) == (
        "no NCCL (libnccl.so.2, libnccl.so) found"
    )


def test_load_says_why_a_library_found_cannot_be_loaded(tmp_path: Path) -> None:
    for name in (CUDART, NCCL):
        (tmp_path / name).write_text("not a shared library\n")
    reason = gpu.load({"LD_LIBRARY_PATH": str(tmp_path)}, search_path=[], system=no_system)
    assert isinstance(reason, str)
    assert reason.startswith("cannot load the CUDA runtime and NCCL: ")
    assert str(tmp_path / CUDART) in reason


# ---- what the libraries say ----


@needs_fake
@pytest.mark.parametrize("count", [0, 1, 8])
def test_device_count_follows_the_runtime(
    rt: gpu.GpuRuntime, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    monkeypatch.setenv("FAKE_GPU_COUNT", str(count))
    assert gpu.device_count(rt) == count


@needs_fake
def test_device_count_from_the_driver_directory(
    rt: gpu.GpuRuntime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gpus = ["0000:10:1c.0", "0000:10:1d.0", "0000:20:1c.0"]
    for address in gpus:
        (tmp_path / address).mkdir()
    monkeypatch.setenv("FAKE_GPU_DRIVER_DIR", str(tmp_path))
    monkeypatch.setenv("FAKE_GPU_COUNT", "8")  # the directory wins
    assert gpu.device_count(rt) == len(gpus)


@needs_fake
def test_versions(rt: gpu.GpuRuntime) -> None:
    assert gpu.nccl_version(rt) == "2.28.5"


def nccl_version_code(major: int, minor: int, patch: int) -> int:
    """NCCL_VERSION(X, Y, Z) as nccl.h defines it."""
    if major <= 2 and minor <= 8:
        return major * 1000 + minor * 100 + patch
    return major * 10000 + minor * 100 + patch


@pytest.mark.parametrize("version", [(2, 4, 8), (2, 8, 4), (2, 9, 6), (2, 28, 5), (3, 0, 1)])
def test_nccl_version_text_reads_both_encodings(version: tuple[int, int, int]) -> None:
    assert gpu.nccl_version_text(nccl_version_code(*version)) == ".".join(map(str, version))


@needs_fake
def test_unique_id_is_all_128_bytes(rt: gpu.GpuRuntime) -> None:
    uid = gpu.unique_id(rt)
    assert len(uid) == 128
    assert uid.startswith(b"fake-nccl-id ")
    assert uid.endswith(b"\0")  # zeros after the text are part of the id


# ---- all_reduce ----


def measured(rt: gpu.GpuRuntime, nranks: int, first_rank: int, devices: int) -> gpu.Bandwidth:
    """allreduce of SIZE, the best of up to three tries: the fake sleeps at least as long as the rate says, so
    no try may exceed it, while a busy machine can only slow one down."""
    tries: list[gpu.Bandwidth] = []
    while len(tries) < 3 and not any(t.busbw_gbps >= 0.7 * BUSBW_GBPS for t in tries):
        tries.append(gpu.allreduce(rt, gpu.unique_id(rt), nranks, first_rank, devices, size_bytes=SIZE))
    assert [t for t in tries if t.busbw_gbps > BUSBW_GBPS] == []
    return max(tries, key=lambda t: t.busbw_gbps)


@needs_fake
@pytest.mark.parametrize(("nranks", "first_rank"), [(4, 0), (8, 4)], ids=["one host", "second of two hosts"])
def test_allreduce_measures_the_bus_bandwidth(
    rt: gpu.GpuRuntime, monkeypatch: pytest.MonkeyPatch, nranks: int, first_rank: int
) -> None:
    monkeypatch.setenv("FAKE_GPU_COUNT", "4")
    monkeypatch.setenv("FAKE_NCCL_BUSBW_GBPS", str(BUSBW_GBPS))
    result = measured(rt, nranks, first_rank, devices=4)
    assert (result.gpus, result.ranks, result.size_bytes) == (4, nranks, SIZE)
    assert result.busbw_gbps == pytest.approx(BUSBW_GBPS, rel=0.3)  # the fake sleeps: the OS's granularity
    assert result.algbw_gbps == pytest.approx(result.busbw_gbps * nranks / (2 * (nranks - 1)))
    assert result.algbw_gbps == pytest.approx(SIZE / result.seconds / 1e9)


@needs_fake
def test_allreduce_on_one_gpu_alone(rt: gpu.GpuRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_GPU_COUNT", "1")
    monkeypatch.setenv("FAKE_NCCL_BUSBW_GBPS", str(BUSBW_GBPS))
    result = measured(rt, 1, 0, devices=1)
    assert (result.gpus, result.ranks) == (1, 1)
    assert result.busbw_gbps == result.algbw_gbps == pytest.approx(BUSBW_GBPS, rel=0.3)


@needs_fake
def test_a_failing_nccl_call_raises_its_message_and_leaves_nccl_usable(
    rt: gpu.GpuRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GPU_COUNT", "2")
    monkeypatch.setenv("FAKE_NCCL_BUSBW_GBPS", str(BUSBW_GBPS))
    monkeypatch.setenv("FAKE_NCCL_FAIL", "1")
    uid = gpu.unique_id(rt)
    with pytest.raises(gpu.GpuError) as failed:
        gpu.allreduce(rt, uid, 2, 0, devices=2, size_bytes=SIZE)
    assert str(failed.value) == "ncclCommInitRank: fake nccl error 2"  # ncclSystemError
    monkeypatch.delenv("FAKE_NCCL_FAIL")
    # Had the failure left its group open, every later group would be nested in it and never end (the fake
    # would never sleep): the bandwidth measured says the group was closed.
    assert measured(rt, 2, 0, devices=2).busbw_gbps == pytest.approx(BUSBW_GBPS, rel=0.3)


@needs_fake
def test_more_devices_than_the_host_has_is_a_cuda_error(
    rt: gpu.GpuRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GPU_COUNT", "2")
    with pytest.raises(gpu.GpuError) as failed:
        gpu.allreduce(rt, gpu.unique_id(rt), 4, 0, devices=4, size_bytes=4096)
    assert str(failed.value) == "cudaSetDevice: fake error 101"  # cudaErrorInvalidDevice


def test_allreduce_rejects_ranks_outside_the_job() -> None:
    with pytest.raises(ValueError, match="ranks 6..9 of 8"):
        gpu.allreduce(None, bytes(128), 8, 6, devices=4)  # type: ignore[arg-type]  # checked first
