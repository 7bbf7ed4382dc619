"""The operations GET /openapi.json documents: each route, its request and response models."""

from __future__ import annotations

from cadence.server.openapi import Operation
from cadence.server.protocol_chat import ChatCompletionRequest
from cadence.server.protocol_completion import CompletionRequest
from cadence.server.protocol_responses import (
    ChatCompletionResponse,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from cadence.server.responses_api import ResponsesRequest
from cadence.server.tokenization import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)

__all__ = ["API_OPERATIONS"]

API_OPERATIONS = [
    Operation("/v1/completions", "POST", "Completions (OpenAI)", CompletionRequest,
              CompletionResponse, streams=True),
    Operation("/v1/chat/completions", "POST", "Chat completions (OpenAI)",
              ChatCompletionRequest, ChatCompletionResponse, streams=True),
    Operation("/v1/responses", "POST", "Responses (OpenAI; no response store)",
              ResponsesRequest, streams=True),
    Operation("/v1/responses/{response_id}", "GET", "404: this server keeps no responses"),
    Operation("/v1/models", "GET", "The served model", response=ModelList),
    Operation("/v1/models/{model}", "GET", "One served model's card (OpenAI), or 404",
              response=ModelCard),
    Operation("/tokenize", "POST", "Token ids of a prompt or a conversation (vLLM)",
              (TokenizeCompletionRequest, TokenizeChatRequest), TokenizeResponse),
    Operation("/detokenize", "POST", "Text of token ids (vLLM)", DetokenizeRequest,
              DetokenizeResponse),
    Operation("/health", "GET", "200 while the engine serves, else 503"),
    Operation("/ping", "GET", "Same as /health"),
    Operation("/version", "GET", "The server's version"),
    Operation("/metrics", "GET", "Prometheus metrics"),
    Operation("/stats", "GET", "The engine's state, per-second history and configuration (JSON; "
              "?since=SECOND for the seconds after that one)"),
]
