from __future__ import annotations

import sys

from cadence.cli import main

if __name__ == "__main__":  # not when a spawned engine-core process re-imports the main module
    sys.exit(main())
