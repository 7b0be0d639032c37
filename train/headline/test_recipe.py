"""The second-generation recipe in seconds: a stopped and resumed run equals an uninterrupted one,
the held-out filler and question never reach a training row, the varied episodes weight the
right tokens, and the cache-budget term is differentiable and lowers the share of live keys.

    /usr/bin/python3 -m pytest -q train/headline/test_recipe.py
"""
import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import budget  # noqa: E402
import fast  # noqa: E402
import texts  # noqa: E402
import train_passkey  # noqa: E402
from dense_data import DenseBatches, episode  # noqa: E402
from reference import Config, Model, decode, encode  # noqa: E402

TINY_RUN = ["--kind", "fpa", "--steps", "4", "--varied", "--budget-weight", "1", "--gate", "0",
            "--lengths", "128", "128", "--tokens-per-step", "256", "--eval-every", "0",
            "--ckpt-every", "1", "--penalty-warmup", "3", "--threads", "1"]
HELD_OUT_MARKS = ("the weather in", texts.HELD_OUT_QUESTION.split("{noun}")[1])


def test_stopped_and_resumed_run_equals_uninterrupted(tmp_path):
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    train_passkey.main(TINY_RUN + ["--run-dir", whole])
    train_passkey.main(TINY_RUN + ["--run-dir", parts, "--stop-after", "2"])
    assert torch.load(os.path.join(parts, "ckpt.pt"))["step"] == 2
    train_passkey.main(["--resume", parts])
    a, b = (torch.load(os.path.join(d, "ckpt.pt")) for d in (whole, parts))
    assert a["step"] == b["step"] == 4
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert a["data_rng"] == b["data_rng"] and a["gate_acc"] == b["gate_acc"]
    assert b["training"]["command"] == a["training"]["command"].replace(whole, parts) + \
        " --stop-after 2"  # the command that started the run, not the resume


@pytest.mark.parametrize("varied", [1, 2])
def test_held_out_filler_and_question_never_in_training(varied):
    data = DenseBatches(3, varied=varied)
    rows = [decode(data.batch(512, 1)[0][0]) for _ in range(300)]
    assert not [r for r in rows if any(m in r for m in HELD_OUT_MARKS)]
    questions = texts.QUESTIONS + (texts.CUE_QUESTIONS if varied == 2 else [])
    for question in questions:  # and the variety is real: every training wording occurs
        assert any(question.split("{noun}")[-1] in r for r in rows), question
    for sentence in ("The river is wide.", "The grass is green.", "Covered Software"):
        assert any(sentence in r for r in rows), sentence
    for n in (512, 4096):
        p = texts.heldout_prompt(n, 0.5, "12345")
        assert all(m in p for m in HELD_OUT_MARKS) and "12345" in p
        assert 0.9 * n <= len(encode(p)) <= n


def test_varied_episodes_weight_answer_and_copies():
    rng = random.Random(1)
    for _ in range(200):
        tokens, weights = episode(rng, 256, 8.0, 2.0, varied=True)
        assert len(tokens) <= 256
        text = decode(tokens)
        key = text[-6:-1]
        answer = [tokens[p] for p, w in sorted(weights.items()) if w == 8.0]
        copies = [tokens[p] for p, w in sorted(weights.items()) if w == 2.0]
        assert decode(answer) == key
        assert decode(copies) == key * (text.count(key) - 2)  # not the first mention nor answer


def toy(kind: str) -> Model:
    cfg = Config(d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64, attention=kind,
                 levels="free" if kind == "fpa" else "tied")
    return Model(cfg).init_weights(5, walk_std=0.1, field_bias=3.0 if kind == "fox" else 0.0)


def test_soft_live_share_tends_to_the_cache_share():
    model, x = toy("fpa"), torch.randint(0, 256, (2, 64))
    with torch.no_grad():
        model.layers[0].attn.field_b.fill_(-0.5)  # a falling walk: some keys evicted, not all
        excesses = []
        fast.forward(model, x, excesses=excesses)
    exc, beta = excesses[0]
    hard = budget.hard_live(exc, beta, 5.0)
    assert 0.05 < hard.min() and hard.max() < 0.95
    torch.testing.assert_close(budget.soft_live(exc, beta, 5.0, 1e-4), hard, atol=0.02, rtol=0)


@pytest.mark.parametrize("kind", ["fpa", "fox"])
def test_budget_term_is_differentiable_and_lowers_the_live_share(kind):
    model, x = toy(kind), torch.randint(0, 256, (2, 96))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    shares = []
    for _ in range(30):
        excesses = []
        fast.forward(model, x, excesses=excesses)
        loss, _ = budget.budget_loss(excesses, 20.0, 4.0, 0.2)
        shares.append(torch.cat([budget.hard_live(e.detach(), b, 20.0) for e, b in excesses]))
        opt.zero_grad()
        loss.backward()
        if len(shares) == 1:  # the walk gets a gradient where every key is still live
            assert model.layers[0].attn.field_w.grad.abs().min() > 0
        opt.step()
    assert shares[0].min() == 1.0  # every head kept every key: the case the term must fix
    assert shares[-1].max() < 0.5


def test_softmax_has_no_budget_term():
    excesses = []
    fast.forward(toy("softmax"), torch.randint(0, 256, (1, 16)), excesses=excesses)
    loss, shares = budget.budget_loss(excesses, 20.0, 4.0, 0.2)
    assert excesses == [] and loss.item() == 0.0 and shares.numel() == 0


def test_gate_holds_the_budget_until_answers_are_right():
    gate = budget.Gate(weight=2.0, lo=0.9, decay=0.5)
    assert gate.update(0.5) == 0.0
    weights = [gate.update(1.0) for _ in range(10)]
    assert weights[-1] > 1.9 and weights == sorted(weights)
    assert gate.update(0.0) == 0.0  # a miss closes it again


def test_summed_budget_gives_each_head_the_whole_push(monkeypatch):
    shares = torch.tensor([1.0, 0.1, 0.1, 0.1])  # one head keeps every key, three are in budget
    monkeypatch.setattr(budget, "soft_live", lambda exc, beta, tau, temp: shares)
    mean, _ = budget.budget_loss([(None, None)], 20.0, 4.0, 0.15)
    total, _ = budget.budget_loss([(None, None)], 20.0, 4.0, 0.15, reduce="sum")
    assert total.item() == pytest.approx(0.85) and mean.item() == pytest.approx(0.85 / 4)
