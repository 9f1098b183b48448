# Simulated multi-host cluster (root, network namespaces): demo and benchmarks. See src/smhvd/cluster/.
.PHONY: cluster-demo bench-cluster bench-allreduce bench-scaling cluster-cleanup

CLUSTER_DEMO_ARGS ?=

cluster-demo: setup ## MNIST through `train` on 2 simulated hosts x 1 process; prints accuracy and each host's exit
	$(PY) -m smhvd.cluster.demo --code $(REPO)/src/scripts/mnist --hosts 2 $(CLUSTER_DEMO_ARGS)

cluster-cleanup: ## remove bridges/links left by a cluster tool that was SIGKILLed
	$(PY) -m smhvd.cluster cleanup
