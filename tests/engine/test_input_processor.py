from __future__ import annotations

import enum

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from cadence.engine.input_processor import InputProcessor, InputValidationError
from cadence.sampling_params import SamplingParams
from tests.tokenizers_helper import byte_level_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return byte_level_tokenizer(
        ["hello world, hello there"], vocab_size=280, special_tokens=["<|eos|>", "<|end|>"]
    )


def _proc(tokenizer: PreTrainedTokenizerFast | None, **kw: object) -> InputProcessor:
    args: dict[str, object] = {"vocab_size": 280, "max_model_len": 64, "eos_token_ids": [0, 1]}
    args.update(kw)
    return InputProcessor(tokenizer, **args)  # type: ignore[arg-type]


def test_text_prompt(tokenizer: PreTrainedTokenizerFast) -> None:
    params = SamplingParams(max_tokens=5, stop_token_ids=[9])
    req, text = _proc(tokenizer).process("r1", "hello world", params, arrival_time=3.0, priority=2)
    assert text == "hello world"
    assert req.prompt_token_ids == tokenizer.encode("hello world")
    assert req.request_id == "r1" and req.arrival_time == 3.0 and req.priority == 2
    assert req.eos_token_id == 0
    assert req.sampling_params.all_stop_token_ids == {0, 1, 9}
    assert req.sampling_params.max_tokens == 5
    # The caller's params are untouched.
    assert params.all_stop_token_ids == {9}
    assert req.sampling_params is not params


