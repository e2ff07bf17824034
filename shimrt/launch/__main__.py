"""python -m shimrt.launch: see shimrt.launch."""

import sys

from . import main

sys.exit(main())
