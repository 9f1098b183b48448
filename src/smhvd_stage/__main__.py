import sys

from .coco import main

sys.exit(main())
