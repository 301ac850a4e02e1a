"""``python -m orchestrator``: the command line (see orchestrator/cli)."""

import sys

from orchestrator.cli import main

sys.exit(main())
