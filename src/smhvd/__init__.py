"""SageMaker Horovod launcher."""
