# The SageMaker Python SDK v2's local mode with this project's image, without a Docker engine: podman (private
# configuration of bin/daemonless-env.sh, netavark + aardvark-dns) behind `docker`, podman-compose behind
# `docker-compose`, the SDK in its own venv (bin/sdk-venv.sh; never in .venv, its pins conflict with TensorFlow's).
#   make sdk-local-demo                                   # MNIST on 2 local containers, prints the latencies
#   make sdk-local-demo SDK_DEMO_ARGS='--epochs 2 --steps-per-epoch 100'
.PHONY: sdk-venv sdk-local-demo notebooks

SDK_DIR ?= $(REPO)/build/sdk
SDK_DEMO_ARGS ?=
SDK_IMAGE_NAME ?= sagemaker-horovod
SDK_BASE_IMAGE ?= localhost/debian:bookworm

sdk-venv: ## the SDK v2 venv and the docker/docker-compose shims (build/sdk)
	bash bin/sdk-venv.sh --install $(SDK_DIR)

# The image is rebuilt through the layer cache every time (about a minute warm): it must hold the current src/.
sdk-local-demo: ## SDK v2 local mode: TensorFlow(image_uri=our CPU image, instance_count=2, distribution=mpi).fit()
	engine_env=$$(bash bin/daemonless-env.sh --install --export); eval "$$engine_env"; \
	bash bin/make-base-image.sh --tag $(SDK_BASE_IMAGE); \
	mkdir -p $(IMAGE_REFS_DIR); \
	bash bin/build.sh --engine buildah --name $(SDK_IMAGE_NAME) --base-image $(SDK_BASE_IMAGE) cpu \
	  | tee $(IMAGE_REFS_DIR)/cpu.refs; \
	sdk=$$(bash bin/sdk-venv.sh --install $(SDK_DIR)); eval "$$sdk"; \
	PATH="$$SHIMS:$$PATH" "$$PYTHON" examples/sdk_local_demo.py --image "$$(head -n 1 $(IMAGE_REFS_DIR)/cpu.refs | cut -d ' ' -f 1)" \
	  --work $(REPO)/build/sdk-local-demo $(SDK_DEMO_ARGS)

# Both notebooks (examples/notebooks), SDK v2 then v3, each in a Jupyter kernel of its SDK's venv, in local mode:
# no AWS account, region or network. NOTEBOOKS_ARGS: see bin/run-notebooks.sh -h (e.g. --image REF).
NOTEBOOKS_ARGS ?=
notebooks: ## run both notebooks in local mode (SDK venvs + kernel, the CPU image, 2 containers); build/notebooks
	bash bin/run-notebooks.sh $(NOTEBOOKS_ARGS)
