# Example: Horovod Keras MNIST / Fashion-MNIST (examples/mnist/), its tests and its benchmark.
#   make mnist-mpirun MNIST_ARGS='--epochs 3 --dataset fashion_mnist'   # 2 ranks under plain mpirun
.PHONY: mnist-mpirun test-mnist bench-mnist

MNIST_NP ?= 2
MNIST_ARGS ?= --epochs 1
# The script leaves TensorFlow's threads to its launcher; under plain mpirun, each rank gets this many.
MNIST_THREADS ?= 1
MNIST_BENCH_ARGS ?=
MNIST_WORKDIR := $(REPO)/build/mnist

mnist-mpirun: setup ## the MNIST example under plain mpirun (MNIST_NP, MNIST_ARGS); outputs in build/mnist/
	rm -rf $(MNIST_WORKDIR)
	SAGEMAKER_BASE_DIR=$(MNIST_WORKDIR) OMP_NUM_THREADS=$(MNIST_THREADS) \
	  TF_NUM_INTRAOP_THREADS=$(MNIST_THREADS) TF_NUM_INTEROP_THREADS=$(MNIST_THREADS) \
	  mpirun --allow-run-as-root --oversubscribe -np $(MNIST_NP) --bind-to none --mca mpi_yield_when_idle 1 \
	  -x OMP_NUM_THREADS -x TF_NUM_INTRAOP_THREADS -x TF_NUM_INTEROP_THREADS \
	  $(PY) examples/mnist/train_mnist.py $(MNIST_ARGS)

test-mnist: setup ## the MNIST example's tests only (unit: seconds; integration: a few minutes on 2 cores)
	$(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) tests/examples/mnist

bench-mnist: setup ## MNIST to 99% at np=1 and np=2, Horovod's overhead at np=1 (~20 min on 2 loaded cores)
	$(PY) benchmarks/mnist_convergence.py $(MNIST_BENCH_ARGS)
