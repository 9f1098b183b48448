"""What the job is: SageMaker's files under /opt/ml read into typed, frozen values, validated once (job)."""
