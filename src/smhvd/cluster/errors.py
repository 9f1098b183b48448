"""The one error type of the cluster tool: its message is the one line a user sees."""


class ClusterError(Exception):
    """Bringing up, using or tearing down the simulated cluster failed; the message says what and where."""


class Interrupted(Exception):
    """SIGTERM or SIGINT reached the process that owns a cluster: the cluster is being torn down."""
