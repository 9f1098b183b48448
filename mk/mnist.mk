# Reference script: Horovod Keras MNIST / Fashion-MNIST (examples/mnist/), its tests and its benchmark.
#   make mnist-mpirun MNIST_ARGS='--epochs 3 --dataset fashion_mnist'   # 2 ranks under plain mpirun
.PHONY: mnist-mpirun test-mnist bench-mnist

MNIST_NP ?= 2
MNIST_ARGS ?= --epochs 1
MNIST_BENCH_ARGS ?=
MNIST_WORKDIR := $(REPO)/build/mnist

mnist-mpirun: setup ## the MNIST script under plain mpirun (MNIST_NP, MNIST_ARGS); outputs in build/mnist/
	rm -rf $(MNIST_WORKDIR)
	SAGEMAKER_BASE_DIR=$(MNIST_WORKDIR) mpirun --allow-run-as-root --oversubscribe -np $(MNIST_NP) \
	  --bind-to none --mca mpi_yield_when_idle 1 $(PY) examples/mnist/train_mnist.py $(MNIST_ARGS)

test-mnist: setup ## the MNIST script's tests only (unit: 2 s; integration: ~7 min on 2 loaded cores)
	$(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) tests/scripts_mnist

bench-mnist: setup ## MNIST to 99% at np=1 and np=2, Horovod's overhead at np=1 (~20 min on 2 loaded cores)
	$(PY) benchmarks/mnist_convergence.py $(MNIST_BENCH_ARGS)
