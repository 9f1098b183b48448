"""A simulated SageMaker cluster on one Linux machine: hosts algo-1..algo-N in Linux namespaces.

Each host is a set of namespaces (network, mount, UTS, IPC, PID) around a small reaping PID 1. Hosts share a
bridge on a private subnet with no default route, see their own /etc/hosts, /root/.ssh and /opt/ml tree,
and run the same command at once, as SageMaker runs ``train`` on every instance of a training job.
"""

from smhvd_sim.cluster import Cluster
from smhvd_sim.jobs import HostResult
from smhvd_sim.spec import ClusterSpec
from smhvd_sim.system import ClusterError, Interrupted

__all__ = ["Cluster", "ClusterError", "ClusterSpec", "HostResult", "Interrupted"]