def test_token_and_dict_prompts(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = _proc(tokenizer)
    req, text = proc.process("a", {"prompt_token_ids": [3, 4, 5]}, SamplingParams())
    assert req.prompt_token_ids == [3, 4, 5] and text is None
    req, text = proc.process("b", {"prompt": "hello"}, SamplingParams())
    assert text == "hello" and req.prompt_token_ids == tokenizer.encode("hello")
    # Ids with their text (vLLM's TokensPrompt with "prompt"): the ids are used, the text kept.
    req, text = proc.process("c", {"prompt_token_ids": [3, 4], "prompt": "xy"}, SamplingParams())
    assert req.prompt_token_ids == [3, 4] and text == "xy"
    # numpy's integers, and 1-D arrays and tensors of ids, are ids too (as Python ints).
    import numpy as np
    import torch

    for ids in ([np.int64(3), np.int32(4)], np.array([3, 4]), torch.tensor([3, 4])):
        req, _ = proc.process("d", {"prompt_token_ids": ids}, SamplingParams())
        assert req.prompt_token_ids == [3, 4] and all(type(t) is int for t in req.prompt_token_ids)


def test_cache_salt_is_a_non_empty_string(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = _proc(tokenizer)
    req, _ = proc.process("a", {"prompt": "hi", "cache_salt": "s"}, SamplingParams())
    assert req.cache_salt == "s"
    req, _ = proc.process("b", {"prompt": "hi", "cache_salt": None}, SamplingParams())
    assert req.cache_salt is None
    for bad in ("", 7):
        with pytest.raises(InputValidationError, match="non-empty string") as info:
            proc.process("c", {"prompt_token_ids": [3], "cache_salt": bad}, SamplingParams())
        assert info.value.parameter == "cache_salt"


def test_ignore_eos_keeps_only_stop_token_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    """ignore_eos: the end ids stop nothing (only the request's own stop_token_ids), yet
    min_tokens still holds them back: vLLM's update_from_generation_config puts them in
    all_stop_token_ids either way."""
    req, _ = _proc(tokenizer).process(
        "r", "hi", SamplingParams(ignore_eos=True, stop_token_ids=[7])
    )
    assert req.sampling_params.stop_token_ids == [7]
    assert req.sampling_params.all_stop_token_ids == {0, 1, 7}
    assert req.eos_token_id == 0


@pytest.mark.parametrize(("generation_ids", "primary", "stops"), [
    ([0, 1], 0, [1]),  # the tokenizer's end id is the config's first
    ([1, 0], 0, [1]),  # ... or not: the tokenizer's is still the primary one
    ([1], 0, [1]),  # the config does not list the tokenizer's: both end a request
    ([], 0, []),
])
def test_the_tokenizers_end_id_is_primary(tokenizer: PreTrainedTokenizerFast,
                                           generation_ids: list[int], primary: int,
                                           stops: list[int]) -> None:
    """vLLM: the tokenizer's eos_token_id is the request's eos_token_id (a finish without a
    stop_reason), the generation config's other end ids its stop_token_ids (stop_reason: the
    id). The fixture's tokenizer ends with id 0."""
    assert tokenizer.eos_token_id == 0
    req, _ = _proc(tokenizer, eos_token_ids=generation_ids).process(
        "r", "hi", SamplingParams(stop_token_ids=[7]))
    assert req.eos_token_id == primary
    assert req.sampling_params.stop_token_ids == [7, *stops]
    assert req.sampling_params.all_stop_token_ids == {primary, 7, *stops}


def test_without_a_tokenizer_the_configs_first_end_id_is_primary() -> None:
    req, _ = _proc(None, eos_token_ids=[5, 1]).process(
        "r", {"prompt_token_ids": [3]}, SamplingParams())
    assert req.eos_token_id == 5 and req.sampling_params.stop_token_ids == [1]


def test_max_tokens_none_resolves_to_the_rest_of_the_context(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    req, _ = _proc(tokenizer).process(
        "r", {"prompt_token_ids": [3] * 10}, SamplingParams(max_tokens=None)
    )
    assert req.sampling_params.max_tokens == 54
    # With a small KV cache the default is capped to what fits: (5 - 1) blocks * 4 tokens of
    # KV, for the prompt and every completion token but the last (never fed back).
    proc = _proc(tokenizer, num_kv_blocks=5, block_size=4)
    req, _ = proc.process("r", {"prompt_token_ids": [3] * 10}, SamplingParams(max_tokens=None))
    assert req.sampling_params.max_tokens == 7
    req, _ = proc.process("r", {"prompt_token_ids": [3] * 16}, SamplingParams(max_tokens=1),
                          strict_max_tokens=True)
    assert req.sampling_params.max_tokens == 1  # a full cache, one token sampled
    with pytest.raises(InputValidationError, match="at most 1 ") as info:
        proc.process("r", {"prompt_token_ids": [3] * 16}, SamplingParams(max_tokens=2),
                      strict_max_tokens=True)
    assert info.value.parameter == "max_tokens"
    with pytest.raises(InputValidationError) as info:
        proc.process("r", {"prompt_token_ids": [3] * 17}, SamplingParams(max_tokens=1))
    assert info.value.parameter == "prompt"


def test_an_empty_text_is_a_prompt_where_the_tokenizer_adds_bos() -> None:
    """vLLM tokenizes an empty text; only no tokens at all is an empty prompt."""
    from tokenizers.processors import TemplateProcessing

    bos = byte_level_tokenizer(["hello world"], vocab_size=280,
                               special_tokens=["<|eos|>", "<|bos|>"])
    bos.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|bos|> $A", special_tokens=[("<|bos|>", 1)])
    proc = _proc(bos)
    req, text = proc.process("r", "", SamplingParams(max_tokens=2))
    assert (req.prompt_token_ids, text) == ([1], "")
    with pytest.raises(InputValidationError, match="decoder prompt cannot be empty"):
        proc.process("r", {"prompt": "", "add_special_tokens": False}, SamplingParams())


@pytest.mark.parametrize(
    ("prompt", "param", "message"),
    [
        ("", "prompt", "cannot be empty"),
        ({"prompt": ""}, "prompt", "cannot be empty"),
        ({"prompt_token_ids": []}, "prompt", "cannot be empty"),
        ({"prompt_token_ids": [1, 280]}, "prompt_token_ids", "token id 280 is out of vocabulary"),
        ({"prompt_token_ids": [-1]}, "prompt_token_ids", "token id -1"),
        ({"prompt_token_ids": [1, "2"]}, "prompt_token_ids", "list of integers"),
        ({"prompt_token_ids": "123"}, "prompt_token_ids", "list of integers"),
        ({"prompt_token_ids": [1, 2.0]}, "prompt_token_ids", "list of integers"),
        ({"prompt_token_ids": [True, 2]}, "prompt_token_ids", "list of integers"),
        ({"prompt_token_ids": [1, None]}, "prompt_token_ids", "list of integers"),
        ({"prompt_token_ids": [np.int64(3), np.bool_(True)]}, "prompt_token_ids",
         "list of integers"),
        ({"prompt_token_ids": [np.int64(3), 2**70]}, "prompt_token_ids", "out of vocabulary"),
        ({"prompt": 5}, "prompt", "must be a string"),
        ({"prompt": "hi", "multi_modal_data": {"image": b"x"}}, "multi_modal_data", "text only"),
        ({"text": "hi"}, "prompt", "'prompt' or a 'prompt_token_ids'"),
        (42, "prompt", "must be a string"),
    ],
)
def test_bad_prompts(
    tokenizer: PreTrainedTokenizerFast, prompt: object, param: str, message: str
) -> None:
    with pytest.raises(InputValidationError, match=message) as info:
        _proc(tokenizer).process("r", prompt, SamplingParams())  # type: ignore[arg-type]
    assert info.value.parameter == param
    assert isinstance(info.value, ValueError)


def test_prompt_plus_max_tokens_over_context(tokenizer: PreTrainedTokenizerFast) -> None:
    # The OpenAI server's rule: refused, with its message.
    with pytest.raises(InputValidationError) as info:
        _proc(tokenizer).process("r", {"prompt_token_ids": [3] * 40}, SamplingParams(max_tokens=30),
                                 strict_max_tokens=True)
    assert str(info.value) == (
        "This model's maximum context length is 64 tokens. However, you requested 70 tokens "
        "(40 in the messages, 30 in the completion). Please reduce the length of the messages "
        "or completion."
    )
    assert info.value.parameter == "max_tokens"
    # Exactly at the limit is fine.
    req, _ = _proc(tokenizer).process("r", {"prompt_token_ids": [3] * 40},
                                      SamplingParams(max_tokens=24), strict_max_tokens=True)
    assert req.sampling_params.max_tokens == 24


@pytest.mark.parametrize(("asked", "kept"), [(30, 24), (24, 24), (10**12, 24), (5, 5)])
def test_max_tokens_past_the_context_is_capped_by_default(
    tokenizer: PreTrainedTokenizerFast, asked: int, kept: int
) -> None:
    """vLLM's engine checks the prompt alone and ends a request at max_model_len: a 40-token
    prompt in a 64-token context gets at most 24 tokens, whatever max_tokens asked."""
    params = SamplingParams(max_tokens=asked)
    req, _ = _proc(tokenizer).process("r", {"prompt_token_ids": [3] * 40}, params)
    assert req.sampling_params.max_tokens == kept
    assert params.max_tokens == asked  # the caller's object is left alone
    if asked > 25:
        # vLLM accepts a min_tokens up to the asked max_tokens and ends the request at the
        # context: offline, min_tokens is capped with max_tokens ...
        req, _ = _proc(tokenizer).process("r", {"prompt_token_ids": [3] * 40},
                                          SamplingParams(max_tokens=asked, min_tokens=25))
        assert (req.sampling_params.min_tokens, req.sampling_params.max_tokens) == (24, 24)
        # ... while the server's rule (max_tokens past the context is an error) refuses both.
        with pytest.raises(InputValidationError):
            _proc(tokenizer).process("r", {"prompt_token_ids": [3] * 40},
                                     SamplingParams(max_tokens=asked, min_tokens=25),
                                     strict_max_tokens=True)
    # Unset max_tokens is the rest of the context: a longer min_tokens is capped offline and
    # refused under the server's rule, naming min_tokens.
    req, _ = _proc(tokenizer).process("r", {"prompt_token_ids": [3] * 40},
                                      SamplingParams(max_tokens=None, min_tokens=30))
    assert req.sampling_params.min_tokens == 24
    with pytest.raises(InputValidationError, match="min_tokens must be at most max_tokens") as e:
        _proc(tokenizer).process("r", {"prompt_token_ids": [3] * 40},
                                 SamplingParams(max_tokens=None, min_tokens=30),
                                 strict_max_tokens=True)
    assert e.value.parameter == "min_tokens"


@pytest.mark.parametrize("length", [64, 100])
def test_prompt_alone_too_long(tokenizer: PreTrainedTokenizerFast, length: int) -> None:
    with pytest.raises(InputValidationError, match="maximum context length is 64") as info:
        _proc(tokenizer).process("r", {"prompt_token_ids": [3] * length}, SamplingParams())
    assert f"{length} input tokens" in str(info.value)
    assert info.value.parameter == "prompt"


def test_request_larger_than_the_kv_cache(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = _proc(tokenizer, num_kv_blocks=4, block_size=4)  # 3 usable blocks: 12 tokens
    # 8 prompt tokens and 5 completion tokens: the last is never cached, 12 slots.
    proc.process("ok", {"prompt_token_ids": [3] * 8}, SamplingParams(max_tokens=5))
    with pytest.raises(InputValidationError, match="at most 12 tokens") as info:
        proc.process("r", {"prompt_token_ids": [3] * 8}, SamplingParams(max_tokens=6))
    assert info.value.parameter == "max_tokens"
    assert "at most 5" in str(info.value)
    req, _ = proc.process("r", {"prompt_token_ids": [3] * 12}, SamplingParams(max_tokens=None))
    assert req.sampling_params.max_tokens == 1
    with pytest.raises(InputValidationError, match="at most 12 tokens") as info:
        proc.process("r", {"prompt_token_ids": [3] * 13}, SamplingParams(max_tokens=None))
    assert info.value.parameter == "prompt"


def test_too_many_logprobs(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(InputValidationError, match="max allowed: 20") as info:
        _proc(tokenizer).process("r", "hi", SamplingParams(logprobs=21))
    assert info.value.parameter == "logprobs"


def test_without_tokenizer() -> None:
    proc = _proc(None)
    req, text = proc.process("r", {"prompt_token_ids": [1, 2]}, SamplingParams())
    assert text is None and req.prompt_token_ids == [1, 2]
    with pytest.raises(InputValidationError, match="skip_tokenizer_init") as info:
        proc.process("r", "hello", SamplingParams())
    assert info.value.parameter == "prompt"
    with pytest.raises(InputValidationError, match="stop_token_ids instead") as info:
        proc.process("r", {"prompt_token_ids": [1]}, SamplingParams(stop=["x"]))
    assert info.value.parameter == "stop"


def test_no_eos_ids() -> None:
    req, _ = _proc(None, eos_token_ids=[]).process("r", {"prompt_token_ids": [1]}, SamplingParams())
    assert req.eos_token_id is None and req.sampling_params.all_stop_token_ids == set()


def test_extra_eos_ids_become_stop_token_ids():
    from cadence.engine.input_processor import InputProcessor
    from cadence.sampling_params import SamplingParams

    proc = InputProcessor(None, vocab_size=100, max_model_len=64, eos_token_ids=[2, 7, 9])
    req, _ = proc.process("a", {"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=4))
    assert req.eos_token_id == 2
    assert req.sampling_params.stop_token_ids == [7, 9]
    assert req.sampling_params.all_stop_token_ids == {2, 7, 9}
    req, _ = proc.process("b", {"prompt_token_ids": [5, 6]},
                          SamplingParams(max_tokens=4, ignore_eos=True))
    assert req.sampling_params.stop_token_ids == []


def test_allowed_tokens_that_nothing_is_left_of(tokenizer: PreTrainedTokenizerFast) -> None:
    """allowed_token_ids emptied by one-token bad words, or (while min_tokens lasts) by the stop
    and end ids, is a 400 naming it; a token left over, or a multi-token bad word, is fine."""
    proc = _proc(tokenizer)
    (word,) = [w for w in ("h", "hello", "e") if len(tokenizer.encode(w)) == 1][:1]
    tok = tokenizer.encode(word)[0]
    spaced = tokenizer.encode(" " + word)
    excluded = [tok] + (spaced if len(spaced) == 1 else [])  # the word with a leading space too
    for params in (
        SamplingParams(allowed_token_ids=excluded, bad_words=[word]),
        SamplingParams(allowed_token_ids=[0, 1], min_tokens=1),  # the two end ids
        # ignore_eos or not, min_tokens holds the end ids back (as vLLM)
        SamplingParams(allowed_token_ids=[0, 1], min_tokens=1, ignore_eos=True),
        SamplingParams(allowed_token_ids=[1, 9], min_tokens=1, stop_token_ids=[9]),
    ):
        with pytest.raises(InputValidationError, match="no token could be sampled") as err:
            proc.process("r", "hi", params)
        assert err.value.parameter == "allowed_token_ids"
    for params in (
        SamplingParams(allowed_token_ids=excluded + [7], bad_words=[word]),
        SamplingParams(allowed_token_ids=[0, 1]),  # no min_tokens: the end may come at once
        SamplingParams(allowed_token_ids=[0, 1, 2], min_tokens=1, ignore_eos=True),
        SamplingParams(allowed_token_ids=[tok], bad_words=[word + word]),  # not one token
    ):
        proc.process("r", "hi", params)


def test_request_ids_lone_surrogates_and_duplicate_allowed_ids(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    proc = _proc(tokenizer)
    for bad in ("", None, 7, b"x"):
        with pytest.raises(InputValidationError, match="request_id") as err:
            proc.process(bad, "hi", SamplingParams())  # type: ignore[arg-type]
        assert err.value.parameter == "request_id"
    with pytest.raises(InputValidationError, match="cannot be tokenized") as err:
        proc.process("r", "Hel\ud800lo", SamplingParams())
    assert err.value.parameter == "prompt"
    # 1000 ids, one distinct: within the vocabulary's 280.
    req, _ = proc.process("r", "hi", SamplingParams(allowed_token_ids=[5] * 1000))
    assert set(req.sampling_params.allowed_token_ids) == {5}
    with pytest.raises(InputValidationError, match="at most 280 distinct ids"):
        proc.process("r", "hi", SamplingParams(allowed_token_ids=list(range(281))))


class _FakeTokenizer:
    """encode() from a table: how the bare and the spaced word tokenize."""

    def __init__(self, table: dict[str, list[int]]) -> None:
        self.table = table

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.table[text]


@pytest.mark.parametrize(("bare", "spaced", "want"), [
    ([1, 2], [3, 2], [[1, 2], [3, 2]]),  # the space changes the first token only: both
    ([1, 2], [3], [[1, 2]]),  # the space merged the word into another token: bare only
    ([1, 2], [1, 2], [[1, 2]]),  # the same tokens: once
    ([1], [4], [[1], [4]]),
])
def test_bad_words_spaced_form_follows_vllms_rule(bare, spaced, want) -> None:
    from cadence.engine.input_processor import bad_word_sequences

    tok = _FakeTokenizer({"foo": bare, " foo": spaced})
    assert bad_word_sequences(tok, ["foo"]) == want  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "make", "limit"), [
    ("stop", lambda n: [f"s{i}" for i in range(n)], 64),
    ("stop", lambda n: ["x" * n], 512),
    ("stop_token_ids", lambda n: list(range(n)), 256),
    ("bad_words", lambda n: [f"w{i}" for i in range(n)], 128),
    ("bad_words", lambda n: ["y" * n], 512),
])
def test_list_bounds_accept_the_limit_and_refuse_one_more(
    tokenizer: PreTrainedTokenizerFast, field: str, make, limit: int
) -> None:
    proc = _proc(tokenizer)
    proc.process("ok", "hi", SamplingParams(max_tokens=2, **{field: make(limit)}))
    with pytest.raises(InputValidationError, match=str(limit)) as info:
        proc.process("no", "hi", SamplingParams(max_tokens=2, **{field: make(limit + 1)}))
    assert info.value.parameter == field


def test_truncation_side_right_keeps_the_first_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    # vLLM's truncation_side: "right" keeps the first k tokens, offline and strict alike.
    proc = _proc(tokenizer)  # max_model_len 64
    ids = list(range(3, 3 + 100))
    for strict in (False, True):
        req, _ = proc.process(f"a{strict}", {"prompt_token_ids": ids}, SamplingParams(
            max_tokens=4, truncate_prompt_tokens=10, truncation_side="right"),
            strict_max_tokens=strict)
        assert req.prompt_token_ids == ids[:10]
    req, _ = proc.process("b", {"prompt_token_ids": ids}, SamplingParams(
        max_tokens=4, truncate_prompt_tokens=-1, truncation_side="right"))
    assert req.prompt_token_ids == ids[:60]
    with pytest.raises(ValueError, match="truncation_side must be 'left' or 'right'"):
        SamplingParams(truncation_side="middle")


def test_truncate_prompt_tokens_keeps_the_last_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = _proc(tokenizer)  # max_model_len 64
    ids = list(range(3, 3 + 100))  # longer than the context
    req, _ = proc.process("a", {"prompt_token_ids": ids},
                          SamplingParams(max_tokens=4, truncate_prompt_tokens=10))
    assert req.prompt_token_ids == ids[-10:]
    req, _ = proc.process("b", {"prompt_token_ids": ids[:5]},
                          SamplingParams(max_tokens=4, truncate_prompt_tokens=10))
    assert req.prompt_token_ids == ids[:5]  # shorter than k: unchanged
    # -1: as many as leave room for max_tokens (vLLM's renderer: 64 - max_tokens).
    for max_tokens, kept in ((1, 63), (4, 60), (16, 48), (None, 63)):
        req, _ = proc.process(f"c{max_tokens}", {"prompt_token_ids": ids},
                              SamplingParams(max_tokens=max_tokens, truncate_prompt_tokens=-1))
        assert req.prompt_token_ids == ids[-kept:]
    req, _ = proc.process("c2", {"prompt_token_ids": ids},
                          SamplingParams(max_tokens=1, truncate_prompt_tokens=63))
    assert req.prompt_token_ids == ids[-63:]
    # The server's rule: more than max_model_len - max_tokens (16 by default) is refused.
    for k in (49, 65):
        with pytest.raises(InputValidationError, match="cannot be greater than max_model_len - "
                           "max_tokens = 48") as info:
            proc.process("d", {"prompt_token_ids": ids}, SamplingParams(truncate_prompt_tokens=k),
                         strict_max_tokens=True)
        assert info.value.parameter == "truncate_prompt_tokens"
    # Offline (vLLM's LLM) only more than max_model_len is; max_tokens is capped to the rest.
    req, _ = proc.process("d2", {"prompt_token_ids": ids}, SamplingParams(truncate_prompt_tokens=49))
    assert req.prompt_token_ids == ids[-49:] and req.sampling_params.max_tokens == 64 - 49
    with pytest.raises(InputValidationError, match="cannot be greater than max_model_len=64"
                       ) as info:
        proc.process("d3", {"prompt_token_ids": ids}, SamplingParams(truncate_prompt_tokens=65))
    assert info.value.parameter == "truncate_prompt_tokens"
    with pytest.raises(InputValidationError, match="maximum context length is 64") as info:
        proc.process("d4", {"prompt_token_ids": ids}, SamplingParams(truncate_prompt_tokens=64))
    assert info.value.parameter == "prompt"
    req, _ = proc.process("d5", {"prompt_token_ids": ids[:10]},
                          SamplingParams(max_tokens=100, truncate_prompt_tokens=30))
    assert req.sampling_params.max_tokens == 64 - 10  # past the context: capped
    # max_tokens that fills the context leaves no room for a prompt.
    with pytest.raises(InputValidationError, match="no room") as info:
        proc.process("f", {"prompt_token_ids": ids},
                     SamplingParams(max_tokens=64, truncate_prompt_tokens=-1))
    assert info.value.parameter == "max_tokens"
    # A text far past the context is tokenized, then truncated (no bound on its length).
    text = "hello world, " * 400
    req, prompt_text = proc.process("e", text, SamplingParams(max_tokens=4,
                                                              truncate_prompt_tokens=20))
    assert req.prompt_token_ids == tokenizer.encode(text)[-20:] and prompt_text == text
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="truncate_prompt_tokens"):
            SamplingParams(truncate_prompt_tokens=bad)


def test_a_long_text_to_truncate_is_tokenized_only_where_its_kept_tokens_lie(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """A text far past the context: only the window the kept tokens come from is tokenized (the
    one input thread is not held for seconds), and the kept tokens are those of the whole text,
    both sides, with and without special tokens."""
    from cadence.engine.prompt_bound import max_chars_per_token
    from cadence.engine.truncation import TRUNCATION_MARGIN_TOKENS

    k = max_chars_per_token(tokenizer)
    assert k is not None
    proc = _proc(tokenizer, max_chars_per_token=k)
    window = k * (64 + TRUNCATION_MARGIN_TOKENS)
    seen: list[int] = []
    encode = tokenizer.encode

    class Spy:
        def __getattr__(self, name: str) -> object:
            return getattr(tokenizer, name)

        def encode(self, text: str, **kw: object) -> list[int]:
            seen.append(len(text))
            return encode(text, **kw)

    proc.tokenizer = Spy()  # type: ignore[assignment]
    text = "hello there, world! " * (3 * window // 20) + "the end"
    whole = tokenizer.encode(text)
    whole_plain = tokenizer.encode(text, add_special_tokens=False)
    for side, kept in (("left", whole[-20:]), ("right", whole[:20])):
        params = SamplingParams(max_tokens=4, truncate_prompt_tokens=20, truncation_side=side)
        req, prompt_text = proc.process(side, text, params)
        assert req.prompt_token_ids == kept and prompt_text == text
        assert seen.pop() == window < len(text)
    req, _ = proc.process("plain", {"prompt": text, "add_special_tokens": False},
                          SamplingParams(max_tokens=4, truncate_prompt_tokens=-1))
    assert req.prompt_token_ids == whole_plain[-60:] and seen.pop() == window
    short = "hello world, " * 40  # past the context, shorter than the window: tokenized whole
    req, _ = proc.process("short", short, SamplingParams(max_tokens=4, truncate_prompt_tokens=9))
    assert req.prompt_token_ids == tokenizer.encode(short)[-9:] and seen.pop() == len(short)


def test_booleans_are_not_integers_and_min_tokens_may_equal_max_tokens(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    proc = _proc(tokenizer)
    with pytest.raises(InputValidationError) as info:
        proc.process("a", {"prompt_token_ids": [True, 5]}, SamplingParams(max_tokens=2))
    assert info.value.parameter == "prompt_token_ids"
    with pytest.raises(InputValidationError) as info:
        proc.process("b", "hi", SamplingParams(max_tokens=2), priority=True)
    assert info.value.parameter == "priority"
    with pytest.raises(InputValidationError) as info:
        proc.process("b2", {"prompt": "hi", "add_special_tokens": "no"},
                     SamplingParams(max_tokens=2))
    assert info.value.parameter == "add_special_tokens"
    # vLLM: min_tokens up to max_tokens, equal included, also when max_tokens is resolved
    # from the context (64 - 5 prompt tokens = 59).
    req, _ = proc.process("c", {"prompt_token_ids": [5] * 5},
                          SamplingParams(max_tokens=4, min_tokens=4))
    assert req.sampling_params.min_tokens == req.sampling_params.max_tokens == 4
    req, _ = proc.process("d", {"prompt_token_ids": [5] * 5},
                          SamplingParams(max_tokens=None, min_tokens=59))
    assert req.sampling_params.max_tokens == 59
    with pytest.raises(InputValidationError) as info:  # the server's rule
        proc.process("e", {"prompt_token_ids": [5] * 5},
                     SamplingParams(max_tokens=None, min_tokens=60), strict_max_tokens=True)
    assert info.value.parameter == "min_tokens"


@pytest.mark.parametrize("field", ["logit_bias", "allowed_token_ids", "stop_token_ids"])
def test_token_fields_accept_the_last_id_and_refuse_the_vocabulary_size(
    tokenizer: PreTrainedTokenizerFast, field: str
) -> None:
    """Ids index the logits row: 279 is the last of a 280-token vocabulary, 280 is past it."""
    def params(tok: int) -> SamplingParams:
        if field == "logit_bias":
            return SamplingParams(max_tokens=2, logit_bias={tok: 1.0})
        if field == "stop_token_ids":
            return SamplingParams(max_tokens=2, stop_token_ids=[5, tok])
        return SamplingParams(max_tokens=2, allowed_token_ids=[5, tok])

    proc = _proc(tokenizer)
    proc.process("ok", "hi", params(279))
    with pytest.raises(InputValidationError, match="token id 280 is out of vocabulary") as info:
        proc.process("no", "hi", params(280))
    assert info.value.parameter == field and info.value.value == 280


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_logprobs_accept_the_cap_and_refuse_one_more(
    tokenizer: PreTrainedTokenizerFast, field: str
) -> None:
    proc = _proc(tokenizer, max_logprobs=5)
    req, _ = proc.process("ok", "hi", SamplingParams(max_tokens=2, **{field: 5}))
    assert getattr(req.sampling_params, field) == 5
    with pytest.raises(InputValidationError, match="max allowed: 5") as info:
        proc.process("no", "hi", SamplingParams(max_tokens=2, **{field: 6}))
    assert info.value.parameter == field


def test_bad_words_spelled_past_the_vocabulary_are_dropped() -> None:
    """A word with an id past the model's vocabulary (a token added to the tokenizer) can never
    be generated; banning it would index past the logits, so its sequence is left out."""
    tok = _FakeTokenizer({"foo": [3, 9], " foo": [4, 9], "bar": [2], " bar": [10]})
    proc = InputProcessor(tok, vocab_size=10, max_model_len=64,  # type: ignore[arg-type]
                          eos_token_ids=[0])
    req, _ = proc.process("r", {"prompt_token_ids": [5]},
                          SamplingParams(max_tokens=2, bad_words=["foo", "bar"]))
    assert req.sampling_params.bad_words_token_ids == [[3, 9], [4, 9], [2]]


def test_structured_outputs_need_a_tokenizer_and_fit_the_size_cap(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    from cadence.engine.param_checks import MAX_GRAMMAR_CHARS
    from cadence.sampling_params import StructuredOutputsParams

    with pytest.raises(InputValidationError, match="need a tokenizer") as info:
        _proc(None).process("r", {"prompt_token_ids": [5]}, SamplingParams(
            max_tokens=2, structured_outputs=StructuredOutputsParams(regex="a+")))
    assert info.value.parameter == "structured_outputs"
    # The cap counts every form of the spec, the choices' characters included.
    half = MAX_GRAMMAR_CHARS // 2
    for spec in (StructuredOutputsParams(choice=["a" * half, "b" * (half + 1)]),
                 StructuredOutputsParams(regex="a" * (MAX_GRAMMAR_CHARS + 1))):
        with pytest.raises(InputValidationError, match=f"at most {MAX_GRAMMAR_CHARS}") as info:
            _proc(tokenizer).process("r", "hi", SamplingParams(max_tokens=2,
                                                               structured_outputs=spec))
        assert info.value.parameter == "structured_outputs"
    _proc(tokenizer).process("r", "hi", SamplingParams(
        max_tokens=2, structured_outputs=StructuredOutputsParams(choice=["yes", "no"])))


class _Colour(enum.IntEnum):
    RED = 7


def test_token_ids_of_any_integer_type_become_a_new_list_of_ints(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    ids = [np.int32(5), 6, _Colour.RED, np.uint8(9)]
    req, _ = _proc(tokenizer).process("r", {"prompt_token_ids": ids}, SamplingParams())
    assert req.prompt_token_ids == [5, 6, 7, 9]
    assert all(type(t) is int for t in req.prompt_token_ids)
    plain = [4, 5, 6]
    req, _ = _proc(tokenizer).process("r", {"prompt_token_ids": plain}, SamplingParams())
    plain.append(7)  # the caller's list is not the request's
    assert req.prompt_token_ids == [4, 5, 6]
    req, _ = _proc(tokenizer).process("r", (4, 5), SamplingParams())
    assert req.prompt_token_ids == [4, 5]


def test_a_thinking_budget_takes_the_engines_tags_and_yields_to_an_ungated_grammar(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """The engine's reasoning tags go to a budget that brings none; a grammar that applies from
    the first token leaves no reasoning block to count (a forced end tag would break it): the
    budget is dropped there, and kept where the grammar waits for the reasoning's end."""
    from cadence.sampling_params import StructuredOutputsParams

    proc = _proc(tokenizer)
    proc.reasoning_tags = (3, 4)
    req, _ = proc.process("r", [5, 3, 6], SamplingParams(thinking_token_budget=2))
    assert req.sampling_params.thinking_tags == (3, 4)
    assert req.sampling_params.thinking_token_budget == 2
    ungated = StructuredOutputsParams(regex="a+")
    req, _ = proc.process("r", [5, 3, 6], SamplingParams(thinking_token_budget=2,
                                                         structured_outputs=ungated))
    assert req.sampling_params.thinking_token_budget is None
    gated = StructuredOutputsParams(regex="a+", reasoning_tags=(3, 4))
    req, _ = proc.process("r", [5, 3, 6], SamplingParams(thinking_token_budget=2,
                                                         structured_outputs=gated))
    assert req.sampling_params.thinking_token_budget == 2


def test_priority_takes_the_whole_int64_range(tokenizer: PreTrainedTokenizerFast) -> None:
    proc = _proc(tokenizer)
    for edge in (2**63 - 1, -(2**63)):
        req, _ = proc.process(f"p{edge}", "hi", SamplingParams(max_tokens=2), priority=edge)
        assert req.priority == edge
    with pytest.raises(InputValidationError) as info:
        proc.process("past", "hi", SamplingParams(max_tokens=2), priority=2**63)
    assert info.value.parameter == "priority"


def test_a_requests_own_thinking_tags_are_kept(tokenizer: PreTrainedTokenizerFast) -> None:
    """The engine's reasoning tags fill in a request's tags only where it gives none."""
    proc = _proc(tokenizer, reasoning_tags=(7, 8))
    params = SamplingParams(max_tokens=8, thinking_token_budget=4)
    params.thinking_tags = (10, 11)
    req, _ = proc.process("own", "hi", params)
    assert req.sampling_params.thinking_tags == (10, 11)
    req, _ = proc.process("engine", "hi", SamplingParams(max_tokens=8, thinking_token_budget=4))
    assert req.sampling_params.thinking_tags == (7, 8)
