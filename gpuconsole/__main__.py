"""`python -m gpuconsole`."""

import sys

from gpuconsole.cli import main

sys.exit(main())
