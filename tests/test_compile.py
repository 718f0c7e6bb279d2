"""The compiled paths, checked without a GPU: torch.compile on the eager backend traces exactly
what inductor would (dynamo's graph capture), so fullgraph=True fails on any graph break, and the
compile counter shows recompilations. Every query mode, GQA, W_K = I, RoPE and QK-norm."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

from model import GPT, GPTConfig, KVCache

MODES = {
    'linear': dict(), 'identity': dict(query='identity'), 'residual': dict(query='residual'),
    'residual_gelu': dict(query='residual_gelu'), 'nonlinear': dict(query='nonlinear'),
    'gqa': dict(query='identity', n_head=4, n_kv_head=2), 'key_identity': dict(key_identity=True),
    'rope': dict(pos='rope'), 'modern_identity': dict(query='identity', pos='rope', qk_norm=True),
    'modern_gqa': dict(pos='rope', qk_norm=True, n_head=4, n_kv_head=2),
}


def tiny(kw):
    torch.manual_seed(0)
    cfg = dict(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=64)
    return GPT(GPTConfig(**{**cfg, **kw}), verbose=False)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # no cache carried between tests: each counts its own compilations
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize('mode', MODES)
def test_training_step_compiles_as_one_graph(mode):
    model = tiny(MODES[mode])
    counter = CompileCounter()
    step = torch.compile(model, backend=counter, fullgraph=True)  # a graph break raises here
    idx = torch.randint(0, 64, (2, 16))
    logits, loss = step(idx, idx)
    loss.backward()
    expected, _ = model(idx, idx)
    torch.testing.assert_close(logits, expected)
    assert counter.frame_count == 1 and all(p.grad is not None for p in model.parameters())


# dynamic shapes take a second to trace per mode; the training graph above stays in the inner loop
@pytest.mark.slow
@pytest.mark.parametrize('mode', MODES)
def test_prefill_and_decoding_compile_without_breaks_or_recompiles(mode):
    """As sample.py runs it: model.compile(dynamic=True), a prefill, then one token per step."""
    model = tiny(MODES[mode]).eval()
    counter = CompileCounter()
    forward = torch.compile(model.forward, backend=counter, fullgraph=True, dynamic=True)
    cache = KVCache(model.config, 1)
    with torch.no_grad():
        forward(torch.randint(0, 64, (1, 5)), cache=cache)  # the prefill
        after_prefill = counter.frame_count
        # the first decoding step may compile its own graph (T = 1); the next 5 may not
        for _ in range(6):
            forward(torch.randint(0, 64, (1, 1)), cache=cache)
            if _ == 0:
                after_first_step = counter.frame_count
    assert after_prefill == 1 and after_first_step <= 2
    assert counter.frame_count == after_first_step  # no recompilation over 5 decoding steps


def test_a_graph_break_is_caught():
    """The check has teeth: a Python branch on .item() in the forward (a data-dependent host
    decision, which no single graph can hold) fails it."""
    model = tiny({})
    original = model.transformer.ln_f.forward

    def ln_f_with_a_branch(x):
        y = original(x)
        return y if y.sum().item() > 0 else -y

    model.transformer.ln_f.forward = ln_f_with_a_branch
    model(torch.randint(0, 64, (2, 8)))  # eager runs it
    with pytest.raises(Exception, match='data-dependent'):
        torch.compile(model, backend='eager', fullgraph=True)(torch.randint(0, 64, (2, 8)))
