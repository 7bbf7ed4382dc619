"""Conversations rendered through a tokenizer's chat template: the offline ``LLM.chat`` and the
server's chat endpoints share it. Messages here are plain dicts in the shape Hugging Face chat
templates read (``role``, text ``content``, an assistant's ``tool_calls``, ...)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from cadence.chat_options import check_template_options, named_template, split_overrides
from cadence.json_nesting import MAX_JSON_DEPTH, nesting_depth

__all__ = ["CONTENT_FORMATS", "TEXT_PARTS", "add_reasoning", "content_format", "content_parts",
           "conversation_of", "detect_content_format", "developer_as_system", "part_texts",
           "render_conversation", "tool_arguments"]

# OpenAI's roles ("function": its deprecated role of a function call's result). Any other role
# string passes to the template as vLLM passes it (Llama 3.1's "ipython", a template's own).
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# Content parts read as text (vLLM): each type and the key holding its text. An assistant's
# refusal as OpenAI clients replay it, and the Responses API's input_text / output_text.
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}

# Used only when the tokenizer ships no template (the built-in byte-level model): ChatML.
_CHATML_START = "<|im_start|>"
_CHATML_END = "<|im_end|>"


# How message content reaches the template (vLLM's --chat-template-content-format): "string"
# (text parts joined by newlines) or "openai" (a list of {"type": "text", "text": ...} parts);
# "auto" reads the template: one that loops over a message's content gets the parts.
CONTENT_FORMATS = ("auto", "string", "openai")


def content_format(requested: str, tokenizer: Any, chat_template: str | None,
                   tools: Any = None) -> str:
    """"string" or "openai": ``requested``, or for "auto" what the template that renders (the
    given one, else the tokenizer's; ChatML without one takes strings) iterates over. Where the
    tokenizer has several named templates, the one its ``get_chat_template`` picks for these
    ``tools`` (``tool_use`` with tools, else ``default``), as transformers renders with it."""
    if requested not in CONTENT_FORMATS:
        raise ValueError(f"chat_template_content_format must be one of "
                         f"{', '.join(CONTENT_FORMATS)}, got {requested!r}.")
    if requested != "auto":
        return requested
    template: Any = chat_template
    getter = getattr(tokenizer, "get_chat_template", None)
    if getter is not None:
        try:
            template = getter(chat_template, tools=tools)
        except Exception:  # no template at all (ChatML renders it): strings
            template = chat_template
    elif template is None:
        template = getattr(tokenizer, "chat_template", None)
    return detect_content_format(template) if isinstance(template, str) else "string"


@functools.lru_cache(maxsize=64)
def detect_content_format(template: str) -> str:
    """"openai" where the template has a ``for`` loop over a message's ``content`` (a message
    being a name bound by loops over, or assignments from, ``messages``, in any chain) or over
    a name ``content``, else "string" (also for a template that does not parse: its error comes
    when it renders), as vLLM's detection reads it."""
    import jinja2
    from jinja2 import nodes

    try:
        tree = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"

    def base(node: Any) -> Any:  # through item / attribute access, filters and tests
        while isinstance(node, (nodes.Getitem, nodes.Getattr, nodes.Filter, nodes.Test)):
            if getattr(node, "node", None) is None:
                break
            node = node.node
        return node

    def names(target: Any) -> set[str]:
        return {n.name for n in target.find_all(nodes.Name)} | (
            {target.name} if isinstance(target, nodes.Name) else set())

    # The names bound, through any chain of assignments and loops, from ``messages``: lists of
    # messages (``loop_messages = messages[1:]``) and messages alike.
    messages = {"messages"}
    grown = True
    while grown:
        grown = False
        for node in tree.find_all((nodes.For, nodes.Assign)):
            root = base(node.iter if isinstance(node, nodes.For) else node.node)
            if isinstance(root, nodes.Name) and root.name in messages:
                new = names(node.target) - messages
                messages |= new
                grown = grown or bool(new)
    for loop in tree.find_all(nodes.For):
        it = loop.iter
        while isinstance(it, (nodes.Filter, nodes.Test)) and it.node is not None:
            it = it.node
        if isinstance(it, nodes.Name) and it.name == "content":
            return "openai"  # a macro's loop over the content it was handed (Qwen3.5's)
        key = (it.arg.value if isinstance(it, nodes.Getitem) and isinstance(it.arg, nodes.Const)
               else it.attr if isinstance(it, nodes.Getattr) else None)
        holder = getattr(it, "node", None)
        if key == "content" and isinstance(holder, nodes.Name) and holder.name in messages:
            return "openai"
    return "string"


def _is_text_part(part: Any) -> bool:
    if isinstance(part, str):
        return True
    if not isinstance(part, Mapping) or part.get("type") not in TEXT_PARTS:
        return False
    text = part.get(TEXT_PARTS[part["type"]])
    return text is None or isinstance(text, str)


