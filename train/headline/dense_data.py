"""A dense passkey curriculum: one complete passkey episode per row, rows of 128 to 512 tokens.

The trainer's mix (train/data.py) gives 5 weighted answer digits per 512-token row at most; here
every row but the English ones is an episode that ends in its answer, and short rows (several per
step) make most of them cheap. The needle and question keep data.py's exact wording; the filler
is cut at sentence boundaries so that episodes shorter than one filler group exist, and the
needle sits at a random sentence boundary. Weighted targets: the answer digits and the second
copy of the key inside the needle ("... Remember it. NNNNN is ..."), the same copy at short range,
a stepping stone for the long-range one. A share of rows is the classic induction-head task
(a random alphanumeric string repeated to the row's end, every repeat a target): many copy targets
per row, so the copy circuit that the passkey needs forms sooner.

With `varied` (the second-generation recipe), all but `STANDARD_SHARE` of the episodes draw their
filler family and wording from texts.py (its held-out family and question never appear), and
every copy of the key after its first mention is a copy target. `varied` 2 (the third-generation
stage) also varies the answer cue (texts.CUE_QUESTIONS).
"""
from __future__ import annotations

import os
import random
import string
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from data import FILLER, QUESTION, TASK, license_texts, needle, passkey_prompt, random_key  # noqa: E402
from reference import BOS, EOS, encode  # noqa: E402
from texts import TRAIN_FAMILIES, Wording, prompt  # noqa: E402

ALNUM = string.ascii_letters + string.digits
SENTENCES = [s if s.endswith(".") else s + "." for s in FILLER.split(". ")]
STANDARD_SHARE = 0.35  # varied episodes that keep the benchmark's filler and wording


def _filler(rng: random.Random, n_chars: int) -> list[str]:
    """Filler sentences, in FILLER's order from a random start, about n_chars long."""
    out, at, size = [], rng.randrange(len(SENTENCES)) if rng.random() < 0.5 else 0, 0
    while size < n_chars:
        out.append(SENTENCES[at % len(SENTENCES)])
        size += len(out[-1]) + 1
        at += 1
    return out


def episode_text(rng: random.Random, n_tokens: int, key: str) -> str:
    """Prompt text of at most about n_tokens tokens, needle at a random sentence boundary."""
    if n_tokens >= 300 and rng.random() < 0.5:  # the benchmark's own prompt, whole filler groups
        return passkey_prompt(n_tokens, rng.random(), key, task=True)
    task = n_tokens >= 260 and rng.random() < 0.5
    head = [TASK] if task else []
    fixed = len(encode(" ".join(head + [needle(key), QUESTION])))
    filler = _filler(rng, max(0, n_tokens - fixed - 20))
    at = rng.randint(0, len(filler))
    return " ".join(head + filler[:at] + [needle(key)] + filler[at:] + [QUESTION])


def varied_text(rng: random.Random, n_tokens: int, key: str, cues: bool = False) -> str:
    """episode_text's benchmark wording in STANDARD_SHARE of the draws, else a training filler
    family and wording from texts.py with the needle at any sentence boundary."""
    if rng.random() < STANDARD_SHARE:
        return episode_text(rng, n_tokens, key)
    return prompt(rng, n_tokens - 1, None, Wording(rng, key, cues=cues),
                  rng.choice(TRAIN_FAMILIES))


def episode(rng: random.Random, n_tokens: int, answer_w: float, copy_w: float,
            varied: int = 0):
    """(tokens, weights of predicting token p at index p-1) for one episode of <= n_tokens:
    the answer digits weigh answer_w, the key's repeats inside the prompt copy_w. `varied`: 0
    the benchmark's wording, 1 texts.py's fillers and wordings, 2 those and the answer cues."""
    key = random_key(rng)
    n_text = rng.randint(max(100, n_tokens // 2), n_tokens - 8)
    text = (varied_text(rng, n_text, key, cues=varied >= 2) if varied
            else episode_text(rng, n_text, key))
    tokens = encode(text) + list(f" {key}.".encode()) + [EOS]
    weights = {}
    body = text.encode()
    at = body.index(key.encode())
    while (at := body.find(key.encode(), at + 1)) >= 0:
        for p in range(at + 1, at + 6):  # +1: BOS
            weights[p] = copy_w
    for p in range(len(tokens) - 7, len(tokens) - 2):
        weights[p] = answer_w
    return tokens, weights


def repeats(rng: random.Random, n_tokens: int, copy_w: float):
    """A random string (10 to 40 letters and digits) repeated over n_tokens: the repeats are
    predictable only by copying."""
    unit = "".join(rng.choice(ALNUM) for _ in range(rng.randint(10, 40))) + " "
    tokens = encode((unit * (n_tokens // len(unit) + 1))[: n_tokens - 1])
    return tokens, {p: copy_w for p in range(len(unit) + 1, len(tokens))}


class DenseBatches:
    """Batches of `tokens_per_step` tokens in rows of one length drawn from `lengths`."""

    def __init__(self, seed: int, text_share: float = 0.15, answer_w: float = 8.0,
                 copy_w: float = 2.0, repeat_share: float = 0.0, varied: int = 0):
        self.rng = random.Random(seed)
        self.text = encode("\n\n".join(license_texts(held_out=False).values()), bos=False)
        self.text_share, self.answer_w, self.copy_w = text_share, answer_w, copy_w
        self.repeat_share, self.varied = repeat_share, varied

    def _row(self, n: int):
        r = self.rng.random()
        if r < self.text_share:
            toks, wmap = [BOS], {}
        elif r < self.text_share + self.repeat_share:
            toks, wmap = repeats(self.rng, n, 1.0)
        else:
            toks, wmap = episode(self.rng, n, self.answer_w, self.copy_w, self.varied)
        start = self.rng.randrange(0, len(self.text) - n)
        toks = (toks + self.text[start:start + n])[:n]
        return toks, [wmap.get(p, 1.0) for p in range(1, n)]

    def batch(self, seq_len: int, rows: int):
        """(inputs [B, T], targets [B, T], weights [B, T])."""
        data = [self._row(seq_len + 1) for _ in range(rows)]
        toks = torch.tensor([d[0] for d in data])
        return toks[:, :-1], toks[:, 1:], torch.tensor([d[1] for d in data])
