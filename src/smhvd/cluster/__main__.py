"""``python -m smhvd.cluster``: the same as the ``smhvd-cluster`` command."""

import sys

from smhvd.cluster.cli import main

sys.exit(main())
