"""The special cases of docs/fpa.md section 1, against independent direct implementations."""
import math

import torch
import torch.nn.functional as F

from reference import Config, Model

SMALL = dict(d_model=24, n_layers=2, n_heads=3, head_dim=8, d_ff=40)


def tokens(n=33, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 259, (2, n), generator=g)


def model(seed=0, field_bias=0.0, **over):
    return Model(Config(**{**SMALL, **over})).init_weights(seed, field_bias=field_bias).eval()


def copy_shared(dst: Model, src: Model):
    """dst gets every tensor of src that it has (the rest stays as is)."""
    state = dst.state_dict()
    state.update({k: v for k, v in src.state_dict().items() if k in state})
    dst.load_state_dict(state)
    return dst


def direct_fox(attn, x):
    """FoX attention written from the FoX paper: weights exp(q.k/sqrt(d)) * prod f_t."""
    b, t, _ = x.shape
    h, hd = attn.cfg.n_heads, attn.cfg.head_dim
    q = (x @ attn.wq.t()).view(b, t, h, hd)
    k = (x @ attn.wk.t()).view(b, t, h, hd)
    v = (x @ attn.wv.t()).view(b, t, h, hd)
    f = torch.sigmoid(x @ attn.field_w.t() + attn.field_b)  # forget gates [B, T, H]
    out = torch.zeros(b, t, h, hd, dtype=torch.float64)
    for i in range(t):
        logits = []
        for j in range(i + 1):
            decay = torch.prod(f[:, j + 1: i + 1].double(), dim=1)  # empty product = 1
            dot = (q[:, i] * k[:, j]).sum(-1).double() / math.sqrt(hd)
            logits.append(dot + torch.log(decay))
        w = torch.softmax(torch.stack(logits, -1), -1)  # [B, H, i+1]
        out[:, i] = torch.einsum("bhj,bjhd->bhd", w, v[:, : i + 1].double())
    return out.reshape(b, t, h * hd).float() @ attn.wo.t()


def test_fox_as_fpa_equals_direct_fox():
    m = model(1, attention="fox", levels="tied", field_bias=2.0)
    x = m.layers[0].attn_norm(m.embed(tokens(20)))
    with torch.no_grad():
        ours, theirs = m.layers[0].attn(x), direct_fox(m.layers[0].attn, x)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    # and the walk never rises, so the penalty is the summed -log f
    d, _ = m.layers[0].attn.walk(x)
    assert (d <= 0).all()


def test_beta_zero_equals_softmax():
    fpa = model(2, attention="fpa", levels="free")
    with torch.no_grad():
        for block in fpa.layers:
            block.attn.beta_raw.fill_(-200.0)  # softplus underflows to exactly 0
            block.attn.field_w.mul_(5.0)  # a wild walk that beta = 0 must ignore
    soft = copy_shared(Model(Config(**SMALL, attention="softmax", levels="tied")), fpa).eval()
    with torch.no_grad():
        assert fpa.layers[0].attn.beta().eq(0).all()
        assert torch.allclose(fpa(tokens()), soft(tokens()), atol=1e-5)


def test_tied_levels_are_free_levels_with_zero_offsets():
    free = model(3, attention="fpa", levels="free")
    with torch.no_grad():
        for block in free.layers:
            block.attn.level_w.zero_()
            block.attn.level_b.zero_()
    tied = copy_shared(Model(Config(**SMALL, attention="fpa", levels="tied")), free).eval()
    with torch.no_grad():
        assert torch.allclose(free(tokens()), tied(tokens()), atol=1e-5)
        for block in free.layers:  # non-zero offsets do change the result
            block.attn.level_b.fill_(3.0)
        assert not torch.allclose(free(tokens()), tied(tokens()), atol=1e-3)


def test_penalty_is_first_passage_depth():
    """pen(i, j) from the parallel forward equals the definition, by brute force."""
    m = model(4, attention="fpa", levels="free")
    x = m.layers[0].attn_norm(m.embed(tokens(17)))
    attn = m.layers[0].attn
    with torch.no_grad():
        exc, beta = attn.excess(x)
        d, u = attn.walk(x)
    phi = torch.cumsum(d.double(), 1)
    lvl = phi + u.double()
    for i in range(17):
        for j in range(i + 1):
            seg = phi[:, j + 1: i + 1]
            m_j = seg.min(1).values if i > j else torch.full_like(phi[:, 0], math.inf)
            want = beta.double() * F.relu(lvl[:, j] - m_j)
            got = beta * F.relu(exc[:, :, i, j])
            assert torch.allclose(got.double(), want, atol=1e-4)
