import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from kvgpt.errors import UserError
from model import GPT, GPTConfig, KVCache, sample_next
import prepare
import sample
import train

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
VARIANTS = {
    'baseline': dict(),
    'query_identity': dict(query='identity'),
    'key_identity': dict(key_identity=True),
    'value_identity': dict(value_identity=True),
    'gqa': dict(query='identity', n_kv_head=2),
    'mqa_baseline': dict(n_kv_head=1),
    'shared_no_norm': dict(query='identity', share_layers=True, norm=False),
    'residual': dict(query='residual'),
    'residual_gelu': dict(query='residual_gelu'),
    'nonlinear': dict(query='nonlinear'),
    'nonlinear_sum_gqa': dict(query='nonlinear', query_mix=1.0, n_kv_head=2),
}


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=12, vocab_size=50)
    cfg.update(kw)
    model = GPT(GPTConfig(**cfg), verbose=False).eval()
    # larger weights than init, so that logits differ clearly between positions
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0 if p.dim() == 2 else 1.0)
    return model


def logits_trace(model, idx, steps, use_cache):
    """Greedy tokens and the logits that chose each of them."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out[:, -1].clone()))
    try:
        out = model.generate(idx, steps, temperature=0.0, use_cache=use_cache)
    finally:
        hook.remove()
    return out, torch.stack(seen)


@pytest.mark.parametrize('name', VARIANTS)
def test_cached_and_uncached_decoding_agree_past_block_size(name):
    model = tiny(**VARIANTS[name])
    idx = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(1))
    steps = 20  # 5 + 20 tokens: well past block_size 12, so the window slides
    tokens_c, logits_c = logits_trace(model, idx, steps, use_cache=True)
    tokens_u, logits_u = logits_trace(model, idx, steps, use_cache=False)
    assert logits_c.shape == (steps, 2, 50)
    torch.testing.assert_close(logits_c, logits_u, rtol=1e-4, atol=1e-4)
    assert torch.equal(tokens_c, tokens_u)
    assert len(set(tokens_c[0].tolist())) > 3  # a non-degenerate sequence


def test_prefill_then_step_matches_full_forward_at_every_position():
    model = tiny(query='identity', n_kv_head=2)
    idx = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(2))
    full, _ = model(idx, targets=idx)  # logits at every position
    cache = KVCache(model.config, 1)
    got = [model(idx[:, :4], cache=cache)[0][:, -1]]  # prefill 4, then 3 at once, then one by one
    got.append(model(idx[:, 4:7], cache=cache)[0][:, -1])
    for t in range(7, 12):
        got.append(model(idx[:, t:t + 1], cache=cache)[0][:, -1])
    want = full[:, [3, 6, 7, 8, 9, 10, 11]].transpose(0, 1)
    torch.testing.assert_close(torch.stack(got), want, rtol=1e-4, atol=1e-4)
    assert cache.pos == 12


def test_cache_memory_scales_with_n_kv_head():
    cfg = lambda n: GPTConfig(n_layer=2, n_head=8, n_embd=64, block_size=32, n_kv_head=n)
    sizes = {n: KVCache(cfg(n), 3).nbytes() for n in (8, 4, 1)}
    # K and V, layers, batch, heads, positions, head_dim, fp32
    assert sizes[8] == 2 * 2 * 3 * 8 * 32 * 8 * 4
    assert sizes[8] == 2 * sizes[4] == 8 * sizes[1]
    # the reduced model's cache is as large as the baseline's: only W_Q went
    assert (KVCache(GPTConfig(query='identity', n_layer=2), 1).nbytes()
            == KVCache(GPTConfig(n_layer=2), 1).nbytes())


def test_fixed_seed_reproduces_a_sample():
    model = tiny()
    idx = torch.zeros(1, 1, dtype=torch.long)
    run = lambda seed: model.generate(idx, 15, temperature=1.0, top_k=20,
                                      generator=torch.Generator().manual_seed(seed))
    assert torch.equal(run(3), run(3)) and not torch.equal(run(3), run(4))


def test_sampling_filters():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
    g = torch.Generator().manual_seed(0)
    assert sample_next(logits, 0.0).item() == 1
    assert {sample_next(logits, 1.0, top_k=1, generator=g).item() for _ in range(20)} == {1}
    assert {sample_next(logits, 1.0, top_p=0.01, generator=g).item() for _ in range(20)} == {1}
    # top_p = 0.9 keeps the smallest prefix reaching 0.9: tokens 1, 2 (0.63 + 0.23 < 0.9) and 0
    picked = {sample_next(logits, 1.0, top_p=0.9, generator=g).item() for _ in range(300)}
    assert picked == {0, 1, 2}
    assert {sample_next(logits, 1.0, top_k=2, generator=g).item() for _ in range(100)} == {1, 2}


def test_a_tiny_temperature_samples_the_greedy_token():
    """logits / 1e-45 overflow to inf, whose softmax is nan: the limit is greedy, as is this."""
    logits = torch.tensor([[1.0, 3.0, 2.0, float('-inf')], [0.5, -2.0, 0.25, 0.0]])
    g = torch.Generator().manual_seed(0)
    for temperature in (1e-45, 1e-30):
        assert sample_next(logits, temperature, generator=g).flatten().tolist() == [1, 0]
        filtered = sample_next(logits, temperature, top_k=2, top_p=0.5, generator=g)
        assert filtered.flatten().tolist() == [1, 0]


def test_eos_stops_generation():
    model = tiny()
    first = model.generate(torch.zeros(1, 1, dtype=torch.long), 6, temperature=0.0)
    eos = first[0, 3].item()  # the greedy path's third new token
    start = torch.zeros(1, 1, dtype=torch.long)
    stopped = model.generate(start, 6, temperature=0.0, eos_token=eos)
    assert stopped[0, -1].item() == eos and stopped.size(1) <= 4


# -----------------------------------------------------------------------------
# sample.py end to end, on checkpoints written by train.py

@pytest.fixture(scope='module',
                params=['byte', pytest.param('gpt2', marks=pytest.mark.gpt2_bpe)])
def trained(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f'sample-{request.param}')
    docs = root / 'docs.jsonl'
    with open(docs, 'w') as f:
        for d in prepare.pydocs_topics()[:40]:
            f.write(json.dumps({'text': d}) + '\n')
    prepare.prepare(dict(prepare.DEFAULTS, dataset=str(docs), tokenizer=request.param,
                         data_root=str(root), num_proc=1, out_name='d'))
    out = root / 'out'
    train.main([f'--data_root={root}', '--dataset=d', f'--out_dir={out}', '--n_layer=1',
                '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
                '--gradient_accumulation_steps=1', '--max_iters=3', '--eval_interval=3',
                '--eval_iters=1', '--device=cpu', '--compile=False', '--dtype=float32'])
    return request.param, str(out)


def cli(*args):
    return subprocess.run([sys.executable, 'sample.py', *args], cwd=HERE, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_sample_cli_end_to_end(trained, capsys):
    tokenizer, out = trained
    args = [f'--out_dir={out}', '--start=def ', '--num_samples=2', '--max_new_tokens=30',
            '--device=cpu']
    a = cli(*args)
    assert a.returncode == 0, a.stderr
    sample.main(args)  # this process: another one than the command line's
    assert a.stdout == capsys.readouterr().out  # same seed, same samples
    assert a.stdout.count('---------- sample') == 2 and 'def ' in a.stdout
    same = dict(sample.DEFAULTS, out_dir=out, start='def ', num_samples=2, max_new_tokens=30,
                device='cpu')
    assert sample.sample(same) != sample.sample(dict(same, seed=2))  # another seed, others


def test_sample_texts_and_no_cache_agree(trained):
    _, out = trained
    base = dict(sample.DEFAULTS, out_dir=out, num_samples=1, max_new_tokens=40, temperature=0.0,
                stop_at_eot=False, device='cpu')
    assert sample.sample(base) == sample.sample(dict(base, use_cache=False))


def test_a_checkpoint_file_samples_as_its_run_does(trained, tmp_path):
    """init_from names a checkpoint file (a kept ckpt_<step>.pt): the same model as the run's."""
    _, out = trained
    copy = tmp_path / 'ckpt_3.pt'
    shutil.copyfile(os.path.join(out, 'ckpt.pt'), copy)
    base = dict(sample.DEFAULTS, out_dir=out, num_samples=1, max_new_tokens=20, device='cpu')
    assert sample.sample(dict(base, out_dir='/no/such/run', init_from=str(copy))) == \
        sample.sample(base)


