"""Configuration of the Mask R-CNN reference script: typed, frozen, a preset plus KEY=VALUE overrides.

Every field can be overridden from the command line (or a SageMaker hyperparameter) as `--config key=value`;
tuples are written comma-separated (`anchor_sizes=16,32,64,128,256`). Unknown keys and unparsable values are
errors that name the key and what was expected.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields, replace
from typing import Any

LR_NAME = "learning_rate"  # the graph variable the schedule sets before every step (tensorpack's name)


@dataclass(frozen=True)
class Config:
    # backbone: ResNet bottleneck stages (blocks per stage), base width, normalisation
    resnet_blocks: tuple[int, ...] = (3, 4, 6, 3)  # ResNet-50; (3, 4, 23, 3) is ResNet-101
    resnet_width: int = 64  # channels of the stem; stage i has width * 2**i bottleneck channels (x4 out)
    norm: str = "FreezeBN"  # FreezeBN (statistics from the pretrained weights, never updated) | GN | None
    # FreezeBN's gamma/beta are not trained either (tensorpack's BACKBONE.FREEZE_AFFINE; its default, false,
    # trains them in every stage from freeze_at on)
    freeze_affine: bool = False
    gn_groups: int = 32
    freeze_at: int = 2  # 0: train all; 1: freeze stem; 2: stem + first stage (Detectron's default)
    fpn_channels: int = 256
    # The backbone reads BGR (images are decoded so): tensorpack's ImageNet ResNets and its published COCO
    # models were trained so. false: RGB, for a backbone trained on RGB.
    bgr_input: bool = True
    # RPN
    anchor_sizes: tuple[int, ...] = (32, 64, 128, 256, 512)  # one per level P2..P6 (strides 4..64)
    anchor_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    rpn_batch_per_image: int = 256
    rpn_fg_ratio: float = 0.5
    rpn_pos_iou: float = 0.7
    rpn_neg_iou: float = 0.3
    rpn_nms_iou: float = 0.7
    rpn_train_pre_nms_topk: int = 2000  # per level
    rpn_train_post_nms_topk: int = 2000  # over all levels (tensorpack: the per-level number, 2000)
    rpn_test_pre_nms_topk: int = 1000
    rpn_test_post_nms_topk: int = 1000
    # box head
    frcnn_batch_per_image: int = 512
    frcnn_fg_ratio: float = 0.25
    frcnn_fg_iou: float = 0.5
    frcnn_fc_dim: int = 1024
    frcnn_box_weights: tuple[float, ...] = (10.0, 10.0, 5.0, 5.0)
    # mask head
    mask_convs: int = 4
    mask_channels: int = 256
    mask_resolution: int = 28  # output side; ROIAlign samples half of it
    # inference
    test_score_thresh: float = 0.05
    test_nms_iou: float = 0.5
    test_max_detections: int = 100
    # data
    short_edge: tuple[int, ...] = (800,)  # training picks one at random (multi-scale); test uses the first
    # Longest side after resizing, rounded up to a multiple of 32 (the FPN's resolution) as tensorpack does:
    # Detectron's 1333 is 1344 here, in the resize and in the box-decoding clip (log(max_size / 16)).
    max_size: int = 1344
    flip: bool = True
    data_workers: int = 2  # threads decoding/augmenting images per rank
    # optimisation, as tensorpack's examples/FasterRCNN: the learning rate and the step counts are written for
    # a total batch of `schedule_batch` images per step (its 8). Gradients are SUMMED over the ranks and the
    # rate divided by schedule_batch; with fewer images per step than that, gradients accumulate over
    # schedule_batch / batch steps before each update; decay and total steps scale by schedule_batch / batch.
    schedule_batch: int = 8
    base_lr: float = 0.01  # TRAIN.BASE_LR
    momentum: float = 0.9
    weight_decay: float = 1e-4  # L2 on every trained kernel (".../W"), as tensorpack
    warmup_steps: int = 1000  # TRAIN.WARMUP: linear, in steps, whatever the batch
    warmup_init_lr: float = 1e-5  # TRAIN.WARMUP_INIT_LR, x min(schedule_batch / batch, 1)
    lr_decay_steps: tuple[int, ...] = (120000, 160000)  # x 0.1 at each, at schedule_batch images per step
    total_steps: int = 180000  # at schedule_batch images per step (about 12 COCO epochs: the "1x" schedule)
    steps_per_epoch: int = 500  # an epoch here is a logging/checkpoint period, not a pass over the data
    images_per_rank: int = 1
    max_checkpoints: int = 3
    eval_max_images: int = 0  # 0: the whole validation set
    # Evaluate on the validation set every this many epochs while training (tensorpack's TRAIN.EVAL_PERIOD);
    # 0: only after training (--eval)
    eval_period: int = 50
    seed: int = 1234


PRESETS: dict[str, dict[str, Any]] = {
    # The standard COCO Mask R-CNN R50-FPN 1x schedule (Detectron: box AP 37.7, mask AP 33.9), with
    # tensorpack's conventions and training defaults (its published COCO-R50FPN-MaskRCNN-Standard.npz predicts
    # as in its example; docs/maskrcnn.md has the table of its config keys).
    "coco": {},
    # A few-second model for tests, demos and CPUs: 128-pixel images, a one-block-per-stage ResNet 8 wide.
    "tiny": {
        "resnet_blocks": (1, 1, 1, 1),
        "resnet_width": 8,
        "norm": "GN",
        "gn_groups": 4,
        "freeze_at": 0,
        "fpn_channels": 32,
        "anchor_sizes": (16, 32, 64, 128, 256),
        "rpn_batch_per_image": 64,
        "rpn_train_pre_nms_topk": 200,
        "rpn_train_post_nms_topk": 100,
        "rpn_test_pre_nms_topk": 200,
        "rpn_test_post_nms_topk": 100,
        "frcnn_batch_per_image": 64,
        "frcnn_fc_dim": 128,
        "mask_convs": 2,
        "mask_channels": 32,
        "mask_resolution": 14,
        "test_max_detections": 20,
        "short_edge": (128,),
        "max_size": 128,
        "schedule_batch": 2,
        "base_lr": 0.01,
        "warmup_steps": 20,
        "warmup_init_lr": 0.0033,
        "lr_decay_steps": (100000,),
        "total_steps": 200,
        "steps_per_epoch": 10,
        "data_workers": 1,
        "eval_period": 0,
    },
}


class ConfigError(ValueError):
    """A configuration value or key that cannot be used (the message names it)."""


def _parse_value(key: str, text: str, current: Any) -> Any:
    """Parse `text` into the type of the field's default value `current`."""
    try:
        if isinstance(current, bool):
            return {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}[
                text.strip().lower()
            ]
        if isinstance(current, tuple):
            item_type = type(current[0]) if current else float
            return tuple(item_type(p) for p in text.replace(" ", "").split(",") if p)
        return type(current)(text)
    except (ValueError, KeyError):
        raise ConfigError(
            f"config key {key!r}: cannot parse {text!r} as {type(current).__name__}"
            + (" (comma-separated list)" if isinstance(current, tuple) else "")
        ) from None


