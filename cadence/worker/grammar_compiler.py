"""Grammar compilation off the engine thread: one xgrammar compiler per engine, a worker thread
that compiles each distinct structured-outputs spec once, and the futures the scheduler polls
(a request waits, as vLLM's ``WAITING_FOR_FSM``, until its grammar is ready; others run on).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cadence.chat import encodes_as_utf8
from cadence.json_nesting import MAX_JSON_DEPTH, nesting_depth
from cadence.sampling_params import StructuredOutputsParams
from cadence.structured_outputs_params import KINDS
from cadence.worker.regex_rewrite import xgrammar_regex
from cadence.worker.schema_features import unenforced_keyword
from cadence.worker.schema_rewrite import enforceable_schema

__all__ = ["GrammarCompilerService", "grammar_of", "regex_literal", "spec_key", "xgrammar_module"]

# The longest run of whitespace a JSON grammar allows between tokens of the JSON text.
MAX_WHITESPACE_RUN = 4

# Distinct compiled grammars kept (least recently used beyond this are dropped; a later request
# with the same spec compiles again).
MAX_CACHED_GRAMMARS = 256


def xgrammar_module() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured outputs need xgrammar (pip install xgrammar).") from None
    return xgrammar


# The characters xgrammar's regex syntax gives a meaning; every other one stands for itself
# (``re.escape`` also escapes blanks, '#', '~', '&', ..., which xgrammar warns of on each compile).
_REGEX_META = frozenset(".^$*+?()[]{}|\\-/")


def regex_literal(text: str) -> str:
    """A regex (xgrammar's syntax) that matches ``text`` and nothing else."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def grammar_of(spec: StructuredOutputsParams) -> Any:
    """The xgrammar ``Grammar`` of ``spec``; a ValueError names what is wrong with it."""
    xgr = xgrammar_module()
    try:
        if spec.json is not None or spec.json_object:
            schema = spec.json if spec.json is not None else {"type": "object"}
            text = schema if isinstance(schema, str) else json.dumps(schema)
            tree = json.loads(text) if isinstance(schema, str) else schema
            exact = checked_schema(tree)
            if exact is not tree:
                text = json.dumps(exact)
            # NOTE: runs of whitespace are bounded: a model that likes blanks could otherwise
            # pad the JSON for ever without breaking the grammar.
            return json_text_only(xgr, xgr.Grammar.from_json_schema(
                text, any_whitespace=not spec.disable_any_whitespace,
                max_whitespace_cnt=MAX_WHITESPACE_RUN))
        if spec.structural_tag is not None:
            tag = structural_tag_of(spec.structural_tag)
            return json_text_only(xgr, xgr.Grammar.from_structural_tag(json.dumps(tag)))
        if spec.regex is not None:
            return xgr.Grammar.from_regex(xgrammar_regex(spec.regex))
        if spec.choice is not None:
            return xgr.Grammar.from_regex("|".join(regex_literal(c) for c in spec.choice))
        if _looks_like_lark(spec.grammar or ""):
            return xgr.Grammar.from_lark(spec.grammar)
        return xgr.Grammar.from_ebnf(spec.grammar or "")
    except Exception as exc:  # xgrammar raises RuntimeError / its own errors
        kind = next(k for k in KINDS if getattr(spec, k) not in (None, False))
        # xgrammar's messages start with a time stamp and a source location: keep the words.
        reason = re.sub(r"^\[[^\]]*\] \S+:\d+: ", "", str(exc).strip()) or (
            # xgrammar gives no words for some (a number past a double's or an int64's range)
            "the grammar engine (xgrammar) cannot compile it (a number out of range?)")
        raise ValueError(f"structured_outputs: invalid {kind}: {reason}") from None


def checked_schema(tree: Any) -> Any:
    """A parsed JSON schema as the grammar is built from it (``enforceable_schema``: exact
    formats and patterns; ``tree`` itself where nothing changes); a ValueError for one that
    JSON text cannot carry or whose keywords the grammar engine would not enforce."""
    problem = not_json_value(tree)
    if problem is not None:
        raise ValueError(f"the schema {problem}")
    keyword = unenforced_keyword(tree)
    if keyword is not None:
        raise ValueError(f"{keyword} cannot be enforced by the grammar engine (xgrammar); the "
                         "output could break it.")
    return enforceable_schema(tree)


# Structural tag formats that name token ids (or token strings): their ids would be checked
# only when the engine compiles (a 500 for one past the vocabulary), and the special tokens they
# mostly name are the ones this engine's grammars never let through as text.
TOKEN_FORMATS = frozenset({"token", "any_tokens", "exclude_token", "token_dispatch",
                           "token_triggered_tags"})


def structural_tag_of(given: str | dict) -> dict[str, Any]:
    """A structural tag (vLLM's ``structural_tag``; ``StructuredOutputsParams`` has bounded its
    nesting) in xgrammar's current form, each of its JSON schemas checked and made exact as a
    ``json`` spec's is, with the same bound on runs of whitespace where the tag sets none (a
    ``max_whitespace_cnt`` of null too). Formats that name tokens (``TOKEN_FORMATS``) are
    refused. The older form (``structures`` of ``begin`` / ``schema`` / ``end``, and
    ``triggers``) becomes the ``triggered_tags`` format it means, as xgrammar converts it. A
    ValueError says what is wrong."""
    tree = json.loads(given) if isinstance(given, str) else given
    if not isinstance(tree, dict):
        raise ValueError("a structural tag is a JSON object.")
    problem = not_json_value(tree)
    if problem is not None:
        raise ValueError(f"the structural tag {problem}")
    if "structures" in tree:
        structures, triggers = tree.get("structures"), tree.get("triggers")
        if not isinstance(structures, list) or not all(
                isinstance(s, dict) and isinstance(s.get("begin"), str)
                and isinstance(s.get("end"), str) and "schema" in s for s in structures):
            raise ValueError("structures must be a list of {begin, schema, end}.")
        if not isinstance(triggers, list) or not triggers or not all(
                isinstance(t, str) and t for t in triggers):
            raise ValueError("triggers must be a non-empty list of non-empty strings.")
        tags = []
        for s in structures:
            schema = s["schema"]
            if isinstance(schema, str):  # JSON text: its nesting is bounded before it parses
                if nesting_depth(schema) > MAX_JSON_DEPTH:
                    raise ValueError(f"a structure's schema nests deeper than {MAX_JSON_DEPTH} "
                                     "levels.")
                schema = json.loads(schema)
            tags.append({"type": "tag", "begin": s["begin"], "end": s["end"],
                         "content": {"type": "json_schema", "json_schema": schema}})
        tree = {"type": "structural_tag",
                "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags}}
    elif not isinstance(tree.get("format"), dict):
        raise ValueError("a structural tag needs its format (an object), or the older "
                         "structures and triggers.")
    else:
        tree = copy.deepcopy(tree)
        tree.setdefault("type", "structural_tag")
    stack = [tree["format"]]
    while stack:  # every format in the tree, wherever it nests
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in TOKEN_FORMATS:
                raise ValueError(f"its {kind!r} format names tokens, which are not supported "
                                 "here; name the text instead (const_string, tag, "
                                 "triggered_tags, ...).")
            if kind in ("json_schema", "qwen_xml_parameter") and "json_schema" in node:
                if isinstance(node["json_schema"], dict):
                    node["json_schema"] = checked_schema(node["json_schema"])
                if kind == "json_schema" and node.get("max_whitespace_cnt") is None:
                    node["max_whitespace_cnt"] = MAX_WHITESPACE_RUN
            if kind == "regex" and isinstance(node.get("pattern"), str):
                node["pattern"] = xgrammar_regex(node["pattern"])
            stack.extend(v for k, v in node.items() if k != "json_schema")
    return tree


def not_json_value(tree: Any) -> str | None:
    """What makes a parsed schema something JSON text cannot carry, or None: a number that is
    not finite (Python's parser takes ``Infinity``, ``NaN`` and 1e400) or a string with a lone
    surrogate escape (no character)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return f"holds a number that is not finite ({node}); JSON numbers are finite."
        if isinstance(node, str):
            if not encodes_as_utf8(node):
                bad = next(c for c in node if not encodes_as_utf8(c))
                return (f"holds a lone surrogate escape (\\u{ord(bad):04x}), which is no "
                        "character.")
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


# xgrammar (0.2.x) writes the characters of a string with minLength / maxLength as this rule,
# which admits the raw control characters U+0000-U+001F that JSON text forbids (its unbounded
# strings exclude them): a constrained output could then fail to parse.
_BOUNDED_CHARS = re.compile(r'^(\S+) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.MULTILINE)
_JSON_CHARS = r'(([^\0-\x1f\"\\]))'  # an EBNF character class, as xgrammar writes it


def _looks_like_lark(grammar: str) -> bool:
    """A Lark grammar (``start: ...``) rather than EBNF (``root ::= ...``): no rule line with
    ``::=`` outside comments (vLLM's reading of its ``grammar`` field)."""
    lines = (line.split("#", 1)[0].split("//", 1)[0] for line in grammar.splitlines())
    return bool(grammar.strip()) and not any("::=" in line for line in lines)


# xgrammar (0.2.x) writes an object of patternProperties / propertyNames as "{" PROP
# PROPS* ... "}" with PROPS ::= ws{0,N} "," ws{0,N} PROP, and PROP itself starts with ws{0,N}:
# 2N blanks in a row after each comma. The comma's own trailing run is dropped (PROP's stays).
_COMMA_RUN = re.compile(r'^(\S+ ::= \(\(\S+\{0, \d+\} ",") (\S+)\{0, \d+\} (\S+)\)\)$',
                        re.MULTILINE)
_BLANK_RULE = "(([ \\n\\r\\t]))"


def json_text_only(xgr: Any, grammar: Any) -> Any:
    """``grammar`` with every length-bounded string's characters limited to those JSON text
    allows unescaped, and no run of blanks longer than the one asked for (the grammar itself
    where nothing changes)."""
    ebnf = str(grammar)
    fixed = _BOUNDED_CHARS.sub(lambda m: f"{m.group(1)} ::= {_JSON_CHARS}", ebnf)
    rules = dict(line.split(" ::= ", 1) for line in fixed.splitlines() if " ::= " in line)

    def one_run(m: re.Match) -> str:
        blank, prop = m.group(2), m.group(3)
        leads = re.match(r"\(\((\S+)\{0, \d+\} ", rules.get(prop, ""))
        if rules.get(blank) != _BLANK_RULE or not leads or rules.get(leads.group(1)) != (
                _BLANK_RULE):
            return m.group(0)
        return f"{m.group(1)} {prop}))"

    fixed = _COMMA_RUN.sub(one_run, fixed)
    return xgr.Grammar.from_ebnf(fixed) if fixed != ebnf else grammar


def spec_key(spec: StructuredOutputsParams) -> str:
    """The compiled grammar's key: the grammar's own fields (not when it starts to apply)."""
    fields = dataclasses.asdict(spec)
    fields.pop("reasoning_tags", None)
    # NOTE: the schema's own key order is kept: it is the order of the output's keys.
    return json.dumps(fields, default=str)


class GrammarCompilerService:
    """Compiles structured-outputs specs on its own thread, each distinct one once."""

    def __init__(self, tokenizer_path: str | None) -> None:
        self.tokenizer_path = tokenizer_path
        self._compiler: Any = None
        self.mask_vocab = 0  # token ids the grammars know: set with the compiler
        self._init_lock = threading.Lock()
        self._futures: OrderedDict[str, Future] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, spec: StructuredOutputsParams) -> Future:
        """The compiled grammar of ``spec``, as a future (already done when cached)."""
        key = spec_key(spec)
        fut = self._futures.get(key)
        if fut is not None:
            self._futures.move_to_end(key)
            return fut
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        fut = self._pool.submit(self._compile, spec)
        self._futures[key] = fut
        while len(self._futures) > MAX_CACHED_GRAMMARS:
            self._futures.popitem(last=False)
        return fut

    def get(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar (waits if it is still compiling; raises what compiling raised)."""
        return self.submit(spec).result()

    def _compile(self, spec: StructuredOutputsParams) -> Any:
        return self._get_compiler().compile_grammar(grammar_of(spec))

    def _get_compiler(self) -> Any:
        with self._init_lock:
            if self._compiler is None:
                xgr = xgrammar_module()
                if self.tokenizer_path is None:
                    raise ValueError("structured outputs need the model's tokenizer; it has none.")
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(self.tokenizer_path)
                # NOTE: the grammar's vocabulary is the tokenizer's, not the model's padded one:
                # xgrammar would treat every padding id as a special token on every fill (about
                # 0.2 ms a row for 150k of them). Ids past it are banned by the mask's apply.
                self.mask_vocab = max(tok.get_vocab().values()) + 1
                info = _without_special_text(
                    xgr, tok, xgr.TokenizerInfo.from_huggingface(tok, vocab_size=self.mask_vocab),
                    self.mask_vocab)
                self._compiler = xgr.GrammarCompiler(info)
            return self._compiler

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _without_special_text(xgr: Any, tok: Any, info: Any, vocab_size: int) -> Any:
    """``info`` with the tokenizer's special tokens (``<|im_start|>``, ...) as xgrammar's special
    tokens, which never stand for text. xgrammar lists none for many tokenizers and would let
    such a token spell its own literal (a choice of "<|im_start|>" as the one token 638), which
    detokenization then drops: the text would break the grammar. The end-of-sequence token
    stays what ends a grammar. Fast tokenizers only: xgrammar's vocabulary for them is
    ``get_vocab()`` as it stands (other kinds it converts first)."""
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tok, PreTrainedTokenizerFast):
        return info
    special = set(getattr(tok, "all_special_ids", ()))
    special |= {i for i, t in getattr(tok, "added_tokens_decoder", {}).items()
                if getattr(t, "special", False)}
    special = {i for i in special if 0 <= i < vocab_size}
    if not special or special <= set(info.special_token_ids):
        return info
    encoded = [""] * vocab_size
    for text, i in tok.get_vocab().items():
        if i < vocab_size and i not in special:
            encoded[i] = text
    return xgr.TokenizerInfo(encoded, info.vocab_type, vocab_size=vocab_size,
                             stop_token_ids=info.stop_token_ids,
                             add_prefix_space=info.add_prefix_space)
