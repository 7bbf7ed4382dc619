"""Engine arguments for the built-in tiny model, shared by the engine and server tests."""

from __future__ import annotations

from cadence.engine.engine_args import EngineArgs


def tiny_args(**overrides) -> EngineArgs:
    """EngineArgs for the built-in tiny model, small and synchronous unless overridden."""
    base = dict(model="tiny", max_model_len=512, num_gpu_blocks_override=512,
                async_scheduling=False)
    base.update(overrides)
    return EngineArgs(**base)
