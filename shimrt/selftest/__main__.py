"""python -m shimrt.selftest: see shimrt.selftest."""

import sys

from . import main

sys.exit(main())
