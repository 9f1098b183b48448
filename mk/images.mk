# Container images: build, push (ECR or any registry), run locally as SageMaker would, and the image test tier.
# Engine: ENGINE=docker|podman|buildah; by default docker when its daemon answers `docker info`, else podman with
# the project's store (bin/lib/engine.sh; docs/images.md, "Which engine, which store"). Each script says which.
#   make image-cpu                          # -> build/images/cpu.refs: NAME:cpu-GITSHA and NAME:cpu
#   make image-push FLAVOR=cpu              # to ECR (AWS CLI credentials), or PUSH_ARGS='--registry HOST'
#   make registry REGISTRY_PORT=5010        # a registry on 127.0.0.1:5010: PUSH_ARGS='--registry 127.0.0.1:5010'
#   make local-train IMAGE=sagemaker-horovod:cpu LOCAL_TRAIN_ARGS='--source DIR --entry-point x.py'

.PHONY: image-cpu image-gpu image-push local-train base-image test-images test-images-gpu registry registry-stop

ENGINE ?=
IMAGE_NAME ?= sagemaker-horovod
FLAVOR ?= cpu
BUILD_ARGS ?=
PUSH_ARGS ?=
LOCAL_TRAIN_ARGS ?=
IMAGE ?= $(IMAGE_NAME):$(FLAVOR)
IMAGE_REFS_DIR := $(REPO)/build/images
_engine_opt = $(if $(ENGINE),--engine $(ENGINE))

image-cpu: ## build the CPU image (ENGINE, IMAGE_NAME, BUILD_ARGS='--base-image REF --no-cache ...')
	$(call _build,cpu)

image-gpu: ## build the GPU image (CUDA 12 + NCCL from NVIDIA's wheels; builds without a GPU)
	$(call _build,gpu)

define _build
	mkdir -p $(IMAGE_REFS_DIR)
	bash bin/build.sh $(_engine_opt) --name $(IMAGE_NAME) $(BUILD_ARGS) $(1) | tee $(IMAGE_REFS_DIR)/$(1).refs
endef

image-push: ## push the last `make image-$(FLAVOR)` to ECR (PUSH_ARGS='--registry HOST' to push elsewhere)
	test -s $(IMAGE_REFS_DIR)/$(FLAVOR).refs || { echo "run 'make image-$(FLAVOR)' first" >&2; exit 2; }
	bash bin/push.sh $(_engine_opt) $(PUSH_ARGS) $$(cat $(IMAGE_REFS_DIR)/$(FLAVOR).refs)

REGISTRY_PORT ?= 5000
registry: ## start a registry on 127.0.0.1:REGISTRY_PORT (plain HTTP, trusted by the project's podman config)
	bash bin/local-registry.sh --port $(REGISTRY_PORT) $(if $(CI),--install)

registry-stop: ## stop the registry of `make registry` on REGISTRY_PORT (its data stays in build/registry)
	bash bin/local-registry.sh --port $(REGISTRY_PORT) --stop

local-train: ## run IMAGE as a one-host SageMaker job on a fresh /opt/ml (LOCAL_TRAIN_ARGS: see bin/local-train.sh -h)
	bash bin/local-train.sh $(_engine_opt) $(LOCAL_TRAIN_ARGS) $(IMAGE)

base-image: ## debootstrap a Debian bookworm base image into podman's store (localhost/debian:bookworm)
	eval "$$(bash bin/daemonless-env.sh --export $(if $(CI),--install))"; bash bin/make-base-image.sh

test-images: setup ## the image tier only: CPU and GPU builds, run, push/pull, docker CLI (SMHVD_SKIP_GPU_IMAGE=1: CPU only)
	$(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) tests/images

test-images-gpu: setup ## build and check the GPU image only (about 4 GB of NVIDIA wheels)
	$(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) tests/images/test_gpu_image.py

