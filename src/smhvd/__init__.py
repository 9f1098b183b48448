"""SageMaker Horovod launcher. Entry points: cli (`train`), rank (the rank wrapper), link.relay; its layers
and modules: docs/architecture.md."""
