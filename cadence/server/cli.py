"""``cadence serve [MODEL]``: the OpenAI-compatible server under uvicorn."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from cadence.cli_config import (
    FILE_MODEL,
    add_config_arg,
    expand_config,
    flags_with_config,
    json_object,
    json_string_list,
)
from cadence.cli_types import int_at_least
from cadence.engine.engine_args import EngineArgs
from cadence.server.reasoning import REASONING_PARSERS
from cadence.server.serve_options import (
    DEFAULT_MODEL,
    api_keys_from,
    check_served_names,
    engine_args_from,
    load_chat_template,
    model_given,
    settings_from,
)
from cadence.server.settings import UVICORN_LOG_LEVELS, ResponseOptions, ServerSettings
from cadence.server.tool_calls import TOOL_CALL_PARSERS
from cadence.user_errors import ArgumentParser, flags_given, one_line_errors

# The command line's meanings live in serve_options; named here too, where callers found them.
__all__ = ["add_serve_args", "add_serve_parser", "api_keys_from", "check_served_names",
           "engine_args_from", "load_chat_template", "model_given", "run_serve", "serve_main",
           "settings_from"]

logger = logging.getLogger("cadence.serve")


DESCRIPTION = (
    "Serve MODEL (default: the built-in 'tiny' model) with an OpenAI-compatible HTTP API "
    "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics and more) and a "
    "page for the browser at / (chat playground, live engine view). "
    "Flags have vLLM's names and meanings."
)


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="built-in model name, shape preset or HF checkpoint directory (default: tiny)",
    )
    add_config_arg(parser)
    parser.add_argument(FILE_MODEL, dest="file_model", default=None, help=argparse.SUPPRESS)
    defaults = ServerSettings()
    parser.add_argument("--host", default=defaults.host,
                        help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=defaults.port,
                        help="port to listen on; 0 = any free port (default: %(default)s)")
    parser.add_argument(
        "--api-key", nargs="+", default=None, metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1/*, /stats and the profiling routes; "
             "several keys: any one of them (for rotation); default: the CADENCE_API_KEY or "
             "VLLM_API_KEY variable",
    )
    parser.add_argument(
        "--served-model-name", nargs="+", default=None, metavar="NAME",
        help="model name(s) in the API: requests may use any, responses carry the one used "
             "(the first where none is) (default: MODEL)",
    )
    parser.add_argument(
        "--chat-template", default=None, metavar="FILE|TEMPLATE",
        help="a Jinja chat template (a file, or the template itself) instead of the "
             "tokenizer's (default: the tokenizer's, else ChatML)",
    )
    parser.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=defaults.max_request_body_bytes,
        help="larger request bodies get 413, refused before reading (default: 8 MiB)",
    )
    parser.add_argument(
        "--timeout-keep-alive",
        type=float,
        default=defaults.timeout_keep_alive,
        help="close an idle kept-alive connection after this many seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--header-read-timeout",
        type=float,
        default=defaults.header_read_timeout,
        help="seconds a client has to send complete request headers (default: %(default)s)",
    )
    parser.add_argument(
        "--body-read-timeout",
        type=float,
        default=defaults.body_read_timeout,
        help="seconds a client has to send the whole request body (default: %(default)s)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=defaults.shutdown_timeout,
        help="on SIGINT/SIGTERM, seconds in-flight requests get to finish before they are "
        "ended with an error (default: %(default)s)",
    )
    parser.add_argument(
        "--engine-stall-timeout",
        type=float,
        default=defaults.engine_stall_timeout,
        help="/health answers 503 when requests are unfinished and no engine step completed "
        "for this many seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--http",
        default=defaults.http,
        choices=("auto", "h11", "httptools"),
        help="HTTP/1.1 implementation; auto = httptools when installed (default: %(default)s)",
    )
    parser.add_argument(
        "--api-server-count",
        type=int,
        default=defaults.api_server_count,
        help="API server processes that share the port over one engine-core process (more "
        "than 1 implies --engine-process; for hundreds of concurrent streams) "
        "(default: %(default)s)",
    )
    _add_http_args(parser, defaults)
    _add_response_args(parser, defaults.responses)
    parser.add_argument(
        "--enable-auto-tool-choice", action=argparse.BooleanOptionalAction, default=False,
        help="let chat requests with tools use tool_choice 'auto': the model's tool calls are "
        "parsed out of its answer (needs --tool-call-parser)",
    )
    parser.add_argument(
        "--tool-call-parser", default=None, choices=list(TOOL_CALL_PARSERS),
        help="how tool calls are written: hermes = <tool_call> JSON lines (Hermes, Qwen2.5, "
        "Qwen3 templates); llama3_json = JSON objects {name, parameters} that start the answer, "
        "'; ' between them, after an optional <|python_tag|> (Llama 3.x templates)",
    )
    parser.add_argument(
        "--chat-template-content-format", default="auto", metavar="{auto,string,openai}",
        help="how message content reaches the chat template: openai = a list of "
        "{type: text, text} parts, string = the parts' text joined by newlines, auto = openai "
        "where the template loops over a message's content, else string (vLLM's)",
    )
    parser.add_argument(
        "--default-chat-template-kwargs", type=json_object, default=None, metavar="JSON",
        help="the chat template's variables for every request, under the request's own "
        "chat_template_kwargs (vLLM's), e.g. '{\"enable_thinking\": false}'",
    )
    parser.add_argument(
        "--trust-request-chat-template", action=argparse.BooleanOptionalAction, default=False,
        help="let chat requests carry their own chat_template (a template runs on the server's "
        "CPU: trust the clients); without it such a request gets a 400",
    )
    parser.add_argument(
        "--reasoning-parser", default=None, choices=sorted(REASONING_PARSERS),
        help="put the model's <think> ... </think> text into the chat message's reasoning "
        "field: qwen3 (the model opens the tag) or deepseek_r1 (the prompt opens it)",
    )
    parser.add_argument(
        "--disable-web-page", action=argparse.BooleanOptionalAction, default=False,
        help="do not serve the browser page at / (a chat playground and a live view of the "
        "engine, which reads /stats; /stats itself stays)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error"),
        help="cadence's own log level (default: %(default)s)",
    )
    parser.add_argument(
        "--uvicorn-log-level", default=None, choices=UVICORN_LOG_LEVELS,
        help="uvicorn's log level (its start-up lines and access log) (default: --log-level, "
        "which is info unless given)",
    )
    parser.add_argument(
        "--enable-log-requests", action=argparse.BooleanOptionalAction, default=False,
        help="log each request's start and end",
    )
    parser.add_argument(
        "--disable-uvicorn-access-log", action=argparse.BooleanOptionalAction, default=False,
        help="no uvicorn access-log line per request (vLLM's)",
    )
    parser.add_argument(
        "--max-log-len", type=int_at_least(0), default=None, metavar="N",
        help="with --enable-log-requests: the most prompt characters and token ids a request's "
        "log line shows (default: all)",
    )
    parser.add_argument(
        "--disable-log-requests", dest="enable_log_requests", action="store_false",
        help="vLLM's older flag, accepted: requests are not logged (the default; the last of "
        "the two flags counts)",
    )
    parser.add_argument(
        "--disable-log-stats", action=argparse.BooleanOptionalAction, default=False,
        help="accepted for vLLM compatibility and changes nothing: cadence logs no periodic "
        "stats (/metrics is always served)",
    )
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(model=DEFAULT_MODEL)  # "tiny", told apart from a --model tiny
    return parser


def _add_http_args(parser: argparse.ArgumentParser, defaults: ServerSettings) -> None:
    """CORS, TLS and the proxy path prefix (vLLM's flags, uvicorn's meanings)."""
    examples = {"origins": '["https://app.example"]', "methods": '["GET", "POST"]',
                "headers": '["Authorization", "Content-Type"]'}
    for name, example in examples.items():
        parser.add_argument(
            f"--allowed-{name}",
            type=json_string_list,
            default=list(getattr(defaults, f"allowed_{name}")),
            metavar="JSON",
            help=f"CORS: allowed {name}, a JSON list such as '{example}' (default: [\"*\"])",
        )
    parser.add_argument(
        "--allow-credentials", action=argparse.BooleanOptionalAction, default=False,
        help="CORS: allow credentials (cookies, Authorization) in cross-origin requests",
    )
    parser.add_argument("--ssl-keyfile", default=None, metavar="FILE",
                        help="TLS private key (PEM); serve HTTPS with --ssl-certfile")
    parser.add_argument("--ssl-certfile", default=None, metavar="FILE",
                        help="TLS certificate chain (PEM); serve HTTPS")
    parser.add_argument(
        "--root-path", default=defaults.root_path, metavar="PATH",
        help="the path prefix under which a routing proxy serves this server, e.g. /llm; "
        "requests may come with or without it (default: none)",
    )


def _add_response_args(parser: argparse.ArgumentParser, defaults: ResponseOptions) -> None:
    """What responses carry (vLLM's flags and meanings)."""
    parser.add_argument(
        "--response-role", default=defaults.response_role, metavar="ROLE",
        help="the role of a chat answer when the request adds the generation prompt "
        "(default: %(default)s)")
    parser.add_argument(
        "--enable-prompt-tokens-details", action=argparse.BooleanOptionalAction, default=False,
        help="usage carries prompt_tokens_details.cached_tokens: the prompt tokens served from "
        "the prefix cache")
    parser.add_argument(
        "--enable-force-include-usage", action=argparse.BooleanOptionalAction, default=False,
        help="every streamed response ends with a usage chunk, asked for or not")
    parser.add_argument(
        "--return-tokens-as-token-ids", action=argparse.BooleanOptionalAction, default=False,
        help="logprobs name each token 'token_id:N' unless the request sets "
        "return_tokens_as_token_ids false")
    parser.add_argument(
        "--enable-request-id-headers", action=argparse.BooleanOptionalAction, default=False,
        help="every response carries an X-Request-Id header: the request's, else a new one")


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``serve`` on the ``cadence`` command's subparsers (dispatch: ``args.func``)."""
    parser = subparsers.add_parser(
        "serve", help="serve a model with an OpenAI-compatible HTTP API", description=DESCRIPTION
    )
    add_serve_args(parser)
    parser.set_defaults(func=run_serve)
    return parser


def run_serve(ns: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (exit status 0) or until the engine dies (status 1)."""
    from cadence.engine.async_llm import AsyncLLM
    from cadence.server.launcher import bind_socket, build_server
    from cadence.server.middleware import check_ssl_files

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(ns.log_level.upper())
    settings = settings_from(ns)  # a ValueError is a one-line error (cadence.user_errors)
    check_served_names(ns)
    keys = api_keys_from(ns)
    chat_template = load_chat_template(ns.chat_template)
    args = engine_args_from(ns)
    check_ssl_files(settings)
    if settings.api_server_count > 1:
        return _run_api_servers(ns, settings, args, chat_template, keys)
    sock = bind_socket(settings.host, settings.port)  # a taken port fails before the model loads
    try:
        engine = AsyncLLM(args, log_requests=ns.enable_log_requests,
                          max_log_len=ns.max_log_len)
    except BaseException:
        sock.close()
        raise
    # NOTE: after the engine starts: a mistake it finds (no such model) stays one line.
    logger.info("Engine arguments: %s", args)
    try:
        config = engine.engine_core.call_utility("config")
        logger.info(
            "Resolved: model=%s served as %r, max_model_len=%d, kv blocks=%d x %d tokens, "
            "config=%s",
            args.model,
            ns.served_model_name or engine.model_name,
            engine.max_model_len,
            engine.num_kv_blocks,
            engine.block_size,
            config,
        )
        logger.info("Server settings: %s", settings)
        server = build_server(
            engine,
            settings,
            served_model_name=ns.served_model_name,
            api_key=keys,
            chat_template=chat_template,
        )
        logger.info(
            "Serving on %s://%s:%d%s (API key %s)",
            "https" if settings.ssl_certfile else "http",
            ns.host,
            sock.getsockname()[1],
            settings.root_path,
            "required" if keys else "not required",
        )
        server.run(sockets=[sock])
        return server.exit_code
    finally:
        engine.shutdown()


def _run_api_servers(ns: argparse.Namespace, settings: ServerSettings, args: EngineArgs,
                     chat_template: str | None, keys: tuple[str, ...]) -> int:
    from dataclasses import replace

    from cadence.server.api_servers import FrontEndOptions, run_api_servers

    args = replace(args, engine_process=True)
    logger.info("Engine arguments: %s", args)
    logger.info("Server settings: %s", settings)
    options = FrontEndOptions(settings, ns.served_model_name, keys, ns.log_level,
                              ns.enable_log_requests, chat_template, ns.max_log_len)
    return run_api_servers(args, options, settings.api_server_count)


def serve_main(argv: list[str] | None = None) -> int:
    import sys

    parser = add_serve_args(ArgumentParser(prog="cadence serve", description=DESCRIPTION))
    given = sys.argv[1:] if argv is None else argv
    with one_line_errors(parser.prog, flags=lambda: flags_with_config(
            parser, given, lambda a: {**flags_given(parser, a), **EngineArgs.cli_flags(a)})):
        ns = parser.parse_args(expand_config(parser, given))
        return run_serve(ns)
