"""A simulated SageMaker cluster on one Linux machine: hosts algo-1..algo-N in Linux namespaces.

Each host is a set of namespaces (network, mount, UTS, IPC, PID) around a small reaping PID 1. Hosts share a
bridge on a private subnet with no default route, see their own /etc/hosts, /root/.ssh and /opt/ml tree,
and run the same command at once, as SageMaker runs ``train`` on every instance of a training job.
"""

from smhvd.cluster.cluster import Cluster
from smhvd.cluster.errors import ClusterError, Interrupted
from smhvd.cluster.jobs import HostResult
from smhvd.cluster.spec import ClusterSpec

__all__ = ["Cluster", "ClusterError", "ClusterSpec", "HostResult", "Interrupted"]
