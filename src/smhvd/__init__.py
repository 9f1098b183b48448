"""SageMaker Horovod launcher.

Entry points: cli (`train`), rank (the rank wrapper mpirun starts), link (the leader-worker relay).
launch runs one job on this host; config/ says what the job is, roles/ what this host does, mpi/ how mpirun
is run, proc/ how processes are run and waited for, report/ what the user is told; environment (SM_* for the
script) and sourcecode (script mode) serve launch; errors maps every failure to its exit code.
"""
