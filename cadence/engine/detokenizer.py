"""Incremental detokenization and stop strings for one request (vLLM v1 semantics).

Text is produced token by token from a small window of token ids: the tokens of the last
emitted chunk (context) plus the tokens not yet emitted. New text is released only when the
window's decoding grew and does not end in U+FFFD, so a character whose UTF-8 bytes are spread
over several tokens is never emitted half-way; one still incomplete when the request ends is left
out (vLLM's detokenizers never release it). Invariant: ``output_text`` only ever grows, except
when a stop string truncates it; streamed deltas therefore always concatenate to the final text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cadence.core_types import EngineCoreRequest

__all__ = [
    "DecodeFn",
    "added_token_contents",
    "IncrementalDetokenizer",
    "TextDecoder",
    "find_stop_string",
    "make_decode_fn",
]

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens used as decoding context: enough for spacing / merges, small for speed.
_MIN_CONTEXT, _MAX_CONTEXT = 4, 24
# Held-back tokens after which text is emitted anyway (a byte run that never completes); bounds
# the window each step decodes. Pending tokens that decode to nothing (skipped special tokens)
# leave the window instead, keeping the context before them.
_MAX_PENDING = 16
# Prompt tokens at most that a character begun at the prompt's end spans (its first 3 bytes).
_MAX_HELD = 3

DecodeFn = Callable[[list[int], bool], str]


def make_decode_fn(tokenizer: Any) -> DecodeFn:
    """``decode(ids, skip_special_tokens)`` for a HF tokenizer or a ``tokenizers.Tokenizer``.

    Fast tokenizers are decoded by their Rust backend directly (no clean-up of spaces), which is
    several times cheaper per call than ``PreTrainedTokenizerFast.decode``.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(
        tokenizer, "_tokenizer", None
    )
    if backend is None and type(tokenizer).__module__.startswith("tokenizers"):
        backend = tokenizer
    if backend is not None and hasattr(backend, "decode"):
        rust = backend

        def decode_fast(ids: list[int], skip_special_tokens: bool) -> str:
            return rust.decode(ids, skip_special_tokens=skip_special_tokens)

        return decode_fast

    def decode_slow(ids: list[int], skip_special_tokens: bool) -> str:
        return tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    return decode_slow


def added_token_contents(tokenizer: Any) -> dict[int, str]:
    """Each added token's id -> its content (HF's ``added_tokens_decoder``, or a
    ``tokenizers.Tokenizer``'s ``get_added_tokens_decoder()``), read once per tokenizer."""
    cached = getattr(tokenizer, "_cadence_added_contents", None)
    if cached is not None:
        return cached
    table = getattr(tokenizer, "added_tokens_decoder", None)
    if table is None and hasattr(tokenizer, "get_added_tokens_decoder"):
        table = tokenizer.get_added_tokens_decoder()
    contents = {int(i): str(getattr(t, "content", t)) for i, t in (table or {}).items()}
    try:
        tokenizer._cadence_added_contents = contents
    except AttributeError:  # a tokenizer that takes no new attributes: read again next time
        pass
    return contents


