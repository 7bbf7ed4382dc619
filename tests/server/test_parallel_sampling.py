"""n > 1 through the official ``openai`` client: one choice per index, streamed or not, the same
choices either way (seeded), usage over every choice."""

from __future__ import annotations

import openai


def test_completions_n_with_several_prompts(client: openai.OpenAI) -> None:
    kw = dict(model="tiny", prompt=["Once upon a time", "The garden"], n=3, max_tokens=6,
              temperature=1.0, seed=11, extra_body={"ignore_eos": True})
    out = client.completions.create(**kw)
    assert sorted(c.index for c in out.choices) == list(range(6))
    texts = {c.index: c.text for c in out.choices}
    assert len(set(texts.values())) > 1
    assert out.usage.completion_tokens == 6 * 6
    streamed: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert streamed == texts
    assert finish == {i: "length" for i in range(6)}
    # Choice k of prompt i is the single request seeded seed + k.
    single = client.completions.create(**{**kw, "prompt": "The garden", "n": 1, "seed": 13})
    assert single.choices[0].text == texts[3 + 2]


def test_chat_n_streamed_and_not(client: openai.OpenAI) -> None:
    kw = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=5,
              temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    out = client.chat.completions.create(**kw)
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage.completion_tokens == 10
    contents: dict[int, str] = {}
    roles = []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.index)
            contents[c.index] = contents.get(c.index, "") + (c.delta.content or "")
    assert sorted(roles) == [0, 1]
    assert contents == {c.index: c.message.content for c in out.choices}
