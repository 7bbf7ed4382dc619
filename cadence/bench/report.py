"""How a benchmark reports: a readable table by default, JSON on request (``--json`` prints it,
``--json-out FILE`` writes it), progress on stderr, a roofline only where the device's read
bandwidth is known (measured here for the H200, or given with ``--bandwidth``)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from tqdm import tqdm

# Measured read bandwidth (bytes/s) of devices this project has run on, by a name fragment.
MEASURED_BANDWIDTH = {"H200": 4.11e12}


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (a rate, a bandwidth, FLOP/s)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def output_file(text: str) -> str:
    """A file a benchmark writes when it is done: checked when the arguments are read, so that
    a directory or a missing folder is refused before the run, not after it. A file that
    exists (``/dev/stdout`` too) needs only to be writable itself."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file name")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.exists(text) and not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"no directory {folder!r} for {text!r}")
    # NOTE: tried, not asked (os.access says yes to root for read-only mounts and /proc): an
    # existing file is opened to append nothing, a new one made and removed again.
    try:
        if os.path.exists(text):
            with open(text, "a"):
                pass
        else:
            with open(text, "x"):
                pass
            os.unlink(text)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {exc.strerror or exc}"
                                         ) from None
    return text


def made_output_file(flag: str, path: str) -> None:
    """``output_file``'s check for a file whose folder the command makes (a trace's): the
    folder is made now, before the run; a ValueError names ``flag``."""
    if not os.path.isdir(path):
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except OSError as exc:
            raise ValueError(f"{flag} {path!r}: {exc.strerror or exc}") from None
    try:
        output_file(path)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{flag}: {exc}") from None


# What matplotlib's Agg, PDF, SVG and PS backends write (checked before a run, not after it).
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".eps", ".ps", ".jpg", ".jpeg", ".tif",
                 ".tiff", ".webp", ".avif", ".gif", ".pgf", ".raw", ".rgba")


def plot_file(text: str) -> str:
    """``output_file`` for a plot: matplotlib writes a name without a suffix as NAME.png; a
    suffix it cannot write is refused at once."""
    suffix = os.path.splitext(text)[1].lower()
    if suffix and suffix not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"cannot plot to {suffix!r} files; use one of {', '.join(PLOT_SUFFIXES)} "
            "(or no suffix: .png)")
    output_file(text if suffix else text + ".png")
    return text


def add_report_args(p: argparse.ArgumentParser, bandwidth: bool = False) -> None:
    p.add_argument("--json", action="store_true",
                   help="print the record as one JSON line instead of a table")
    p.add_argument("--json-out", default=None, metavar="FILE", type=output_file,
                   help="also write the record here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    if bandwidth:
        p.add_argument("--bandwidth", type=bandwidth_arg, default=None, metavar="BYTES_PER_S",
                       help="read bandwidth for the roofline (default: the measured one of a "
                       "known device, else no roofline; 'none': no roofline)")


def bandwidth_arg(text: str) -> float:
    """``--bandwidth``: bytes/s, or ``none`` (0.0: no roofline, even on a known device)."""
    return 0.0 if text.strip().lower() == "none" else positive_float(text)


def read_bandwidth(given: float | None, device: str) -> float | None:
    """The bandwidth for the roofline: ``given`` (``--bandwidth``; 0.0 for ``none``: no
    roofline), else a measured one for ``device``."""
    if given is not None:
        return given or None
    return next((bw for name, bw in MEASURED_BANDWIDTH.items() if name in device), None)


def progress(items: Iterable[Any], ns: argparse.Namespace, desc: str,
             total: int | None = None) -> Iterable[Any]:
    return tqdm(items, desc=desc, total=total, disable=ns.no_progress or ns.json,
                file=sys.stderr, leave=False, dynamic_ncols=True)


def fmt(value: Any) -> str:
    """A figure as a person reads it: ints whole, floats to 4 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows of figures as an aligned text table (columns: the keys, in first-seen order)."""
    cols: list[str] = []
    for row in rows:
        cols.extend(k for k in row if k not in cols and not isinstance(row[k], (list, dict)))
    cells = [[fmt(row.get(c)) for c in cols] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def emit(record: Any, ns: argparse.Namespace, rows: Sequence[dict[str, Any]],
         settings: dict[str, Any] | None = None) -> None:
    """Print ``record`` (a ``common.Record``) as a table of ``rows`` under a header, or as JSON;
    write its JSON to ``--json-out``."""
    line = record.dump()
    if ns.json:
        print(line, flush=True)
    else:
        print(f"{record.bench} · {record.model} · {record.device} · commit {record.commit} · "
              f"{record.date}")
        if settings:
            print(" · ".join(f"{k} {fmt(v)}" for k, v in settings.items()))
        print(table(rows), flush=True)
    if ns.json_out:
        with open(ns.json_out, "w") as f:
            f.write(line + "\n")
