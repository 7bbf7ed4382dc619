"""Several --served-model-name values and --chat-template."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from cadence.model.tiny import ensure_tiny_model
from cadence.server.cli import load_chat_template

TEMPLATE = ("{% for m in messages %}<<{{ m['role'] }}:{{ m['content'] }}>>{% endfor %}"
            "{% if add_generation_prompt %}ASSISTANT:{% endif %}")


def test_every_served_name_is_accepted_and_listed(server_factory) -> None:
    # A name given twice is one served name: a model list's ids are unique.
    srv = server_factory(app_kwargs={"served_model_name": ["main-name", "alias", "main-name"]})
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        cards = http.get("/v1/models").json()["data"]
        assert [m["id"] for m in cards] == ["main-name", "alias"]
        # Each name's card roots at the model it serves (vLLM's: the model path), here "tiny".
        assert [m["root"] for m in cards] == ["tiny", "tiny"]
        # Responses carry the name asked for; none or "": the first (vLLM's).
        for name, shown in (("main-name", "main-name"), ("alias", "alias"), ("", "main-name"),
                            (None, "main-name")):
            resp = http.post("/v1/completions", json={"model": name, "prompt": "Hi",
                                                      "max_tokens": 2})
            assert resp.status_code == 200, resp.text
            assert resp.json()["model"] == shown
            chat = {"model": name, "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 2}
            assert http.post("/v1/chat/completions", json=chat).json()["model"] == shown
            with http.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as r:
                frames = [json.loads(line[6:]) for line in r.iter_lines()
                          if line.startswith("data: {")]
            assert frames and {f["model"] for f in frames} == {shown}
            with http.stream("POST", "/v1/completions",
                             json={"model": name, "prompt": "Hi", "max_tokens": 2,
                                   "stream": True}) as r:
                frames = [json.loads(line[6:]) for line in r.iter_lines()
                          if line.startswith("data: {")]
            assert frames and {f["model"] for f in frames} == {shown}
            answer = http.post("/v1/responses", json={"model": name, "input": "Hi",
                                                      "max_output_tokens": 2})
            assert answer.json()["model"] == shown
        # Only served names (vLLM): the model's own name is not one here.
        for name in ("other", "tiny"):
            resp = http.post("/v1/completions", json={"model": name, "prompt": "Hi"})
            assert resp.status_code == 404 and resp.json()["error"]["param"] == "model"
            assert http.get(f"/v1/models/{name}").status_code == 404


def test_the_server_chat_template_replaces_the_tokenizers(server_factory) -> None:
    srv = server_factory(app_kwargs={"chat_template": TEMPLATE})
    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text = "<<system:Be brief.>><<user:Hi!>>ASSISTANT:"  # the template, rendered by hand
    expected = tok.encode(text, add_special_tokens=False)
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert http.post("/tokenize", json={"messages": messages}).json()["tokens"] == expected
        chat = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
        assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] == len(expected)


def test_chat_template_argument(tmp_path: Path) -> None:
    f = tmp_path / "template.jinja"
    f.write_text(TEMPLATE)
    assert load_chat_template(str(f)) == TEMPLATE
    assert load_chat_template(TEMPLATE) == TEMPLATE
    # An inline template's escapes are read as vLLM reads them (a shell passes \n as two
    # characters); other characters stay as given.
    inline = "{% for m in messages %}{{ m.content }}\\n\\t日é{% endfor %}"
    assert load_chat_template(inline) == "{% for m in messages %}{{ m.content }}\n\t日é{% endfor %}"
    with pytest.raises(ValueError, match="--chat-template: a bad escape"):
        load_chat_template("{{ x }}\\x4")
    assert load_chat_template(None) is None
    blocks = "{% for m in messages %}{% if m.role == 'user' %}Q{% endif %}{% endfor %}"
    assert load_chat_template(blocks) == blocks  # a template of statements only is one too
    # One that does not parse would fail every chat request: refused at start-up.
    with pytest.raises(ValueError, match="--chat-template"):
        load_chat_template("{% for m in messages %}{{ m.content }}")
    with pytest.raises(ValueError, match="neither a file nor a Jinja template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    # A real template is longer than a file name may be (the check for a file raised there).
    long = "{% for m in messages %}{{ m.content }}{% endfor %}" + "{# padding #}" * 400
    assert load_chat_template(long) == long


def test_cadence_serve_reads_a_chat_template_file_before_loading(tmp_path: Path, capsys) -> None:
    from cadence.cli import main

    with pytest.raises(SystemExit) as info:
        main(["serve", "tiny", "--chat-template", str(tmp_path / "missing.jinja")])
    assert info.value.code == 2
    assert "--chat-template" in capsys.readouterr().err


def test_a_chat_template_path_under_the_home_directory(tmp_path: Path, monkeypatch) -> None:
    # As a shell leaves it when the path is quoted: "~/template.jinja".
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "template.jinja").write_text(TEMPLATE)
    assert load_chat_template("~/template.jinja") == TEMPLATE
