"""The one error type of the cluster tool: its message is the one line a user sees."""


class ClusterError(Exception):
    """Bringing up, using or tearing down the simulated cluster failed; the message says what and where."""
