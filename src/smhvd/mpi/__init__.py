"""Open MPI: the hostfile, the mpirun argv (a pure function of the plan), reading mpirun's output, EFA."""
