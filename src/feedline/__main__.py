"""``python -m feedline`` runs the command line."""

import sys

from feedline._cli.__main__ import main

sys.exit(main())
