"""Staging tools that run on a user's workstation (not in the training image): COCO 2017 + weights to S3."""
