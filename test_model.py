import math

import pytest
import torch

from kvgpt.device import device_peak_flops
from model import GPT, GPTConfig, CausalSelfAttention

GPT2 = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, bias=False)
PAPER_VARIANTS = [  # (overrides, total params, attention scale) from the paper's table
    (dict(), 124_373_760, 1 / 8),
    (dict(query='identity'), 117_295_872, 1 / 16),
    (dict(query='identity', mlp_hidden=3456), 124_373_760, 1 / 16),
    (dict(mlp_hidden=2688), 117_295_872, 1 / 8),
    (dict(n_embd=744, mlp_hidden=2976), 117_915_816, 1 / math.sqrt(62)),
]
IDENTITIES = ['query', 'key_identity', 'value_identity']  # which of W_Q, W_K, W_V is the identity


def identity_kw(identity):
    """The setting that makes one of W_Q, W_K, W_V the identity (None: none)."""
    if identity is None:
        return {}
    return dict(query='identity') if identity == 'query' else {identity: True}


def attention_params(model):
    return sum(p.numel() for name, p in model.named_parameters() if '.attn.' in name)


def tiny(**kw):
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=64)
    cfg.update(kw)
    torch.manual_seed(0)
    return GPT(GPTConfig(**cfg), verbose=False)


@pytest.mark.parametrize('overrides,params,scale', PAPER_VARIANTS)
def test_paper_variant_counts_and_scales(overrides, params, scale):
    with torch.device('meta'):  # counts need no memory
        model = GPT(GPTConfig(**{**GPT2, **overrides}), verbose=False)
    assert model.get_num_params() == params
    assert model.config.scale == pytest.approx(scale, rel=1e-12)


