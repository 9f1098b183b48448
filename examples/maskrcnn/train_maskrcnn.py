"""Mask R-CNN (ResNet-FPN) on tensorpack: train with Horovod (or one process), checkpoint/resume, export the
model, evaluate with COCOeval (bbox + segm).

Runs as a SageMaker script (every hyperparameter arrives as `--key value`) or directly:

    mpirun -np 2 python train_maskrcnn.py --preset tiny --data-dir DIR --config total_steps=40

Paths default to the SageMaker layout under $SAGEMAKER_BASE_DIR (default /opt/ml): channels `train`, `val`,
`annotations` (optional: the COCO json files when the image channels hold only images, as
`smhvd-stage-coco` stages them) and `pretrained` (an .npz), checkpoints in <root>/checkpoints, the model in
SM_MODEL_DIR, evaluation JSON in SM_OUTPUT_DATA_DIR.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Python puts this script's directory first on sys.path (so does `python -m mpi4py`): the `mrcnn` package next
# to it imports from any working directory. TensorFlow logs at import time: its log level is set before that.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ warnings drown the training log
import numpy as np
import tensorflow as tf
from mrcnn import data, dist, staged
from mrcnn.config import Config, ConfigError, Schedule, build_config, scaled_schedule, to_dict
from mrcnn.data import DataError
from mrcnn.weights import check_readable, is_model_variable, model_init, pretrained_init

tf1 = tf.compat.v1

MODEL_FILE = "model.npz"
# For a SageMaker estimator's metric_definitions (docs/maskrcnn.md): rank 0's line per epoch and the
# COCO lines of every evaluation (while training and after it).
METRIC_DEFINITIONS = [
    {"Name": "train:loss", "Regex": r"epoch \d+: mean loss ([0-9.]+)"},
    {"Name": "val:bbox_AP", "Regex": r"COCO bbox AP ([0-9.]+)"},
    {"Name": "val:bbox_AP50", "Regex": r"COCO bbox AP [0-9.]+ AP50 ([0-9.]+)"},
    {"Name": "val:segm_AP", "Regex": r"COCO segm AP ([0-9.]+)"},
    {"Name": "val:segm_AP50", "Regex": r"COCO segm AP [0-9.]+ AP50 ([0-9.]+)"},
]
VAL_CHANNELS = ("val", "validation", "test")


class UsageError(ValueError):
    """A path or argument that cannot be used (the message names it)."""


@dataclass(frozen=True)
class Paths:
    train: Path | None
    val: Path | None
    train_json: str | None  # annotation file relative to `train` (None: auto-detect)
    val_json: str | None
    annotations: Path | None  # the `annotations` channel: instances_{train,val}*.json (+ a staging manifest)
    pretrained: Path | None
    checkpoints: Path
    model: Path
    output: Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # Every option also takes underscores (--train_json): hyperparameter keys are often written so.
    p = argparse.ArgumentParser(description="Mask R-CNN (ResNet-FPN) with tensorpack and Horovod")
    p.add_argument("--preset", default="coco", help="tiny | coco (default coco)")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE ...",
        help="config overrides, space-separated, repeatable (e.g. --config 'total_steps=40 norm=GN')",
    )
    p.add_argument(
        "--data-dir", "--data_dir", type=Path, help="holds train/ and val/ (used when channels are absent)"
    )
    p.add_argument("--train-dir", "--train_dir", type=Path, help="training data (default: $SM_CHANNEL_TRAIN)")
    p.add_argument("--val-dir", "--val_dir", type=Path, help="validation data (default: $SM_CHANNEL_VAL)")
    p.add_argument(
        "--train-json", "--train_json", help="annotation file relative to the training dir (default: auto)"
    )
    p.add_argument(
        "--val-json", "--val_json", help="annotation file relative to the validation dir (default: auto)"
    )
    p.add_argument(
        "--annotations-dir",
        "--annotations_dir",
        type=Path,
        help="COCO annotation files for image-only train/val dirs (default: $SM_CHANNEL_ANNOTATIONS)",
    )
    p.add_argument(
        "--pretrained", type=Path, help="backbone .npz, or a dir with one (default: pretrained channel)"
    )
    p.add_argument(
        "--checkpoint-dir",
        "--checkpoint_dir",
        type=Path,
        help="default: $SM_CHECKPOINT_DIR, else $SAGEMAKER_BASE_DIR/checkpoints",
    )
    p.add_argument("--model-dir", "--model_dir", type=Path, help="default: $SM_MODEL_DIR")
    p.add_argument("--output-dir", "--output_dir", type=Path, help="default: $SM_OUTPUT_DATA_DIR")
    p.add_argument("--eval", default="true", help="evaluate after training: true | false")
    p.add_argument(
        "--eval-only", "--eval_only", default="false", help="skip training; evaluate --model-dir's model.npz"
    )
    return p.parse_args(argv)


def _bool(name: str, text: str) -> bool:
    low = str(text).strip().lower()
    if low not in ("true", "false", "1", "0", "yes", "no"):
        raise UsageError(f"--{name}: expected true or false, got {text!r}")
    return low in ("true", "1", "yes")


def _channel(name: str) -> Path | None:
    value = os.environ.get(f"SM_CHANNEL_{name.upper()}")
    return Path(value) if value else None


def resolve_paths(a: argparse.Namespace) -> Paths:
    root = Path(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml"))
    train = a.train_dir or _channel("train") or (a.data_dir / "train" if a.data_dir else None)
    val = a.val_dir or next((c for c in map(_channel, VAL_CHANNELS) if c), None)
    if val is None and a.data_dir and (a.data_dir / "val").is_dir():
        val = a.data_dir / "val"
    annotations = a.annotations_dir or _channel("annotations")
    if annotations is not None and not annotations.is_dir():
        raise UsageError(f"annotations directory {annotations} does not exist")
    pretrained = a.pretrained or _channel("pretrained")
    if pretrained is not None and pretrained.is_dir():
        found = sorted(pretrained.glob("*.npz"))
        if len(found) != 1:
            raise UsageError(
                f"pretrained directory {pretrained}: expected exactly one .npz, found {len(found)}"
            )
        pretrained = found[0]
    if pretrained is not None and not pretrained.is_file():
        raise UsageError(f"pretrained weights {pretrained} do not exist")
    return Paths(
        train=train,
        val=val,
        train_json=a.train_json,
        val_json=a.val_json,
        annotations=annotations,
        pretrained=pretrained,
        checkpoints=a.checkpoint_dir or Path(os.environ.get("SM_CHECKPOINT_DIR") or root / "checkpoints"),
        model=a.model_dir or Path(os.environ.get("SM_MODEL_DIR", root / "model")),
        output=a.output_dir or Path(os.environ.get("SM_OUTPUT_DATA_DIR", root / "output" / "data")),
    )


def load_training_data(paths: Paths) -> data.Dataset:
    if paths.train is None:
        raise UsageError("no training data: give --train-dir or --data-dir, or a 'train' channel")
    if not paths.train.is_dir():
        raise UsageError(f"training data directory {paths.train} does not exist")
    ds = data.load_dataset(paths.train, paths.train_json, paths.annotations, "train")
    if not data.records(ds, with_empty=False):
        raise DataError(f"{ds.annotation_file}: no image has a usable (non-crowd) annotation")
    return ds


def parse_overrides(values: list[str]) -> list[str]:
    return [item for v in values for item in shlex.split(v)]


def latest_checkpoint_step(ckpt_dir: Path) -> tuple[str | None, int]:
    path = tf1.train.latest_checkpoint(str(ckpt_dir)) if ckpt_dir.is_dir() else None
    if path is None:
        return None, 0
    return path, int(tf1.train.load_variable(path, "global_step"))


def export_npz(ckpt: str, out: Path) -> None:
    """The model's variables (no optimizer slots, step counter or learning rate) as an .npz, atomically."""
    from tensorpack.tfutils.varmanip import load_checkpoint_vars

    params = {k: v for k, v in load_checkpoint_vars(ckpt).items() if is_model_variable(k)}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **params)
    tmp.replace(out)


