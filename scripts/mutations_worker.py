"""Planted bugs of scripts/mutation_check.py (worker layer): a registry it loads, which defines
``Mutation`` here."""

# ruff: noqa: F821

MR = "cadence/worker/model_runner.py"
GR = "cadence/worker/grammar.py"
LP = "cadence/worker/logits_processors.py"
LD = "cadence/model/loader.py"
DEC = "cadence/model/decoder.py"
AR = "cadence/model/arch.py"
PR = "cadence/model/presets.py"
TI = "cadence/model/tiny.py"
PA = "cadence/model/parallel.py"
CPU = "cadence/runtime/cpu.py"
SP = "cadence/runtime/slot_pool.py"
GA = "cadence/worker/greedy_argmax.py"
SM = "cadence/worker/sampler.py"

T_MR = ("tests/worker/test_model_runner.py",)
T_GR = ("tests/worker/test_grammar.py",)
T_LP = ("tests/worker/test_logits_processors.py",)
T_LD = ("tests/model/test_loader.py", "tests/model/test_loader_checks.py")
T_DEC = ("tests/model/test_decoder.py",)
T_AR = ("tests/model/test_arch.py", "tests/model/test_registry.py")
T_PR = ("tests/model/test_registry.py",)
T_TI = ("tests/model/test_tiny.py",)
T_PA = ("tests/model/test_tp_shards.py",)
T_CPU = ("tests/runtime/test_cpu.py",)
T_SP = ("tests/runtime/test_slot_pool.py",)
T_GA = ("tests/worker/test_greedy_argmax.py",)
T_SM = ("tests/worker/test_sampler.py", "tests/worker/test_logits_processors.py")

