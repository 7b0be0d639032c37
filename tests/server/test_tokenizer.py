"""The server speaks through the tokenizer of its model directory (issue 25): a model directory
with GPT-2-style BPE files encodes text prompts with them, streams their text, and says so in
ModelInfo and /v1/models; a directory without them keeps the byte tokenizer."""
import json
import os
import re
import shutil
import urllib.request

import pytest

from conftest import REPO, TEST_MODEL, solo_generate


def spell(b: int) -> str:
    """GPT-2's byte-level spelling of a byte (bytes_to_unicode)."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    rest = [c for c in range(256) if c not in printable]
    return chr(b) if b in printable else chr(256 + rest.index(b))


# Ids 0-255 the bytes, 256 "he", 257 "ll", 258 "<|end|>": inside the test model's 259 ids, so
# the model's own ids 256-258 (BOS, EOS, PAD) become these tokens.
MERGED = {256: b"he", 257: b"ll"}


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("bpe-model")
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(TEST_MODEL, f), d / f)
    vocab = {spell(b): b for b in range(256)}
    vocab.update({"".join(map(spell, t)): i for i, t in MERGED.items()})
    vocab["<|end|>"] = 258
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "merges.txt").write_text("#version: 0.2\nh e\nl l\n")
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": True, "bos_token": "<|end|>", "eos_token": "<|end|>"}))
    return str(d)


def decode(ids):
    return b"".join(MERGED.get(i, bytes([i]) if i < 256 else b"") for i in ids).decode(
        "utf-8", "replace")


def http_get(server, path):
    port = re.search(r":(\d+) \(http\)", server.output()).group(1)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def test_bpe_model_directory(make_server, bpe_model):
    s = make_server(model=bpe_model)
    info = s.client.model_info()
    assert (info.bos_id, info.eos_id) == (256, 257)  # the fpa-serve/1 config's, not the files'
    assert s.client.tokenize("hello h\u00e9") == [258, 256, 257, ord("o"), ord(" "), ord("h"),
                                                   0xC3, 0xA9]
    assert s.client.model_info().tokenizer == "bpe"
    model = http_get(s, "/v1/models")["data"][0]
    assert (model["tokenizer"], model["attention"]) == ("bpe", "fpa")
    # A text prompt is the tokenizer's ids; the output text is the decode of the output ids.
    by_text = s.client.generate("hello hello", max_new_tokens=24, ignore_eos=True)
    by_ids = s.client.generate([258, 256, 257, ord("o"), ord(" "), 256, 257, ord("o")],
                               max_new_tokens=24, ignore_eos=True)
    assert list(by_text.token_ids) == list(by_ids.token_ids)
    assert by_text.text == decode(by_text.token_ids)


def test_byte_model_says_byte(server):
    assert server.client.model_info().tokenizer == "byte"
    assert http_get(server, "/v1/models")["data"][0]["tokenizer"] == "byte"


def test_hugging_face_fox_directory_serves(make_server):
    """A FoX directory in the published Hugging Face format (tests/vectors/hf) serves as fox with
    eviction, and the daemon's greedy tokens are the engine's own."""
    model = os.path.join(REPO, "tests", "vectors", "hf", "fox_llama")
    s = make_server(model=model)
    info = s.client.model_info()
    assert (info.attention, info.vocab_size, info.tokenizer) == ("fox", 320, "byte")
    out = s.client.generate([256, 1, 2, 3, 4, 5, 6, 7], max_new_tokens=12, ignore_eos=True,
                            eviction_policy="fpa", tau=2.0)
    assert list(out.token_ids) == solo_generate([256, 1, 2, 3, 4, 5, 6, 7], model=model,
                                                max_new_tokens=12, tau=2.0)
    assert out.usage.live_fraction < 1.0


def test_fox_pro_with_key_value_shift_serves(make_server):
    """FoX Pro (QK-norm, output gate and norm, key/value shift carried across prompt chunks and
    decode steps) serves equal to the engine (its prefix-cache hits: test_prefix_cache.py)."""
    model = os.path.join(REPO, "tests", "vectors", "hf", "fox_pro")
    s = make_server("--prefill-chunk", "5", model=model)
    prompt = [256] + list(range(40, 60))
    out = s.client.generate(prompt, max_new_tokens=10)
    assert list(out.token_ids) == solo_generate(prompt, model=model, max_new_tokens=10,
                                                prefill_chunk=256)
