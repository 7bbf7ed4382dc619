"""``cadence serve [MODEL]``: the OpenAI-compatible server under uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from cadence.engine.engine_args import EngineArgs

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
    parser.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=None,
        help="larger request bodies get 413 (default: 8 MiB)",
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


def run_serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from cadence.engine.async_llm import AsyncLLM
    from cadence.server.app import DEFAULT_MAX_REQUEST_BODY_BYTES, build_app

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(ns.log_level.upper())
    args = engine_args_from(ns)
    logger.info("Engine arguments: %s", args)
    engine = AsyncLLM(args, log_requests=ns.enable_log_requests)
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
        app = build_app(
            engine,
            served_model_name=ns.served_model_name,
            api_key=ns.api_key,
            max_request_body_bytes=ns.max_request_body_bytes or DEFAULT_MAX_REQUEST_BODY_BYTES,
        )
        logger.info(
            "Serving on http://%s:%d (API key %s)",
            ns.host,
            ns.port,
            "required" if ns.api_key else "not required",
        )
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=ns.host,
                port=ns.port,
                log_level=ns.log_level,
                timeout_graceful_shutdown=5,
                lifespan="off",
            )
        )
        try:
            asyncio.run(server.serve())
        except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled gracefully
            logger.info("Interrupted; shutting down.")
    finally:
        engine.shutdown()
    return 0


def serve_main(argv: list[str] | None = None) -> int:
    parser = add_serve_args(argparse.ArgumentParser(prog="cadence serve", description=__doc__))
    return run_serve(parser.parse_args(argv))
