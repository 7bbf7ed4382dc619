"""How ``cadence serve`` listens, reads requests, watches the engine and shuts down."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cadence.chat import CONTENT_FORMATS
from cadence.chat_options import check_template_options

__all__ = ["DEFAULT_MAX_REQUEST_BODY_BYTES", "UVICORN_LOG_LEVELS", "ResponseOptions",
           "ServerSettings"]

DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 1024 * 1024
UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_CORS_LISTS = ("allowed_origins", "allowed_methods", "allowed_headers")


@dataclass(frozen=True)
class ResponseOptions:
    """What the server adds to or changes in its responses (vLLM's flags of the same names)."""

    # The role of a chat answer when the prompt ends with the generation prompt.
    response_role: str = "assistant"
    # usage.prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache supplied.
    enable_prompt_tokens_details: bool = False
    # Streamed responses end with a usage chunk whether or not stream_options asks for one.
    enable_force_include_usage: bool = False
    # Logprobs name tokens "token_id:N" unless a request says otherwise.
    return_tokens_as_token_ids: bool = False
    # Every response carries X-Request-Id: the request's header, else a new one.
    enable_request_id_headers: bool = False

    def __post_init__(self) -> None:
        if not self.response_role.strip():
            raise ValueError("response_role must be a non-empty role name.")


@dataclass(frozen=True)
class ServerSettings:
    """Every server-side knob (seconds for times); docs/serving.md explains each."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    # An idle kept-alive connection is closed after this long (uvicorn's and vLLM's default).
    timeout_keep_alive: float = 5.0
    # From a connection's first byte (or its opening) to the end of the request headers.
    header_read_timeout: float = 20.0
    # From the end of the headers to the end of the body.
    body_read_timeout: float = 60.0
    # In-flight requests get this long after SIGINT / SIGTERM before they are ended.
    shutdown_timeout: float = 20.0
    # Unfinished requests and no completed engine step for this long: /health answers 503.
    engine_stall_timeout: float = 60.0
    # After the engine dies, the server answers 503 for this long, then exits with status 1.
    engine_death_grace: float = 2.0
    # HTTP/1.1 implementation: "auto" (httptools when installed, else h11), "h11", "httptools".
    http: str = "auto"
    # API server processes over one engine-core process; more than 1 implies engine_process.
    api_server_count: int = 1
    # uvicorn's own loggers (startup lines, access log, protocol errors).
    uvicorn_log_level: str = "info"
    # CORS, as vLLM: every origin, method and header allowed unless narrowed; no credentials.
    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    # HTTPS when given (the key may also be inside the certificate file).
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    # The path prefix a routing proxy serves this server under ("" for none).
    root_path: str = ""
    # The browser page at / (chat playground and engine view); /stats is served either way.
    web_page: bool = True
    # Splits <think> ... </think> into the message's reasoning field (cadence.server.reasoning).
    reasoning_parser: str | None = None
    # Tool calls parsed out of chat answers for tool_choice "auto" (cadence.server.tool_calls).
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    # Chat requests may carry their own Jinja chat template (vLLM's flag; off: a 400).
    trust_request_chat_template: bool = False
    # How message content reaches the template (vLLM's): auto (read from the template),
    # string (text parts joined) or openai (a list of text parts).
    chat_template_content_format: str = "auto"
    disable_uvicorn_access_log: bool = False  # uvicorn's line per request off (vLLM's)
    # The template's variables for every chat request, under the request's own (vLLM's).
    default_chat_template_kwargs: Mapping[str, Any] | None = None
    responses: ResponseOptions = ResponseOptions()

    def __post_init__(self) -> None:
        for name in _CORS_LISTS:
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name} must be a list of strings, got {value!r}.")
            object.__setattr__(self, name, tuple(value))  # lists from JSON or YAML
        if self.chat_template_content_format not in CONTENT_FORMATS:
            raise ValueError("--chat-template-content-format must be one of "
                             f"{', '.join(CONTENT_FORMATS)}, got "
                             f"{self.chat_template_content_format!r}.")
        kwargs = self.default_chat_template_kwargs
        if kwargs is not None:
            if not isinstance(kwargs, Mapping):
                raise ValueError("--default-chat-template-kwargs must be a JSON object, got "
                                 f"{kwargs!r}.")
            if "chat_template" in kwargs:  # a request's own template must be trusted
                raise ValueError("--default-chat-template-kwargs cannot set chat_template: give "
                                 "the server's template with --chat-template.")
            problem = check_template_options(kwargs, True, False)
            if problem is not None:  # what a request's own kwargs would get: a 400
                raise ValueError("--default-chat-template-kwargs: " + problem[1])
        if self.uvicorn_log_level not in UVICORN_LOG_LEVELS:
            raise ValueError(f"uvicorn_log_level must be one of {UVICORN_LOG_LEVELS}, "
                             f"got {self.uvicorn_log_level!r}.")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("--ssl-keyfile needs --ssl-certfile (the certificate to serve).")
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise ValueError(f"root_path must start with '/' and not end with one (e.g. '/llm'), "
                             f"got {self.root_path!r}.")
        if self.reasoning_parser is not None:
            from cadence.server.reasoning import reasoning_parser

            reasoning_parser(self.reasoning_parser)  # a ValueError naming the choices
        from cadence.server.tool_calls import TOOL_CALL_PARSERS

        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(f"--tool-call-parser {self.tool_call_parser!r} is not known; "
                             f"use one of {', '.join(TOOL_CALL_PARSERS)}.")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (one of "
                             f"{', '.join(TOOL_CALL_PARSERS)}).")
        if not 1 <= self.api_server_count <= 64:
            raise ValueError(f"api_server_count must be in [1, 64], got {self.api_server_count}.")
        if self.http not in ("auto", "h11", "httptools"):
            raise ValueError(f"http must be 'auto', 'h11' or 'httptools', got {self.http!r}.")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}.")
        if self.max_request_body_bytes < 1:
            raise ValueError(
                f"max_request_body_bytes must be positive, got {self.max_request_body_bytes}."
            )
        positive = {
            "timeout_keep_alive": self.timeout_keep_alive,
            "header_read_timeout": self.header_read_timeout,
            "body_read_timeout": self.body_read_timeout,
            "engine_stall_timeout": self.engine_stall_timeout,
        }
        for name, value in positive.items():
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}.")
        for name, value in (
            ("shutdown_timeout", self.shutdown_timeout),
            ("engine_death_grace", self.engine_death_grace),
        ):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value}.")
