"""The model's attention and the lab's probes of it, against independent computations."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from lab.probes import attention_probs, diagnostics, induction, param_breakdown
import model as M
from model import GPT, GPTConfig, KVCache


def reference(q, k, v, scale, allowed):
    """softmax(scale q k^T) v over the allowed (T, S) entries, in numpy float64, heads repeated
    for GQA."""
    q, k, v = (t.detach().double().numpy() for t in (q, k, v))
    k, v = (np.repeat(t, q.shape[1] // t.shape[1], axis=1) for t in (k, v))
    s = scale * q @ k.swapaxes(-1, -2)
    s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return torch.from_numpy(p / p.sum(-1, keepdims=True) @ v)


# (n_head, n_kv_head, T, S): S > T is decoding with T new positions after a cached prefix
CASES = [(4, 4, 9, 9), (4, 2, 9, 9), (4, 1, 7, 7), (2, 2, 3, 11), (4, 2, 1, 6)]


def inputs(n_head, n_kv, T, S):
    g = torch.Generator().manual_seed(T * 100 + S)
    return (torch.randn(2, n_head, T, 8, dtype=torch.float64, generator=g),
            torch.randn(2, n_kv, S, 8, dtype=torch.float64, generator=g),
            torch.randn(2, n_kv, S, 8, dtype=torch.float64, generator=g))


@pytest.mark.parametrize('backend', [None, SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
@pytest.mark.parametrize('n_head,n_kv,T,S', CASES)
def test_attention_with_the_models_masks_equals_the_reference_in_float64(backend, n_head, n_kv, T,
                                                                         S):
    """The model's call of SDPA: is_causal in training, model.causal_mask after a cached
    prefix (query i at position S - T + i), grouped-query heads, every backend."""
    q, k, v = inputs(n_head, n_kv, T, S)
    if T == S:  # training: is_causal, query i sees keys 0..i
        allowed, mask, causal = np.tril(np.ones((T, S), bool)), None, True
    else:
        allowed = np.tril(np.ones((T, S), bool), k=S - T)
        mask, causal = M.causal_mask(T, S), False
        assert np.array_equal(mask.numpy(), allowed)
    no_choice = torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x)
    with sdpa_kernel(backend) if backend else no_choice:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=0.3,
                                             enable_gqa=n_kv != n_head)
    torch.testing.assert_close(out, reference(q, k, v, 0.3, allowed), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('kw', [dict(), dict(query='identity'), dict(query='nonlinear'),
                                dict(key_identity=True), dict(n_kv_head=1),
                                dict(pos='rope', qk_norm=True),
                                dict(query='identity', learn_scale=True)])
def test_the_probes_measure_the_attention_the_model_computes(kw):
    """lab.probes.attention_probs, its explicit softmax, times v is the model's attention output
    (before c_proj), in float64: what the diagnostics describe is what trains."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, **kw),
                verbose=False).double()
    x, rope = model.embed(torch.randint(0, 64, (2, 16)))
    block = model.transformer.h[0]
    if block.attn.log_scale is not None:  # heads apart, away from the starting scale
        with torch.no_grad():
            block.attn.log_scale.copy_(torch.tensor([-3.0, -1.5]))
    probs, _, _, _ = attention_probs(block, x, rope)
    _, _, v = block.attn.qkv(block.ln_1(x), rope)
    v = v.repeat_interleave(2 // v.size(1), dim=1)
    mixed = (probs @ v).transpose(1, 2).reshape(2, 16, 32)
    torch.testing.assert_close(block.attn.c_proj(mixed), block.attn(block.ln_1(x), rope=rope),
                               rtol=1e-10, atol=1e-12)


def test_the_diagnostics_log_each_heads_learned_scale_and_only_when_it_is_learned():
    """learn_scale's per-head exp(theta_h) per layer, as the model holds it; a fixed scale is the
    config's and adds nothing to the log line."""
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, query='identity')
    learned = GPT(GPTConfig(**cfg, learn_scale=True), verbose=False).double()
    with torch.no_grad():
        learned.transformer.h[1].attn.log_scale.copy_(torch.tensor([-3.0, -1.5]))
    idx = torch.randint(0, 64, (2, 16))
    scale = diagnostics(learned, idx)['scale']
    assert scale[0] == pytest.approx([1 / 8, 1 / 8], rel=1e-7)  # 1/(2 sqrt(16)), ln in fp32
    assert scale[1] == pytest.approx([np.exp(-3.0), np.exp(-1.5)], rel=1e-12)
    assert 'scale' not in diagnostics(GPT(GPTConfig(**cfg), verbose=False), idx)


def test_bf16_autocast_on_cpu_trains_and_keeps_three_digits():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, dropout=0.1)
    model = GPT(cfg, verbose=False)
    idx = torch.randint(0, 64, (2, 16))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        logits, loss = model(idx, idx)
    loss.backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    model.eval()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        low, _ = model(idx, idx)
    full, _ = model(idx, idx)
    torch.testing.assert_close(low.float(), full, rtol=0.05, atol=0.05)  # bf16 keeps ~3 digits


