"""In-flight (docs/inflight.md): while the job runs, which host makes every step wait, and why.

In a training script that nothing measures by itself (mpi4py, a custom loop), one call a step, right before
the step's collective::

    from smhvd import inflight
    ...
    inflight.step()
    comm.Allreduce(...)

Horovod's TensorFlow optimizers (Keras included) and tensorpack's HorovodTrainer are measured with no code
at all (inflight/tfgraph.py); `step()` is then a no-op, as it is when in-flight is off (`launcher_inflight:
off`) or the script runs outside `train`. It never raises and never blocks.
"""

from smhvd.inflight.record import current


def step() -> None:
    """This rank reached its step's collective now (a wall-clock time; docs/inflight.md)."""
    recorder = current()
    if recorder is not None and not recorder.hooked:
        recorder.step()