def test_a_checkpoint_with_non_finite_weights_is_one_line(trained, tmp_path):
    # a diverged nanoGPT run saves one: sampling raised in torch, or printed NULs greedily
    _, out = trained
    ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
    name = next(iter(ckpt['model']))
    ckpt['model'][name][0] = float('nan')
    torch.save(ckpt, tmp_path / 'nan.pt')
    with pytest.raises(UserError, match=f"^{tmp_path}/nan.pt holds non-finite weights "
                                        f"\\({name}.*\\): the run diverged before this"):
        sample.sample(dict(sample.DEFAULTS, init_from=str(tmp_path / 'nan.pt'), device='cpu',
                           temperature=0.0))


@pytest.mark.parametrize('kw,message', [
    (dict(init_from='/no/such/ckpt_5.pt'), "init_from '/no/such/ckpt_5.pt' is no file or folder"),
    (dict(top_k=0), 'top_k must be a positive integer'),
    (dict(top_p=1.5), r'top_p must be in \(0, 1\]'),
    (dict(top_p=0), r'top_p must be in \(0, 1\]'),
    (dict(temperature=-1.0), 'temperature must be >= 0'),
    (dict(num_samples=0), 'num_samples must be a positive integer'),
    (dict(start='FILE:/no/such/prompt.txt'), 'prompt file /no/such/prompt.txt not found'),
    (dict(out_dir='/no/such/run'), 'no checkpoint at /no/such/run/ckpt.pt'),
    (dict(init_from='scratch'), "sample.py's init_from is resume"),
])
def test_bad_sampling_input(kw, message):
    with pytest.raises(UserError, match=message):
        sample.sample(dict(sample.DEFAULTS, **kw))


