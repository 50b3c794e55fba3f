"""`python -m zerotrain ...` (and `torchrun -m zerotrain train ...`) is the `zerotrain` command."""

import sys

from .cli import main

sys.exit(main())
