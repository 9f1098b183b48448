"""In-flight for TensorFlow jobs, with no code: each optimizer step's gradient allreduce timed in the graph.

Around the function that allreduces a step's gradients (Horovod's `_make_allreduce_grads_fn`, which its
DistributedOptimizer for Keras and tf.compat.v1 and its DistributedGradientTape use; tensorpack's
`HorovodTrainer.allreduce`), two `tf.timestamp()` ops: READY once every gradient of the step is computed on
this rank, DONE once every allreduced gradient is back; one `tf.numpy_function` a step records both
(record.py). A rank that reaches the allreduce last waits least for it: the others' DONE - READY exceeds its
own by how late it was (docs/inflight.md). The step's results wait for that record op (a control dependency),
so graphs run in a tf.compat.v1 session record it too. Under XLA (`jit_compile`) nothing is added: XLA
cannot run a Python function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import control_flow_util  # XLA context: a graph that cannot hold a py func

from smhvd.inflight.record import current


def _record(ready: Any, done: Any) -> None:
    recorder = current()
    if recorder is not None:
        recorder.hooked = True
        recorder.step(float(ready), float(done))


def _in_xla() -> bool:
    if tf.executing_eagerly():
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _stamp_after(tensors: Sequence[Any]) -> tuple[Any, list[Any]]:
    """A wall-clock time taken once every tensor of `tensors` has its value, and the tensors passed on.

    Each tensor goes through an identity first: a control dependency on a tensor is one on the op that made
    it, and when that op is a function call (Horovod's allreduce_grads is a tf.function) TensorFlow's
    inlining makes it a dependency on the function's side effects, not on its outputs' values (measured:
    the time came before the allreduce had finished). An identity needs the value itself."""
    passed = [tf.identity(t) if isinstance(t, tf.Tensor) else t for t in tensors]
    values = [t for t in passed if isinstance(t, tf.Tensor)]
    with tf.device("/cpu:0"), tf.control_dependencies(values):
        return tf.timestamp(), passed


def _recorded(outputs: list[Any], ready: Any) -> list[Any]:
    """`outputs` (the allreduced gradients), once the step's READY and DONE are recorded."""
    if not any(isinstance(o, tf.Tensor) for o in outputs):
        return outputs
    done, passed = _stamp_after(outputs)
    with tf.device("/cpu:0"):
        op = tf.numpy_function(_record, [ready, done], [], stateful=True, name="smhvd_inflight")
    if tf.executing_eagerly() or not isinstance(op, tf.Operation):
        return outputs
    with tf.control_dependencies([op]):
        return [tf.identity(o) if isinstance(o, tf.Tensor) else o for o in passed]


def timed(allreduce_grads: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's allreduce_grads(grads, vars=None, ...), its step recorded."""

    def allreduce_grads_timed(grads: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        if current() is None or _in_xla():
            return allreduce_grads(grads, *args, **kwargs)
        ready, grads = _stamp_after(list(grads))
        return _recorded(list(allreduce_grads(grads, *args, **kwargs)), ready)

    return allreduce_grads_timed


def patch_horovod(module: ModuleType) -> None:
    """horovod.tensorflow: every allreduce_grads function it makes from now on is timed."""
    make = module._make_allreduce_grads_fn
    if getattr(make, "smhvd_inflight", False):
        return

    def make_timed(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        return timed(make(*args, **kwargs))

    make_timed.smhvd_inflight = True  # type: ignore[attr-defined]
    setattr(module, "_make_allreduce_grads_fn", make_timed)  # noqa: B010


def patch_tensorpack(module: ModuleType) -> None:
    """tensorpack.train.trainers: HorovodTrainer.allreduce(grads as (gradient, variable) pairs) timed."""
    trainer = module.HorovodTrainer
    allreduce = trainer.allreduce
    if getattr(allreduce, "smhvd_inflight", False):
        return

    def allreduce_timed(self: Any, grads: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        reduced_pairs = allreduce(self, grads)
        if current() is None or _in_xla() or reduced_pairs is grads:  # one rank: nothing was reduced
            return reduced_pairs  # type: ignore[no-any-return]
        out = list(reduced_pairs)
        ready, _ = _stamp_after([g for g, _ in grads])
        reduced = _recorded([g for g, _ in out], ready)
        return list(zip(reduced, [v for _, v in out], strict=True))

    allreduce_timed.smhvd_inflight = True  # type: ignore[attr-defined]
    trainer.allreduce = allreduce_timed