def test_a_prompt_file_that_is_not_utf8_is_one_line(tmp_path):
    prompt = tmp_path / 'prompt.txt'
    prompt.write_bytes(b'caf\xe9')  # Latin-1
    with pytest.raises(UserError, match=f"prompt file {prompt} is not UTF-8 text"):
        sample.sample(dict(sample.DEFAULTS, start=f'FILE:{prompt}'))


@pytest.mark.slow
@pytest.mark.parametrize('trained', ['byte'], indirect=True)  # the CLI's errors: one tokenizer
def test_corrupt_checkpoint_and_long_prompt(tmp_path, trained, capsys):
    _, out = trained
    bad = tmp_path / 'bad'
    bad.mkdir()
    data = open(os.path.join(out, 'ckpt.pt'), 'rb').read()
    (bad / 'ckpt.pt').write_bytes(data[:len(data) // 2])
    r = cli(f'--out_dir={bad}')
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith(f'error: cannot read checkpoint {bad}/ckpt.pt')
    sample.main([f'--out_dir={out}', '--start=' + 'word ' * 200, '--max_new_tokens=3',
                 '--num_samples=1', '--device=cpu'])
    assert 'more than block_size 32: keeping the last 32' in capsys.readouterr().err
    sample.main([f'--out_dir={out}', '--start=', '--max_new_tokens=3', '--num_samples=1',
                 '--device=cpu'])
    assert 'empty prompt' in capsys.readouterr().err


@pytest.mark.slow  # sample.py's command line
def test_pickled_code_in_a_checkpoint_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ('echo pwned',))
    torch.save({'model': {}, 'model_args': {}, 'x': Evil()}, tmp_path / 'ckpt.pt')
    r = cli(f'--out_dir={tmp_path}')
    assert r.returncode == 2 and 'pwned' not in r.stdout and 'cannot read checkpoint' in r.stderr


@pytest.mark.gpt2_bpe
@pytest.mark.parametrize('trained', ['byte'], indirect=True)
def test_prompt_tokens_outside_the_vocabulary_are_refused(tmp_path, trained):
    """A byte-level model (vocab 320) whose checkpoint claims the gpt2 tokenizer."""
    _, out = trained
    ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
    ckpt['meta']['tokenizer'] = 'gpt2'
    (tmp_path / 'run').mkdir()
    torch.save(ckpt, tmp_path / 'run' / 'ckpt.pt')
    with pytest.raises(UserError, match=r"outside the model's vocabulary of 320: "
                                        r".*not trained with the gpt2 tokenizer"):
        sample.sample(dict(sample.DEFAULTS, out_dir=str(tmp_path / 'run'), start='def main',
                           device='cpu'))
