"""Planted bugs of scripts/mutation_check.py (server layer, newer routes): a registry it loads,
which defines ``Mutation`` here."""

# ruff: noqa: F821

_RESP = "tests/server/test_responses_api.py"

MUTATIONS = [
    Mutation("resp-no-instructions", "instructions never reach the template",
             "cadence/server/responses_api.py",
             '            messages.append({"role": "system", "content": self.instructions})\n',
             "            pass\n", (_RESP,)),
    Mutation("resp-always-completed", "a max_output_tokens cut is reported completed",
             "cadence/server/responses_api.py",
             'status = "incomplete" if choice.finish_reason == "length" else "completed"',
             'status = "completed"', (_RESP,)),
    Mutation("resp-reasoning-input-refused", "an earlier reasoning item is a 400",
             "cadence/server/responses_api.py",
             '            elif kind == "reasoning":\n                continue',
             '            elif kind == "reasoning-x":\n                continue', (_RESP,)),
    Mutation("resp-late-head", "the opening events are numbered when the stream first runs",
             "cadence/server/serving_responses.py",
             "            yield events.head\n", "            yield events.start()\n", (_RESP,)),
    Mutation("resp-call-output-lost", "a function_call_output's text is dropped",
             "cadence/server/responses_api.py",
             '                                 "content": output if isinstance(output, str)',
             '                                 "content": "" if isinstance(output, str)', (_RESP,)),
    Mutation("resp-params-unnamed", "a chat field's error keeps its chat name",
             "cadence/server/serving_responses.py",
             "            exc.param = param_of(exc.param)", "            pass", (_RESP,)),
    Mutation("pythonic-positional", "a positional argument is taken (and dropped)",
             "cadence/server/tool_calls_pythonic.py",
             "                    or node.args or any(k.arg is None for k in node.keywords)",
             "                    or any(k.arg is None for k in node.keywords)",
             ("tests/server/test_tool_calls_pythonic.py",)),
    Mutation("pythonic-trailing-text", "text after the list is dropped instead of refusing calls",
             "cadence/server/tool_calls_pythonic.py",
             'if not body.startswith("[") or not body.endswith("]") or len(body) > _MAX_SOURCE:',
             'body = body[: body.rfind("]") + 1]\n    if not body.startswith("[") or '
             'len(body) > _MAX_SOURCE:',
             ("tests/server/test_tool_calls_pythonic.py",)),
]
