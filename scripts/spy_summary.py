"""Summarize a py-spy ``-f raw`` (collapsed stacks) recording: samples per thread and the
functions with the most own samples in each thread (``--gil`` recordings: lock time).

    python scripts/spy_summary.py spy.txt [--top 25]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--top", type=int, default=25)
    ns = p.parse_args()
    per_thread: Counter[str] = Counter()
    own: dict[str, Counter[str]] = defaultdict(Counter)
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    for line in open(ns.path):
        line = line.rstrip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        # "thread (tid): name" first (py-spy --threads), then the frames, outermost first.
        thread = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread") else "?"
        frames = frames[1:] if frames[0].startswith("thread") else frames
        n = int(count)
        per_thread[thread] += n
        leaf = frames[-1] if frames else "?"
        own[thread][_short(leaf)] += n
        for f in set(_short(f) for f in frames):
            inclusive[thread][f] += n
    total = sum(per_thread.values()) or 1
    for thread, n in per_thread.most_common():
        print(f"\n== {thread}: {n} samples ({100 * n / total:.1f}%)")
        print("  own:")
        for fn, c in own[thread].most_common(ns.top):
            print(f"  {100 * c / n:5.1f}%  {fn}")
        print("  inclusive:")
        for fn, c in inclusive[thread].most_common(ns.top):
            print(f"  {100 * c / n:5.1f}%  {fn}")
    return 0


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py:123)"
    return re.sub(r"\(([^()]*/)?([^/()]+)\)$", r"(\2)", frame.strip())


if __name__ == "__main__":
    raise SystemExit(main())
