"""``python -m dpsql``: the ``dpsql`` command line."""

import sys

from dpsql.cli import main

sys.exit(main())
