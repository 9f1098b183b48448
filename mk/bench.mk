# Launchers side by side on one simulated 2-host cluster (root): ours, horovodrun (MPI and Gloo), the toolkit.
#   make bench-peers BENCH_PEERS_ARGS='--repeats 5 --heavy-repeats 2'
.PHONY: bench-peers

BENCH_PEERS_ARGS ?=

bench-peers: setup ## ours vs horovodrun (MPI, --gloo) vs the sagemaker-training toolkit, 2 simulated hosts (~12 min)
	$(PY) benchmarks/peers_side_by_side.py $(BENCH_PEERS_ARGS)