def part_texts(parts: Sequence[Any]) -> list[str]:
    """The texts of a list of content parts, in order (vLLM's reading): a plain string is a text
    part; a text-like part (``TEXT_PARTS``) gives its text; one whose text is null or missing
    is skipped. Parts are assumed checked (``conversation_of``, the server's schema)."""
    texts = []
    for part in parts:
        text = part if isinstance(part, str) else part.get(TEXT_PARTS[part["type"]])
        if text is not None:
            texts.append(text)
    return texts


def content_parts(content: Any) -> list[dict[str, str]]:
    """A message's content as OpenAI's text parts (the "openai" content format): a string is
    one part, each text-like part (``part_texts``) a text part of its text, None none."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "text", "text": text} for text in part_texts(content)]


def conversation_of(messages: Any, content_format: str = "string") -> list[dict[str, Any]]:
    """One offline conversation as the templates read it: each message a mapping with a string
    ``role`` (any: the template decides what it shows) and ``content`` text, a list of text
    parts (``part_texts``, joined by newlines), or None (an assistant's tool calls); other keys
    pass through but for those set to None. ``content_format`` "openai": the content as text
    parts (``content_parts``; a tool message's stays a string, as templates read tool results).
    A ValueError names the bad message."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages: a conversation is a non-empty list of message dicts.")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages.{i}: a message is a dict, got "
                             f"{type(message).__name__}.")
        if not isinstance(message.get("role"), str):
            raise ValueError(f"messages.{i}.role: a string such as {', '.join(ROLES)}, got "
                             f"{message.get('role')!r}.")
        content = raw = message.get("content")
        if isinstance(content, Sequence) and not isinstance(content, str):
            if not all(_is_text_part(p) for p in content):
                raise ValueError(f"messages.{i}.content: only text parts "
                                 "({'type': 'text', 'text': ...}, or refusal, input_text, "
                                 "output_text, or plain strings) are supported.")
            content = "\n".join(part_texts(content))
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ValueError(f"messages.{i}.content: must be a string or a list of text parts, "
                             f"got {type(content).__name__}.")
        if content_format == "openai" and message["role"] != "tool":
            content = content_parts(raw)
        # Keys set to None are left out, as the server's messages leave them (a template's
        # "is defined" test must not see a null reasoning or name; newer transformers releases
        # drop them too, older ones rendered "None").
        shaped = {key: value for key, value in message.items() if value is not None}
        shaped["content"] = content
        if message["role"] == "assistant":
            add_reasoning(shaped, message.get("reasoning"), message.get("reasoning_content"))
            reasoning = shaped.get("reasoning")
            if reasoning is not None and not isinstance(reasoning, str):
                raise ValueError(f"messages.{i}.reasoning: must be a string, got "
                                 f"{type(reasoning).__name__}.")
        if message.get("tool_calls"):
            shaped["tool_calls"] = [_tool_call(call, f"messages.{i}.tool_calls.{j}")
                                    for j, call in enumerate(message["tool_calls"])]
        else:  # an empty list is no calls (vLLM drops it; templates test "is defined")
            shaped.pop("tool_calls", None)
        out.append(shaped)
    return out


def add_reasoning(message: dict[str, Any], reasoning: Any, reasoning_content: Any) -> None:
    """An assistant message's earlier reasoning (``reasoning``, else its older name
    ``reasoning_content``) under both names templates read (Qwen3's and others' interleaved
    thinking), as vLLM hands it."""
    chosen = reasoning if reasoning is not None else reasoning_content
    if chosen is not None:
        message["reasoning"] = message["reasoning_content"] = chosen


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    """An assistant's tool call as templates read it: OpenAI's ``function.arguments`` JSON text
    parsed into an object (templates serialise it themselves), as the server and vLLM hand it."""
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ValueError(f"{where}: a tool call is {{'type': 'function', 'function': "
                         "{'name': str, 'arguments': str}}.")
    arguments = fn.get("arguments")
    if arguments is None:
        arguments = {}  # vLLM's: no arguments are an empty object
    elif isinstance(arguments, str):
        try:
            arguments = tool_arguments(arguments)
        except ValueError as exc:
            raise ValueError(f"{where}.function.arguments: {exc}") from None
    return {**call, "type": call.get("type", "function"),
            "function": {**fn, "arguments": arguments}}


def tool_arguments(text: str) -> Any:
    """A tool call's arguments (OpenAI's JSON text) as the object templates read: empty text is
    an empty object (vLLM's, for calls without arguments), and so is JSON null (templates read
    the arguments as a mapping); a ValueError says what is wrong (nesting past MAX_JSON_DEPTH,
    checked without recursion; not JSON)."""
    if not text:
        return {}
    if nesting_depth(text) > MAX_JSON_DEPTH:
        raise ValueError(f"nest deeper than {MAX_JSON_DEPTH} levels.")
    try:
        value = json.loads(text, parse_constant=_not_json)
        return {} if value is None else value
    except (ValueError, RecursionError) as exc:
        if "int_max_str_digits" in str(exc):  # valid JSON past Python's digit limit
            raise ValueError(f"hold an integer of more than {sys.get_int_max_str_digits()} "
                             "digits.") from None
        shown = text if len(text) <= 200 else text[:200] + "..."
        raise ValueError(f"must be JSON, got {shown!r}.") from None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python's parser takes NaN and Infinity


