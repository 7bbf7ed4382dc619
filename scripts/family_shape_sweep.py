"""Greedy parity over unusual shapes of every family: cadence in float32 (CUDA graphs, eager
and 16-token chunks; each batch run twice, the second through the prefix cache) against
transformers' greedy tokens on random checkpoints built here (head sizes 24-256, MQA, odd
head counts, windows of 3-100 tokens, soft caps, yarn, longrope, partial rotation, MoE
routing variants). Prints one line a configuration and a summary; on the GPU it exercises the
Triton kernels at those shapes, on the CPU the torch path.

    python3 scripts/family_shape_sweep.py [NAME-FRAGMENT ...]
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
import traceback

import torch
import transformers

VOCAB = 301
NEW = 20
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    ps = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (5, 17, 33, 70, 8, 130)]
    pre = [rng.randrange(3, VOCAB) for _ in range(40)]
    ps += [pre + [rng.randrange(3, VOCAB) for _ in range(n)] for n in (3, 9)]
    return ps


def build(cls_name: str, path: str, seed: int = 0, **fields: object
          ) -> transformers.PreTrainedModel:
    kw = {**BASE, **fields}
    cfg = getattr(transformers, cls_name)(**kw)
    cfg._attn_implementation = "eager"
    if "Moe" in cls_name:
        cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    gemma = "Gemma" in cls_name
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if gemma:
                p.copy_((0.5 if "norm" in name else 0.02 if "embed" in name else 0.3) * noise)
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.2 * noise)
            else:
                p.copy_(0.15 * noise)
    model.save_pretrained(path)
    kw2 = {"experts_implementation": "eager"} if "Moe" in cls_name else {}
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", **kw2).eval()


def hf_greedy(model: transformers.PreTrainedModel, ps: list[list[int]]) -> list[list[int]]:
    model.generation_config.eos_token_id = None
    sc = getattr(model.config, "rope_parameters", None) or {}
    use_cache = not (isinstance(sc, dict) and sc.get("rope_type") == "longrope")
    out = []
    for p in ps:
        ids = torch.tensor([p])
        with torch.no_grad():
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None,
                               pad_token_id=0, use_cache=use_cache)
        out.append(g[0, len(p):].tolist())
    return out


def run_cadence(path: str, ps: list[list[int]], **kw: object
                ) -> tuple[list[list[int]], list[list[int]]]:
    from cadence import LLM, SamplingParams
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32", max_model_len=512,
              max_num_seqs=8, **kw)
    sp = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    a = [list(o.outputs[0].token_ids) for o in
         llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False)]
    b = [list(o.outputs[0].token_ids) for o in
         llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False)]
    llm.shutdown()
    del llm
    torch.cuda.empty_cache()
    return a, b


def first_diff(e: list[int], g: list[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(e, g)) if x != y), min(len(e), len(g)))


CONFIGS = [
    ("llama hd24", "LlamaConfig", dict(hidden_size=96, head_dim=24)),
    ("llama hd40 mqa", "LlamaConfig", dict(hidden_size=80, num_attention_heads=2,
                                           num_key_value_heads=1, head_dim=40)),
    ("llama hd48 6/3 heads", "LlamaConfig", dict(hidden_size=96, num_attention_heads=6,
                                                 num_key_value_heads=3, head_dim=48)),
    ("llama hd80 5/5 heads", "LlamaConfig", dict(hidden_size=80, num_attention_heads=5,
                                                 num_key_value_heads=5, head_dim=80)),
    ("llama hd96", "LlamaConfig", dict(hidden_size=192, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=96)),
    ("llama hd256", "LlamaConfig", dict(hidden_size=256, num_attention_heads=2,
                                        num_key_value_heads=1, head_dim=256)),
    ("llama bias yarn", "LlamaConfig", dict(attention_bias=True, mlp_bias=True,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})),
    ("llama 8 kv of 8, hidden 72", "LlamaConfig", dict(hidden_size=72, num_attention_heads=8,
        num_key_value_heads=8, head_dim=9 * 2, intermediate_size=100)),
    ("qwen2 window 8", "Qwen2Config", dict(use_sliding_window=True, sliding_window=8,
                                           max_window_layers=0)),
    ("qwen3 hd40", "Qwen3Config", dict(hidden_size=64, head_dim=40)),
    ("qwen3 window 5", "Qwen3Config", dict(use_sliding_window=True, sliding_window=5,
                                           max_window_layers=1, head_dim=16)),
    ("qwen3moe 6e top2 i37", "Qwen3MoeConfig", dict(num_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=37, head_dim=16)),
    ("qwen3moe top1 nonorm step2", "Qwen3MoeConfig", dict(num_experts=5, num_experts_per_tok=1,
        moe_intermediate_size=24, norm_topk_prob=False, decoder_sparse_step=2, head_dim=16,
        num_hidden_layers=3)),
    ("qwen3moe all experts", "Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=4,
        moe_intermediate_size=32, head_dim=16, mlp_only_layers=[1])),
    ("mistral window 8 hd24", "MistralConfig", dict(sliding_window=8, hidden_size=96,
                                                    head_dim=24)),
    ("mistral window 3", "MistralConfig", dict(sliding_window=3)),
    ("mistral window 100", "MistralConfig", dict(sliding_window=100)),
    ("gemma2 caps q100 hd24", "Gemma2Config", dict(query_pre_attn_scalar=100, head_dim=24,
        hidden_size=96, sliding_window=8, attn_logit_softcapping=30.0,
        final_logit_softcapping=20.0, num_hidden_layers=3)),
    ("gemma2 no caps hd32", "Gemma2Config", dict(head_dim=32, sliding_window=16,
        attn_logit_softcapping=None, final_logit_softcapping=None)),
    ("gemma3 hd24 pattern", "Gemma3TextConfig", dict(head_dim=24, hidden_size=96,
        sliding_window=8, num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"])),
    ("gemma3 hd256", "Gemma3TextConfig", dict(head_dim=256, hidden_size=128,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=16, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"])),
    ("phi3 partial 0.5 window 16", "Phi3Config", dict(partial_rotary_factor=0.5,
                                                      sliding_window=16)),
    ("phi3 longrope orig 32", "Phi3Config", dict(max_position_embeddings=512,
        original_max_position_embeddings=32,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                      "long_factor": [2.0 + 0.3 * i for i in range(8)]})),
    ("phi3 hd24 partial 0.75", "Phi3Config", dict(hidden_size=96, num_attention_heads=4,
        num_key_value_heads=4, partial_rotary_factor=0.75)),
]


def main() -> None:
    only = sys.argv[1:] if len(sys.argv) > 1 else None
    ps = prompts()
    results = []
    for name, cls, fields in CONFIGS:
        if only and not any(o in name for o in only):
            continue
        d = tempfile.mkdtemp(prefix="gfs_")
        t0 = time.time()
        try:
            model = build(cls, d, **fields)
            exp = hf_greedy(model, ps)
        except Exception as e:
            why = f"{type(e).__name__}: {str(e)[:200]}"
            print(f"=== {name}: SKIP (transformers: {why})", flush=True)
            results.append((name, "skip"))
            continue
        status = []
        for label, kw in (("graphs", {}), ("eager", {"enforce_eager": True}),
                          ("chunk16", {"max_num_batched_tokens": 16})):
            try:
                a, b = run_cadence(d, ps, **kw)
            except Exception as e:
                print(f"=== {name} [{label}] ERROR {type(e).__name__}: {str(e)[:400]}", flush=True)
                traceback.print_exc(limit=4)
                status.append(f"{label}:ERROR")
                continue
            bad = [(i, first_diff(e, g)) for i, (e, g) in enumerate(zip(exp, a)) if e != g]
            bad2 = [(i, first_diff(e, g)) for i, (e, g) in enumerate(zip(exp, b)) if e != g]
            if bad or bad2:
                status.append(f"{label}:MISMATCH{bad[:4]}/{bad2[:4]}")
                i = (bad or bad2)[0][0]
                got = (a if bad else b)[i]
                print(f"=== {name} [{label}] prompt {i} len {len(ps[i])}\n hf ={exp[i]}\n"
                      f" cad={got}", flush=True)
            else:
                status.append(f"{label}:ok")
        print(f"=== {name}: {' '.join(status)} ({time.time() - t0:.1f}s)", flush=True)
        results.append((name, " ".join(status)))
    print("\nSUMMARY")
    for name, st in results:
        print(f"{name:32s} {st}")


if __name__ == "__main__":
    main()