def build_config(preset: str, overrides: list[str]) -> Config:
    """The preset's config with `KEY=VALUE` overrides applied in order."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}: expected one of {sorted(PRESETS)}")
    cfg = replace(Config(), **PRESETS[preset])
    names = {f.name for f in fields(Config)}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"config override {item!r}: expected KEY=VALUE")
        if key not in names:
            raise ConfigError(f"unknown config key {key!r}; known keys: {', '.join(sorted(names))}")
        cfg = replace(cfg, **{key: _parse_value(key, text, getattr(cfg, key))})
    cfg = replace(cfg, max_size=-(-cfg.max_size // 32) * 32)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    if cfg.norm not in ("FreezeBN", "GN", "None"):
        raise ConfigError(f"config key 'norm': expected FreezeBN, GN or None, got {cfg.norm!r}")
    if len(cfg.resnet_blocks) != 4 or min(cfg.resnet_blocks) < 1:
        raise ConfigError("config key 'resnet_blocks': expected 4 positive block counts, e.g. 3,4,6,3")
    if len(cfg.anchor_sizes) != 5:
        raise ConfigError("config key 'anchor_sizes': expected 5 sizes, one per level P2..P6")
    if len(cfg.frcnn_box_weights) != 4:
        raise ConfigError("config key 'frcnn_box_weights': expected 4 weights")
    if cfg.mask_resolution % 2:
        raise ConfigError("config key 'mask_resolution': expected an even number")
    if cfg.images_per_rank != 1:
        raise ConfigError("config key 'images_per_rank': only 1 image per rank per step is implemented")
    if cfg.max_size < 32 or min(cfg.short_edge, default=0) < 1:
        raise ConfigError("config keys 'max_size', 'short_edge': expected positive sizes (max_size >= 32)")
    if not 0 <= cfg.freeze_at <= 5:
        raise ConfigError("config key 'freeze_at': expected 0..5")
    if cfg.freeze_affine and cfg.norm != "FreezeBN":
        raise ConfigError(f"config key 'freeze_affine': only with norm=FreezeBN (norm is {cfg.norm})")
    if cfg.schedule_batch < 1 or cfg.steps_per_epoch < 1 or cfg.warmup_steps < 0 or cfg.eval_period < 0:
        raise ConfigError(
            "config keys 'schedule_batch', 'steps_per_epoch', 'warmup_steps', 'eval_period': expected "
            "schedule_batch, steps_per_epoch >= 1 and warmup_steps, eval_period >= 0"
        )


@dataclass(frozen=True)
class Schedule:
    """The optimisation at `total_batch` images per step, by tensorpack's rules (examples/FasterRCNN train.py
    and modeling/generalized_rcnn.py, with its 8 as `schedule_batch`).

    The learning rate (the graph's `learning_rate` variable, tensorpack's) is set before every step: linear
    from `warmup_init_lr` at step 0 to `base_lr` at `warmup_steps`, then x0.1 from each decay step on. The
    optimizer applies `learning_rate / lr_divisor` to the gradients SUMMED over the ranks (and over
    `accumulate` steps when the batch is below schedule_batch: one update every `accumulate` steps), so each
    image's gradient weighs the same at every cluster size."""

    base_lr: float
    warmup_init_lr: float
    warmup_steps: int
    decay_steps: tuple[int, ...]
    total_steps: int
    lr_divisor: int
    accumulate: int

    def learning_rate(self, step: int) -> float:
        """The `learning_rate` variable during step `step` (0-based: the step the global step leaves)."""
        if step < self.warmup_steps:
            return self.warmup_init_lr + (self.base_lr - self.warmup_init_lr) * step / self.warmup_steps
        return float(self.base_lr * 0.1 ** sum(step >= b for b in self.decay_steps))


