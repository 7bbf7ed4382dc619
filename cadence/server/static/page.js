"use strict";
// The cadence page: a chat playground over /v1/chat/completions (or token-id completions for a
// model without a tokenizer) and a live view of the engine from /stats. Plain DOM, no library.
(function () {
  const base = location.pathname.replace(/\/+$/, "");  // the server's root, proxy prefix kept
  const KEY_STORE = "cadence-api-key";
  const POLL_MS = 1000;
  const $ = (id) => document.getElementById(id);

  const state = {
    key: sessionStorage.getItem(KEY_STORE) || "",
    config: null,
    boot: null,
    lastSecond: -1,
    rows: [],
    windowS: 300,
    messages: [],  // the conversation sent with each chat request
    controller: null,  // the streaming request's AbortController
    pollTimer: null,
    pollRound: 0,  // a new round (a new key) ends the previous one's chain of polls
    needKey: false,
    now: null,  // /stats' gauges of the latest answer
  };

  // -- requests -----------------------------------------------------------------------------
  function headers(json) {
    const h = {};
    if (json) h["Content-Type"] = "application/json";
    if (state.key) h["Authorization"] = "Bearer " + state.key;
    return h;
  }

  async function errorText(resp) {
    try {
      const body = await resp.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (e) { /* not JSON */ }
    return resp.status + " " + resp.statusText;
  }

  // -- API key ------------------------------------------------------------------------------
  function askForKey(message) {
    state.needKey = true;
    $("key-form").hidden = false;
    $("key-status").textContent = message;
    $("model-line").textContent = "This server needs an API key.";
  }

  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.key = $("api-key").value.trim();
    if (state.key) sessionStorage.setItem(KEY_STORE, state.key);
    else sessionStorage.removeItem(KEY_STORE);
    $("key-status").textContent = "Checking the key\u2026";
    state.boot = null;
    poll();
  });

  // -- engine view --------------------------------------------------------------------------
  const CHARTS = [
    { id: "requests", title: "Requests", kind: "line", unit: "",
      series: [["running", "running"], ["waiting", "waiting"]],
      now: (n) => [n.running, n.waiting] },
    { id: "kv", title: "KV-cache usage", kind: "line", unit: "%", max: 100,
      series: [["kv_cache_usage", "used", (v) => v * 100]],
      now: (n) => [n.kv_cache_usage * 100] },
    { id: "toks", title: "Generation tokens/s", kind: "bars", unit: "tok/s",
      series: [["generation_tokens", "tok/s"]] },
    { id: "ttft", title: "Time to first token (mean per second)", kind: "bars", unit: "ms",
      series: [["ttft_mean", "TTFT", (v) => v * 1000]] },
    { id: "itl", title: "Inter-token latency (mean per second)", kind: "bars", unit: "ms",
      series: [["itl_mean", "ITL", (v) => v * 1000]] },
  ];
  const SVG = "http://www.w3.org/2000/svg";
  const W = 300, H = 60;

  function buildCharts() {
    const box = $("charts");
    for (const c of CHARTS) {
      const fig = document.createElement("figure");
      const cap = document.createElement("figcaption");
      const name = document.createElement("span");
      name.textContent = c.title;
      const value = document.createElement("span");
      value.className = "value";
      value.id = "chart-" + c.id + "-value";
      cap.append(name, value);
      const svg = document.createElementNS(SVG, "svg");
      svg.setAttribute("class", "chart");
      svg.setAttribute("viewBox", "0 0 " + W + " " + H);
      svg.setAttribute("preserveAspectRatio", "none");
      svg.setAttribute("role", "img");
      svg.id = "chart-" + c.id;
      fig.append(cap, svg);
      if (c.series.length > 1) {
        const legend = document.createElement("p");
        legend.className = "legend";
        c.series.forEach((s, i) => {
          const k = document.createElement("span");
          k.className = "k" + (i + 1);
          k.textContent = (i ? " \u2504 " : "\u2500 ") + s[1];
          legend.append(k);
        });
        fig.append(legend);
      }
      box.append(fig);
    }
  }

  function fmt(v, unit) {
    if (v === null || v === undefined || Number.isNaN(v)) return "\u2013";
    const digits = Math.abs(v) >= 100 || Number.isInteger(v) ? 0 : Math.abs(v) >= 10 ? 1 : 2;
    return v.toFixed(digits) + (unit ? " " + unit : "");
  }

  function drawChart(c) {
    const svg = $("chart-" + c.id);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const n = state.windowS;
    const rows = state.rows;
    const values = c.series.map((s) => rows.map((r) => {
      const v = r[s[0]];
      return v === null || v === undefined ? null : s[2] ? s[2](v) : v;
    }));
    let top = c.max || 0;
    for (const vs of values) for (const v of vs) if (v !== null && v > top) top = v;
    if (top <= 0) top = 1;
    const x0 = W - rows.length * (W / n);
    const step = W / n;
    const y = (v) => H - 2 - (v / top) * (H - 4);
    const axis = document.createElementNS(SVG, "line");
    axis.setAttribute("class", "axis");
    axis.setAttribute("x1", "0"); axis.setAttribute("x2", String(W));
    axis.setAttribute("y1", String(H - 1)); axis.setAttribute("y2", String(H - 1));
    svg.append(axis);
    values.forEach((vs, i) => {
      if (c.kind === "bars") {
        vs.forEach((v, j) => {
          if (v === null || v <= 0) return;
          const r = document.createElementNS(SVG, "rect");
          r.setAttribute("class", "bar");
          r.setAttribute("x", (x0 + j * step).toFixed(2));
          r.setAttribute("width", Math.max(step * 0.8, 0.8).toFixed(2));
          r.setAttribute("y", y(v).toFixed(2));
          r.setAttribute("height", (H - 2 - y(v)).toFixed(2));
          svg.append(r);
        });
      } else {
        const pts = vs.map((v, j) => (x0 + j * step).toFixed(2) + "," + y(v || 0).toFixed(2));
        if (pts.length === 1) pts.push((x0 + step).toFixed(2) + "," + y(vs[0] || 0).toFixed(2));
        const line = document.createElementNS(SVG, "polyline");
        line.setAttribute("class", "s" + (i + 1));
        line.setAttribute("points", pts.join(" "));
        svg.append(line);
      }
    });
    // The latest value in words: the caption, and the chart's accessible name.
    // Gauges: their value now; the rest: the last complete second that had one.
    const last = c.now && state.now ? c.now(state.now) : values.map((vs) => {
      for (let j = vs.length - 1; j >= 0; j--) if (vs[j] !== null) return vs[j];
      return null;
    });
    const words = c.series.map((s, i) => (c.series.length > 1 ? s[1] + " " : "") +
                                         fmt(last[i], c.unit)).join(", ");
    $("chart-" + c.id + "-value").textContent = words;
    const minutes = Math.round(n / 60);
    svg.setAttribute("aria-label", c.title + " over the last " + minutes +
                     " minutes; latest: " + words + "; peak " + fmt(top, c.unit));
  }

  function showConfig(cfg) {
    const graphs = cfg.graphs.enabled
      ? "decode batch " + range(cfg.graphs.decode_batch_sizes) + "; mixed steps " +
        (cfg.graphs.mixed_token_sizes.length ? range(cfg.graphs.mixed_token_sizes) + " tokens"
                                             : "eager") +
        (cfg.graphs.emulated ? " (emulated)" : "")
      : "off (eager)";
    const rowsOf = [
      ["Model", cfg.model],
      ["Served as", cfg.served_model_name],
      ["Device, dtype", cfg.device + ", " + cfg.dtype],
      ["Max model length", cfg.max_model_len],
      ["Max sequences", cfg.max_num_seqs],
      ["Max batched tokens", cfg.max_num_batched_tokens],
      ["Policy", cfg.policy],
      ["Async scheduling", cfg.async_scheduling ? "on" : "off"],
      ["Chunked prefill", cfg.chunked_prefill ? "on" : "off"],
      ["Prefix caching", cfg.prefix_caching ? "on" : "off"],
      ["KV cache", cfg.num_kv_blocks + " blocks \u00d7 " + cfg.block_size + " tokens"],
      ["CUDA graphs", graphs],
      ["Tokenizer", cfg.has_tokenizer ? "yes" : "none (token ids only)"],
    ];
    const body = $("config").tBodies[0];
    body.textContent = "";
    for (const [k, v] of rowsOf) {
      const tr = document.createElement("tr");
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = k;
      const td = document.createElement("td");
      td.textContent = String(v);
      tr.append(th, td);
      body.append(tr);
    }
  }

  function range(sizes) {
    return sizes.length === 1 ? String(sizes[0])
      : sizes[0] + "\u2013" + sizes[sizes.length - 1] + " (" + sizes.length + " graphs)";
  }

  function applyStats(s) {
    if (s.boot !== state.boot) {  // first answer, or a restarted server: start over
      state.boot = s.boot;
      state.rows = [];
      state.lastSecond = -1;
    }
    if (s.config) {
      state.config = s.config;
      showConfig(s.config);
      setMode(s.config.has_tokenizer ? "chat" : "ids");
      $("model-line").textContent = s.config.served_model_name + " \u00b7 cadence " + s.version;
    }
    state.windowS = s.window_s;
    state.now = s.now;
    for (const r of s.history) state.rows.push(r);
    if (s.history.length) state.lastSecond = s.history[s.history.length - 1].t;
    const keepFrom = s.second - state.windowS;
    while (state.rows.length && state.rows[0].t < keepFrom) state.rows.shift();
    $("stat-running").textContent = String(s.now.running);
    $("stat-waiting").textContent = String(s.now.waiting);
    $("stat-kv").textContent = fmt(s.now.kv_cache_usage * 100, "%");
    const latest = state.rows.length ? state.rows[state.rows.length - 1] : null;
    $("stat-toks").textContent = fmt(latest ? latest.generation_tokens : 0, "tok/s");
    const status = $("engine-status");
    status.textContent = s.status === "serving" ? "Serving; updated every second." : s.status;
    status.className = s.status === "serving" ? "" : "problem";
    for (const c of CHARTS) drawChart(c);
  }

  async function poll(round) {
    if (round === undefined) round = ++state.pollRound;
    if (round !== state.pollRound) return;
    clearTimeout(state.pollTimer);
    state.pollTimer = null;
    const since = state.boot === null ? -1 : state.lastSecond;
    let again = true;
    try {
      const resp = await fetch(base + "/stats?since=" + since, { headers: headers(false),
                                                                 cache: "no-store" });
      if (resp.status === 401) {
        askForKey(state.key ? "That key was refused." : "");
        again = false;
      } else if (!resp.ok) {
        $("engine-status").textContent = "Stats: " + (await errorText(resp));
        $("engine-status").className = "problem";
      } else {
        const body = await resp.json();
        if (state.needKey) $("key-status").textContent = "Key accepted.";
        if (since >= 0 && body.config === undefined && state.boot !== body.boot) {
          state.boot = null;  // restarted: ask again for everything
        } else {
          applyStats(body);
        }
      }
    } catch (e) {
      $("engine-status").textContent = "The server does not answer.";
      $("engine-status").className = "problem";
    }
    if (again && round === state.pollRound) {
      state.pollTimer = setTimeout(() => poll(round), POLL_MS);
    }
  }

  // -- chat ---------------------------------------------------------------------------------
  let mode = "chat";

  function setMode(m) {
    if (m === mode) return;
    mode = m;
    $("message-label").textContent = m === "chat" ? "Message"
      : "Prompt token ids (this model has no tokenizer), separated by spaces or commas";
    $("system-field").hidden = m !== "chat";
    $("stop").closest(".field").hidden = m !== "chat";
  }

  function addMessage(role, text) {
    const li = document.createElement("li");
    li.className = role;
    const who = document.createElement("div");
    who.className = "role";
    who.textContent = role === "user" ? "You" : "Model";
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    const meta = document.createElement("p");
    meta.className = "meta";
    li.append(who, body, meta);
    $("conversation").append(li);
    li.scrollIntoView({ block: "end" });
    return li;
  }

  function numberField(id, integer) {
    const raw = $(id).value.trim();
    if (raw === "") return undefined;
    const v = integer ? parseInt(raw, 10) : parseFloat(raw);
    return Number.isFinite(v) ? v : undefined;
  }

  function sampling() {
    const p = {
      temperature: numberField("temperature", false),
      top_p: numberField("top-p", false),
      max_tokens: numberField("max-tokens", true),
    };
    if (mode === "chat") {
      const stop = $("stop").value.split("\n").filter((s) => s.length > 0);
      if (stop.length) p.stop = stop;
    }
    return p;
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop-button").disabled = !busy;
    $("clear").disabled = busy;
  }

  async function send() {
    const text = $("message").value;
    if (!text.trim() || state.controller) return;
    let url, body, prompt = null;
    const model = state.config ? state.config.served_model_name : undefined;
    if (mode === "chat") {
      const sys = $("system").value.trim();
      const history = state.messages.concat([{ role: "user", content: text }]);
      body = { model, messages: sys ? [{ role: "system", content: sys }].concat(history)
                                    : history };
      url = base + "/v1/chat/completions";
    } else {
      prompt = text.split(/[\s,]+/).filter((s) => s).map((s) => Number(s));
      if (!prompt.length || prompt.some((v) => !Number.isInteger(v) || v < 0)) {
        $("chat-status").textContent = "Token ids must be whole numbers of 0 or more.";
        return;
      }
      body = { model, prompt };
      url = base + "/v1/completions";
    }
    Object.assign(body, sampling(), { stream: true, stream_options: { include_usage: true } });
    addMessage("user", mode === "chat" ? text : prompt.join(" "));
    $("message").value = "";
    const li = addMessage("assistant", "");
    const out = li.querySelector(".text");
    const meta = li.querySelector(".meta");
    li.dataset.state = "streaming";
    li.dataset.updates = "0";
    const controller = new AbortController();
    state.controller = controller;
    setBusy(true);
    $("chat-status").textContent = "Answering\u2026";
    const started = performance.now();
    let answer = "", ids = [], usage = null, finish = null, failure = null;
    try {
      const resp = await fetch(url, { method: "POST", headers: headers(true),
                                      body: JSON.stringify(body), signal: controller.signal });
      if (resp.status === 401) askForKey("The server refused the key.");
      if (!resp.ok) throw new Error(await errorText(resp));
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let added = "";
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:"))
            .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
          if (!data || data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) { failure = chunk.error.message || "error"; continue; }
          if (chunk.usage) usage = chunk.usage;
          for (const ch of chunk.choices || []) {
            if (mode === "chat") added += (ch.delta && ch.delta.content) || "";
            else if (ch.token_ids) { ids = ids.concat(ch.token_ids); added += " "; }
            if (ch.finish_reason) finish = ch.finish_reason;
          }
        }
        if (added) {  // one DOM update per network read
          const conv = $("conversation");
          const atEnd = conv.scrollHeight - conv.scrollTop - conv.clientHeight < 24;
          answer += mode === "chat" ? added : "";
          out.textContent = mode === "chat" ? answer : ids.join(" ");
          if (atEnd) conv.scrollTop = conv.scrollHeight;
          li.dataset.updates = String(Number(li.dataset.updates) + 1);
        }
      }
      if (failure) throw new Error(failure);
      const secs = (performance.now() - started) / 1000;
      const n = usage ? usage.completion_tokens : null;
      meta.textContent = (n !== null ? n + " tokens in " + secs.toFixed(2) + " s" +
                          (secs > 0 ? " (" + (n / secs).toFixed(1) + " tok/s)" : "")
                                     : secs.toFixed(2) + " s") +
                         (finish === "length" ? "; cut at max_tokens" : "");
      li.dataset.state = "done";
      $("chat-status").textContent = "Answer complete.";
      if (mode === "chat") {
        state.messages.push({ role: "user", content: text }, { role: "assistant", content: answer });
      }
    } catch (e) {
      if (e.name === "AbortError") {
        li.dataset.state = "stopped";
        meta.textContent = "Stopped.";
        $("chat-status").textContent = "Stopped.";
        if (mode === "chat") {
          state.messages.push({ role: "user", content: text },
                              { role: "assistant", content: answer });
        }
      } else {
        li.dataset.state = "error";
        meta.textContent = "Error: " + e.message;
        $("chat-status").textContent = "Error: " + e.message;
      }
    } finally {
      state.controller = null;
      setBusy(false);
      $("message").focus();
    }
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  $("chat-form").addEventListener("submit", (ev) => { ev.preventDefault(); send(); });
  $("stop-button").addEventListener("click", stop);
  $("clear").addEventListener("click", () => {
    state.messages = [];
    $("conversation").textContent = "";
    $("chat-status").textContent = "Conversation cleared.";
  });
  $("message").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && state.controller) { ev.preventDefault(); stop(); }
  });

  buildCharts();
  if (state.key) $("api-key").value = state.key;
  poll();
})();
