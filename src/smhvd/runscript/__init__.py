"""The script runner: run.py, run by its path under each rank (see run.py for why not with `-m`). This folder
holds nothing else, as it is first on sys.path while the runner starts."""
