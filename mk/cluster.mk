# Simulated multi-host cluster (root, network namespaces): demo and benchmarks. Code: dev/smhvd_sim/.
.PHONY: cluster-demo cluster-cleanup bench-cluster bench-allreduce bench-scaling cluster-iperf3

CLUSTER_DEMO_ARGS ?=

cluster-demo: setup ## MNIST through `train` on 2 simulated hosts x 1 process; prints accuracy and each host's exit
	$(PY) -m smhvd_dev.cluster_demo --code $(REPO)/examples/mnist --hosts 2 $(CLUSTER_DEMO_ARGS)

cluster-cleanup: ## remove bridges and links left by a cluster tool that was SIGKILLed
	$(PY) -m smhvd_sim cleanup

cluster-iperf3:
	@command -v iperf3 >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends iperf3; }

bench-cluster: setup ## ours vs the sagemaker-training toolkit's MPI runner on 2 simulated hosts (~5 min)
	$(PY) benchmarks/cluster_vs_toolkit.py

bench-allreduce: setup cluster-iperf3 ## Horovod 64 MiB allreduce bus bandwidth vs iperf3 across 2 simulated hosts
	$(PY) benchmarks/allreduce_vs_iperf.py

bench-scaling: setup ## MNIST images/s at np=1, np=2 and 2 simulated hosts x 1, launcher defaults
	$(PY) benchmarks/scaling_mnist.py

# What the pre-flight adds to a healthy job: off vs warn at 2..32 simulated hosts, median of 3 (root).
#   make bench-preflight BENCH_PREFLIGHT_ARGS='--hosts 2,4 --repeats 1'
.PHONY: bench-preflight
BENCH_PREFLIGHT_ARGS ?=

bench-preflight: setup ## the pre-flight's added cost on a healthy job, 2-32 simulated hosts, and any false alarm (~10 min)
	$(PY) benchmarks/preflight_cost.py $(BENCH_PREFLIGHT_ARGS)
