"""``python -m sidecar`` is ``llm-sidecar``."""

import sys

from .cli import main

sys.exit(main())