def scaled_schedule(cfg: Config, total_batch: int) -> Schedule:
    """tensorpack's schedule for `total_batch` images per step: decay and total steps x schedule_batch /
    batch, rounded down to whole epochs (its learning-rate decay and its last step fall at the end of an
    epoch; at least one epoch), warmup in steps whatever the batch, from warmup_init_lr x
    min(schedule_batch / batch, 1). A batch below schedule_batch must divide it (tensorpack: 1, 2 or 4 GPUs
    for its 8)."""
    ref = cfg.schedule_batch
    if total_batch < ref and ref % total_batch:
        raise ConfigError(
            f"config key 'schedule_batch': {ref} images per step is not a multiple of the {total_batch} "
            f"images each step has here (ranks x images_per_rank): use a rank count that divides {ref} or "
            "is above it, or set schedule_batch"
        )
    factor = ref / total_batch
    spe = cfg.steps_per_epoch

    def whole_epochs(steps: int) -> int:
        return int(steps * factor // spe) * spe

    return Schedule(
        base_lr=cfg.base_lr,
        warmup_init_lr=cfg.warmup_init_lr * min(factor, 1.0),
        warmup_steps=cfg.warmup_steps,
        decay_steps=tuple(whole_epochs(s) for s in cfg.lr_decay_steps),
        total_steps=max(spe, whole_epochs(cfg.total_steps)),
        lr_divisor=ref,
        accumulate=max(1, ref // total_batch),
    )


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
