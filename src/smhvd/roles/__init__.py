"""What this host does: the leader (links, pre-flight, mpirun), a worker (sshd, the verdict), sshd."""
