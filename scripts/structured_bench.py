"""What structured outputs cost a decode step: a batch of requests generating under a grammar
against the same batch unconstrained (prints both and the ratio).

    python scripts/structured_bench.py --model qwen3-0.6b --load-format dummy --batch 32
"""

from __future__ import annotations

import argparse
import time

from cadence import LLM, SamplingParams
from cadence.bench.common import random_prompts
from cadence.sampling_params import StructuredOutputsParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--tokenizer", default="tiny", help="grammars need a tokenizer")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    # A grammar with no end: the stop token is never allowed, so every row stays under it for
    # the whole run.
    p.add_argument("--grammar", default="root ::= [a-z ] root",
                   help="EBNF grammar of every constrained row")
    ns = p.parse_args()
    llm = LLM(model=ns.model, load_format=ns.load_format, tokenizer=ns.tokenizer,
              max_model_len=ns.input_len + ns.output_len + 16, max_num_seqs=ns.batch)
    prompts = [{"prompt_token_ids": t} for t in
               random_prompts(ns.batch, ns.input_len, llm.engine_core.vocab_size)]
    spec = StructuredOutputsParams(grammar=ns.grammar)
    results = {}
    host = _time_mask_fill()
    for name, so in (("free", None), ("grammar", spec), ("free", None), ("grammar", spec)):
        params = SamplingParams(temperature=1.0, seed=1, max_tokens=ns.output_len,
                                ignore_eos=True, structured_outputs=so)
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        results[name] = (elapsed, tokens)  # the second (warm) round of each counts
        if name == "grammar":
            fill_ms = host["s"] / max(host["calls"], 1) * 1e3
            host.update(s=0.0, calls=0)
    free, grammar = results["free"], results["grammar"]
    ms = {k: v[0] / ns.output_len * 1e3 for k, v in results.items()}
    print(f"batch {ns.batch}, {ns.output_len} tokens each: unconstrained {ms['free']:.3f} ms "
          f"per step ({free[1]} tokens), every row under a grammar {ms['grammar']:.3f} ms "
          f"({grammar[1]} tokens); ratio {ms['grammar'] / ms['free']:.3f}; host time of the "
          f"masks {fill_ms:.3f} ms per step (accept + fill + staging, overlapping the forward)")


def _time_mask_fill() -> dict:
    """Accumulate the host time of GrammarState.bitmask (the whole per-step grammar work)."""
    from cadence.worker.grammar import GrammarState

    acc = {"s": 0.0, "calls": 0}
    original = GrammarState.bitmask

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            acc["s"] += time.perf_counter() - start
            acc["calls"] += 1

    GrammarState.bitmask = timed
    return acc


if __name__ == "__main__":
    main()
