"""`python -m bridge.cli`."""

import sys

from bridge.cli import main

sys.exit(main())
