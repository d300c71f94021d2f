"""``python -m feedline`` runs the command line."""

import sys

from feedline.cli.__main__ import main

sys.exit(main())
