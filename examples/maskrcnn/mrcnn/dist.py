"""Process-group facts and the two small collectives the script needs outside training (Horovod, graph mode).

A single process (no MPI environment) runs without importing Horovod at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from numpy.typing import NDArray

tf1 = tf.compat.v1
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE")


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int
    hvd: Any  # horovod.tensorflow, or None for a single process

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


def launched_by_mpi() -> bool:
    return any(int(os.environ.get(v, "1") or 1) > 1 for v in MPI_SIZE_VARS)


def init_world() -> World:
    if not launched_by_mpi():
        return World(0, 1, 0, 1, None)
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        raise RuntimeError(
            f"started as several MPI processes but horovod.tensorflow cannot be imported: {e}"
        ) from e
    hvd.init()
    return World(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd)


def _run_collective(world: World, build: Any, feed_values: list[NDArray[Any]]) -> list[NDArray[Any]]:
    with tf.Graph().as_default():
        placeholders = [tf1.placeholder(tf.as_dtype(v.dtype), [None]) for v in feed_values]
        outputs = build(placeholders)
        # CPU only: these tiny collectives must not claim GPU memory before training does.
        with tf1.Session(config=tf1.ConfigProto(device_count={"GPU": 0})) as sess:
            results: list[NDArray[Any]] = sess.run(
                outputs, feed_dict=dict(zip(placeholders, feed_values, strict=True))
            )
            return results


def broadcast_int(world: World, value: int) -> int:
    """Rank 0's value on every rank."""
    if world.hvd is None:
        return value
    hvd = world.hvd
    (out,) = _run_collective(
        world, lambda ph: [hvd.broadcast(ph[0], 0, name="broadcast_int")], [np.array([value], np.int64)]
    )
    return int(out[0])


def gather_bytes(world: World, payload: bytes) -> list[bytes]:
    """Every rank's payload, in rank order, on every rank."""
    if world.hvd is None:
        return [payload]
    hvd = world.hvd
    sizes, data = _run_collective(
        world,
        lambda ph: [hvd.allgather(ph[0], name="gather_sizes"), hvd.allgather(ph[1], name="gather_data")],
        [np.array([len(payload)], np.int64), np.frombuffer(payload, np.uint8).copy()],
    )
    out, start = [], 0
    for n in sizes:
        out.append(data[start : start + int(n)].tobytes())
        start += int(n)
    return out


def broadcast_bytes(world: World, payload: bytes) -> bytes:
    """Rank 0's payload on every rank."""
    if world.hvd is None:
        return payload
    hvd = world.hvd
    size = broadcast_int(world, len(payload))
    buf = np.frombuffer(payload, np.uint8).copy() if world.is_chief else np.zeros(size, np.uint8)
    (out,) = _run_collective(world, lambda ph: [hvd.broadcast(ph[0], 0, name="broadcast_bytes")], [buf])
    return out.tobytes()
