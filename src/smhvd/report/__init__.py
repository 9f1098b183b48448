"""What the job tells the user: the failure file, the job summary, stack dumps of hung ranks."""