def developer_as_system(conversation: list[dict[str, Any]], template: Any
                        ) -> list[dict[str, Any]]:
    """vLLM's rule for a template that never names the ``developer`` role (most drop messages
    of roles they do not know): developer messages become system ones (without their
    ``tools``), and where a system message is then not the first, or not the only one, all are
    merged into one at the front (their texts joined by a blank line), the others after it in
    order. ``template``: the template's text (or a tokenizer's named templates); None for the
    ChatML fallback, which names no developer role either."""
    if not any(m.get("role") == "developer" for m in conversation):
        return conversation
    texts = [template] if isinstance(template, str) else list(
        template.values() if isinstance(template, Mapping) else [])
    if any("'developer'" in t or '"developer"' in t for t in texts if isinstance(t, str)):
        return conversation
    converted = [{**{k: v for k, v in m.items() if k != "tools"}, "role": "system"}
                 if m.get("role") == "developer" else m for m in conversation]
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if systems in ([], [0]):
        return converted
    parts = any(isinstance(converted[i]["content"], list) for i in systems)
    texts = [_text_of(converted[i]["content"]) for i in systems]
    merged = "\n\n".join(t for t in texts if t)
    head = {"role": "system", "content": content_parts(merged) if parts else merged}
    return [head, *(m for m in converted if m["role"] != "system")]


def _text_of(content: Any) -> str:
    """A message's text: its string, or its text parts joined by newlines."""
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, Mapping) and "text" in p)
    return content or ""


def render_conversation(
    tokenizer: Any,
    conversation: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    documents: list[dict[str, str]] | None = None,
) -> str:
    """The prompt text of ``conversation``: ``chat_template`` or the tokenizer's, else ChatML.
    The renderer's options that ``chat_template_kwargs`` names count where the named ones are
    unset (vLLM's merge, ``chat_options.TEMPLATE_OVERRIDES``). A template that fails is a
    ValueError naming ``messages``."""
    problem = check_template_options(chat_template_kwargs, add_generation_prompt,
                                     continue_final_message)
    if problem is not None:
        raise ValueError(problem[1])
    overrides, chat_template_kwargs = split_overrides(chat_template_kwargs)
    chat_template = chat_template or named_template(overrides)
    tools = tools if tools is not None else overrides.get("tools")
    documents = documents if documents is not None else overrides.get("documents")
    for i, tool in enumerate(tools or []):
        if nesting_depth(tool) > MAX_JSON_DEPTH:
            raise ValueError(f"tools: tool {i} nests deeper than {MAX_JSON_DEPTH} levels.")
    template = chat_template if chat_template is not None else getattr(
        tokenizer, "chat_template", None)
    conversation = developer_as_system(conversation, template)
    if chat_template is None and not template:
        if tools:
            raise ValueError("tools: this model has no chat template, and the ChatML fallback "
                             "has no place for tools; pass a chat_template that shows them.")
        if documents:
            raise ValueError("documents: this model has no chat template, and the ChatML "
                             "fallback has no place for documents; pass a chat_template that "
                             "shows them.")
        text = _chatml(conversation, add_generation_prompt, continue_final_message)
    else:
        try:
            text = tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, chat_template=chat_template,
                tools=tools, documents=documents, **(chat_template_kwargs or {}),
            )
        except Exception as exc:  # jinja errors, template-level raise_exception()
            raise ValueError(f"messages: chat template rendering failed: {exc}") from exc
    if not isinstance(text, str) or not encodes_as_utf8(text):
        # A lone surrogate (a "\ud800" escape in tool-call arguments, or a template's own)
        # cannot be tokenized.
        raise ValueError("messages: the text cannot be tokenized (the rendered conversation "
                         "holds a lone surrogate such as \\ud800).")
    return text


def encodes_as_utf8(text: str) -> bool:
    """False for text holding a lone surrogate (JSON's "\\ud800" escape decodes to one): no
    tokenizer or response encoder takes it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _chatml(messages: list[dict[str, Any]], add_generation_prompt: bool,
            continue_final: bool) -> str:
    parts = []
    for i, m in enumerate(messages):
        last = i == len(messages) - 1
        end = "" if (continue_final and last) else f"{_CHATML_END}\n"
        content = m["content"]
        for call in m.get("tool_calls") or []:
            # The <tool_call> JSON lines of the Qwen templates.
            fn = call["function"]
            body = json.dumps({"name": fn["name"], "arguments": fn["arguments"]},
                              ensure_ascii=False)
            content += f"{chr(10) if content else ''}<tool_call>\n{body}\n</tool_call>"
        parts.append(f"{_CHATML_START}{m['role']}\n{content}{end}")
    if add_generation_prompt:
        parts.append(f"{_CHATML_START}assistant\n")
    return "".join(parts)
