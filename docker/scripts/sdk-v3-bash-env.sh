# shellcheck shell=bash
# The image's BASH_ENV: bash sources this file before the command of every non-interactive shell.
#
# SageMaker Python SDK v3's ModelTrainer(source_code=...) replaces the image's entrypoint with exactly the command
# below (sagemaker.train.constants.DEFAULT_CONTAINER_ARGUMENTS), which runs v3's own drivers. For that command
# only, run the launcher instead: `train` reads what v3 wrote to the sm_drivers channel (src/smhvd/config/sdk_v3.py) and
# runs the job with its own supervision, or hands the job back to v3's sm_train.sh for what it does not run
# (SourceCode.command, Torchrun). Every other shell is untouched.
#
# Only a `bash -c` shell sets BASH_EXECUTION_STRING itself (overriding any inherited value); in any other shell
# (`bash script.sh`) the variable is whatever a parent exported, so `c` in $- must say that this shell was
# started with -c before its value means anything.
if [[ $- == *c* && "${BASH_EXECUTION_STRING:-}" == "chmod +x /opt/ml/input/data/sm_drivers/sm_train.sh && /opt/ml/input/data/sm_drivers/sm_train.sh" ]]; then
  unset BASH_ENV
  exec train
fi
