"""Training and evaluation data, built here from nothing downloaded.

Three sources, mixed into fixed-length training sequences of byte tokens:
  * passkey retrieval (docs/fpa.md section 6): task line, repeated filler, the needle at a random depth,
    the question, then the answer; the answer digits carry `answer_weight` in the loss;
  * nested scopes: `a=3;{a=8;b=1;a?8}a?3` style programs where an inner block's bindings must be
    forgotten when it closes and the outer ones kept; the answers after `?` are weighted too;
  * English text: the license texts Debian's base-files package installs under
    /usr/share/common-licenses (present on every Debian system). Apache-2.0, Artistic and CC0-1.0
    are held out for perplexity; the others are for training.
"""
from __future__ import annotations

import dataclasses
import os
import random

import torch

from reference import BOS, EOS, encode

TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
        "them. I will quiz you about the important information there.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "What is the pass key? The pass key is"
LICENSE_DIR = "/usr/share/common-licenses"
HELD_OUT = ("Apache-2.0", "Artistic", "CC0-1.0")


def needle(key: str) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def passkey_prompt(n_tokens: int, depth: float, key: str, task: bool = True) -> str:
    """A passkey prompt of about n_tokens byte tokens (BOS included): the task line (unless
    `task` is false), filler with the needle after round(depth * reps) of the `reps` filler
    groups, then the question (no answer)."""
    head = [TASK] if task else []
    fixed = len(encode(" ".join(head + [needle(key), QUESTION])))
    reps = max(1, (n_tokens - fixed) // (len(FILLER) + 1))
    at = round(depth * reps)
    parts = head + [FILLER] * at + [needle(key)] + [FILLER] * (reps - at) + [QUESTION]
    return " ".join(parts)


def random_key(rng: random.Random) -> str:
    return str(rng.randint(10000, 99999))


def passkey_sample(rng: random.Random, max_tokens: int) -> tuple[list[int], list[int]]:
    """(tokens, positions of the answer digits) of one passkey sample, at most max_tokens."""
    key = random_key(rng)
    n = rng.randint(min(96, max_tokens), max_tokens)
    task = n >= 300 and rng.random() < 0.8  # the task line alone is 150 tokens
    prompt = encode(passkey_prompt(n - 8, rng.random(), key, task))
    tokens = prompt + list(f" {key}.".encode()) + [EOS]
    return tokens, list(range(len(prompt) + 1, len(prompt) + 6))


def nested_sample(rng: random.Random, max_tokens: int) -> tuple[list[int], list[int]]:
    """A nested-scope program; queries `v?` are answered with v's value in the current scope."""
    names, text, marks = "abcde", "", []
    scopes = [{}]
    while len(text) < max_tokens - 8:
        r = rng.random()
        if r < 0.35 or not scopes[-1]:
            v = rng.choice(names)
            scopes[-1][v] = str(rng.randint(0, 9))
            text += f"{v}={scopes[-1][v]};"
        elif r < 0.5 and len(scopes) < 4:
            scopes.append({})
            text += "{"
        elif r < 0.65 and len(scopes) > 1:
            scopes.pop()
            text += "}"
        else:
            v = rng.choice([n for s in scopes for n in s])
            value = next(s[v] for s in reversed(scopes) if v in s)
            text += f"{v}?"
            marks.append(len(text) + 1)  # +1 for BOS
            text += f"{value};"
    return encode(text) + [EOS], marks


def license_texts(held_out: bool) -> dict[str, str]:
    """The English corpus: unique license files, split by file name."""
    out, seen = {}, set()
    for name in sorted(os.listdir(LICENSE_DIR)):
        path = os.path.realpath(os.path.join(LICENSE_DIR, name))
        if path in seen or (name in HELD_OUT) != held_out:
            continue
        seen.add(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            out[name] = f.read()
    return out


@dataclasses.dataclass
class Mix:
    """Shares of the rows led by a passkey or a nested sample; the rest is English text."""

    passkey: float = 0.6
    nested: float = 0.15
    answer_weight: float = 5.0


class Batches:
    """Random training batches for next-token prediction, drawn from one seeded stream.

    Each row starts with one sample of the drawn kind, then is filled up with English text, so
    every row is full length and needs no padding.
    """

    def __init__(self, seed: int, mix: Mix | None = None):
        self.mix = mix or Mix()
        self.rng = random.Random(seed)
        self.text = encode("\n\n".join(license_texts(held_out=False).values()), bos=False)

    def _text(self, n: int) -> list[int]:
        start = self.rng.randrange(0, len(self.text) - n)
        return self.text[start:start + n]

    def row(self, seq_len: int) -> tuple[list[int], list[float]]:
        """seq_len + 1 tokens and the loss weight of predicting each token after the first."""
        n = seq_len + 1
        r = self.rng.random()
        if r < self.mix.passkey:
            toks, answers = passkey_sample(self.rng, n)
        elif r < self.mix.passkey + self.mix.nested:
            toks, answers = nested_sample(self.rng, n)
        else:
            toks, answers = [BOS], []
        toks = (toks + self._text(max(0, n - len(toks))))[:n]
        w = [1.0] * (n - 1)
        for p in answers:
            if p < n:
                w[p - 1] = self.mix.answer_weight
        return toks, w

    def batch(self, seq_len: int, size: int):
        """(tokens [B, T], targets [B, T], weights [B, T])."""
        rows = [self.row(seq_len) for _ in range(size)]
        toks = torch.tensor([r[0] for r in rows])
        return toks[:, :-1], toks[:, 1:], torch.tensor([r[1] for r in rows])


def heldout_tokens() -> list[int]:
    return encode("\n\n".join(license_texts(held_out=True).values()))


