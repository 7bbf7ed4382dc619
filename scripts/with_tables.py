"""Run the cadence CLI with the bulk kernels' tables extended from the JSON files the sweep
scripts write: a table's candidate entries measured in a whole decode step before they are
committed.

    python scripts/with_tables.py TABLE.json [TABLE.json ...] bench latency --model llama3-8b ...
    python scripts/with_tables.py TABLE.json [...] scripts/kernel_profile.py --decode-batch 8 ...

A file from ``bulk_gemv_bench.py --json`` (``{"weights": "bf16" | "fp8", "table": [...]}``)
goes into ``BULK_CONFIGS`` or ``BULK_FP8_CONFIGS``; one from ``bulk_mma_bench.py --json``
(``[[n, k, mode, wtype, rows, [rows, kc, stages, threads, padded]], ...]``) into
``MMA_CONFIGS``. Entries replace the committed ones of the same key; the arguments after the
files are the CLI's, or a Python script's path and its arguments.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadence.model import bulk_gemv, bulk_mma  # noqa: E402


def load(path: str) -> int:
    """Put the file's entries into their table; how many."""
    spec = json.loads(Path(path).read_text())
    if isinstance(spec, dict):
        if spec.get("weights") not in ("bf16", "fp8"):
            raise ValueError(f"weights must be 'bf16' or 'fp8', got {spec.get('weights')!r}")
        table = bulk_gemv.BULK_FP8_CONFIGS if spec["weights"] == "fp8" else bulk_gemv.BULK_CONFIGS
        for e in spec["table"]:
            table[(e["n"], e["k"], e["mode"])] = bulk_gemv.BulkConfig(
                e["rows"], e["stages"], e["threads"], e.get("hw_cvt", False))
        return len(spec["table"])
    for n, k, mode, wtype, rows, cfg in spec:
        bulk_mma.MMA_CONFIGS[(n, k, mode, wtype, rows)] = bulk_mma.MmaConfig(*cfg)
    return len(spec)


def main(argv: list[str]) -> int:
    files = []
    while argv and argv[0].endswith(".json"):
        files.append(argv.pop(0))
    if not files:
        print(__doc__, file=sys.stderr)
        return 2
    for path in files:
        try:
            count = load(path)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
            # NOTE: json.JSONDecodeError is a ValueError; a bad entry raises one of the others.
            print(f"{path}: not a table file the sweeps write ({type(err).__name__}: {err})",
                  file=sys.stderr)
            return 2
        print(f"{path}: {count} entries", flush=True)
    if argv and argv[0].endswith(".py"):
        sys.argv = list(argv)
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as done:
            return done.code if isinstance(done.code, int) else 0
        return 0
    from cadence.cli import main as cli

    return cli(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
