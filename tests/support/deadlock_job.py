"""A Horovod job that deadlocks: rank 0 waits in an allreduce that rank 1 never joins (stack dump tests)."""

import sys
import time

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()


def wait_for_peer() -> None:
    hvd.allreduce(tf.constant([1.0]), name="never_joined")


def busy_elsewhere() -> None:
    time.sleep(600)


print(f"rank {hvd.rank()} entering the deadlock", file=sys.stderr, flush=True)
if hvd.rank() == 0:
    wait_for_peer()
else:
    busy_elsewhere()
