"""The second-generation recipe's text variety: filler families and task/needle/question wordings,
with one filler family and one question wording held out of training for evaluation.

A retrieval circuit that keys on the benchmark's one filler ("The grass is green. ...") fails on
another filler; drawing the filler from several families (the benchmark's, other passkey-style
repeated fillers, English sentences from the training licenses, grammar-generated sentences)
and varying the wording leaves the needle's key as the only thing worth copying. The held-out
family ("weather": its own grammar and vocabulary) and question never appear in training rows
(test_recipe.py checks it), so evaluating on them measures that generalisation.
"""
from __future__ import annotations

import itertools
import os
import random
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from data import FILLER, QUESTION, TASK, license_texts, needle  # noqa: E402

# Repeated passkey-style fillers other than the benchmark's, no digits in any of them.
VARIANTS = [
    "The river is wide. The road is long. Birds fly south. The hills are quiet. On we walk.",
    "A cat sleeps on the mat. The kettle is hot. Rain taps the window. All is calm.",
    "The ocean is deep. The sand is warm. Waves roll in. Gulls call out. The tide turns.",
    "Trees grow tall. Leaves turn red. Wind blows cold. Snow falls soft. Spring comes back.",
    "The city is loud. Cars pass by. Lights turn green. People hurry home. Night falls.",
    "Bread is baked at dawn. Milk is poured. The table is set. Breakfast is ready.",
]
_ADJ = "small old bright quiet heavy gentle distant busy simple curious".split()
_NOUN = "farmer teacher dog garden letter window train painter bridge lamp".split()
_VERBS = ["looks at", "carries", "finds", "paints", "visits", "follows", "opens", "watches"]
_WEATHER = {"day": "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split(),
            "city": "Oslo Lima Cairo Quito Perth Dublin Nairobi Kyoto".split(),
            "sky": "cloudy sunny foggy windy stormy clear".split(),
            "temp": "cold mild warm chilly hot".split()}
NOUNS = ["pass key", "secret number", "access code", "magic number"]
NEEDLES = ["The {noun} is {key}. Remember it. {key} is the {noun}.",
           "The {noun} is {key}.",
           "Remember this {noun}: {key}.",
           "Here is the {noun}: {key}. Keep it in mind."]
QUESTIONS = ["What is the {noun}? The {noun} is",
             "What was the {noun} mentioned above? It is",
             "Tell me the {noun}. The {noun} is",
             "Do you remember the {noun}? It was"]
TASKS = [TASK, "Read the text below and remember the {noun} in it.", None]
# The third-generation stage adds questions whose answer follows a cue ("Answer:", "A:", a
# colon) rather than "... is": gen2 models answered no cue they had not seen (the held-out
# question ends in "Answer:"), so the variety has to cover the cue as well as the words.
CUE_QUESTIONS = ["What is the {noun}? Answer:",
                 "Question: which {noun} was given above? Answer:",
                 "Q: What was the {noun}? A:",
                 "Write down the {noun}:",
                 "The {noun} in the text above reads:",
                 "Name the {noun} from the passage. Reply:"]
HELD_OUT_QUESTION = "Recall the {noun} hidden in the text. Answer:"
HELD_OUT_FILLER = "weather"


def _fill(make, n_chars: int) -> list[str]:
    """Sentences from make() while they fit in n_chars (so that episodes never overrun a row)."""
    out, size = [], 0
    while size + len(s := make()) + 1 <= n_chars:
        out.append(s)
        size += len(s) + 1
    return out


def _cycle(rng: random.Random, sentences: list[str], n_chars: int) -> list[str]:
    """Sentences in order from a random start, cycled."""
    at = itertools.count(rng.randrange(len(sentences)))
    return _fill(lambda: sentences[next(at) % len(sentences)], n_chars)


def _sentences(text: str) -> list[str]:
    return [s if s.endswith(".") else s + "." for s in text.split(". ")]


_LICENSE: list[str] = []


def _license(rng: random.Random, n_chars: int) -> list[str]:
    """A contiguous run of the training licenses' sentences (those without digits, so that the
    key is the only number in the prompt)."""
    if not _LICENSE:
        text = " ".join(re.sub(r"\s+", " ", t) for t in license_texts(held_out=False).values())
        _LICENSE.extend(s for s in re.split(r"(?<=\.) ", text)
                        if 20 <= len(s) <= 200 and not re.search(r"\d", s) and s.isascii())
    return _cycle(rng, _LICENSE, n_chars)


def _generated(rng: random.Random, n_chars: int) -> list[str]:
    def make():
        a, b = rng.sample(_NOUN, 2)
        return f"The {rng.choice(_ADJ)} {a} {rng.choice(_VERBS)} the {b}."
    return _fill(make, n_chars)


def _weather(rng: random.Random, n_chars: int) -> list[str]:
    def make():
        w = {k: rng.choice(v) for k, v in _WEATHER.items()}
        return f"On {w['day']} the weather in {w['city']} was {w['sky']} and {w['temp']}."
    return _fill(make, n_chars)


FAMILIES = {
    "classic": lambda rng, n: _cycle(rng, _sentences(FILLER), n),
    "variants": lambda rng, n: _cycle(rng, _sentences(rng.choice(VARIANTS)), n),
    "license": _license,
    "generated": _generated,
    HELD_OUT_FILLER: _weather,
}
TRAIN_FAMILIES = [f for f in FAMILIES if f != HELD_OUT_FILLER]


class Wording:
    """One draw of (task line or None, needle, question) around a key; `cues` (level 2 of the
    recipe's variety) adds CUE_QUESTIONS to the questions drawn from."""

    def __init__(self, rng: random.Random | None, key: str, held_out: bool = False,
                 cues: bool = False):
        if rng is None:  # the benchmark's own wording (data.py)
            self.task, self.needle, self.question = TASK, needle(key), QUESTION
            return
        noun = rng.choice(NOUNS)
        task = rng.choice(TASKS)
        self.task = task.format(noun=noun) if task else None
        self.needle = rng.choice(NEEDLES).format(noun=noun, key=key)
        questions = QUESTIONS + CUE_QUESTIONS if cues else QUESTIONS
        question = HELD_OUT_QUESTION if held_out else rng.choice(questions)
        self.question = question.format(noun=noun)


def prompt(rng: random.Random, n_chars: int, depth: float | None, wording: Wording,
           family: str) -> str:
    """Task line (unless it would take over half of a short prompt), filler up to n_chars with
    the needle at a sentence boundary (`depth` in [0, 1], or uniform when None), the question."""
    head = [wording.task] if wording.task else []
    fixed = len(" ".join(head + [wording.needle, wording.question]))
    if 2 * fixed > n_chars:
        head, fixed = [], len(wording.needle) + len(wording.question) + 1
    filler = FAMILIES[family](rng, max(0, n_chars - fixed - 2))
    at = rng.randint(0, len(filler)) if depth is None else round(depth * len(filler))
    return " ".join(head + filler[:at] + [wording.needle] + filler[at:] + [wording.question])


def heldout_prompt(n_tokens: int, depth: float, key: str) -> str:
    """The held-out evaluation prompt: the held-out filler family and question wording, about
    n_tokens byte tokens (BOS included), seeded by the key so that it is reproducible."""
    rng = random.Random(int(key))
    return prompt(rng, n_tokens - 1, depth, Wording(rng, key, held_out=True), HELD_OUT_FILLER)