def session_config(world: dist.World) -> Any:
    """Thread pools sized to this rank's share of the cores; on CPU, no grappler memory optimiser (it only
    matters for GPU memory, and its cost model logs a page of warnings for every CropAndResize)."""
    from tensorflow.core.protobuf import rewriter_config_pb2

    cores = max(1, (os.cpu_count() or 1) // world.local_size)
    config = tf1.ConfigProto(
        allow_soft_placement=True, intra_op_parallelism_threads=cores, inter_op_parallelism_threads=cores
    )
    if not tf.config.list_physical_devices("GPU"):
        config.graph_options.rewrite_options.memory_optimization = (
            rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
        )
    return config


def train_log_callback(images_per_step: int) -> Any:
    """Tensorpack callback (rank 0): per-epoch mean loss, s/step, images/s; stops on a non-finite loss."""
    from tensorpack.callbacks import Callback
    from tensorpack.utils import logger

    class _TrainLog(Callback):  # type: ignore[misc]  # tensorpack has no type information: Callback is Any
        def _setup_graph(self) -> None:
            self._cost = tf1.get_default_graph().get_tensor_by_name("total_cost:0")

        def _before_epoch(self) -> None:
            self._losses: list[float] = []
            self._t0 = time.perf_counter()

        def _before_run(self, _: Any) -> Any:
            return tf1.train.SessionRunArgs(fetches=self._cost)

        def _after_run(self, _: Any, values: Any) -> None:
            loss = float(values.results)
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss became {loss} at step {self.global_step}")
            self._losses.append(loss)

        def _trigger_epoch(self) -> None:
            dt = time.perf_counter() - self._t0
            n = max(len(self._losses), 1)
            mean = float(np.mean(self._losses)) if self._losses else float("nan")
            self.trainer.monitors.put_scalar("train/loss_epoch_mean", mean)
            self.trainer.monitors.put_scalar("train/sec_per_step", dt / n)
            self.trainer.monitors.put_scalar("train/images_per_sec", n * images_per_step / dt)
            logger.info(
                f"epoch {self.epoch_num}: mean loss {mean:.4f}, {dt / n:.3f} s/step, "
                f"{n * images_per_step / dt:.2f} images/s"
            )

    return _TrainLog()


def schedule_callback(schedule: Schedule) -> Any:
    """Tensorpack callback (every rank, as tensorpack's ScheduledHyperParamSetter): sets the `learning_rate`
    variable before the first step and after every step to the schedule's value for the next one."""
    from mrcnn.config import LR_NAME
    from tensorpack.callbacks import HyperParamSetter

    class _Schedule(HyperParamSetter):  # type: ignore[misc]  # tensorpack has no type information: Any
        def _get_value_to_set(self) -> float:
            return schedule.learning_rate(self.global_step)

        def _trigger_step(self) -> None:
            self.trigger()

        def _trigger_epoch(self) -> None:
            pass  # set after every step already

    return _Schedule(LR_NAME)


def eval_epochs(eval_period: int, first_epoch: int, max_epoch: int, final_eval: bool) -> tuple[int, ...]:
    """The epochs after which training evaluates: every eval_period-th (tensorpack's TRAIN.EVAL_PERIOD) and
    the last one, which the evaluation after training covers when it runs."""
    if eval_period <= 0:
        return ()
    wanted = {e for e in range(first_epoch, max_epoch + 1) if e % eval_period == 0} | {max_epoch}
    return tuple(sorted(wanted - ({max_epoch} if final_eval else set())))


def eval_callback(cfg: Config, world: dist.World, ds: data.Dataset, epochs: tuple[int, ...]) -> Any:
    """Tensorpack callback (every rank): after the given epochs, each rank predicts its share of the
    validation set with the weights being trained; rank 0 logs COCO AP (log_metrics) and puts it in
    stats.json."""
    from mrcnn.model import OUTPUT_NAMES
    from tensorpack.callbacks import Callback

    class _Eval(Callback):  # type: ignore[misc]  # tensorpack has no type information: Callback is Any
        _chief_only = False  # every rank predicts its shard

        def _setup_graph(self) -> None:
            # An inference tower sharing the training variables (device 0: the rank's own GPU, or the CPU).
            self._predict = self.trainer.get_predictor(["image"], list(OUTPUT_NAMES))

        def _trigger_epoch(self) -> None:
            if self.epoch_num not in epochs:
                return
            metrics = score(cfg, world, ds, self._predict, self.global_step)
            if metrics is not None:
                for kind in ("bbox", "segm"):
                    for key in ("AP", "AP50", "AP75"):
                        value = metrics[kind][key]
                        if value is not None:
                            self.trainer.monitors.put_scalar(f"val/{kind}_{key}", value)

    return _Eval()


def train(
    cfg: Config,
    schedule: Schedule,
    paths: Paths,
    world: dist.World,
    ds: data.Dataset,
    val: tuple[data.Dataset, bool] | None,
) -> str:
    """Train (or resume) to schedule.total_steps, evaluating on `val` (a data set, and whether the evaluation
    after training follows) every cfg.eval_period epochs; returns the final checkpoint path (on rank 0)."""
    from mrcnn.model import MaskRCNN
    from tensorpack import TrainConfig, launch_train_with_config
    from tensorpack.callbacks import MergeAllSummaries, ModelSaver, MovingAverageSummary, RunUpdateOps
    from tensorpack.input_source import QueueInput
    from tensorpack.tfutils.sesscreate import NewSessionCreator
    from tensorpack.tfutils.sessinit import SmartInit
    from tensorpack.train import HorovodTrainer, SimpleTrainer
    from tensorpack.utils import logger

    recs = data.records(ds, with_empty=False)
    ckpt, step = latest_checkpoint_step(paths.checkpoints) if world.is_chief else (None, 0)
    step = dist.broadcast_int(world, step)
    spe = cfg.steps_per_epoch
    first_epoch, max_epoch = step // spe + 1, schedule.total_steps // spe
    epochs = eval_epochs(cfg.eval_period, first_epoch, max_epoch, val[1]) if val else ()
    if world.is_chief:
        logger.info(
            f"{len(recs)} training images, {ds.num_classes - 1} classes, world size {world.size}; "
            f"learning rate {schedule.warmup_init_lr:g} -> {schedule.base_lr:g} over {schedule.warmup_steps} "
            f"steps, x0.1 at {list(schedule.decay_steps)}, applied / {schedule.lr_divisor} to the gradients "
            f"summed over ranks" + (f" and {schedule.accumulate} steps" if schedule.accumulate > 1 else "")
            + f"; {schedule.total_steps} steps"
            + (f"; evaluating after epochs {list(epochs)}" if epochs else "")
            + (f"; resuming from {ckpt} (step {step})" if ckpt else "")
        )  # fmt: skip
        if cfg.eval_period and val is None:
            logger.info(f"eval_period {cfg.eval_period}: no validation data, not evaluating while training")
    if step >= schedule.total_steps:
        if world.is_chief:
            logger.info(
                f"checkpoint at step {step} already reaches {schedule.total_steps} steps: not training"
            )
        return ckpt or ""

    session_init = None
    if world.is_chief:
        if ckpt:
            session_init = SmartInit(ckpt)
        elif paths.pretrained:
            logger.info(f"loading pretrained weights from {paths.pretrained}")
            session_init = pretrained_init(paths.pretrained, logger.info)
    sess_config = session_config(world)
    callbacks = [schedule_callback(schedule), train_log_callback(world.size * cfg.images_per_rank)]
    if world.is_chief:
        callbacks.append(ModelSaver(max_to_keep=cfg.max_checkpoints, checkpoint_dir=str(paths.checkpoints)))
    if val and epochs:
        callbacks.append(eval_callback(cfg, world, val[0], epochs))
    config = TrainConfig(
        model=MaskRCNN(cfg, ds.num_classes, schedule),
        data=QueueInput(data.train_dataflow(recs, cfg, world.rank, world.size)),
        callbacks=callbacks,
        extra_callbacks=[MovingAverageSummary(), MergeAllSummaries(period=spe), RunUpdateOps()],
        session_creator=NewSessionCreator(config=sess_config),
        session_init=session_init,
        steps_per_epoch=spe,
        starting_epoch=first_epoch,
        max_epoch=max_epoch,
    )
    # Horovod: gradients are summed over the ranks, not averaged (tensorpack's HorovodTrainer(average=False));
    # the schedule divides the rate by its reference batch instead.
    trainer = HorovodTrainer(average=False) if world.size > 1 else SimpleTrainer()
    launch_train_with_config(config, trainer)
    final, _ = latest_checkpoint_step(paths.checkpoints) if world.is_chief else (None, 0)
    return final or ""


def score(
    cfg: Config, world: dist.World, ds: data.Dataset, predictor: Any, step: int | None
) -> dict[str, Any] | None:
    """Each rank predicts its shard of the validation images (rank r every size-th from r), the detections
    are gathered to rank 0, which runs COCOeval and logs the result (log_metrics); the metrics on rank 0."""
    from mrcnn.evaluation import coco_evaluate, predict_image

    recs = data.records(ds, with_empty=True)
    if cfg.eval_max_images:
        recs = recs[: cfg.eval_max_images]
    t0 = time.perf_counter()
    mine = recs[world.rank :: world.size]
    results = [
        res for r in mine for res in predict_image(predictor, r.path, r.image_id, cfg, ds.category_ids)
    ]
    seconds = time.perf_counter() - t0
    mine_json = json.dumps({"images": len(mine), "results": results}).encode()
    everything = [json.loads(b) for b in dist.gather_bytes(world, mine_json)]
    if not world.is_chief:
        return None
    results = [r for part in everything for r in part["results"]]
    metrics = coco_evaluate(ds.coco, results, [r.image_id for r in recs])
    metrics.update(
        images=len(recs), images_per_rank=[part["images"] for part in everything], detections=len(results),
        annotations=str(ds.annotation_file), seconds_per_image_per_rank=seconds / max(len(mine), 1),
        step=step, results=results,
    )  # fmt: skip
    log_metrics(metrics)
    return metrics


def log_metrics(metrics: dict[str, Any]) -> None:
    """One line per kind, in the fixed format METRIC_DEFINITIONS reads: `COCO bbox AP 0.4523 AP50 0.6651
    AP75 0.4012 (16 images: 8 + 8 by rank; step 40)` (nan where COCOeval has no value; no step for a model
    file evaluated alone)."""
    from tensorpack.utils import logger

    where = " + ".join(map(str, metrics["images_per_rank"])) + " by rank"
    where += f"; step {metrics['step']}" if metrics.get("step") is not None else ""
    for kind in ("bbox", "segm"):
        values = " ".join(
            f"{key} {metrics[kind][key]:.4f}" if metrics[kind][key] is not None else f"{key} nan"
            for key in ("AP", "AP50", "AP75")
        )
        logger.info(f"COCO {kind} {values} ({metrics['images']} images: {where})")


def evaluate(
    cfg: Config, world: dist.World, ds: data.Dataset, weights: Path, output: Path, step: int | None
) -> dict[str, Any] | None:
    """score() with the weights of a model file; rank 0 writes eval.json and detections.json."""
    from mrcnn.model import OUTPUT_NAMES, MaskRCNN
    from tensorpack.predict import OfflinePredictor, PredictConfig
    from tensorpack.tfutils.sesscreate import NewSessionCreator
    from tensorpack.utils import logger

    sess_config = session_config(world)
    sess_config.gpu_options.visible_device_list = str(world.local_rank)  # as HorovodTrainer does in training
    sess_config.gpu_options.allow_growth = True
    predictor = OfflinePredictor(
        PredictConfig(
            model=MaskRCNN(cfg, ds.num_classes),
            session_creator=NewSessionCreator(config=sess_config),
            session_init=model_init(weights, logger.info),
            input_names=["image"],
            output_names=list(OUTPUT_NAMES),
        )
    )
    metrics = score(cfg, world, ds, predictor, step)
    if metrics is None:
        return None
    results = metrics.pop("results")
    metrics["model"] = str(weights)
    output.mkdir(parents=True, exist_ok=True)
    (output / "eval.json").write_text(json.dumps(metrics, indent=2))
    (output / "detections.json").write_text(json.dumps(results))
    logger.info(f"evaluation written to {output / 'eval.json'}")
    return metrics


def run(a: argparse.Namespace) -> int:
    from tensorpack.utils import logger

    cfg = build_config(a.preset, parse_overrides(a.config))
    paths = resolve_paths(a)
    do_eval, eval_only = _bool("eval", a.eval), _bool("eval-only", a.eval_only)
    want_val = do_eval or eval_only or cfg.eval_period > 0  # after training, only, or while training
    # Data problems surface here, before anything is written (and not after hours of training for val).
    staging_report = staged.check_manifest(
        paths.annotations,
        {
            "train": None if eval_only else paths.train,
            "val": paths.val if want_val else None,
            "annotations": paths.annotations,
            "pretrained": paths.pretrained.parent if paths.pretrained and not eval_only else None,
        },
    )
    train_ds = None if eval_only else load_training_data(paths)
    val_ds = (
        data.load_dataset(paths.val, paths.val_json, paths.annotations, "val")
        if want_val and paths.val
        else None
    )
    if paths.pretrained is not None and not eval_only:
        check_readable(paths.pretrained)
    if eval_only and val_ds is None:
        raise UsageError("--eval-only needs validation data: --val-dir, a 'val' channel or <data-dir>/val")
    # Graph mode for tensorpack: process-wide, so only once the arguments are known to be good.
    tf1.disable_eager_execution()
    world = dist.init_world()
    schedule = None if eval_only else scaled_schedule(cfg, world.size * cfg.images_per_rank)
    if world.is_chief:
        paths.checkpoints.mkdir(parents=True, exist_ok=True)
        logger.set_logger_dir(str(paths.checkpoints), action="k")
        logger.info("config: " + json.dumps(to_dict(cfg)))
        if staging_report:
            logger.info(staging_report)
    else:
        # One log, rank 0's: tensorpack.utils.logger logs through the standard logger named "tensorpack".
        logging.getLogger("tensorpack").setLevel(logging.WARNING)
    model_file = paths.model / MODEL_FILE
    step = None
    if train_ds is not None and schedule is not None:
        final = train(cfg, schedule, paths, world, train_ds, (val_ds, do_eval) if val_ds else None)
        if world.is_chief and final:
            export_npz(final, model_file)
            (paths.model / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
            logger.info(f"model written to {model_file}")
            step = int(tf1.train.load_variable(final, "global_step"))
    if val_ds is None or not (do_eval or eval_only):
        if do_eval and world.is_chief:
            logger.info("no validation data (--val-dir, 'val' channel or <data-dir>/val): not evaluating")
        return 0
    if world.is_chief and not model_file.is_file():
        raise UsageError(f"no model to evaluate: {model_file} does not exist")
    with tempfile.TemporaryDirectory(prefix="maskrcnn-eval-") as tmp:
        evaluate(cfg, world, val_ds, shared_file(world, model_file, Path(tmp)), paths.output, step)
    return 0


def shared_file(world: dist.World, path: Path, scratch: Path) -> Path:
    """`path` of rank 0, readable on every rank: itself where visible (one host), else a copy rank 0 sends."""
    visible = dist.gather_bytes(world, b"1" if path.is_file() else b"0")
    if all(v == b"1" for v in visible):
        return path
    payload = dist.broadcast_bytes(world, path.read_bytes() if world.is_chief else b"")
    if world.is_chief:
        return path
    copy = scratch / path.name
    copy.write_bytes(payload)
    return copy


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (ConfigError, DataError, UsageError) as e:
        print(f"train_maskrcnn: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
