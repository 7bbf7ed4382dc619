"""Server requests that leave temperature / top_p / top_k unset take the model's
generation-config defaults; fields a request sets win."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from cadence.model.tiny import ensure_tiny_model


@pytest.fixture
def greedy_by_default(tmp_path: Path) -> Path:
    model = tmp_path / "tiny-greedy"
    shutil.copytree(ensure_tiny_model(), model)
    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**gen, "temperature": 0.0}))
    return model


def test_server_requests_without_sampling_fields_use_the_defaults(
    greedy_by_default: Path, server_factory
) -> None:
    srv = server_factory(model=str(greedy_by_default))
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        def tokens(extra: dict) -> list[int]:
            body = {"prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": True,
                    "return_token_ids": True, **extra}
            resp = http.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            return resp.json()["choices"][0]["token_ids"]

        greedy = tokens({"temperature": 0.0})
        assert tokens({}) == greedy and tokens({}) == greedy  # greedy by default
        hot = {tuple(tokens({"temperature": 1.5, "seed": s})) for s in range(4)}
        assert len(hot) > 1  # an explicit temperature still wins
