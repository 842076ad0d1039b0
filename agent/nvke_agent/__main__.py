"""``python -m nvke_agent`` is the same as the ``nvke-agent`` console script."""

from __future__ import annotations

import sys

from nvke_agent.cli import main

sys.exit(main())
