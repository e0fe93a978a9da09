"""`python -m gpuconsole`."""

import sys

from gpuconsole.cli.main import main

sys.exit(main())
