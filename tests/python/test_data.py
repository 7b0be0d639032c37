"""Training data: passkey prompts, nested scopes, English split."""
import random
import re

from data import (FILLER, QUESTION, TASK, Batches, license_texts, needle, nested_sample,
                  passkey_prompt, passkey_sample)
from reference import decode, encode


def test_passkey_prompt_shape():
    for n in (512, 1024, 4096):
        p = passkey_prompt(n, 0.3, "12345")
        assert n - 2 * len(FILLER) <= len(encode(p)) <= n
        assert p.startswith(TASK) and p.endswith(QUESTION) and needle("12345") in p
    deep = passkey_prompt(1024, 1.0, "55555")
    assert deep.index(needle("55555")) > deep.index(FILLER) > 0


def test_passkey_sample_answer_positions():
    rng = random.Random(0)
    for _ in range(20):
        toks, answers = passkey_sample(rng, 513)
        text = decode(toks)
        key = re.search(r"pass key is (\d{5})\.", text).group(1)
        assert decode([toks[p] for p in answers]) == key and len(toks) <= 513


def test_nested_answers_respect_scopes():
    rng = random.Random(1)
    for _ in range(20):
        toks, answers = nested_sample(rng, 200)
        text, scopes = decode(toks), [{}]
        for m in re.finditer(r"([a-e])=(\d);|\{|\}|([a-e])\?(\d);", text):
            if m.group(0) == "{":
                scopes.append({})
            elif m.group(0) == "}":
                scopes.pop()
            elif m.group(1):
                scopes[-1][m.group(1)] = m.group(2)
            else:
                assert next(s[m.group(3)] for s in reversed(scopes) if m.group(3) in s) == m.group(4)
        assert all(chr(toks[p]).isdigit() and chr(toks[p - 1]) == "?" for p in answers)


def test_english_split_is_disjoint():
    train, held = license_texts(held_out=False), license_texts(held_out=True)
    assert held and train and not set(train) & set(held)


def test_batches_are_full_and_seeded():
    x1, y1, w1 = Batches(3).batch(256, 4)
    x2, _, _ = Batches(3).batch(256, 4)
    assert x1.shape == y1.shape == w1.shape == (4, 256) and (x1 == x2).all()
    assert (x1[:, 1:] == y1[:, :-1]).all() and w1.max() > 1
