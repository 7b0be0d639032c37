"""/v1/chat/completions renders the model's own chat template (issue 24): a model directory whose
tokenizer_config.json has a Jinja chat_template gets prompts rendered by it (with bos_token,
eos_token, add_generation_prompt and tools) and encoded without an extra BOS; a template that
does not parse leaves the model serving completions while chats get an error naming the problem."""
import json
import os
import re
import shutil
import urllib.error
import urllib.request

import pytest

from conftest import TEST_MODEL
from test_tokenizer import spell

TEMPLATE = (
    "{%- macro turn(role, text) %}[{{ role|upper }}] {{ text|trim }}\n{% endmacro -%}\n"
    "{{ bos_token }}{% for m in messages %}{{ turn(m.role, m.content) }}{% endfor %}\n"
    "{%- if tools %}[TOOLS] {{ tools|map(attribute='function.name')|join(', ') }}\n{% endif %}\n"
    "{%- if messages[-1].role == 'system' %}{{ raise_exception('a system message comes last') }}"
    "{% endif %}\n"
    "{%- if add_generation_prompt %}[ASSISTANT] {% endif %}")


def rendered(messages, tools=()):
    """TEMPLATE's rendering, written out by hand."""
    text = "<|end|>" + "".join(f"[{m['role'].upper()}] {m['content'].strip()}\n"
                               for m in messages)
    if tools:
        text += "[TOOLS] " + ", ".join(t["function"]["name"] for t in tools) + "\n"
    return text + "[ASSISTANT] "


def model_dir(tmp_path, chat_template):
    """The test model with a byte-level BPE tokenizer (ids 0-255 the bytes, 258 <|end|>)."""
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(TEST_MODEL, f), tmp_path / f)
    vocab = {spell(b): b for b in range(256)}
    vocab["<|end|>"] = 258
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": True, "bos_token": "<|end|>", "eos_token": "<|end|>",
         "chat_template": chat_template}))
    return str(tmp_path)


def post(server, path, body):
    port = re.search(r":(\d+) \(http\)", server.output()).group(1)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


MESSAGES = [{"role": "system", "content": " Be brief. "},
            {"role": "user", "content": "{{ not a tag }} {% nor this %} caf\u00e9"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {}}}]


def test_chat_renders_the_model_template(make_server, tmp_path):
    s = make_server(model=model_dir(tmp_path, TEMPLATE))
    status, by_text = post(s, "/tokenize", {"prompt": rendered(MESSAGES, TOOLS),
                                            "add_special_tokens": False})
    assert status == 200
    want = by_text["tokens"]
    assert want[0] == 258 and want.count(258) == 1  # the template's BOS, not one more
    status, by_chat = post(s, "/tokenize", {"messages": MESSAGES, "tools": TOOLS})
    assert (status, by_chat["tokens"]) == (200, want)
    status, chat = post(s, "/v1/chat/completions",
                        {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 2})
    assert status == 200, chat
    assert chat["usage"]["prompt_tokens"] == len(want)
    status, plain = post(s, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2})
    assert plain["usage"]["prompt_tokens"] == len(post(s, "/tokenize", {
        "prompt": rendered(MESSAGES), "add_special_tokens": False})[1]["tokens"])


def test_raise_exception_is_a_400_with_its_message(make_server, tmp_path):
    s = make_server(model=model_dir(tmp_path, TEMPLATE))
    status, err = post(s, "/v1/chat/completions",
                       {"messages": [{"role": "system", "content": "x"}], "max_tokens": 2})
    assert status == 400
    assert "a system message comes last" in err["error"]["message"]


def test_a_template_that_does_not_parse_refuses_chats_only(make_server, tmp_path):
    s = make_server(model=model_dir(tmp_path, "{% for m in messages %}{{ m.content }}"))
    assert "warning" in s.output() and "missing 'endfor'" in s.output()
    status, err = post(s, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2})
    assert status == 500
    assert "chat template" in err["error"]["message"]
    assert "missing 'endfor'" in err["error"]["message"]
    status, completion = post(s, "/v1/completions", {"prompt": "hello", "max_tokens": 2})
    assert status == 200, completion


def test_model_without_a_template_keeps_chatml(server):
    status, chat = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    status, text = post(server, "/tokenize", {"prompt": "<|im_start|>user\nhi<|im_end|>\n"
                                                        "<|im_start|>assistant\n"})
    assert chat["tokens"] == text["tokens"]


def test_chat_without_max_tokens_runs_to_the_server_cap(make_server):
    """A chat with no max_tokens runs on to the end of its turn or the server's --max-new-tokens
    (OpenAI's and vLLM's chats have no default cap), where a completion stops at OpenAI's 16."""
    s = make_server("--max-new-tokens", "40")
    messages = [{"role": "user", "content": "Tell me a long story."}]
    # ignore_eos: the random test model may end its turn at any token.
    for body in ({"messages": messages, "ignore_eos": True},
                 {"messages": messages, "ignore_eos": True, "max_tokens": None}):
        status, chat = post(s, "/v1/chat/completions", body)
        assert status == 200, chat
        reason, tokens = chat["choices"][0]["finish_reason"], chat["usage"]["completion_tokens"]
        assert (reason, tokens) == ("length", 40), chat
    status, chat = post(s, "/v1/chat/completions",
                        {"messages": messages, "ignore_eos": True, "max_tokens": 5})
    assert (status, chat["usage"]["completion_tokens"]) == (200, 5), chat
    status, completion = post(s, "/v1/completions", {"prompt": "Once upon a time",
                                                     "ignore_eos": True})
    assert (status, completion["usage"]["completion_tokens"]) == (200, 16), completion
