# Reference script: Mask R-CNN (ResNet-FPN) on tensorpack with Horovod (examples/maskrcnn/), tests, benchmark.
#   make maskrcnn-demo MASKRCNN_DEMO_ARGS='--fresh --config "total_steps=600"'
.PHONY: maskrcnn-demo maskrcnn-shapes test-maskrcnn bench-maskrcnn

MASKRCNN_DEMO_ARGS ?= --fresh
MASKRCNN_BENCH_ARGS ?=

maskrcnn-demo: setup ## tiny Mask R-CNN on synthetic shapes through `train` (2 processes), then COCOeval (~3-6 min)
	$(PY) benchmarks/maskrcnn_demo.py $(MASKRCNN_DEMO_ARGS)

maskrcnn-shapes: setup ## synthetic COCO shapes in build/shapes/{train,val} (for your own runs)
	$(PY) examples/maskrcnn/make_shapes.py --out build/shapes/train --n 64 --seed 1
	$(PY) examples/maskrcnn/make_shapes.py --out build/shapes/val --n 16 --seed 2

test-maskrcnn: setup ## the Mask R-CNN tests only (unit <1 min; np=2 integration ~13 min on 2 loaded cores, 5 min CPU)
	$(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) tests/examples/maskrcnn

bench-maskrcnn: setup ## CPU s/step (tiny, coco) and an overfit run to bbox AP >= 0.5 on shapes (~17 min)
	$(PY) benchmarks/maskrcnn_bench.py $(MASKRCNN_BENCH_ARGS)

.PHONY: bench-maskrcnn-input
MASKRCNN_INPUT_ARGS ?=
bench-maskrcnn-input: setup ## input pipeline alone (decode, resize, flip, masks, anchor targets) on real JPEGs: images/s per core, cores for 8 GPUs (~1 min)
	$(PY) benchmarks/maskrcnn_input.py $(MASKRCNN_INPUT_ARGS)

# Inputs for trying a Mask R-CNN job locally in minutes (docs/tensorpack-example.md, docs/maskrcnn.md).
.PHONY: maskrcnn-tryout-inputs
TRYOUT_DIR ?= build/maskrcnn-tryout
maskrcnn-tryout-inputs: setup ## a tiny COCO 2017 layout + a stand-in of tensorpack's COCO model in build/maskrcnn-tryout (~5 s)
	rm -rf $(TRYOUT_DIR)/coco
	$(PY) examples/maskrcnn/make_coco2017.py --out $(TRYOUT_DIR)/coco
	$(PY) examples/maskrcnn/make_standin_weights.py --out $(TRYOUT_DIR)/pretrained/standin-COCO-R50FPN-MaskRCNN-Standard.npz
