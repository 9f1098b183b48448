import sys

from smhvd.cli import main

sys.exit(main())
