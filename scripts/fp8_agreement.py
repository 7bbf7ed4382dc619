"""Top-1 agreement of FP8 weights with bf16 and float32, teacher-forced, on test_fp8's random
unit-gain models (CPU: FP8 is float32 arithmetic over the e4m3 weights, so only the weights'
rounding counts; CUDA: the FP8 kernels as served).

    python scripts/fp8_agreement.py [--family qwen3] [--seeds 0,1,2] [--steps 256]
        [--device cpu]

Per seed: the float32 model's greedy continuation of a prompt is fed to every variant; prints
each variant's top-1 agreement with float32 (and FP8's with bf16) over the steps, and the
reference's median gap between its top two logits in logit standard deviations (how flat the
next-token distribution is, which sets how many near ties rounding can swap).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from cadence.model.attention import TorchAttentionBackend
    from cadence.model.loader import build_model
    from cadence.model.registry import resolve_model
    from tests.model.helpers import save_hf_model
    from tests.model.test_fp8 import _decode, _prompts, unit_gain_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="qwen3")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--device", default="cpu")
    ns = p.parse_args()
    cuda = ns.device.startswith("cuda")
    if cuda:
        from cadence.model.triton_backend import TritonAttentionBackend

    def decode(model, prompt, forced, dtype):
        logits, fed = _decode(model, prompt, ns.steps, dtype, forced, ns.device)
        return logits.cpu(), fed

    def agree(a, b):
        return float((a.argmax(-1) == b.argmax(-1)).float().mean())

    for seed in [int(s) for s in ns.seeds.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            spec = resolve_model(str(save_hf_model(unit_gain_model(ns.family, seed), Path(tmp))))

            def load(dtype, quantization=None, spec=spec):
                backend = TritonAttentionBackend() if cuda else TorchAttentionBackend()
                return build_model(spec, dtype, ns.device, "auto", backend, 0,
                                   quantization=quantization)

            prompt = _prompts(5)[2]
            ref, tokens = decode(load(torch.float32), prompt, None, torch.float32)
            bf16, _ = decode(load(torch.bfloat16), prompt, tokens, torch.bfloat16)
            fp8_dtype = torch.bfloat16 if cuda else torch.float32
            fp8, _ = decode(load(fp8_dtype, "fp8"), prompt, tokens, fp8_dtype)
            top2 = ref.topk(2, dim=-1).values
            gap = float(((top2[:, 0] - top2[:, 1]) / ref.std(-1)).median())
            print(f"{ns.family} seed {seed}: bf16 vs float32 {agree(bf16, ref):.3f}, FP8 vs "
                  f"float32 {agree(fp8, ref):.3f}, FP8 vs bf16 {agree(fp8, bf16):.3f}; median "
                  f"top-two gap {gap:.2f} logit std", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