class TextDecoder:
    """Turns a stream of token ids into a stream of complete-character text chunks."""

    def __init__(
        self, decode: DecodeFn, prompt_token_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self._decode = decode
        self._skip = skip_special_tokens
        self._ids, self._prefix_index = self._prompt_context(prompt_token_ids)
        self._prefix = self._decode(self._ids[:self._prefix_index], self._skip)
        # Prompt tokens pending in the window: a character the prompt's end leaves incomplete.
        self._held = len(self._ids) - self._prefix_index

    def _prompt_context(self, prompt: list[int]) -> tuple[list[int], int]:
        """The prompt's last tokens that seed the window, and how many of them are context:
        the shortest suffix of 4-23 tokens that decodes cleanly (vLLM's search); else one whose
        text is clean but for a character its last tokens leave incomplete, those tokens held
        as pending, so that the output's first bytes complete it (as vLLM's fast detokenizer,
        primed with the whole prompt, shows it); else the last four."""
        if len(prompt) <= _MIN_CONTEXT:
            return self._held_back(list(prompt))
        sizes = range(_MIN_CONTEXT, min(len(prompt) + 1, _MAX_CONTEXT))
        for n in sizes:
            suffix = prompt[-n:]
            if REPLACEMENT_CHAR not in self._decode(suffix, self._skip):
                return list(suffix), n
        for n in sizes:
            ids, clean = self._held_back(prompt[-n:])
            if clean < n and REPLACEMENT_CHAR not in self._decode(ids[:clean], self._skip):
                return ids, clean
        return list(prompt[-_MIN_CONTEXT:]), _MIN_CONTEXT

    def _held_back(self, ids: list[int]) -> tuple[list[int], int]:
        """``ids`` and how many of them precede the tokens of a character left incomplete at
        its end (at most three tokens: a character's first bytes), all of them if none."""
        if not ids or not self._decode(ids, self._skip).endswith(REPLACEMENT_CHAR):
            return ids, len(ids)
        for held in range(1, min(_MAX_HELD, len(ids)) + 1):
            if not self._decode(ids[:-held], self._skip).endswith(REPLACEMENT_CHAR):
                return ids, len(ids) - held
        return ids, len(ids)

    def step(self, token_id: int) -> str:
        """Add one token; return the text it completes ("" while a character is incomplete)."""
        self._ids.append(token_id)
        if self._held:
            self._settle_held()
        text = self._decode(self._ids, self._skip)
        pending = len(self._ids) - self._prefix_index
        grew = len(text) > len(self._prefix)
        if grew and not text.endswith(REPLACEMENT_CHAR):
            return self._advance(text, len(self._ids))
        if pending < _MAX_PENDING:
            return ""
        if not grew:
            # Tokens that add no text (skipped special tokens): dropped from the window, so the
            # context that spaces the next word stays (and the prompt's held bytes).
            del self._ids[self._prefix_index + self._held:]
            return ""
        return self._flush(text)

    def _settle_held(self) -> None:
        """Whether the prompt's unfinished character is completed by the output: kept when
        it is; dropped from the window when the output's bytes do not continue it (its stray
        bytes are the prompt's: no U+FFFD of them leads the output, unlike vLLM's fast
        detokenizer, whose stream releases them)."""
        tail = self._decode(self._ids[self._prefix_index:], self._skip)
        if not tail.startswith(REPLACEMENT_CHAR):
            self._held = 0
        elif len(tail) > 1:
            del self._ids[self._prefix_index:self._prefix_index + self._held]
            self._held = 0

    def _flush(self, text: str) -> str:
        """A window of _MAX_PENDING tokens whose text still ends in U+FFFD: emit all of it but
        that last character, which later bytes may still complete, and keep the tokens that
        make it pending."""
        head = text[:-1]
        for cut in range(len(self._ids) - 1, self._prefix_index - 1, -1):
            if self._decode(self._ids[:cut], self._skip) == head:
                break
        else:
            return self._advance(text, len(self._ids))  # no clean cut: the window's bound wins
        if cut > self._prefix_index:
            return self._advance(head, cut)
        # The whole window is one unfinished character plus tokens that add no text (skipped
        # special tokens between its bytes): those leave the window, the character's bytes stay.
        # NOTE: only tokens that decode to nothing alone: a byte of the character also leaves
        # the text as it is (one U+FFFD for one, two or three of its bytes).
        for i in range(len(self._ids) - 1, self._prefix_index, -1):
            trial = self._ids[:i] + self._ids[i + 1:]
            if (self._decode(self._ids[i:i + 1], self._skip) == ""
                    and self._decode(trial, self._skip) == text):
                self._ids = trial
        if len(self._ids) - self._prefix_index >= _MAX_PENDING:
            return self._advance(text, len(self._ids))
        return ""

    def _advance(self, text: str, end: int) -> str:
        """Emit ``text`` (the decoding of the window's first ``end`` tokens) past the prefix;
        those tokens become the next chunk's context, the rest stay pending."""
        new_text = text[len(self._prefix) :]
        self._ids = self._ids[self._prefix_index :]
        end -= self._prefix_index
        self._prefix = self._decode(self._ids[:end], self._skip)
        self._prefix_index = end
        return new_text


def find_stop_string(
    text: str, new_char_count: int, stop: list[str], include_in_output: bool
) -> tuple[str, int] | None:
    """Find a stop string that overlaps the last ``new_char_count`` characters of ``text``.

    Returns (stop string, length to truncate the text to), with -1 for "no truncation". When
    several stop strings match, the first listed wins, wherever it starts (vLLM's order).
    """
    if new_char_count <= 0 or not stop:
        return None
    for s in stop:
        idx = text.find(s, max(0, len(text) - new_char_count - len(s) + 1))
        if idx == -1:
            continue
        if include_in_output:
            end = idx + len(s)
            return s, (-1 if end >= len(text) else end)
        return s, idx
    return None


class IncrementalDetokenizer:
    """Per-request output state: token ids, text, and stop-string detection.

    Without a tokenizer (``skip_tokenizer_init``) only token ids are tracked and text stays "".
    """

    def __init__(self, tokenizer: Any | None, request: EngineCoreRequest) -> None:
        params = request.sampling_params
        self.token_ids: list[int] = []
        self.output_text = ""
        self.stop: list[str] = list(params.stop or []) if tokenizer is not None else []
        self.include_stop_str_in_output = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        # Characters held back while streaming, so a stop string still being formed is never
        # streamed and then taken back.
        if self.stop and not self.include_stop_str_in_output:
            self.stop_buffer_length = max(len(s) for s in self.stop) - 1
        else:
            self.stop_buffer_length = 0
        self._sent_offset = 0
        self._decoder: TextDecoder | None = None
        # Added tokens' contents, where spaces between special tokens are not wanted.
        self._added: dict[int, str] | None = None
        self._last_added = False
        if tokenizer is not None:
            self._decoder = TextDecoder(
                make_decode_fn(tokenizer), request.prompt_token_ids, params.skip_special_tokens
            )
            if not (params.skip_special_tokens or params.spaces_between_special_tokens):
                self._added = added_token_contents(tokenizer) or None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Add new tokens, detokenize them and look for stop strings.

        ``stop_terminated``: the engine core stopped the request on the last of these tokens (EOS
        or a stop token id); its text is left out unless ``include_stop_str_in_output``.
        Returns the stop string that ended the request, if any (the text is truncated there).
        """
        if self._decoder is None:
            self.token_ids.extend(new_token_ids)
            return None
        skipped: int | None = None
        if stop_terminated and new_token_ids and not self.include_stop_str_in_output:
            skipped = new_token_ids[-1]
            new_token_ids = new_token_ids[:-1]

        check_from = len(self.output_text)
        for tok in new_token_ids:
            self.token_ids.append(tok)
            self.output_text += self._next_text(tok)
            if self.min_tokens and len(self.token_ids) <= self.min_tokens:
                # vLLM: stop strings inside the first min_tokens tokens do not count.
                check_from = len(self.output_text)
        if skipped is not None:
            self.token_ids.append(skipped)

        if not self.stop or len(self.token_ids) <= self.min_tokens:
            return None
        found = find_stop_string(
            self.output_text,
            len(self.output_text) - check_from,
            self.stop,
            self.include_stop_str_in_output,
        )
        if found is None:
            return None
        stop_string, truncate_to = found
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        return stop_string

    def _next_text(self, token_id: int) -> str:
        assert self._decoder is not None
        text = self._decoder.step(token_id)
        if self._added is not None:
            # spaces_between_special_tokens=False (vLLM): an added token right after another is
            # its own content, without the space the decoder puts between tokens.
            content = self._added.get(token_id)
            if content is not None and self._last_added and text:
                text = content
            self._last_added = content is not None
        return text

    @property
    def sent_offset(self) -> int:
        """How much of ``output_text`` delta outputs have carried."""
        return self._sent_offset

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to report now: everything (``delta=False``) or what is new since the last
        call. While unfinished, the last ``stop_buffer_length`` characters are held back."""
        hold = 0 if finished else self.stop_buffer_length
        end = max(len(self.output_text) - hold, 0)
        if not delta:
            return self.output_text[:end]
        if end <= self._sent_offset:
            return ""
        text = self.output_text[self._sent_offset : end]
        self._sent_offset = end
        return text
