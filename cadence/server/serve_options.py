"""What a parsed ``cadence serve`` command line means: the engine's arguments (which model),
the server's settings, the API keys, the chat template file or text, and the checks of the
mistakes a command line makes that argparse cannot see."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cadence.engine.engine_args import EngineArgs
from cadence.envs import read_envs
from cadence.server.settings import ResponseOptions, ServerSettings

__all__ = ["DEFAULT_MODEL", "api_keys_from", "check_no_model_taken", "check_served_names",
           "engine_args_from", "load_chat_template", "model_given", "settings_from"]


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    """The engine's arguments; the model: the positional, else --model, else a --config
    file's."""
    if ns.model_tag is not None:
        if model_given(ns) and ns.model != ns.model_tag:
            # vLLM moves --model into the positional's place: two models are an error there.
            raise ValueError(f"two models given: {ns.model_tag!r} and --model {ns.model!r}; "
                             f"give one (cadence serve MODEL).")
        ns.model = ns.model_tag
    elif not model_given(ns) and getattr(ns, "file_model", None) is not None:
        ns.model = ns.file_model
    ns.model = str(ns.model)
    return EngineArgs.from_cli_args(ns)


class _Default(str):
    """The default model's name, as a value of its own: ``--model tiny`` is not it."""


DEFAULT_MODEL = _Default(EngineArgs.model)


def model_given(ns: argparse.Namespace) -> bool:
    """Whether ``--model`` was given (its value is not the parser's default object)."""
    model = getattr(ns, "model", None)
    return model is not None and not isinstance(model, _Default)


def settings_from(ns: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        host=ns.host,
        port=ns.port,
        max_request_body_bytes=ns.max_request_body_bytes,
        timeout_keep_alive=ns.timeout_keep_alive,
        header_read_timeout=ns.header_read_timeout,
        body_read_timeout=ns.body_read_timeout,
        shutdown_timeout=ns.shutdown_timeout,
        engine_stall_timeout=ns.engine_stall_timeout,
        http=ns.http,
        api_server_count=ns.api_server_count,
        uvicorn_log_level=ns.uvicorn_log_level or ns.log_level,
        allowed_origins=tuple(ns.allowed_origins),
        allowed_methods=tuple(ns.allowed_methods),
        allowed_headers=tuple(ns.allowed_headers),
        allow_credentials=ns.allow_credentials,
        ssl_keyfile=ns.ssl_keyfile,
        ssl_certfile=ns.ssl_certfile,
        root_path=ns.root_path,
        web_page=not ns.disable_web_page,
        reasoning_parser=ns.reasoning_parser,
        enable_auto_tool_choice=ns.enable_auto_tool_choice,
        tool_call_parser=ns.tool_call_parser,
        trust_request_chat_template=ns.trust_request_chat_template,
        chat_template_content_format=ns.chat_template_content_format,
        default_chat_template_kwargs=ns.default_chat_template_kwargs,
        disable_uvicorn_access_log=ns.disable_uvicorn_access_log,
        responses=ResponseOptions(
            response_role=ns.response_role,
            enable_prompt_tokens_details=ns.enable_prompt_tokens_details,
            enable_force_include_usage=ns.enable_force_include_usage,
            return_tokens_as_token_ids=ns.return_tokens_as_token_ids,
            enable_request_id_headers=ns.enable_request_id_headers,
        ),
    )


def api_keys_from(ns: argparse.Namespace) -> tuple[str, ...]:
    """The keys the server requires: ``--api-key``'s, or else the environment's (CADENCE_API_KEY,
    or vLLM's VLLM_API_KEY), or none. An empty key on the command line is a mistake (it would
    read as no key: an open server where one was meant to be closed)."""
    keys = tuple(ns.api_key or ())
    if any(not key.strip() for key in keys):
        raise ValueError("--api-key: a key cannot be empty.")
    check_no_model_taken(ns, "--api-key", keys)
    if keys:
        return keys
    key = read_envs().api_key
    if key and not key.strip():
        raise ValueError("CADENCE_API_KEY / VLLM_API_KEY is blank: unset it, or give a key.")
    return (key,) if key else ()


def check_no_model_taken(ns: argparse.Namespace, flag: str, values: tuple[str, ...]) -> None:
    """``serve --api-key K /models/x`` (or ``--served-model-name``): a flag of several values
    took the model, given after it, as one of its own, and the default model would be served.
    Refused where no model came otherwise and a value names one (a path, a preset)."""
    from cadence.model.presets import PRESETS
    from cadence.model.registry import TINY_MODEL

    if (ns.model_tag is not None or model_given(ns)
            or getattr(ns, "file_model", None) is not None):
        return
    taken = [v for v in values if os.path.exists(v) or v in PRESETS or v == TINY_MODEL]
    if taken:
        raise ValueError(f"{flag} takes every value up to the next option, and {taken[0]!r} "
                         f"names a model: put the model first (cadence serve MODEL {flag} ...).")


def check_served_names(ns: argparse.Namespace) -> None:
    """``--served-model-name``'s values: none empty, none a model the flag took."""
    names = tuple(ns.served_model_name or ())
    if any(not name.strip() for name in names):
        raise ValueError("--served-model-name: a model name cannot be empty.")
    check_no_model_taken(ns, "--served-model-name", names)


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False where the name cannot be one (an inline template past the
    system's name length: ENAMETOOLONG is raised, not answered False, before Python 3.12)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a file's text, or the value itself when it is a template, its
    backslash escapes (``\\n``, ``\\t``, ``\\u....``) read as vLLM reads an inline template."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if _is_file(path):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--chat-template: cannot read {value!r}: {exc}") from None
    elif "{{" in value or "{%" in value:
        # Characters past Latin-1 ride through the escape decoding as their own escapes.
        try:
            text = value.encode("latin-1", "backslashreplace").decode("unicode_escape")
        except UnicodeDecodeError as exc:
            raise ValueError(f"--chat-template: a bad escape in the template: {exc.reason} "
                             f"at character {exc.start}.") from None
    else:
        raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template.")
    # A template that does not parse would fail every chat request: refuse it at start-up.
    from cadence.server.chat_template import check_template_syntax
    from cadence.server.protocol import ParamError

    try:
        check_template_syntax(text)
    except ParamError as exc:
        raise ValueError(f"--chat-template: {exc}") from None
    return text
