"""The fast forward equals the reference forward (with and without eviction; a zero penalty
scale is a flat walk), and the dense curriculum keeps the benchmark's wording and weights the
right tokens.

    /usr/bin/python3 -m pytest -q train/headline/test_fast.py
"""
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fast  # noqa: E402
from data import QUESTION, needle  # noqa: E402
from dense_data import episode  # noqa: E402
from reference import Config, Model, decode  # noqa: E402


def test_fast_forward_equals_reference():
    cfg = Config(d_model=32, n_layers=2, n_heads=2, head_dim=16, d_ff=64)
    model = Model(cfg).init_weights(3, walk_std=1.0, beta_raw=0.5)
    x = torch.randint(0, 256, (2, 97))
    for tau in (None, 2.0):
        ref_stats, fast_stats = [], []
        ref = model(x, tau=tau, stats=ref_stats)
        got = fast.forward(model, x, tau=tau, stats=fast_stats)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
        assert fast_stats == ref_stats
    assert min(ref_stats) < 1.0  # tau = 2 evicted something: the mask was exercised


def test_fast_forward_gradients_equal_reference():
    cfg = Config(d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64)
    model = Model(cfg).init_weights(4, walk_std=1.0, beta_raw=0.5)
    x = torch.randint(0, 256, (1, 40))
    grads = []
    for f in (model, lambda t: fast.forward(model, t)):
        model.zero_grad()
        f(x).logsumexp(-1).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


def test_penalty_scale_zero_is_a_flat_walk():
    cfg = Config(d_model=32, n_layers=2, n_heads=2, head_dim=16, d_ff=64)
    model = Model(cfg).init_weights(3, walk_std=1.0, beta_raw=0.5)
    x = torch.randint(0, 256, (2, 50))
    scaled, walked = fast.forward(model, x, penalty_scale=0.0), fast.forward(model, x)
    assert not torch.allclose(scaled, walked)  # the walk matters at scale 1
    with torch.no_grad():
        for layer in model.layers:
            for name in ("field_w", "field_b", "level_w", "level_b"):
                getattr(layer.attn, name).zero_()
    torch.testing.assert_close(scaled, fast.forward(model, x), rtol=0, atol=1e-6)


def test_episode_wording_and_weights():
    rng = random.Random(0)
    for n in (128, 256, 512):
        tokens, weights = episode(rng, n, 8.0, 2.0)
        assert len(tokens) <= n
        text = decode(tokens)
        key = text[-6:-1]
        assert needle(key) in text and text.endswith(f"{QUESTION} {key}.")
        answer = [tokens[p] for p, w in sorted(weights.items()) if w == 8.0]
        copy = [tokens[p] for p, w in sorted(weights.items()) if w == 2.0]
        assert decode(answer) == key and decode(copy) == key