@pytest.mark.parametrize('n_embd,n_head', [(768, 12), (128, 2), (256, 4), (189, 7)])
def test_derived_values_follow_the_final_geometry(n_embd, n_head):
    """Left None, the MLP width, query rank, K/V heads, init std and softmax scale are derived
    from the final n_embd and n_head: the widths config files used to write out, at any size."""
    cfg = lambda **kw: GPTConfig(n_embd=n_embd, n_head=n_head, **kw)
    hd = n_embd // n_head
    assert cfg(mlp_ratio=4.5).mlp_hidden == 4 * n_embd + n_embd // 2  # config/reduced_mlp.py's
    assert cfg(mlp_ratio=3.5).mlp_hidden == 4 * n_embd - n_embd // 2  # baseline_small_mlp.py's
    assert cfg().mlp_hidden == 4 * n_embd and cfg().n_kv_head == n_head
    assert (cfg().query_rank, cfg(query_ratio=1 / 8).query_rank) == (n_embd // 2, n_embd // 8)
    assert cfg().init_std == 0.02
    assert cfg(init_width=768).init_std == 0.02 * (768 / n_embd) ** 0.5  # config/gpt2_init.py's
    assert cfg(query='identity').scale == 1 / (2 * hd ** 0.5)
    assert cfg(query='nonlinear', attn_scale_factor=0.5).scale == 1 / (2 * hd ** 0.5)
    assert cfg(query='identity', attn_scale_factor=1.0).scale == hd ** -0.5
    assert cfg(attn_scale_factor=0.5).scale == 0.5 * hd ** -0.5


def test_a_value_given_wins_over_its_rule_and_survives_a_reload():
    """model_args hold the derived values: a config rebuilt from them is the same config."""
    from dataclasses import asdict
    cfg = GPTConfig(mlp_ratio=4.5, init_width=768, n_embd=128, n_head=2, attn_scale=0.3,
                    attn_scale_factor=1.0, query_rank=8, query_ratio=0.25)
    assert (cfg.mlp_hidden, cfg.init_std, cfg.scale, cfg.query_rank) == (
        576, 0.02 * 6 ** 0.5, 0.3, 8)
    assert GPTConfig.from_dict(asdict(cfg)) == cfg
    assert GPTConfig(init_std=0.049, init_width=768).init_std == 0.049


def test_reduced_saves_n_layer_n_embd_squared_and_a_quarter_of_attention():
    with torch.device('meta'):
        base = GPT(GPTConfig(**GPT2), verbose=False)
        red = GPT(GPTConfig(**GPT2, query='identity'), verbose=False)
        red_b = GPT(GPTConfig(**{**GPT2, 'bias': True}, query='identity'), verbose=False)
        base_b = GPT(GPTConfig(**{**GPT2, 'bias': True}), verbose=False)
    assert base.get_num_params() - red.get_num_params() == 12 * 768 ** 2
    assert base_b.get_num_params() - red_b.get_num_params() == 12 * (768 ** 2 + 768)
    a, b = attention_params(base), attention_params(red)
    assert b / a == 0.75


def test_construction_prints_parameter_count(capsys):
    with torch.device('meta'):
        GPT(GPTConfig(**GPT2, query='identity'))
    assert 'number of parameters: 117.30M' in capsys.readouterr().out


def reference_attention(attn, x, cfg, scale):
    """Plain-torch causal attention written from the paper's formula, independent of the module."""
    B, T, C = x.shape
    hd, nh, nkv = C // cfg.n_head, cfg.n_head, cfg.n_kv_head
    W = attn.c_attn.weight.T  # row-vector convention: x @ W
    dims = [0 if cfg.query == 'identity' else C, 0 if cfg.key_identity else nkv * hd,
            0 if cfg.value_identity else nkv * hd]
    Wq, Wk, Wv = W.split(dims, dim=1)
    q = x if cfg.query == 'identity' else x @ Wq
    k = x if cfg.key_identity else x @ Wk
    v = x if cfg.value_identity else x @ Wv
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    out = []
    for h in range(nh):
        g = h // (nh // nkv)  # the kv head this query head reads
        qh = q[..., h * hd:(h + 1) * hd]
        kh, vh = k[..., g * hd:(g + 1) * hd], v[..., g * hd:(g + 1) * hd]
        s = scale * qh @ kh.transpose(-1, -2)
        out.append(torch.softmax(s.masked_fill(~causal, float('-inf')), dim=-1) @ vh)
    return torch.cat(out, dim=-1) @ attn.c_proj.weight.T


HEADS = [(1, 1), (4, 4), (8, 8), (4, 2), (8, 1)]  # (n_head, n_kv_head)
# K or V as the identity needs n_kv_head == n_head (test_bad_configs_fail_clearly covers the rest)
ATTENTION_CASES = [(i, h, kv) for i in [None] + IDENTITIES for h, kv in HEADS
                   if kv == h or i not in ('key_identity', 'value_identity')]


@pytest.mark.parametrize('identity,n_head,n_kv_head', ATTENTION_CASES)
def test_attention_matches_independent_computation(identity, n_head, n_kv_head):
    cfg = GPTConfig(n_embd=32, n_head=n_head, n_kv_head=n_kv_head, **identity_kw(identity))
    torch.manual_seed(1)
    attn = CausalSelfAttention(cfg).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    expected = reference_attention(attn, x, cfg, cfg.scale)
    torch.testing.assert_close(attn(x), expected, rtol=1e-10, atol=1e-12)
    if identity == 'query':
        assert attn.c_attn.weight.shape == (2 * n_kv_head * (32 // n_head), 32)


def test_explicit_scale_is_honoured():
    cfg = GPTConfig(n_embd=32, n_head=4, query='identity', attn_scale=0.37)
    torch.manual_seed(2)
    attn = CausalSelfAttention(cfg).double()
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    torch.testing.assert_close(attn(x), reference_attention(attn, x, cfg, 0.37))
    assert not torch.allclose(attn(x), reference_attention(attn, x, cfg, cfg.head_dim ** -0.5 / 2))


def plain_attention(X, Wq, Wk, Wv, n_head, scale):
    T, C = X.shape[-2:]
    hd = C // n_head
    q, k, v = X @ Wq, X @ Wk, X @ Wv
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for h in range(n_head):
        s = slice(h * hd, (h + 1) * hd)
        logits = scale * q[..., s] @ k[..., s].transpose(-1, -2)
        a = torch.softmax(logits.masked_fill(~causal, float('-inf')), -1)
        heads.append(a @ v[..., s])
    return torch.cat(heads, -1)


def test_reparametrization_lemma():
    """attention(X Theta; Theta^-1 W_Q, Theta^-1 W_K, Theta^-1 W_V) == attention(X; W_Q, W_K, W_V),
    and Theta = W_Q turns the query weight into the identity, so the reduced module computes it."""
    torch.manual_seed(3)
    C, nh = 24, 3
    X = torch.randn(2, 9, C, dtype=torch.float64)
    Wq, Wk, Wv = (torch.randn(C, C, dtype=torch.float64) / C ** 0.5 for _ in range(3))
    Theta = torch.randn(C, C, dtype=torch.float64) / C ** 0.5 + torch.eye(C, dtype=torch.float64)
    Ti = torch.linalg.inv(Theta)
    ref = plain_attention(X, Wq, Wk, Wv, nh, 0.3)
    torch.testing.assert_close(plain_attention(X @ Theta, Ti @ Wq, Ti @ Wk, Ti @ Wv, nh, 0.3), ref,
                               rtol=1e-9, atol=1e-10)
    Qi = torch.linalg.inv(Wq)
    torch.testing.assert_close(Qi @ Wq, torch.eye(C, dtype=torch.float64), rtol=0, atol=1e-10)
    # the reduced module, given X W_Q and the folded K/V weights, reproduces the full attention
    cfg = GPTConfig(n_embd=C, n_head=nh, query='identity', attn_scale=0.3)
    attn = CausalSelfAttention(cfg).double()
    with torch.no_grad():
        attn.c_attn.weight.copy_(torch.cat([Qi @ Wk, Qi @ Wv], dim=1).T)
        attn.c_proj.weight.copy_(torch.eye(C))
    torch.testing.assert_close(attn(X @ Wq), ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('identity', [None] + IDENTITIES)
def test_causality(identity):
    model = tiny(**identity_kw(identity)).eval()
    idx = torch.randint(0, 64, (1, 12))
    logits, _ = model(idx, targets=idx)
    changed = idx.clone()
    changed[0, 8] = (changed[0, 8] + 1) % 64
    logits2, _ = model(changed, targets=changed)
    torch.testing.assert_close(logits[:, :8], logits2[:, :8], rtol=0, atol=0)
    assert not torch.allclose(logits[:, 8:], logits2[:, 8:])


def test_tied_weights_share_storage_and_untied_do_not():
    tied, untied = tiny(), tiny(tie_weights=False)
    assert tied.lm_head.weight.data_ptr() == tied.transformer.wte.weight.data_ptr()
    assert untied.lm_head.weight.data_ptr() != untied.transformer.wte.weight.data_ptr()
    assert untied.get_num_params() - tied.get_num_params() == 64 * 32


def test_theory_settings_parameter_counts():
    base = tiny()
    shared = tiny(share_layers=True)
    per_block = sum(p.numel() for p in base.transformer.h[0].parameters())
    # 2 layers, one block stored
    assert base.get_num_params() - shared.get_num_params() == per_block
    # ln_1, ln_2 x2, ln_f
    assert tiny(norm=False).get_num_params() == base.get_num_params() - 5 * 32
    assert tiny(mlp_residual=False).get_num_params() == base.get_num_params()


@pytest.mark.parametrize('kw,steps', [
    (dict(), 80), (dict(query='identity'), 80), (dict(key_identity=True), 80),
    (dict(value_identity=True), 80),
    (dict(query='identity', n_kv_head=2), 80), (dict(query='identity', share_layers=True), 80),
    (dict(query='identity', norm=False), 80),
    # without the MLP skip connection the MLP output replaces the stream: slower to fit
    (dict(query='identity', norm=False, mlp_residual=False), 200)])
def test_tiny_model_overfits_one_batch(kw, steps):
    model = tiny(**kw)
    torch.manual_seed(4)
    x = torch.randint(0, 64, (4, 16))
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(steps):
        _, loss = model(x, y)
        first = first or loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 3.5 and loss.item() < 0.3, (first, loss.item())


@pytest.mark.parametrize('kw,message', [
    (dict(query='identity', key_identity=True), 'at most one of'),
    (dict(key_identity=True, value_identity=True, query='identity'), 'at most one of'),
    (dict(n_head=4, n_kv_head=3), 'multiple of n_kv_head'),
    (dict(n_head=4, n_kv_head=2, key_identity=True), 'n_kv_head == n_head'),
    (dict(n_head=4, n_kv_head=2, value_identity=True), 'n_kv_head == n_head'),
    (dict(n_embd=30, n_head=4), 'divisible by n_head'),
    (dict(attn_scale=-1.0), 'attn_scale must be positive'),
    (dict(mlp_hidden=0), 'mlp_hidden must be positive'),
    (dict(mlp_ratio=-4.0), 'mlp_hidden must be positive'),
    (dict(init_width=0), 'init_width must be positive'),
    (dict(attn_scale_factor=0.0), 'attn_scale_factor must be positive'),
])
def test_bad_configs_fail_clearly(kw, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**kw)


def test_sequence_longer_than_block_size_is_an_error():
    with pytest.raises(ValueError, match='longer than block_size'):
        tiny()(torch.zeros(1, 17, dtype=torch.long))


def test_flops_follow_the_model_and_cpu_has_no_peak():
    base, red = tiny(), tiny(query='identity')
    assert base.flops_per_token(16) - red.flops_per_token(16) == 6 * 2 * 32 * 32
    shared = tiny(share_layers=True)
    # a shared block still runs n_layer times
    assert shared.flops_per_token(16) == base.flops_per_token(16)
    if not torch.cuda.is_available():
        assert device_peak_flops() is None
        assert base.estimate_mfu(1000, 0.1, device_peak_flops()) is None


def test_optimizer_decays_matrices_only():
    model = tiny(bias=True)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    decay, no_decay = opt.param_groups
    assert decay['weight_decay'] == 0.1 and no_decay['weight_decay'] == 0.0
    assert all(p.dim() >= 2 for p in decay['params'])
    assert all(p.dim() < 2 for p in no_decay['params'])
    assert sum(p.numel() for g in opt.param_groups for p in g['params']) == model.get_num_params()


# -----------------------------------------------------------------------------
# the query family: linear, identity, residual, residual_gelu (authors' code), nonlinear
# (the follow-up's)

def reference_query(attn, x, cfg):
    """Each mode's query from its formula in plain torch (float64), independent of the module."""
    C = x.size(-1)
    W = attn.c_attn.weight.T
    xq = x @ W[:, :C] if cfg.query in ('linear', 'residual', 'residual_gelu') else None
    gelu = lambda z: 0.5 * z * (1 + torch.erf(z / math.sqrt(2)))
    formulas = dict(linear=lambda: xq, identity=lambda: x, residual=lambda: x + xq,
                    residual_gelu=lambda: x + gelu(xq))
    if cfg.query in formulas:
        return formulas[cfg.query]()
    m = attn.q_mlp
    eps = torch.finfo(x.dtype).eps
    rms = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * m.norm.weight
    z = gelu(rms @ m.fc.weight.T) @ m.proj.weight.T
    ln = ((z - z.mean(-1, keepdim=True))
          / torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + 1e-5) * m.ln.weight)
    return cfg.query_mix * (x + ln)


def reference_attention_with_query(attn, x, cfg):
    B, T, C = x.shape
    hd, nh, nkv = C // cfg.n_head, cfg.n_head, cfg.n_kv_head
    W = attn.c_attn.weight.T
    q_dim = C if cfg.query in ('linear', 'residual', 'residual_gelu') else 0
    k, v = W[:, q_dim:].split([nkv * hd, nkv * hd], dim=1)
    q, k, v = reference_query(attn, x, cfg), x @ k, x @ v
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    out = []
    for h in range(nh):
        g = h // (nh // nkv)
        s = cfg.scale * q[..., h * hd:(h + 1) * hd] @ k[..., g * hd:(g + 1) * hd].transpose(-1, -2)
        p = torch.softmax(s.masked_fill(~causal, float('-inf')), dim=-1)
        out.append(p @ v[..., g * hd:(g + 1) * hd])
    return torch.cat(out, dim=-1) @ attn.c_proj.weight.T


QUERY_CASES = [(q, kv, {}) for q in ('linear', 'identity', 'residual', 'residual_gelu',
                                    'nonlinear') for kv in (4, 2)]
QUERY_CASES += [('nonlinear', kv, dict(query_mix=1.0)) for kv in (4, 2)]
QUERY_CASES += [('nonlinear', 4, dict(query_rank=8))]


@pytest.mark.parametrize('query,n_kv_head,extra', QUERY_CASES)
def test_query_modes_match_their_formulas(query, n_kv_head, extra):
    cfg = GPTConfig(n_embd=32, n_head=4, n_kv_head=n_kv_head, query=query, **extra)
    torch.manual_seed(5)
    attn = CausalSelfAttention(cfg).double()
    with torch.no_grad():  # non-trivial norm weights, so that a missing weight would show
        for p in attn.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    torch.testing.assert_close(attn(x), reference_attention_with_query(attn, x, cfg),
                               rtol=1e-10, atol=1e-12)


def test_query_parameter_counts_and_flops():
    with torch.device('meta'):
        counts = {q: GPT(GPTConfig(**GPT2, query=q), verbose=False) for q in
                  ('linear', 'identity', 'residual', 'residual_gelu', 'nonlinear')}
    assert {q: m.get_num_params() for q, m in counts.items()} == dict(
        linear=124_373_760, identity=117_295_872, residual=124_373_760, residual_gelu=124_373_760,
        # W1 + W2 = d^2 at r = d/2, plus RMSNorm and LN weights
        nonlinear=124_373_760 + 12 * 2 * 768)
    base = counts['linear'].flops_per_token()
    assert counts['nonlinear'].flops_per_token() == base == counts['residual'].flops_per_token()
    assert base - counts['identity'].flops_per_token() == 6 * 12 * 768 ** 2
    attention = {q: attention_params(m) for q, m in counts.items()}
    assert attention['nonlinear'] == attention['linear'] + 12 * 1536


def test_query_is_the_one_setting_and_the_old_shorthand_is_still_read():
    assert 'query_identity' not in GPTConfig().__dict__ and GPTConfig().query == 'linear'
    assert GPTConfig.from_dict(dict(query_identity=True)).query == 'identity'
    assert GPTConfig.from_dict(dict(query_identity=False)).query == 'linear'
    flagged = GPTConfig.from_dict(dict(query_identity=True))
    assert GPTConfig(query='identity').scale == flagged.scale == 1 / 16
    with pytest.raises(ValueError, match="query_identity=True contradicts query='residual'"):
        GPTConfig.from_dict(dict(query='residual', query_identity=True))


def test_checkpoint_saved_with_query_identity_loads_with_identical_logits():
    old = tiny(query='identity').eval()
    args = {k: v for k, v in old.config.__dict__.items()
            if k not in ('query', 'query_rank', 'query_mix', 'init_std')}
    args['query_identity'] = True
    ckpt = dict(model=old.state_dict(), model_args=args)  # what the first release wrote
    new = GPT.from_checkpoint(ckpt, verbose=False).eval()
    assert new.config.query == 'identity'
    idx = torch.randint(0, 64, (2, 16))
    assert torch.equal(old(idx, idx)[0], new(idx, idx)[0])
    again = GPT.from_checkpoint(dict(model=new.state_dict(), model_args=new.config.__dict__),
                                verbose=False)
    assert again.config == new.config


@pytest.mark.parametrize('kw', [dict(activation='relu'), dict(query='nonlinear'),
                                dict(query='residual_gelu')])
def test_new_modes_overfit_one_batch(kw):
    test_tiny_model_overfits_one_batch(kw, 80)


def test_relu_is_relu():
    mlp = tiny(activation='relu').transformer.h[0].mlp
    x = torch.randn(3, 32)
    torch.testing.assert_close(mlp(x), mlp.c_proj(torch.clamp(mlp.c_fc(x), min=0)))


@pytest.mark.parametrize('kw,message', [
    (dict(query='bogus'), 'query must be one of'),
    (dict(query='nonlinear', key_identity=True), 'at most one of'),
    (dict(query='nonlinear', query_rank=0), 'query_rank must be positive'),
    (dict(query='nonlinear', query_mix=0.0), 'query_mix must be positive'),
    (dict(activation='swish'), 'activation must be one of'),
])
def test_bad_query_configs_fail_clearly(kw, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**kw)


def test_query_identity_flag_is_the_papers_spelling_of_the_reduced_model():
    with torch.device('meta'):
        model = GPT(GPTConfig(**GPT2, query_identity=True), verbose=False)
        assert model.get_num_params() == 117_295_872
    small = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=64)
    torch.manual_seed(0)
    flagged = GPT(GPTConfig(**small, query_identity=True), verbose=False)
    torch.manual_seed(0)
    reduced = GPT(GPTConfig(**small, query='identity'), verbose=False)
    assert flagged.config == reduced.config
    assert all(torch.equal(a, b) for a, b in zip(flagged.state_dict().values(),
                                                 reduced.state_dict().values()))
    # never saved into a checkpoint's model_args
    assert 'query_identity' not in vars(flagged.config)
    with pytest.raises(ValueError, match="query_identity=True contradicts query='nonlinear'"):
        GPTConfig(query='nonlinear', query_identity=True)


def test_a_learned_scale_starts_at_the_fixed_one_and_learns_per_head():
    """learn_scale: each head's softmax scale is exp(theta_h), theta_h from ln(scale); at the start
    the model computes what the fixed scale does, and the scale gets a gradient, no decay."""
    fixed = tiny(query='identity').double()
    learned = tiny(query='identity', learn_scale=True).double()
    assert learned.get_num_params() - fixed.get_num_params() == 2 * 4  # n_layer x n_head
    attn = learned.transformer.h[0].attn
    assert torch.allclose(attn.log_scale.exp(), torch.full((4,), fixed.config.scale,
                                                           dtype=torch.float64))
    learned.load_state_dict({**fixed.state_dict(), **{k: v for k, v in learned.state_dict()
                                                     .items() if k.endswith('log_scale')}})
    idx = torch.randint(0, 64, (2, 16))
    a, loss = learned(idx, idx)
    torch.testing.assert_close(a, fixed(idx, idx)[0], rtol=1e-10, atol=1e-10)
    loss.backward()
    assert attn.log_scale.grad is not None and attn.log_scale.grad.abs().sum() > 0
    decayed = learned.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu').param_groups[0]
    assert all(p is not attn.log_scale for p in decayed['params'])
    with torch.no_grad():  # heads apart: the cached path computes the same function
        attn.log_scale.copy_(torch.tensor([-3.0, -2.0, -1.5, -2.5]))
        learned.eval()
        full = learned(idx, idx)[0]
        steps = torch.cat([learned.generate(idx[:, :8], 8, temperature=0.0)[:, 8:]])
    assert torch.equal(steps, learned.generate(idx[:, :8], 8, temperature=0.0, use_cache=False)
                       [:, 8:]) and full.shape == (2, 16, 64)

