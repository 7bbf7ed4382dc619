"""vLLM's logprob_token_ids through the official ``openai`` client: each token's top_logprobs
are the sampled token's and the tracked ids' (in their order), with the offline engine's
values; misuse is a 400 naming the field."""

from __future__ import annotations

import math

import openai
import pytest

from cadence import SamplingParams

PROMPT = "The garden was"
MSG = [{"role": "user", "content": "Tell me about the garden."}]


def _tracked(server) -> list[int]:
    """Three ids whose texts differ (completions key top_logprobs by text)."""
    tok = server.engine.tokenizer
    seen: dict[str, int] = {}
    for t in (40, 41, 57, 66, 71, 80, 97):
        seen.setdefault(tok.decode([t]), t)
    return list(seen.values())[:3]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_completions_show_the_sampled_token_then_the_tracked_ids(server, client, offline,
                                                                 stream: bool) -> None:
    ids = _tracked(server)
    extra = {"ignore_eos": True, "logprob_token_ids": ids, "return_token_ids": True}
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0.0, logprobs=0)
    if stream:
        tokens, rows = [], []
        for chunk in client.completions.create(**kw, stream=True, extra_body=extra):
            c = chunk.choices[0]
            tokens += getattr(c, "token_ids", None) or []
            rows += (c.logprobs.top_logprobs if c.logprobs else None) or []
    else:
        c = client.completions.create(**kw, extra_body=extra).choices[0]
        tokens, rows = c.token_ids, c.logprobs.top_logprobs  # type: ignore[attr-defined]
    want = offline.generate([PROMPT], SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, logprob_token_ids=ids),
        use_tqdm=False)[0].outputs[0]
    assert tokens == want.token_ids and len(rows) == 6
    for row, want_row in zip(rows, want.logprobs):
        assert list(row) == [lp.decoded_token for lp in want_row.values()]
        assert all(math.isclose(v, lp.logprob, abs_tol=1e-4)
                   for v, lp in zip(row.values(), want_row.values()))


def test_chat_lists_every_tracked_id_whatever_top_logprobs_says(server, client) -> None:
    ids = _tracked(server)
    out = client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=5, temperature=0.0, logprobs=True,
        top_logprobs=1, extra_body={"ignore_eos": True, "logprob_token_ids": ids,
                                    "return_token_ids": True})
    choice = out.choices[0]
    content = choice.logprobs.content
    tok = server.engine.tokenizer
    assert len(content) == 5
    for sampled, entry in zip(choice.token_ids, content):  # type: ignore[attr-defined]
        # The sampled token, then the tracked ids (a tracked sampled token only once).
        expected = [tok.decode([t]) for t in dict.fromkeys([sampled, *ids])]
        assert [t.token for t in entry.top_logprobs] == expected
        assert entry.top_logprobs[0].logprob == entry.logprob


@pytest.mark.parametrize("body, param", [
    ({"logprob_token_ids": [1, 2]}, "logprob_token_ids"),  # chat without logprobs
    ({"logprobs": True, "logprob_token_ids": []}, "logprob_token_ids"),
    ({"logprobs": True, "logprob_token_ids": [10 ** 9]}, "logprob_token_ids"),
    ({"logprobs": True, "logprob_token_ids": list(range(129))}, "logprob_token_ids"),
    ({"logprobs": True, "logprob_token_ids": [1], "use_beam_search": True, "n": 2},
     "logprob_token_ids"),
])
def test_chat_misuse_is_a_400_naming_the_field(client, body, param) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2,
                                       extra_body=body)
    assert err.value.body["param"] == param  # type: ignore[index]


@pytest.mark.parametrize("body, param", [
    ({"logprob_token_ids": [1, 2]}, "logprob_token_ids"),  # without logprobs
    ({"logprobs": 1, "logprob_token_ids": [1], "echo": True}, "logprob_token_ids"),
    ({"logprobs": 0, "logprob_token_ids": [-1]}, "logprob_token_ids"),
    ({"logprobs": 2, "logprob_token_ids": []}, "logprob_token_ids"),  # vLLM: min_length 1
    ({"logprobs": 2, "logprob_token_ids": [], "use_beam_search": True, "n": 2},
     "logprob_token_ids"),
])
def test_completions_misuse_is_a_400_naming_the_field(client, body, param) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, extra_body=body)
    assert err.value.body["param"] == param  # type: ignore[index]
