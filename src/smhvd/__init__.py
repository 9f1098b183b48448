"""SageMaker Horovod launcher: entry points cli (`train`), rank and link.relay (docs/architecture.md)."""
