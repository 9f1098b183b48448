"""Pre-flight checks run on every host before an expensive multi-host job."""
