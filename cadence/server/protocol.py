"""OpenAI-compatible request schemas (vLLM's field names and extensions): what every sampling
request shares; completions are in ``protocol_completion``, chat requests in ``protocol_chat``."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from cadence.engine.param_checks import MAX_STOP_TOKEN_IDS
from cadence.field_checks import INT64_MAX, INT64_MIN
from cadence.repetition import MAX_MIN_COUNT, MAX_PATTERN_SIZE, RepetitionDetectionParams
from cadence.sampling_checks import MAX_LOGPROB_TOKEN_IDS, MAX_N, MAX_TEMPERATURE
from cadence.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from cadence.worker.grammar import check_structured_outputs

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
MAX_REQUEST_ID_CHARS = 256

# Fields beam search does not apply, each with the values that ask for nothing (vLLM ignores
# them; here they are a 400). temperature, top_p, top_k, min_p and seed choose each step's
# sampled token, which joins the candidates.
BEAM_SEARCH_REFUSES: Mapping[str, tuple[Any, ...]] = MappingProxyType({
    "min_tokens": (0,), "stop": ([],), "stop_token_ids": ([],), "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,), "repetition_penalty": (1.0,), "logit_bias": ({},),
    "allowed_token_ids": (), "bad_words": ([],), "prompt_logprobs": (),
    "structured_outputs": (), "repetition_detection": (), "thinking_token_budget": (-1,),
    "logprob_token_ids": ([],),
})


class ParamError(ValueError):
    """An invalid request parameter, found after schema validation."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


def client_request_id(header: str | None, body_id: str | None) -> str | None:
    """The id a client gave its request: the X-Request-Id header's (vLLM's tracing rule: it
    wins), else the body's ``request_id``, else None."""
    if not header:
        return body_id
    if len(header) > MAX_REQUEST_ID_CHARS:
        raise ParamError("X-Request-Id",
                         f"X-Request-Id must be at most {MAX_REQUEST_ID_CHARS} characters.")
    return header


def response_and_engine_ids(prefix: str, header: str | None, body_id: str | None
                            ) -> tuple[str, str]:
    """(the response's id, the engine's): ``prefix-<client's id>`` (``client_request_id``) and
    that id with a unique suffix, so that requests carrying one id (a gateway's trace id on
    fanned-out calls) run side by side, as vLLM's internal ids allow; without a client's id,
    one random id for both."""
    given = client_request_id(header, body_id)
    response_id = random_id(prefix, given)
    if given is None:
        return response_id, response_id
    return response_id, f"{response_id}-{uuid.uuid4().hex[:8]}"


def random_id(prefix: str, given: str | None = None) -> str:
    """``prefix-<given>``, or ``prefix-<random hex>`` without one (``resp_``: the Responses
    API's ids take an underscore, as OpenAI's and vLLM's)."""
    sep = "_" if prefix == "resp" else "-"
    return f"{prefix}{sep}{given if given is not None else uuid.uuid4().hex}"


NO_DEFAULTS: Mapping[str, Any] = MappingProxyType({})


class OpenAIModel(BaseModel):
    # Unknown fields are ignored, as vLLM and OpenAI do. NaN and infinities are no numbers here.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(OpenAIModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class JsonSchemaFormat(OpenAIModel):
    name: str  # required, as by OpenAI and vLLM
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class StructuralTagItem(OpenAIModel):
    """One of the older structural tag's ``structures``: text, JSON of the schema, text."""

    begin: str
    schema_: dict[str, Any] = Field(alias="schema")
    end: str


class ResponseFormat(OpenAIModel):
    # Required, as by OpenAI and vLLM; "structural_tag" is vLLM's (xgrammar's structural tags).
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # A structural tag: its ``format``, or the older ``structures`` with their ``triggers``.
    format: dict[str, Any] | None = None
    structures: list[StructuralTagItem] | None = None
    triggers: list[str] | None = None

    def structural_tag(self) -> dict[str, Any]:
        """The structural tag this format describes (``type`` "structural_tag"), as vLLM passes
        it to the grammar engine."""
        if self.format is not None:
            return {"type": "structural_tag", "format": self.format}
        return {"type": "structural_tag", "triggers": self.triggers,
                "structures": [s.model_dump(by_alias=True) for s in self.structures or ()]}


