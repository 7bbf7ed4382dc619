from __future__ import annotations

import sys

from cadence.cli import main

sys.exit(main())