def test_induction_probe_equals_an_independent_computation():
    """Hand-set weights, no LayerNorm, one layer of 2 heads of size 2, on 3 tokens repeated."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=4, block_size=6, vocab_size=7, norm=False),
                verbose=False).double()
    rng = np.random.default_rng(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(rng.normal(0, 0.7, tuple(p.shape))))
    idx = torch.tensor([[1, 4, 2, 1, 4, 2], [3, 0, 5, 3, 0, 5]])
    probe = induction(model, idx)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    x = sd['transformer.wte.weight'][idx.numpy()] + sd['transformer.wpe.weight'][np.arange(6)]
    W = sd['transformer.h.0.attn.c_attn.weight']
    q, k, v = x @ W[:4].T, x @ W[4:8].T, x @ W[8:].T
    scores, heads = [], []
    for h in range(2):
        s = q[:, :, 2 * h:2 * h + 2] @ k[:, :, 2 * h:2 * h + 2].transpose(0, 2, 1) / np.sqrt(2)
        s = np.where(np.tril(np.ones((6, 6), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        # to the token after the earlier copy
        scores.append(np.mean([p[:, i, i - 3 + 1] for i in (3, 4, 5)]))
        heads.append(p @ v[:, :, 2 * h:2 * h + 2])
    assert probe['induction'][0] == pytest.approx(scores, rel=1e-9)
    y = np.concatenate(heads, -1) @ sd['transformer.h.0.attn.c_proj.weight'].T
    h1 = x + y
    hidden = h1 @ sd['transformer.h.0.mlp.c_fc.weight'].T
    gelu = torch.nn.functional.gelu(torch.from_numpy(hidden)).numpy()
    out = h1 + gelu @ sd['transformer.h.0.mlp.c_proj.weight'].T
    logits = out @ sd['transformer.wte.weight'].T  # tied head
    top = logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits - top).sum(-1, keepdims=True)) - top
    targets = idx.numpy()[:, 4:]  # the second copy's targets: positions 3 and 4 predict 4 and 5
    expected = -np.mean([logp[b, i - 1, targets[b, i - 4]] for b in range(2) for i in (4, 5)])
    assert probe['repeat_loss'] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_diagnostics_and_probe_stay_finite_and_close_under_16_bit_autocast(dtype):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64)
    model = GPT(cfg, verbose=False).eval()
    idx = torch.randint(0, 64, (4, 32))
    full, probe = diagnostics(model, idx), induction(model, idx)
    with torch.autocast('cpu', dtype=dtype):
        low, low_probe = diagnostics(model, idx), induction(model, idx)
    # 16-bit probabilities gave NaN here
    assert low['entropy'] == pytest.approx(full['entropy'], rel=1e-2)
    assert low_probe['repeat_loss'] == pytest.approx(probe['repeat_loss'], rel=1e-2)


def test_diagnostics_equal_an_independent_computation():
    """Hand-set weights, no LayerNorm (ln_1 is the identity), one layer of 2 heads of size 2."""
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=4, block_size=5, vocab_size=6, norm=False)
    model = GPT(cfg, verbose=False).double()
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(rng.normal(0, 0.7, tuple(p.shape))))
    idx = torch.tensor([[1, 4, 2, 5, 0], [3, 3, 1, 0, 2]])
    diag = diagnostics(model, idx)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    x = sd['transformer.wte.weight'][idx.numpy()] + sd['transformer.wpe.weight'][np.arange(5)]
    W = sd['transformer.h.0.attn.c_attn.weight']
    q, k = x @ W[:4].T, x @ W[4:8].T
    ents, norms = [], []
    scores_all = []
    for b in range(2):
        for h in range(2):
            s = (q[b, :, 2 * h:2 * h + 2] @ k[b, :, 2 * h:2 * h + 2].T) / np.sqrt(2)
            for t in range(5):
                row = s[t, :t + 1]
                scores_all.extend(row)
                p = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
                ents.append(-(p * np.log(p)).sum())
                if t:
                    norms.append(ents[-1] / np.log(t + 1))
    assert diag['logit_std'][0] == pytest.approx(np.std(scores_all, ddof=1), rel=1e-6)
    assert diag['entropy'][0] == pytest.approx(np.mean(ents), rel=1e-6)
    assert diag['entropy_norm'][0] == pytest.approx(np.mean(norms), rel=1e-6)
    assert diag['q_rms'][0] == pytest.approx(np.sqrt((q ** 2).mean()), rel=1e-6)
    assert diag['k_rms'][0] == pytest.approx(np.sqrt((k ** 2).mean()), rel=1e-6)
    fro = lambda *names: np.sqrt(sum((sd[n] ** 2).sum() for n in names))
    assert diag['weight_norm'] == pytest.approx(dict(
        attn_in=fro('transformer.h.0.attn.c_attn.weight'),
        attn_out=fro('transformer.h.0.attn.c_proj.weight'),
        mlp_in=fro('transformer.h.0.mlp.c_fc.weight'),
        mlp_out=fro('transformer.h.0.mlp.c_proj.weight'),
        embeddings=fro('transformer.wte.weight', 'transformer.wpe.weight')), rel=1e-9)


# -----------------------------------------------------------------------------
# the modern block: rotary positions and QK-norm

def test_rope_attention_equals_a_float64_reference():
    """One layer's attention with pos='rope' against numpy: q and k turned pair by pair,
    dimension i with i + hd/2 by the angle position * base^(-2i/hd), then causal softmax
    attention."""
    cfg = GPTConfig(n_embd=16, n_head=2, block_size=16, pos='rope', rope_base=100.0)
    torch.manual_seed(3)
    attn = M.CausalSelfAttention(cfg).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    positions = torch.arange(4, 13)  # anywhere in the sequence
    out = attn(x, rope=M.rope_tables(positions, 8, 100.0))
    W = attn.c_attn.weight.detach().numpy()
    q, k, v = (x.numpy() @ W[i * 16:(i + 1) * 16].T for i in range(3))
    heads = []
    for h in range(2):
        qh, kh, vh = (t[:, :, 8 * h:8 * h + 8] for t in (q, k, v))
        angle = positions.numpy()[:, None] * 100.0 ** (-np.arange(4) / 4)[None, :]  # (T, hd/2)
        cos, sin = np.cos(angle), np.sin(angle)
        turn = lambda t: np.concatenate([t[..., :4] * cos - t[..., 4:] * sin,
                                         t[..., 4:] * cos + t[..., :4] * sin], -1)
        s = turn(qh) @ turn(kh).transpose(0, 2, 1) / np.sqrt(8)
        s = np.where(np.tril(np.ones((9, 9), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        heads.append((p / p.sum(-1, keepdims=True)) @ vh)
    expected = np.concatenate(heads, -1) @ attn.c_proj.weight.detach().numpy().T
    torch.testing.assert_close(out, torch.from_numpy(expected), rtol=1e-10, atol=1e-12)


MODERN = [dict(pos='rope'), dict(pos='rope', qk_norm=True), dict(qk_norm=True),
          dict(pos='rope', qk_norm=True, query='identity'),
          dict(pos='rope', qk_norm=True, query='nonlinear'),
          dict(pos='rope', qk_norm=True, query='residual_gelu'),
          dict(pos='rope', key_identity=True),
          dict(pos='rope', qk_norm=True, value_identity=True),
          dict(pos='rope', qk_norm=True, n_kv_head=1)]


@pytest.mark.parametrize('kw', MODERN, ids=lambda kw: ','.join(f'{k}={v}' for k, v in kw.items()))
def test_cached_decoding_equals_recomputation_with_the_modern_block(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=64, **kw),
                verbose=False).double().eval()
    idx = torch.randint(0, 64, (2, 24))
    full, _ = model(idx, idx)
    cache = KVCache(model.config, 2, dtype=torch.float64)
    model(idx[:, :10], cache=cache)  # a prefill, then one token at a time up to block_size
    steps = [model(idx[:, t:t + 1], cache=cache)[0][:, -1] for t in range(10, 24)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 10:], rtol=1e-10, atol=1e-10)
    logits, loss = GPT(model.config, verbose=False)(idx, idx)  # trains in float32 too
    loss.backward()


def test_under_rope_a_shift_of_every_position_leaves_the_logits_unchanged():
    for pos, same in (('rope', True), ('learned', False)):
        torch.manual_seed(0)
        cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64, pos=pos,
                        qk_norm=True)
        model = GPT(cfg, verbose=False).double()
        idx = torch.randint(0, 64, (2, 20))
        at0, at9 = model(idx, idx)[0], model(idx, idx, offset=9)[0]
        assert torch.allclose(at0, at9, rtol=0, atol=1e-12) == same, pos


def test_generation_past_block_size_matches_recomputation_under_rope():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=64, pos='rope'),
                verbose=False).double().eval()
    prompt = torch.randint(0, 64, (1, 5))
    cached = model.generate(prompt, 12, temperature=0.0)  # past block_size: the window slides
    assert torch.equal(cached, model.generate(prompt, 12, temperature=0.0, use_cache=False))


def test_modern_block_parameter_counts_are_exact():
    gpt2 = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304)
    with torch.device('meta'):
        count = lambda **kw: GPT(GPTConfig(**gpt2, **kw), verbose=False).get_num_params()
        assert count(query='identity', pos='rope') == 117_295_872 - 1024 * 768  # no position table
        assert (count(query='identity', pos='rope', qk_norm=True)
                == 117_295_872 - 1024 * 768 + 12 * 2 * 64)
        assert count(pos='rope') == 124_373_760 - 1024 * 768
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, pos='rope',
                    qk_norm=True)
    model = GPT(cfg, verbose=False)
    assert 'transformer.wpe.weight' not in model.state_dict()
    parts = param_breakdown(model)
    assert parts['attention'] == 2 * (3 * 32 * 32 + 32 * 32 + 2 * 16)
    assert parts['total'] == model.get_num_params() == sum(parts.values()) - parts['total']


@pytest.mark.parametrize('kw,message', [(dict(pos='alibi'), "pos must be 'learned' or 'rope'"),
                                        (dict(pos='rope', n_embd=30, n_head=2), 'even head size')])
def test_bad_position_settings_fail_clearly(kw, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**kw)
