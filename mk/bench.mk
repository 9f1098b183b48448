# Launchers side by side on one simulated 2-host cluster (root): ours, horovodrun (MPI and Gloo), the toolkit.
#   make bench-peers BENCH_PEERS_ARGS='--repeats 5 --heavy-repeats 2'
.PHONY: bench-peers

BENCH_PEERS_ARGS ?=

bench-peers: setup ## ours vs horovodrun (MPI, --gloo) vs the sagemaker-training toolkit, 2 simulated hosts (~12 min)
	$(PY) benchmarks/peers_side_by_side.py $(BENCH_PEERS_ARGS)

# How the launchers' start and exit grow with the cluster: 2..32 simulated hosts, 1 rank each (root).
#   make bench-scale BENCH_SCALE_ARGS='--hosts 2,4,8 --repeats 1 --script mpi4py'   # a quick look
.PHONY: bench-scale
BENCH_SCALE_ARGS ?=

bench-scale: setup ## ours vs horovodrun vs the toolkit at 2, 4, 8, 16, 32 simulated hosts: start, end, crash (~1 h)
	cd benchmarks && $(PY) scale_launchers.py $(BENCH_SCALE_ARGS)

# Rank output through `train` vs plain mpirun --tag-output: lines/s, MB/s, ratio, broken lines (root for 2 hosts).
#   make bench-output BENCH_OUTPUT_ARGS='--hosts 1 --repeats 5'
.PHONY: bench-output
BENCH_OUTPUT_ARGS ?=

bench-output: setup ## rank output: ours vs plain mpirun --tag-output, 100- and 1000-byte lines, 1x2 and 2x2 ranks (~3 min)
	$(PY) benchmarks/output_speed.py $(BENCH_OUTPUT_ARGS)

# In-flight's cost and false alarms: MNIST through `train` on simulated hosts, launcher_inflight warn vs off (root).
#   make bench-inflight BENCH_INFLIGHT_ARGS='--hosts 2 --repeats 3'
.PHONY: bench-inflight
BENCH_INFLIGHT_ARGS ?=

bench-inflight: setup ## in-flight on vs off: MNIST step time and false alarms, 2 and 4 simulated hosts (~15 min)
	cd benchmarks && $(PY) inflight_cost.py $(BENCH_INFLIGHT_ARGS)
