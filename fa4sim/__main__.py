"""`python -m fa4sim ...`: the same command line as the `fa4sim` script (fa4sim/cli.py)."""
import sys

from .cli import main

sys.exit(main())
