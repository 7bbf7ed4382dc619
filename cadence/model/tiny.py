"""The built-in ``tiny`` model: a deterministic random Qwen3-style checkpoint with a real
byte-level BPE tokenizer, written on first use as an ordinary HF directory.

The directory lives at ``$CADENCE_CACHE_DIR/tiny-v1`` (default ``~/.cache/cadence/tiny-v1``). It is
written into a temporary sibling and renamed into place, so readers only ever see a complete one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import Qwen3Config

from cadence.model.bpe import byte_symbols, learn_merges, symbol_bytes
from cadence.model.tiny_text import TINY_TEXT

TINY_DIR_NAME = "tiny-v1"
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 640  # 256 byte symbols + learned merges + the special tokens
WEIGHT_SEED = 20240601
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 2048,
}
_INIT_STD = 0.02
_EMBED_STD = 0.1
# Residual channel 0 is constant: every embedding sets it to _BIAS_CHANNEL_VALUE and no layer
# writes it (row 0 of o_proj and down_proj is zero). After the final norm it is positive, so
# column 0 of lm_head works as a per-token bias that favours printable tokens.
_BIAS_CHANNEL_VALUE = 0.4
_PRINTABLE_BIAS = 2.0
_PRINTABLE_STD = 0.2


def default_cache_root() -> Path:
    from cadence.envs import read_envs

    return Path(read_envs().cache_dir)


def ensure_tiny_model(cache_root: Path | None = None) -> Path:
    """The tiny model's directory, generating it first if it does not exist yet."""
    root = cache_root if cache_root is not None else default_cache_root()
    final = root / TINY_DIR_NAME
    if _is_complete(final):
        return final
    if final.exists():
        raise ValueError(f"{final} exists but is not a complete tiny model directory; remove it.")
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{TINY_DIR_NAME}-", dir=root))
    except OSError as exc:  # e.g. a file, or a read-only place, where the directory should be
        raise ValueError(f"cannot write the tiny model under {root} ({exc.strerror or exc}): "
                         "set CADENCE_CACHE_DIR to a writable directory.") from exc
    try:
        write_tiny_model(tmp)
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not _is_complete(final):  # not a lost race with another process: a real failure
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in REQUIRED_FILES)


def write_tiny_model(dest: Path) -> None:
    """Write the complete tiny model directory into ``dest`` (which must exist)."""
    tokenizer = build_tokenizer()
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    config = tiny_config(eos_id)
    config.save_pretrained(dest)
    _write_json(dest / "generation_config.json", {"eos_token_id": eos_id, "pad_token_id": eos_id})
    printable = printable_token_mask(tokenizer)
    save_file(tiny_weights(config, printable), str(dest / "model.safetensors"), {"format": "pt"})
    tokenizer.save(str(dest / "tokenizer.json"))
    _write_tokenizer_configs(dest, tokenizer, config.max_position_embeddings)


def tiny_config(eos_token_id: int) -> Qwen3Config:
    return Qwen3Config(
        architectures=["Qwen3ForCausalLM"],
        vocab_size=VOCAB_SIZE,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        attention_bias=False,
        hidden_act="silu",
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        dtype="float32",
        **_SHAPE,
    )


def build_tokenizer() -> Tokenizer:
    """Byte-level BPE: ids 0-255 are the bytes, then merges learned from TINY_TEXT, then the
    special tokens."""
    vocab = {symbol: i for i, symbol in enumerate(byte_symbols())}
    merges: list[tuple[str, str]] = []
    num_regular = VOCAB_SIZE - len(SPECIAL_TOKENS)
    for left, right in learn_merges(TINY_TEXT, num_regular):
        if len(vocab) == num_regular:
            break
        merges.append((left, right))
        vocab.setdefault(left + right, len(vocab))
    if len(vocab) != num_regular:
        raise RuntimeError(f"the tiny text yields only {len(vocab)} of {num_regular} tokens.")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    return tokenizer


def printable_token_mask(tokenizer: Tokenizer) -> torch.Tensor:
    """True for tokens that decode on their own to printable text (and for EOS)."""
    mask = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    specials = set(SPECIAL_TOKENS)
    for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
        if token in specials:
            mask[token_id] = token == EOS_TOKEN
            continue
        try:
            text = symbol_bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            continue
        mask[token_id] = all(ch.isprintable() or ch in "\n\t" for ch in text)
    return mask


def tiny_weights(config: Qwen3Config, printable: torch.Tensor) -> dict[str, torch.Tensor]:
    """HF-named float32 weights, drawn from one seeded generator in a fixed order."""
    gen = torch.Generator().manual_seed(WEIGHT_SEED)
    hidden, inter = config.hidden_size, config.intermediate_size
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim

    def normal(*shape: int, std: float = _INIT_STD) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    embed = normal(config.vocab_size, hidden, std=_EMBED_STD)
    embed[:, 0] = _BIAS_CHANNEL_VALUE
    weights = {"model.embed_tokens.weight": embed}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}"
        weights[f"{p}.input_layernorm.weight"] = torch.ones(hidden)
        weights[f"{p}.self_attn.q_proj.weight"] = normal(q_size, hidden)
        weights[f"{p}.self_attn.k_proj.weight"] = normal(kv_size, hidden)
        weights[f"{p}.self_attn.v_proj.weight"] = normal(kv_size, hidden)
        weights[f"{p}.self_attn.q_norm.weight"] = torch.ones(config.head_dim)
        weights[f"{p}.self_attn.k_norm.weight"] = torch.ones(config.head_dim)
        o_proj = normal(hidden, q_size)
        o_proj[0] = 0.0
        weights[f"{p}.self_attn.o_proj.weight"] = o_proj
        weights[f"{p}.post_attention_layernorm.weight"] = torch.ones(hidden)
        weights[f"{p}.mlp.gate_proj.weight"] = normal(inter, hidden)
        weights[f"{p}.mlp.up_proj.weight"] = normal(inter, hidden)
        down = normal(hidden, inter)
        down[0] = 0.0
        weights[f"{p}.mlp.down_proj.weight"] = down
    weights["model.norm.weight"] = torch.ones(hidden)
    lm_head = normal(config.vocab_size, hidden, std=_PRINTABLE_STD)
    lm_head[:, 0] = _PRINTABLE_BIAS
    lm_head[~printable] = 0.0
    weights["lm_head.weight"] = lm_head
    return {name: t.contiguous() for name, t in weights.items()}


def _write_tokenizer_configs(dest: Path, tokenizer: Tokenizer, max_length: int) -> None:
    added = {
        str(tokenizer.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    _write_json(
        dest / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": added,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None,
            "eos_token": EOS_TOKEN,
            "pad_token": EOS_TOKEN,
            "unk_token": None,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "model_max_length": max_length,
        },
    )
    _write_json(
        dest / "special_tokens_map.json",
        {
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "eos_token": EOS_TOKEN,
            "pad_token": EOS_TOKEN,
        },
    )


def _write_json(path: Path, value: object) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")
