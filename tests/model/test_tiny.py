"""The built-in tiny model: deterministic, a real tokenizer, loadable by transformers and by us."""

from __future__ import annotations

import os

import pytest
import torch
import transformers

from cadence.model import tiny
from cadence.model.bpe import symbol_bytes
from tests.model.helpers import Chunk, load_ours, make_batch, run_ours


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny.ensure_tiny_model(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return transformers.AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_dir).eval()


def _printable(text: str) -> bool:
    return all(ch.isprintable() or ch in "\n\t" for ch in text)


def test_directory_is_complete_and_reused(tiny_dir):
    assert sorted(os.listdir(tiny_dir)) == sorted(tiny.REQUIRED_FILES)
    stamp = os.stat(tiny_dir / "model.safetensors").st_mtime_ns
    assert tiny.ensure_tiny_model(tiny_dir.parent) == tiny_dir
    assert os.stat(tiny_dir / "model.safetensors").st_mtime_ns == stamp
    assert os.listdir(tiny_dir.parent) == [tiny.TINY_DIR_NAME]  # no temporary leftovers


def test_two_builds_are_byte_identical(tiny_dir, tmp_path):
    tiny.write_tiny_model(tmp_path)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (tiny_dir / name).read_bytes(), name


def test_incomplete_directory_is_reported(tmp_path):
    (tmp_path / tiny.TINY_DIR_NAME).mkdir()
    with pytest.raises(ValueError, match="not a complete tiny model"):
        tiny.ensure_tiny_model(tmp_path)


def test_a_cache_root_that_cannot_be_a_directory_is_a_one_line_error(tmp_path, monkeypatch):
    """CADENCE_CACHE_DIR naming a file (or a place nothing can be made): a ValueError that
    names the variable, which the CLI prints in one line (a FileExistsError traceback)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for root in (blocker, blocker / "below"):
        monkeypatch.setenv("CADENCE_CACHE_DIR", str(root))
        with pytest.raises(ValueError, match="CADENCE_CACHE_DIR"):
            tiny.ensure_tiny_model()


def test_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(dest):
        (dest / "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(tiny, "write_tiny_model", broken)
    with pytest.raises(OSError, match="disk full"):
        tiny.ensure_tiny_model(tmp_path)
    assert os.listdir(tmp_path) == []


def test_losing_a_race_keeps_the_winners_directory(tmp_path, monkeypatch):
    real_write = tiny.write_tiny_model

    def racing(dest):
        real_write(dest)
        winner = tmp_path / "winner"  # another process finishes first
        winner.mkdir()
        real_write(winner)
        os.rename(winner, tmp_path / tiny.TINY_DIR_NAME)

    monkeypatch.setattr(tiny, "write_tiny_model", racing)
    assert tiny.ensure_tiny_model(tmp_path) == tmp_path / tiny.TINY_DIR_NAME
    assert os.listdir(tmp_path) == [tiny.TINY_DIR_NAME]


@pytest.mark.parametrize(
    "text",
    ["The morning was cold and clear.", "naïve café — 日本語, emoji 🙂 and\ttabs\nnewlines"],
)
def test_tokenizer_round_trip(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert len(ids) < len(text.encode()) or not text.isascii()  # merges compress English
    assert tokenizer.decode(ids) == text
    assert all(0 <= i < tiny.VOCAB_SIZE - len(tiny.SPECIAL_TOKENS) for i in ids)


def test_special_tokens_and_chat_template(tokenizer):
    assert len(tokenizer) == tiny.VOCAB_SIZE
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 637
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [638, 639]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[0] == 638 and ids.count(639) == 2


def test_unprintable_tokens_have_zero_lm_head_rows(hf_model):
    mask = tiny.printable_token_mask(tiny.build_tokenizer())
    for byte in (0x00, 0x1B, 0x7F, 0x80, 0xC3, 0xFF):  # control, continuation and lead bytes
        assert not mask[byte]
    assert mask[ord("a")] and mask[ord(" ")] and mask[ord("\n")] and mask[637]
    assert not mask[638] and not mask[639]
    head = hf_model.lm_head.weight.detach()
    assert torch.equal(head[~mask], torch.zeros_like(head[~mask]))
    assert (head[mask].abs().sum(-1) > 0).all()
    assert int(mask.sum()) > 400


def test_generation_is_printable(tokenizer, hf_model):
    prompt = tokenizer("The river", return_tensors="pt")
    with torch.no_grad():
        greedy = hf_model.generate(**prompt, do_sample=False, max_new_tokens=32)
    text = tokenizer.decode(greedy[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text and _printable(text)
    # Temperature-1 sampling: the probability mass on unprintable tokens stays tiny everywhere.
    ids = tokenizer(" ".join(["The town was quiet again."] * 8), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probs = hf_model(ids).logits[0].softmax(-1)
    mask = tiny.printable_token_mask(tiny.build_tokenizer())
    assert probs[:, ~mask].sum(-1).max() < 1e-3


def test_our_model_matches_transformers_on_tiny(tiny_dir, hf_model, tokenizer):
    tokens = tokenizer("A computer is a machine that follows instructions.")["input_ids"]
    model = load_ours(tiny_dir)
    logits = run_ours(model, make_batch([Chunk(tokens, 0, list(range(1, 1 + len(tokens))))]))
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


def test_every_regular_token_is_a_byte_string(tokenizer):
    vocab = tiny.build_tokenizer().get_vocab(with_added_tokens=False)
    assert sorted(vocab.values()) == list(range(tiny.VOCAB_SIZE - len(tiny.SPECIAL_TOKENS)))
    assert all(len(symbol_bytes(token)) >= 1 for token in vocab)


def test_residual_channel_zero_is_a_constant_bias(tokenizer, hf_model):
    """Every embedding sets residual channel 0 to 0.4 and no layer writes it, so every layer's
    output (before the final norm) still holds 0.4 there, for every token."""
    ids = tokenizer("The river ran past the old mill, slowly.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        states = hf_model(ids, output_hidden_states=True).hidden_states
    assert len(states) == hf_model.config.num_hidden_layers + 1
    for layer, h in enumerate(states[:-1]):  # the last one is after the final norm
        torch.testing.assert_close(h[0, :, 0], torch.full((ids.shape[1],), 0.4), atol=1e-6,
                                   rtol=0, msg=f"after layer {layer}")
    assert (states[-1][0, :, 0] > 0).all()


def test_tokenizer_knows_the_context_length(tokenizer, hf_model):
    assert tokenizer.model_max_length == hf_model.config.max_position_embeddings == 2048
