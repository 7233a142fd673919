"""``python -m fedvlr_plus.cli ...``: the ``fedvlr-plus`` command."""

import sys

from .main import main

sys.exit(main())