MUTATIONS = [
    # model_runner
    Mutation("wk-mr-cpu-blocks-uncapped", "CPU KV blocks ignore what the batch can need",
             MR, "return max(2, min(needed, _CPU_KV_CACHE_BYTES // self.kv_block_bytes()))",
             "return max(2, _CPU_KV_CACHE_BYTES // self.kv_block_bytes())", T_MR),
    Mutation("wk-mr-needed-no-dummy", "KV blocks needed leave out the reserved dummy block",
             MR, "needed = self.max_num_reqs * self.max_blocks_per_req + 1",
             "needed = self.max_num_reqs * self.max_blocks_per_req", T_MR),
    Mutation("wk-mr-block-bytes-itemsize", "KV block bytes leave out the element size",
             MR, "return math.prod(shape) * self.model.num_layers * self.kv_dtype.itemsize",
             "return math.prod(shape) * self.model.num_layers", T_MR),
    Mutation("wk-mr-max-tokens", "the token buffers are sized by the budget alone",
             MR, "self.max_num_tokens = max(sched.max_num_batched_tokens, self.max_num_reqs)",
             "self.max_num_tokens = sched.max_num_batched_tokens", T_MR),
    Mutation("wk-mr-mixed-rows", "a mixed graph gets max_num_reqs rows even for fewer tokens",
             MR, "return min(tokens, self.max_num_reqs)", "return self.max_num_reqs",
             T_MR + ("tests/engine/test_graph_buckets.py",)),
    Mutation("wk-mr-moves-swapped", "condensed rows carry their last token the wrong way",
             MR, "self.last_sampled[dst_t] = self.last_sampled[src_t]",
             "self.last_sampled[src_t] = self.last_sampled[dst_t]",
             ("tests/engine/test_async_equivalence.py",)),
    # grammar
    Mutation("wk-gr-record-twice", "a token recorded twice is appended twice",
             GR, "if state is not None and state is admission and len(state.history) == index:",
             "if state is not None and state is admission and len(state.history) >= index:",
             T_GR),
    Mutation("wk-gr-no-token-kept", "a NO_TOKEN record keeps the request constrained",
             GR, "            if token < 0:  # NO_TOKEN: the request is failing; nothing more to constrain\n                self._reqs.pop(req_id, None)\n",
             "            if token < 0:  # NO_TOKEN: the request is failing; nothing more to constrain\n", T_GR),
    Mutation("wk-gr-retain-inverted", "retain drops the live requests",
             GR, "for req_id in [r for r in self._reqs if r not in live]:",
             "for req_id in [r for r in self._reqs if r in live]:", T_GR),
    Mutation("wk-gr-in-flight-ignored", "the in-flight token never advances the matcher",
             GR, "if token is not None and len(state.history) == need - 1:",
             "if token is not None and len(state.history) == need:", T_GR),
    Mutation("wk-gr-terminated-accepts", "tokens past a terminated grammar fail the request",
             GR, "                continue  # sampled past the grammar's end by a step scheduled ahead: dropped\n",
             "                pass\n", T_GR),
    Mutation("wk-gr-terminated-masked", "a terminated grammar's row is still masked",
             GR, "            if not state.reasoning and not state.matcher.is_terminated():\n"
             "                ready.append((row, req_id))",
             "            if not state.reasoning:\n                ready.append((row, req_id))", T_GR),
    Mutation("wk-gr-reasoning-masked", "a row still reasoning is masked by its grammar",
             GR, "            if not state.reasoning and not state.matcher.is_terminated():\n",
             "            if not state.matcher.is_terminated():\n", T_GR),
    Mutation("wk-gr-reasoning-end-fed", "the reasoning's end tag is fed to the grammar",
             GR, "                state.reasoning = token != state.tags[1]\n                continue\n",
             "                state.reasoning = token != state.tags[1]\n"
             "                if state.reasoning:\n                    continue\n", T_GR),
    Mutation("wk-gr-bad-token-kept", "a token that breaks the grammar leaves it constrained",
             GR, "                self._failed[req_id] = NO_TOKEN_FITS\n                self._reqs.pop(req_id, None)\n",
             "                self._failed[req_id] = NO_TOKEN_FITS\n", T_GR),
    # logits processors
    Mutation("wk-lp-ban-vocab-edge", "a banned id equal to the vocabulary size is indexed",
             LP, "if 0 <= tok < vocab:", "if 0 <= tok <= vocab:", T_LP),
    Mutation("wk-lp-conditional-overwrite", "two conditional bans of one token overwrite each other",
             LP, "logits.index_put_((cond.rows, cond.tokens), add, accumulate=True)",
             "logits.index_put_((cond.rows, cond.tokens), add)", T_LP),
    Mutation("wk-lp-penalty-slots-rows", "penalties read counts by logits row, not slot",
             LP, "c = counts.index_select(0, pen.slots)", "c = counts.index_select(0, pen.rows)", T_LP),
    # loader
    Mutation("wk-ld-more-count", "the missing-tensor error says '(and 0 more)'",
             LD, 'more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""',
             'more = f" (and {len(missing) - 1} more)"', T_LD),
    Mutation("wk-ld-kv-scale-layer", "a KV scale of layer num_layers is not refused",
             LD, "    if layer >= model.arch.num_layers:\n",
             "    if layer > model.arch.num_layers:\n", T_LD),
    Mutation("wk-ld-kv-scale-zero", "a zero KV scale is accepted",
             LD, "    if not (math.isfinite(float(scale)) and float(scale) > 0):",
             "    if not (math.isfinite(float(scale)) and float(scale) >= 0):", T_LD),
    Mutation("wk-ld-kv-scale-both", "the single kv_scale sets neither k_scale nor v_scale",
             LD, 'for kv in ("k", "v") if which == "kv" else (which,):',
             "for kv in (which,):", T_LD),
    Mutation("wk-ld-unindexed-first-file", "an unindexed multi-file checkpoint reads its first file only",
             LD, "return [os.path.join(path, name) for name in found]",
             "return [os.path.join(path, name) for name in found[:1]]", T_LD),
    Mutation("wk-ld-dummy-bias-random", "dummy biases drawn at random",
             LD, '        elif name.endswith(".bias"):\n            param.zero_()\n',
             '        elif name.endswith(".bias") and False:\n            param.zero_()\n', T_LD),
    # decoder
    Mutation("wk-dec-kv-shape-first-dim", "a KV cache without its k/v dimension is accepted",
             DEC, "                or cache.shape[0] != 2\n", "", T_DEC),
    Mutation("wk-dec-bytes-per-block", "bytes per block count the keys only",
             DEC, "per_layer = 2 * block_size * self.arch.num_kv_heads * self.arch.head_dim",
             "per_layer = block_size * self.arch.num_kv_heads * self.arch.head_dim", T_DEC),
    # arch
    Mutation("wk-ar-sparse-step", "decoder_sparse_step counts layers from 0",
             AR, "i not in dense and (i + 1) % step == 0 for i in range(config.num_hidden_layers)",
             "i not in dense and i % step == 0 for i in range(config.num_hidden_layers)", T_AR),
    Mutation("wk-ar-phi3-window", "Phi-3's sliding window is dropped",
             AR, 'windowed = (arch in ("MistralForCausalLM", "Phi3ForCausalLM") or gemma',
             'windowed = (arch in ("MistralForCausalLM",) or gemma', T_AR),
    Mutation("wk-ar-topk-all-experts", "num_experts_per_tok equal to num_experts is refused",
             AR, "not 0 < self.num_experts_per_tok <= self.num_experts",
             "not 0 < self.num_experts_per_tok < self.num_experts", T_AR),
    Mutation("wk-ar-kv-heads-divide", "num_heads not a multiple of kv heads accepted",
             AR, "        if num_heads % num_kv_heads:\n", "        if False:\n", T_AR),
    Mutation("wk-ar-qwen2-o-bias", "Qwen2 gets an o_proj bias when attention_bias is set",
             AR, "o_bias=False if is_qwen2 else attention_bias,", "o_bias=attention_bias,", T_AR),
    # presets
    Mutation("wk-pr-llama3-8b-theta", "llama3-8b rope_theta typo",
             PR, '"max_position_embeddings": 8192,\n            "rope_theta": 500000.0,',
             '"max_position_embeddings": 8192,\n            "rope_theta": 50000.0,', T_PR),
    Mutation("wk-pr-qwen3-eps", "qwen3-0.6b rms_norm_eps typo",
             PR, '"max_position_embeddings": 40960,\n            "rope_theta": 1000000.0,\n            "rms_norm_eps": 1e-6,\n            "tie_word_embeddings": True,',
             '"max_position_embeddings": 40960,\n            "rope_theta": 1000000.0,\n            "rms_norm_eps": 1e-5,\n            "tie_word_embeddings": True,', T_PR),
    Mutation("wk-ti-specials-printable", "every special token counts as printable",
             TI, "mask[token_id] = token == EOS_TOKEN", "mask[token_id] = True", T_TI),
    Mutation("wk-ti-o-proj-row0", "o_proj writes the constant bias channel",
             TI, "        o_proj[0] = 0.0\n", "", T_TI),
    Mutation("wk-ti-max-length", "tokenizer model_max_length not the context length",
             TI, '"model_max_length": max_length,', '"model_max_length": 1 << 30,', T_TI),
    # parallel
    Mutation("wk-pa-vocab-floor", "vocab per rank rounded down",
             PA, "full.intermediate_size // size, -(-full.vocab_size // size),",
             "full.intermediate_size // size, full.vocab_size // size,", T_PA),
    Mutation("wk-pa-embed-edge", "vocab-parallel embedding takes the next rank's first id",
             PA, "outside = (local < 0) | (local >= self.rows)",
             "outside = (local < 0) | (local > self.rows)", T_PA),
    Mutation("wk-pa-rank-bound", "rank == size accepted",
             PA, "if not 0 <= rank < size:", "if not 0 <= rank <= size:", T_PA),
    Mutation("wk-pa-gather-order", "gathered logits keep rank-major order",
             PA, "full = out.view(shard.size, n, -1).transpose(0, 1).reshape(n, -1)",
             "full = out.view(n, -1)", T_PA),
    # runtime cpu
    Mutation("wk-cpu-record-given", "stream.record(event) records a fresh event instead",
             CPU, "ev = event if event is not None else CpuEvent()", "ev = CpuEvent()", T_CPU),
    Mutation("wk-cpu-stream-priority", "the CPU stream drops its priority",
             CPU, "return CpuStream(priority)", "return CpuStream()", T_CPU),
    Mutation("wk-cpu-mem-info-order", "mem_get_info returns (total, free)",
             CPU, "return free_pages * page, pages * page", "return pages * page, free_pages * page", T_CPU),
    Mutation("wk-cpu-zero-buffer", "a zero-byte buffer is accepted",
             CPU, "if nbytes < 1:", "if nbytes < 0:", T_CPU),
    Mutation("wk-cpu-elapsed-sign", "elapsed_ms negated",
             CPU, "return (end_time - self._time) * 1e3", "return (self._time - end_time) * 1e3", T_CPU),
    # slot pool
    Mutation("wk-sp-lifo", "released slots are lent again first (LIFO)",
             SP, "self._free.append(slot.index)", "self._free.appendleft(slot.index)", T_SP),
    Mutation("wk-sp-fetch-alias", "fetch returns a view the next stage overwrites",
             SP, "return self.host[:n].numpy().copy()", "return self.host[:n].numpy()", T_SP),
    Mutation("wk-sp-copy-no-wait", "the copy stream does not wait for the snapshot",
             SP, "        copy.wait(self.produced)\n", "", T_SP),
    Mutation("wk-sp-borrow-no-sync", "borrow does not wait for the slot's previous copy",
             SP, "        slot.ready.synchronize()\n        return slot", "        return slot", T_SP),
    Mutation("wk-sp-release-unlent", "a slot never lent can be released",
             SP, "        if not self._lent[slot.index]:\n", "        if False:\n", T_SP),
    Mutation("wk-sp-ctor-and", "a pool of zero slots is accepted when capacity is positive",
             SP, "if num_slots < 1 or capacity < 1:", "if num_slots < 1 and capacity < 1:", T_SP),
    Mutation("wk-mr-decode-bucket-all-rows",
             "a one-token step with a row that does not sample takes the decode graph", MR,
             "if inp.max_query_len == 1 and len(inp.sample_rows) == inp.num_reqs:",
             "if inp.max_query_len == 1:", ("tests/engine/test_graph_buckets.py",)),
    Mutation("wk-mr-grammar-failed-dropped", "a token outside the grammar never fails its request",
             MR, "        failed.update(self.sampling.grammar.take_failed())\n", "",
             ("tests/engine/test_structured_outputs.py",)),
    # greedy argmax
    Mutation("wk-ga-tie-right", "a block's tie goes to its last largest entry",
             GA, "return_indices_tie_break_left=True", "return_indices_tie_break_left=False",
             T_GA),
    Mutation("wk-ga-nan-by-bits", "a NaN counts by its bits (a negative NaN below every number)",
             GA, "        key = tl.where(x != x, _INT_MAX, key)\n", "", T_GA),
    Mutation("wk-ga-signed-zero", "-0.0 counts below 0.0",
             GA, "        x = tl.where(x == 0.0, 0.0, x)", "        x = x", T_GA),
    Mutation("wk-ga-last-block", "of the blocks holding the largest key, the last wins",
             GA, "first = tl.min(tl.where(k == tl.max(k, 0), i, _INT_MAX), 0)",
             "first = tl.max(tl.where(k == tl.max(k, 0), i, -1), 0)", T_GA),
    Mutation("wk-sm-greedy-skips-processors", "plain greedy steps skip the logits processors",
             SM, "        if (md.all_greedy and md.grammar is None and md.processors is None\n",
             "        if (md.all_greedy and md.grammar is None\n", T_SM),
    Mutation("wk-sm-tracked-ignored", "rows with logprob_token_ids get the top-k instead",
             SM, "            top_ids[rows] = ids\n", "",
             T_SM + ("tests/engine/test_logprob_token_ids.py",)),
    Mutation("wk-tracked-off", "logprob_token_ids alone ask for no logprobs",
             "cadence/sampling_params.py",
             "        return None if self.logprob_token_ids is None else len(self.logprob_token_ids)",
             "        return None", ("tests/engine/test_logprob_token_ids.py",)),
    Mutation("wk-oneof-overlap-taken", "a oneOf whose branches may overlap is accepted",
             "cadence/worker/schema_features.py", "    if _one_of_may_overlap(schema, root):",
             "    if False:", ("tests/engine/test_structured_outputs.py",)),
    Mutation("wk-date-format-kept", "the date format keeps xgrammar's grammar (November 31st)",
             "cadence/worker/schema_rewrite.py", '    "date": f"^{_DATE}$",\n', "",
             ("tests/engine/test_structured_outputs.py",)),
    Mutation("wk-optional-group-kept", "a pattern's optional group is left to xgrammar",
             "cadence/worker/schema_rewrite.py",
             "    return optional_groups_counted(json_string_pattern(pattern))",
             "    return json_string_pattern(pattern)", ("tests/engine/test_structured_outputs.py",)),
    Mutation("wk-pattern-raw-escapes", "a pattern's quote or backslash goes to the grammar raw",
             "cadence/worker/schema_patterns.py",
             '    if not (_needs_rewrite(tree) or "[\\\\^" in pattern):',
             "    if True:", ("tests/worker/test_schema_patterns.py",)),
    Mutation("wk-shared-subschema-twice", "a subschema used twice has its pattern escaped twice",
             "cadence/worker/schema_rewrite.py",
             "        if not isinstance(node, dict) or depth > MAX_DEPTH or id(node) in done:",
             "        if not isinstance(node, dict) or depth > MAX_DEPTH:",
             ("tests/worker/test_schema_rewrite.py",)),
    Mutation("wk-dot-left-raw", "the dot is left to xgrammar (raw quotes past ASCII)",
             "cadence/worker/schema_patterns.py",
             '        return f"[^{_NOT_RAW}]", True', '        return ".", True',
             ("tests/worker/test_schema_patterns.py",)),
    Mutation("wk-untyped-bounds-dropped", "an untyped node's bounds are left for xgrammar to drop",
             "cadence/worker/schema_rewrite.py", '    if implied & {"number", "string"}:',
             "    if False:", ("tests/worker/test_schema_rewrite.py",)),
    Mutation("wk-ref-beside-taken", "constraints beside a $ref compile to its target alone",
             "cadence/worker/schema_features.py",
             '        return "$ref beside other constraints (the grammar keeps only the reference)"',
             "        return None", ("tests/worker/test_schema_rewrite.py",)),
    Mutation("wk-enum-untyped", "an enum beside a type keeps values of other types",
             "cadence/worker/schema_rewrite.py",
             "        kept = [v for v in enum if value_meets(v, node)]",
             "        kept = list(enum)", ("tests/worker/test_schema_rewrite.py",)),
    Mutation("wk-reused-id-keeps-grammar", "a reused id inherits its old request's grammar",
             "cadence/worker/request_sampling.py",
             "            self.grammar.forget(new.req_id)\n", "",
             ("tests/engine/test_request_isolation.py::"
              "test_an_id_reused_the_step_after_its_request_ended_starts_clean",)),
]
