"""Turn chat messages into prompt token ids through the tokenizer's chat template."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cadence.chat import add_reasoning, content_parts, render_conversation, tool_arguments
from cadence.chat import content_format as content_format_of
from cadence.chat_options import named_template
from cadence.server.protocol import ParamError
from cadence.server.protocol_chat import ChatMessage


def template_message(message: ChatMessage, index: int = 0, openai: bool = False
                     ) -> dict[str, Any]:
    """One message in the shape Hugging Face chat templates read: text content, an assistant's
    ``tool_calls`` with their arguments as objects (templates serialise them themselves, as
    vLLM hands them), an assistant's earlier reasoning (``add_reasoning``), and a tool
    message's ``tool_call_id`` and ``name``."""
    if openai and message.role != "tool":  # a tool's result stays text, as templates read it
        content: Any = content_parts(
            message.content if not isinstance(message.content, list) else message.parts())
    else:
        content = message.text()
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        calls = []
        for i, call in enumerate(message.tool_calls):
            try:
                arguments = tool_arguments(call.function.arguments)
            except ValueError as exc:
                raise ParamError(f"messages.{index}.tool_calls.{i}.function.arguments",
                                 f"tool call arguments {exc}") from None
            calls.append({"id": call.id, "type": call.type,
                          "function": {"name": call.function.name, "arguments": arguments}})
        out["tool_calls"] = calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.role == "assistant":
        add_reasoning(out, message.reasoning, message.reasoning_content)
    return out


def check_template_syntax(template: str) -> None:
    """A 400 naming ``chat_template`` for a request's template that does not parse."""
    import jinja2

    try:
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ParamError("chat_template", f"the chat template does not parse: {exc}") from None


def request_template(requested: str | None, server: str | None, trusted: bool,
                     chat_template_kwargs: dict[str, Any] | None = None) -> str | None:
    """The template a chat request renders with: its own ``chat_template`` where the server
    trusts request templates (``--trust-request-chat-template``; it must parse), else the
    server's, else the one its ``chat_template_kwargs`` name (vLLM's merge: the request's
    ``chat_template`` field wins over the kwargs' one, the server's over the kwargs' too); a
    request template the server does not trust, in either field, is refused."""
    named = named_template(chat_template_kwargs)
    if requested is None and named is None:
        return server
    if not trusted:
        raise ParamError("chat_template", "Chat template is passed with the request, but "
                         "--trust-request-chat-template is not set: refused.")
    if requested is None:
        if server is not None:
            return server
        requested = named
    check_template_syntax(requested)
    return requested


def render_chat(
    tokenizer: Any,
    messages: list[ChatMessage],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    check_text: Callable[[str], None] | None = None,
    chat_template: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, str]] | None = None,
    add_special_tokens: bool = False,
    content_format: str = "auto",
) -> list[int]:
    """Prompt token ids of a conversation. Template errors are ``ParamError("messages")``.
    ``chat_template``: the server's template (``--chat-template``) instead of the tokenizer's.

    CPU-heavy for long conversations: callers run it off the event loop. ``check_text`` sees the
    rendered text before it is tokenized (to refuse one that cannot fit the context).
    ``add_special_tokens``: the tokenizer's own special tokens around the rendered text too
    (vLLM's /tokenize option; the chat endpoint never adds them)."""
    if tokenizer is None:
        raise ParamError("messages", "chat requires a tokenizer; the server runs without one.")
    openai = content_format_of(content_format, tokenizer, chat_template, tools) == "openai"
    conversation = [template_message(m, i, openai) for i, m in enumerate(messages)]
    try:
        text = render_conversation(
            tokenizer, conversation, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, chat_template=chat_template,
            tools=tools, documents=documents, chat_template_kwargs=chat_template_kwargs,
        )
    except ValueError as exc:
        message = str(exc)
        for param in ("tools", "documents"):  # they, not the conversation, are at fault
            if message.startswith(f"{param}: "):
                raise ParamError(param, message) from exc
        raise ParamError("messages", message.removeprefix("messages: ")) from exc
    if check_text is not None:
        check_text(text)
    # The template already holds every special token it wants (BOS included).
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
