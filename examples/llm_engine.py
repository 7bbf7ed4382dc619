"""The engine stepped by hand (vLLM's ``LLMEngine``): requests with different sampling
parameters go in as they arrive, each ``step()`` hands out what it produced, one request is
aborted midway.

    python examples/llm_engine.py                       # the built-in tiny model
    python examples/llm_engine.py --model MODEL_DIR --device cuda   # any engine argument
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadence import EngineArgs, LLMEngine, RequestOutputKind, SamplingParams  # noqa: E402

REQUESTS = [
    ("A robin is", SamplingParams(temperature=0.0, max_tokens=12)),
    ("To be or not to be,", SamplingParams(temperature=0.8, top_k=5, seed=1, max_tokens=12)),
    ("What is the meaning of life?", SamplingParams(n=2, temperature=0.8, seed=2, max_tokens=12,
                                                    output_kind=RequestOutputKind.FINAL_ONLY)),
    # A long answer (never cut short by an end-of-text token), aborted after 5 tokens.
    ("It is only with the heart", SamplingParams(temperature=0.0, max_tokens=200,
                                                 ignore_eos=True)),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    EngineArgs.add_cli_args(parser)
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(parser.parse_args()))
    pending = list(enumerate(REQUESTS))
    steps = 0
    try:
        while pending or engine.has_unfinished_requests():
            if pending:  # one new request a step, as if they arrived over time
                i, (prompt, params) = pending.pop(0)
                engine.add_request(str(i), prompt, params)
            for out in engine.step():
                if out.request_id == "3" and len(out.outputs[0].token_ids) >= 5:
                    engine.abort_request(["3"])
                    print(f"request 3 aborted after {len(out.outputs[0].token_ids)} tokens")
                if out.finished:
                    for choice in out.outputs:
                        print(f"request {out.request_id} choice {choice.index} "
                              f"({choice.finish_reason}): {out.prompt!r} -> {choice.text!r}")
            steps += 1
    finally:
        engine.shutdown()
    print(f"{steps} steps, llm engine example ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
