"""``python -m orchestrator``: the command line (see orchestrator/cli)."""

import sys

from orchestrator.cli import run

sys.exit(run())
