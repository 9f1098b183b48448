"""The hosts' roles: the leader (runs mpirun), workers (sshd, wait for the job's end), and what joins them
(sshd and its client config, the leader's links to workers, each host's environment for its ranks)."""
