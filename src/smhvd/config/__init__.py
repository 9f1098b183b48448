"""What the job is: SageMaker's files under /opt/ml read into typed, frozen values, validated once whichever
SDK wrote them (job); the layout and its modules: docs/architecture.md."""
