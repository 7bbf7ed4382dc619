"""Engine arguments for the built-in tiny model, shared by the engine and server tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cadence.engine.engine_args import EngineArgs


def tiny_args(**overrides) -> EngineArgs:
    """EngineArgs for the built-in tiny model, small and synchronous unless overridden."""
    base = dict(model="tiny", max_model_len=512, num_gpu_blocks_override=512,
                async_scheduling=False)
    base.update(overrides)
    return EngineArgs(**base)


def tiny_copy_with_generation_config(dest: Path, **fields: object) -> Path:
    """A copy of the tiny model at ``dest`` whose generation_config.json also sets ``fields``."""
    from cadence.model.tiny import ensure_tiny_model

    shutil.copytree(ensure_tiny_model(), dest)
    path = dest / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return dest


def tiny_copy_adding_a_bos(dest: Path) -> tuple[Path, int]:
    """A copy of the tiny model at ``dest`` whose tokenizer's post-processor puts a BOS
    (``<|im_start|>``) before every text it encodes with special tokens; and that BOS's id."""
    from cadence.model.tiny import ensure_tiny_model

    shutil.copytree(ensure_tiny_model(), dest)
    spec = json.loads((dest / "tokenizer.json").read_text())
    bos = next(t for t in spec["added_tokens"] if t["content"] == "<|im_start|>")
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [bos["id"]],
                                             "tokens": ["<|im_start|>"]}},
    }
    (dest / "tokenizer.json").write_text(json.dumps(spec))
    return dest, bos["id"]
