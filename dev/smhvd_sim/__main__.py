"""``python -m smhvd_sim``: the same as the ``smhvd-cluster`` command."""

import sys

from smhvd_sim.cli import main

sys.exit(main())
