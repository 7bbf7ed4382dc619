"""POST /tokenize and /detokenize, with vLLM's request and response shapes.

``/tokenize`` takes a completion-style body (``prompt``; special tokens added by default) or a
chat-style one (``messages`` rendered through the chat template exactly as
``/v1/chat/completions`` renders them; the template holds its special tokens). It answers the
token ids, their count and the context length, and with ``return_token_strs`` each token's
string. ``/detokenize`` turns ids back into text. Both need the model's tokenizer.

Unlike vLLM's, ``/tokenize`` refuses a text too long to fit in the context by its characters
alone (more than the tokenizer's most characters a token times the context length), before
tokenizing it, as the generation routes do: tokenizing runs on the engine's one input thread,
where a multi-megabyte text would hold every other request up for seconds. A shorter text is
tokenized and answered whole, its count and ``max_model_len`` side by side (vLLM's answer),
even where the count is over the context: a client counting tokens wants the count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field

from cadence.chat_options import template_kwargs_with_defaults
from cadence.engine.param_checks import InputValidationError
from cadence.server.chat_template import render_chat, request_template
from cadence.server.protocol import OpenAIModel, ParamError
from cadence.server.protocol_chat import (
    NO_MESSAGES,
    ChatMessage,
    ChatTool,
    check_template_options,
)

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM

__all__ = [
    "DetokenizeRequest",
    "DetokenizeResponse",
    "TokenizeChatRequest",
    "TokenizeCompletionRequest",
    "TokenizeResponse",
    "Tokenization",
]

# Token ids a request may carry to /detokenize (a context's worth many times over).
MAX_DETOKENIZE_TOKENS = 1 << 20


class TokenizeCompletionRequest(OpenAIModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIModel):
    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None  # as the chat endpoint takes it (where trusted)
    return_token_strs: bool | None = False
    tools: list[ChatTool] | None = None  # rendered by the template, as the chat endpoint does

    def check(self) -> None:
        if not self.messages:
            raise ParamError("messages", NO_MESSAGES)
        check_template_options(self.chat_template_kwargs, self.add_generation_prompt,
                               self.continue_final_message)


class TokenizeResponse(OpenAIModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int] = Field(max_length=MAX_DETOKENIZE_TOKENS)


class DetokenizeResponse(OpenAIModel):
    prompt: str


class Tokenization:
    """The tokenizer routes' work over one engine (run in its input thread)."""

    # A request's own template, as the chat endpoint has it (--trust-request-chat-template).
    trust_request_chat_template = False
    content_format = "auto"  # --chat-template-content-format
    default_chat_template_kwargs: Mapping[str, Any] | None = None  # the server's

    def __init__(self, engine: AsyncLLM, chat_template: str | None = None) -> None:
        self.engine = engine
        self.chat_template = chat_template

    def _tokenizer(self) -> Any:
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ParamError("model", "this server runs without a tokenizer.")
        return tokenizer

    def _check_text(self, text: str, param: str = "prompt") -> None:
        try:
            self.engine.input_processor.check_prompt_text(text)
        except InputValidationError as exc:
            raise ParamError(param, str(exc)) from None

    def _check_chat_text(self, text: str) -> None:
        self._check_text(text, "messages")

    def tokenize(self, body: dict[str, Any]) -> TokenizeResponse:
        """``body``: the parsed JSON object (chat form when it has ``messages``)."""
        tokenizer = self._tokenizer()
        request: TokenizeCompletionRequest | TokenizeChatRequest
        if "messages" in body:
            request = TokenizeChatRequest.model_validate(body)
            request.check()
            request.chat_template_kwargs = template_kwargs_with_defaults(
                self.default_chat_template_kwargs, request.chat_template_kwargs)
            ids = render_chat(
                tokenizer,
                request.messages,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                chat_template_kwargs=request.chat_template_kwargs,
                chat_template=request_template(request.chat_template, self.chat_template,
                                               self.trust_request_chat_template,
                                               request.chat_template_kwargs),
                # vLLM: the rendered text is tokenized with the tokenizer's own specials too.
                add_special_tokens=request.add_special_tokens,
                check_text=self._check_chat_text,
                content_format=self.content_format,
                tools=([t.model_dump(exclude_none=True) for t in request.tools]
                       if request.tools else None),
            )
        else:
            request = TokenizeCompletionRequest.model_validate(body)
            self._check_text(request.prompt)
            ids = list(tokenizer.encode(request.prompt,
                                        add_special_tokens=request.add_special_tokens))
        strs = tokenizer.convert_ids_to_tokens(ids) if request.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=self.engine.max_model_len,
                                tokens=ids, token_strs=strs)

    def detokenize(self, body: dict[str, Any]) -> DetokenizeResponse:
        tokenizer = self._tokenizer()
        request = DetokenizeRequest.model_validate(body)
        vocab = len(tokenizer)
        bad = next((t for t in request.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise ParamError("tokens", f"token id {bad} is outside the vocabulary [0, {vocab}).")
        return DetokenizeResponse(prompt=tokenizer.decode(request.tokens))
