"""``cadence serve [MODEL]``: the OpenAI-compatible server under uvicorn."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from cadence.engine.engine_args import EngineArgs
from cadence.server.settings import ServerSettings

logger = logging.getLogger("cadence.serve")


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="built-in model name or HF checkpoint directory (default: tiny)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*"
    )
    parser.add_argument(
        "--served-model-name", default=None, help="model name in the API (default: MODEL)"
    )
    defaults = ServerSettings()
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
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    parser.add_argument(
        "--enable-log-requests", action="store_true", help="log each request's start and end"
    )
    EngineArgs.add_cli_args(parser)
    return parser


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``serve`` on the ``cadence`` command's subparsers (dispatch: ``args.func``)."""
    parser = subparsers.add_parser(
        "serve", help="serve a model with an OpenAI-compatible HTTP API", description=__doc__
    )
    add_serve_args(parser)
    parser.set_defaults(func=run_serve)
    return parser


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    if ns.model_tag is not None:
        ns.model = ns.model_tag
    return EngineArgs.from_cli_args(ns)


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
    )


def run_serve(ns: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (exit status 0) or until the engine dies (status 1)."""
    from cadence.engine.async_llm import AsyncLLM
    from cadence.server.launcher import bind_socket, build_server

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(ns.log_level.upper())
    settings = settings_from(ns)  # a ValueError is a one-line error (cadence.user_errors)
    args = engine_args_from(ns)
    if settings.api_server_count > 1:
        return _run_api_servers(ns, settings, args)
    logger.info("Engine arguments: %s", args)
    sock = bind_socket(settings.host, settings.port)  # a taken port fails before the model loads
    try:
        engine = AsyncLLM(args, log_requests=ns.enable_log_requests)
    except BaseException:
        sock.close()
        raise
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
            api_key=ns.api_key,
            log_level=ns.log_level,
        )
        logger.info(
            "Serving on http://%s:%d (API key %s)",
            ns.host,
            sock.getsockname()[1],
            "required" if ns.api_key else "not required",
        )
        server.run(sockets=[sock])
        return server.exit_code
    finally:
        engine.shutdown()


def _run_api_servers(ns: argparse.Namespace, settings: ServerSettings, args: EngineArgs) -> int:
    from dataclasses import replace

    from cadence.server.api_servers import FrontEndOptions, run_api_servers

    args = replace(args, engine_process=True)
    logger.info("Engine arguments: %s", args)
    logger.info("Server settings: %s", settings)
    options = FrontEndOptions(settings, ns.served_model_name, ns.api_key, ns.log_level,
                              ns.enable_log_requests)
    return run_api_servers(args, options, settings.api_server_count)


def serve_main(argv: list[str] | None = None) -> int:
    parser = add_serve_args(argparse.ArgumentParser(prog="cadence serve", description=__doc__))
    return run_serve(parser.parse_args(argv))
