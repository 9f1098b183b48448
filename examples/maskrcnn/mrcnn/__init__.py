"""Mask R-CNN (ResNet-FPN) on tensorpack: the modules behind train_maskrcnn.py."""