class StructuredOutputsField(OpenAIModel):
    """vLLM's ``structured_outputs`` request field: exactly one of these."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # vLLM's: a structural tag, as JSON text (or an object).
    structural_tag: str | dict[str, Any] | None = None
    # vLLM's options (see StructuredOutputsParams): compact JSON; the rest change nothing.
    disable_any_whitespace: bool = False
    disable_fallback: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


class RepetitionDetectionField(OpenAIModel):
    """vLLM's ``repetition_detection`` request field (``cadence.repetition``)."""

    max_pattern_size: int = Field(default=0, ge=0, le=MAX_PATTERN_SIZE)
    min_pattern_size: int = Field(default=0, ge=0, le=MAX_PATTERN_SIZE)
    min_count: int = Field(default=0, ge=0, le=MAX_MIN_COUNT)


class SamplingRequest(OpenAIModel):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_tokens: int = Field(default=0, ge=0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    # Capped here, before the items are checked: a body of a million ids is refused at once.
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM: a streamed answer's chunks every this many tokens; raises --stream-interval, never
    # lowers it.
    stream_interval: int | None = Field(default=None, ge=1, le=INT64_MAX)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    priority: Int64 = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's sampling extensions.
    repetition_penalty: float | None = None
    min_p: float | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # vLLM: per prompt token after the first, its logprob and the top-N (non-streamed only).
    prompt_logprobs: int | None = Field(default=None, ge=-1)
    # vLLM: each token's logprobs are the sampled token's and these ids' (in this order) in
    # place of the top ones; needs logprobs asked for.
    logprob_token_ids: list[int] | None = Field(default=None, max_length=MAX_LOGPROB_TOKEN_IDS)
    structured_outputs: StructuredOutputsField | None = None
    response_format: ResponseFormat | None = None
    # vLLM: end the answer (finish reason "repetition") once it repeats a pattern.
    repetition_detection: RepetitionDetectionField | None = None
    # vLLM: at most this many tokens of reasoning, then its end tag (-1: no limit); needs the
    # server's --reasoning-parser.
    thinking_token_budget: int | None = Field(default=None, ge=-1, le=INT64_MAX)
    user: str | None = None
    # vLLM: prefix-cache isolation; only requests with the same salt share cached blocks.
    cache_salt: str | None = None
    # vLLM: the response's id is "cmpl-<request_id>" / "chatcmpl-<request_id>" (tracing).
    request_id: str | None = Field(default=None, min_length=1, max_length=MAX_REQUEST_ID_CHARS)
    # vLLM: keep the prompt's last k tokens (-1: the context length); its first k with
    # truncation_side "right".
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    # vLLM: logprobs show each token as "token_id:N" (for tokens that are not valid text alone);
    # unset: the server's --return-tokens-as-token-ids (``apply_server_defaults``).
    return_tokens_as_token_ids: bool | None = None
    # vLLM's beam search: n beams, the best first (``cadence.beam_search``); fields it does not
    # apply are refused with it (``BEAM_SEARCH_REFUSES``).
    use_beam_search: bool = False
    length_penalty: float = Field(default=1.0, allow_inf_nan=False)
    # vLLM fields this server does not implement: refused (a 400 naming them) where they would
    # change the output, rather than ignored as unknown fields are.
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    # check_fields=False: echo, return_token_ids and (chat) logprobs are the subclasses' fields.
    @field_validator("stream", "n", "echo", "logprobs", "return_token_ids", "max_tokens",
                     mode="before", check_fields=False)
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        # OpenAI's schema lets these be null, meaning the default (vLLM takes null too).
        return cls.model_fields[info.field_name].default if value is None else value

    def _check_common(self) -> None:
        if self.logprob_token_ids is not None and not self.logprob_token_ids:  # vLLM's too
            raise ParamError("logprob_token_ids", "logprob_token_ids must not be empty.")
        if self.use_beam_search:
            self._check_beam_search()
        for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"):
            if getattr(self, name) is not None:
                kind = name.removeprefix("guided_")
                raise ParamError(name, f"{name} is not supported: use structured_outputs "
                                       f"({{\"{kind}\": ...}}) or response_format.")
        if self.cache_salt is not None and not self.cache_salt:
            raise ParamError("cache_salt", "cache_salt must be a non-empty string if provided.")
        # vLLM refuses only options that say something: {} is as good as none.
        if self.stream_options is not None and self.stream_options.model_fields_set and (
                not self.stream):
            raise ParamError("stream_options", "stream_options can only be set when stream=true.")
        if (self.response_format is not None and self.response_format.type == "json_schema"
                and (self.response_format.json_schema is None
                     or self.response_format.json_schema.schema_ is None)):
            raise ParamError("response_format",
                             "response_format json_schema needs json_schema.schema.")
        if self.response_format is not None and self.response_format.type == "structural_tag":
            rf = self.response_format
            if (rf.format is None) == (rf.structures is None and rf.triggers is None):
                raise ParamError("response_format", "a structural_tag response_format needs "
                                 "its format, or else structures and triggers.")
            if rf.format is None and (rf.structures is None or not rf.triggers):
                raise ParamError("response_format", "a structural_tag response_format needs "
                                 "both structures and (non-empty) triggers.")
        if self.stream and self.prompt_logprobs is not None and self.prompt_logprobs != 0:
            raise ParamError("prompt_logprobs",
                             "prompt_logprobs are not available when stream=true.")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(s == "" for s in stops):
            raise ParamError("stop", "stop cannot contain an empty string.")

    def _check_beam_search(self) -> None:
        """A field beam search would not apply is a 400 naming it (vLLM ignores them): the
        candidates are the raw logprobs' best, stopped by the end token alone."""
        for name, neutral in BEAM_SEARCH_REFUSES.items():
            value = getattr(self, name, None)
            if value is not None and value not in neutral:
                raise ParamError(name, f"{name} is not supported with use_beam_search.")
        if self.response_format is not None and self.response_format.type != "text":
            raise ParamError("response_format",
                             "response_format is not supported with use_beam_search.")

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None,
                         defaults: Mapping[str, Any],
                         prompt_logprobs: int | None = None) -> SamplingParams:
        kind = RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY
        try:
            return self._make_sampling_params(kind, max_tokens, logprobs, defaults,
                                              prompt_logprobs)
        except ParamError:
            raise
        except ValueError as exc:  # combinations the schema cannot see (min_tokens > max_tokens)
            message = str(exc)
            first_word = message.split(" ", 1)[0]
            param = first_word if first_word in type(self).model_fields else None
            raise ParamError(param, message) from exc

    def _make_sampling_params(
        self, kind: RequestOutputKind, max_tokens: int | None, logprobs: int | None,
        defaults: Mapping[str, Any], prompt_logprobs: int | None,
    ) -> SamplingParams:
        # Fields the request leaves unset take the model's generation-config defaults.
        def pick(value: Any, name: str, neutral: Any) -> Any:
            return value if value is not None else defaults.get(name, neutral)

        # The generation config's max_new_tokens caps every request (vLLM's rule).
        cap = defaults.get("max_tokens")
        if cap is not None:
            max_tokens = cap if max_tokens is None else min(max_tokens, cap)

        return SamplingParams(
            n=1 if self.use_beam_search else self.n,  # beam search: n beams, one sequence each
            temperature=pick(self.temperature, "temperature", 1.0),
            top_p=pick(self.top_p, "top_p", 1.0),
            top_k=pick(self.top_k, "top_k", 0),
            min_p=pick(self.min_p, "min_p", 0.0),
            repetition_penalty=pick(self.repetition_penalty, "repetition_penalty", 1.0),
            presence_penalty=pick(self.presence_penalty, "presence_penalty", 0.0),
            frequency_penalty=pick(self.frequency_penalty, "frequency_penalty", 0.0),
            logit_bias=self._logit_bias(),
            allowed_token_ids=self.allowed_token_ids,
            bad_words=self.bad_words or None,
            structured_outputs=self._structured_outputs(),
            repetition_detection=self._repetition_detection(),
            thinking_token_budget=self.thinking_token_budget,
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            # vLLM: the tracked ids' count is the logprobs' (whatever number was asked for).
            logprobs=None if self.logprob_token_ids else logprobs,
            logprob_token_ids=self.logprob_token_ids or None,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            truncation_side=self.truncation_side or "left",
            output_kind=kind,
            stream_interval=self.stream_interval,
        )

    def _repetition_detection(self) -> RepetitionDetectionParams | None:
        rd = self.repetition_detection
        if rd is None:
            return None
        try:
            return RepetitionDetectionParams(**rd.model_dump())
        except ValueError as exc:  # the fields' relations (min <= max, min_count >= 2)
            raise ParamError("repetition_detection", str(exc)) from None

    @property
    def params_size(self) -> int:
        """How many items the sampling parameters' lists hold: the work of building and
        checking them (the input worker takes large ones off the event loop)."""
        return (len(self.allowed_token_ids or ()) + len(self.logit_bias or ())
                + len(self.bad_words or ()) + len(self.stop_token_ids or ()))

    @property
    def grammar_param(self) -> str:
        """The field that carried the request's structured output (errors name it)."""
        if self.structured_outputs is None and self.response_format is not None:
            return "response_format"
        return "structured_outputs"

    def _structured_outputs(self) -> StructuredOutputsParams | None:
        """``structured_outputs`` (vLLM's field) or ``response_format`` (OpenAI's)."""
        so, rf = self.structured_outputs, self.response_format
        if so is not None:
            if rf is not None and rf.type != "text":
                raise ParamError("structured_outputs",
                                 "set structured_outputs or response_format, not both.")
            try:
                return StructuredOutputsParams(
                    json=so.json_, regex=so.regex, choice=so.choice, grammar=so.grammar,
                    json_object=so.json_object, structural_tag=so.structural_tag,
                    disable_any_whitespace=so.disable_any_whitespace,
                    disable_fallback=so.disable_fallback,
                    disable_additional_properties=so.disable_additional_properties,
                    whitespace_pattern=so.whitespace_pattern)
            except ValueError as exc:
                raise ParamError("structured_outputs", str(exc)) from None
        if rf is None or rf.type == "text":
            return None
        if rf.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        try:
            if rf.type == "structural_tag":
                spec = StructuredOutputsParams(structural_tag=rf.structural_tag())
            else:
                assert rf.json_schema is not None
                spec = StructuredOutputsParams(json=rf.json_schema.schema_)
            check_structured_outputs(spec)  # the error names response_format, not the engine's
        except ValueError as exc:
            message = str(exc).replace("structured_outputs: invalid json:",
                                       "response_format: invalid json_schema:")
            if message.startswith("structured_outputs"):
                message = "response_format" + message.removeprefix("structured_outputs")
            raise ParamError("response_format", message) from None
        return spec

    def _logit_bias(self) -> dict[int, float] | None:
        """OpenAI's string token ids as ints, biases clipped to [-100, 100] (as vLLM does)."""
        if not self.logit_bias:
            return None
        bias: dict[int, float] = {}
        for key, value in self.logit_bias.items():
            try:
                tok = int(key)
            except ValueError:
                raise ParamError("logit_bias",
                                 f"logit_bias keys must be token ids, got {key!r}.") from None
            if tok < 0:
                raise ParamError("logit_bias", f"logit_bias: token id {tok} is negative.")
            bias[tok] = min(100.0, max(-100.0, value))
        return bias

    def apply_server_defaults(self, tokens_as_ids: bool, force_usage: bool) -> None:
        """The server's defaults for what the request leaves unset (vLLM's
        ``--return-tokens-as-token-ids``); ``force_usage``: a streamed response ends with its
        usage whatever stream_options say (``--enable-force-include-usage``)."""
        if self.return_tokens_as_token_ids is None:
            self.return_tokens_as_token_ids = tokens_as_ids
        if force_usage and self.stream:
            if self.stream_options is None:
                self.stream_options = StreamOptions(include_usage=True)
            else:
                self.stream_options.include_usage = True

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(
            self.stream_options and self.stream_options.continuous_usage_stats
        )
