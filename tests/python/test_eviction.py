"""Decoding with eviction at tau (docs/fpa.md section 2, docs/model-format.md conventions)."""
import math

import pytest
import torch

from reference import Config, Model, decode_steps

CFG = dict(d_model=24, n_layers=2, n_heads=3, head_dim=8, d_ff=40)
T = 40


def walk_model(levels="free", seed=5):
    m = Model(Config(**CFG, attention="fpa", levels=levels)).init_weights(seed)
    with torch.no_grad():
        for block in m.layers:
            block.attn.beta_raw.copy_(torch.tensor([-0.5, 0.5, 1.5]))
            block.attn.field_b.copy_(torch.tensor([-0.4, 0.0, 0.3]))
    return m.eval()


def prompt(seed=0):
    return torch.randint(0, 256, (T,), generator=torch.Generator().manual_seed(seed))


def parallel_excess(m, toks, tau):
    """Per layer: excess [H, i, j] and beta [H] from the parallel forward evicting at tau (a
    layer's input depends on the evictions below it)."""
    out = []
    with torch.no_grad():
        h = m.embed(toks[None])
        for block in m.layers:
            exc, beta = block.attn.excess(block.attn_norm(h))
            out.append((exc[0], beta))
            h = block(h, tau)
    return out


@pytest.mark.parametrize("levels", ["free", "tied"])
def test_live_sets_are_exact(levels):
    m, toks, tau = walk_model(levels), prompt(), 3.0
    res = decode_steps(m, toks, tau)
    live = res["live"]  # [T, L, H, T]
    assert 0.2 < 1 - live[-1].float().mean() < 0.9, "the walk must evict a real share of keys"
    for li, (exc, beta) in enumerate(parallel_excess(m, toks, tau)):
        thr = (tau / beta)[:, None, None]
        # dead iff at some step t in (j, i] the walk was tau/beta below the key's level
        should_die = torch.cummax((exc >= thr - 1e-4).int(), dim=1).values.bool()  # [H, i, j]
        sure_die = torch.cummax((exc >= thr + 1e-4).int(), dim=1).values.bool()
        got_live = live[:, li].permute(1, 0, 2)  # [H, i, j]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        assert not (got_live & sure_die & causal).any(), "a live key that should be dead"
        evicted = ~got_live & causal
        assert not (evicted & ~should_die).any(), "an evicted key whose penalty is below tau"
        pen = beta[:, None, None] * torch.relu(exc)
        assert (pen[evicted] >= tau * (1 - 1e-4)).all()
        # dead stays dead
        assert not (got_live[:, 1:] & ~got_live[:, :-1] & causal[:-1]).any()


def test_margin_matches_live():
    m, toks, tau = walk_model(), prompt(1), 3.0
    res = decode_steps(m, toks, tau)
    margin, live = res["margin"], res["live"]
    # key j dies at the first step i > j with margin >= 0 (its own step does not count)
    after = torch.ones(T, T, dtype=torch.bool).tril(-1)[:, None, None, :]
    dead_by = torch.cummax((margin >= 0).int() * after, dim=0).values.bool()
    causal = torch.ones(T, T, dtype=torch.bool).tril()[:, None, None, :]
    assert torch.equal(live & causal, ~dead_by & causal)


def test_full_cache_decode_matches_parallel_forward():
    m, toks = walk_model(), prompt(2)
    res = decode_steps(m, toks, None)
    with torch.no_grad():
        logits, layers = m(toks[None], return_layers=True)
    assert torch.allclose(res["logits"], logits[0], atol=1e-4)
    for got, want in zip(res["layer_out"], layers):
        assert torch.allclose(got, want[0], atol=1e-4)
    assert res["live"][-1].all()


def test_evicting_decode_matches_masked_parallel_forward():
    m, toks, tau = walk_model(), prompt(3), 3.0
    res = decode_steps(m, toks, tau)
    with torch.no_grad():
        assert torch.allclose(res["logits"], m(toks[None], tau=tau)[0], atol=1e-4)


@pytest.mark.parametrize("tau", [4.0, 8.0, 12.0, 16.0])
def test_eviction_error_is_exp_minus_tau_sized(tau):
    """One attention layer: dropping keys with penalty >= tau moves the output by at most
    2 max|v| * L * exp(2U - tau), U bounding the scaled dot products (docs/fpa.md section 2)."""
    m = walk_model()
    attn = m.layers[0].attn
    x = m.layers[0].attn_norm(m.embed(prompt(4)[None]))
    with torch.no_grad():
        full, evict = attn(x), attn(x, tau)
        q, k, v = attn.qkv(x, torch.arange(T))
        u = (q.norm(dim=-1).max() * k.norm(dim=-1).max() / math.sqrt(CFG["head_dim"])).item()
        v_out = (v.abs().max() * attn.wo.abs().sum(1).max()).item()
    bound = 2 * v_out * T * math.exp(2 * u - tau)
    err = (full - evict).abs().max().item()
    assert err <= bound
    # and the end-to-end error shrinks like exp(-tau)
    with torch.no_grad():
        e2e = (m(prompt(4)[None]) - m(prompt(4)[None], tau=tau)).abs().max().item()
    assert e2e <= 1e3 * math.exp(-tau)


def test_no_eviction_without_beta():
    m = Model(Config(**CFG, attention="softmax", levels="tied", rope_theta=10000.0))
    m = m.init_weights(0).eval()
    res = decode_steps(m, prompt(), 0.5)
    assert res["live"][-1].all()
    assert torch.isneginf(res["margin"][-1]).all()


def test_blocked_queries_equal_all_at_once():
    m, toks = walk_model(), prompt(5)[None]
    with torch.no_grad():
        for tau in (None, 3.0):
            s1, s2 = [], []
            a, b = m(toks, tau=tau, stats=s1), m(toks, tau=tau, stats=s2, block=7)
            assert torch.allclose(a, b, atol=1e-5) and s1 == s2
