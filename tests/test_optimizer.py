"""The optimizers: Muon against torch.optim.Muon on the same matrices, which parameters each
optimizer takes, and Muon under everything train.py promises AdamW (exact resume, float16's
scaler, gradient accumulation, compilation, DDP in test_train's way; a fixed seed's first losses
are test_train's PINNED)."""
import os
import re
import subprocess

import pytest
import torch

from kvgpt.checkpoint import load_checkpoint
from kvgpt.errors import UserError
from kvgpt.optimizer import Muon, Optimizers, build_optimizer, orthogonalize
from model import GPT, GPTConfig
import train
from test_train import (HERE, TORCHRUN, argv, assert_same_state, final_state, losses, read_log,
                        run)

MUON = dict(optimizer='muon')


def assert_near_state(a, b):
    """Weights equal as far as Muon's rounding lets two sums of one gradient be: its bfloat16
    Newton-Schulz steps multiply a gradient's smallest directions about 3.4 times a step, so
    rounding apart by 1e-7 moves a weight by up to about 3e-3 after 6 steps at LR 1e-2 (measured
    here: AdamW's runs stay within 2e-5). A gradient summed wrong moves the losses and the
    gradient norms, which the callers compare at 1e-3."""
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=5e-3, msg=k)


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    return GPT(GPTConfig(**{**cfg, **kw}), verbose=False)


def settings(**kw):
    return dict(train.DEFAULTS, **MUON, **kw)


@pytest.mark.parametrize('scale', ['original', 'match_rms_adamw'])
@pytest.mark.parametrize('nesterov', [True, False])
def test_muon_steps_each_stacked_matrix_as_torch_muon_steps_it_alone(scale, nesterov):
    """A (96, 32) parameter stacking three (32, 32) projections, split, against torch.optim.Muon
    on the three as parameters of their own; and a tall and a wide matrix alone: equal, bit for
    bit, over steps with momentum and weight decay."""
    torch.manual_seed(0)
    shapes = [(96, 32), (128, 32), (32, 128)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [torch.nn.Parameter(t.detach().clone()) for t in (*ours[0].split(32), *ours[1:])]
    mine = Muon([{'params': ours[:1], 'split': (32, 32, 32)}, {'params': ours[1:]}], lr=0.02,
                weight_decay=0.1, nesterov=nesterov, scale=scale)
    reference = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, nesterov=nesterov,
                                 adjust_lr_fn=scale)
    for _ in range(4):
        grads = [torch.randn(s) for s in shapes]
        for p, g in zip(ours, grads):
            p.grad = g
        for p, g in zip(theirs, (*grads[0].split(32), *grads[1:])):
            p.grad = g.clone()
        mine.step()
        reference.step()
    assert torch.equal(ours[0], torch.cat(theirs[:3]))
    assert all(torch.equal(a, b) for a, b in zip(ours[1:], theirs[3:]))


def test_a_fused_matrix_orthogonalized_whole_is_not_its_projections_orthogonalized():
    """What the split is for: three projections whose gradients differ in size (x1, x10, x0.1).
    Each orthogonalized on its own gets singular values near 1; the fused matrix orthogonalized
    whole gives the smallest one almost no update."""
    torch.manual_seed(0)
    g = torch.randn(96, 32) * torch.tensor([1.0, 10.0, 0.1]).repeat_interleave(32)[:, None]
    whole = orthogonalize(g, 5).float().split(32)
    each = [orthogonalize(b, 5).float() for b in g.split(32)]
    for block in each:
        assert 0.6 < torch.linalg.svdvals(block).median() < 1.3
    assert torch.linalg.svdvals(whole[2]).median() < 0.1


@pytest.mark.parametrize('kw,split', [
    (dict(), (32, 32, 32)), (dict(query='identity'), (32, 32)),
    (dict(query='nonlinear'), (32, 32)), (dict(value_identity=True), (32, 32)),
    (dict(n_head=4, n_kv_head=2), (32, 16, 16)), (dict(share_layers=True), (32, 32, 32)),
    (dict(tie_weights=False, bias=True, learn_scale=True, qk_norm=True), (32, 32, 32))])
def test_muon_takes_the_blocks_matrices_and_adamw_the_rest(kw, split):
    model = tiny(**kw)
    opt = build_optimizer(model, settings(), 'cpu')
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in opt.parts['muon'].param_groups for p in g['params']]
    adamw = [names[id(p)] for g in opt.parts['adamw'].param_groups for p in g['params']]
    assert sorted(muon + adamw) == sorted(names.values())  # each parameter once
    assert all(re.match(r'transformer\.h\.\d+\.', n) and model.get_parameter(n).dim() == 2
               for n in muon)
    assert all(not n.startswith('transformer.h.') or model.get_parameter(n).dim() < 2
               for n in adamw)
    fused = opt.parts['muon'].param_groups[1]
    assert fused['split'] == split and all(
        names[id(p)].endswith('attn.c_attn.weight') for p in fused['params'])
    assert len(fused['params']) == (1 if kw.get('share_layers') else 2)
    if kw.get('query') == 'nonlinear':
        assert any('q_mlp.fc.weight' in n for n in muon)


def test_adamw_is_the_default_and_as_before(data_root):
    model = tiny()
    opt = build_optimizer(model, dict(train.DEFAULTS), 'cpu')
    assert train.DEFAULTS['optimizer'] == 'adamw' and isinstance(opt, torch.optim.AdamW)
    assert [g['weight_decay'] for g in opt.param_groups] == [0.1, 0.0]


def test_muon_lr_sets_muons_peak_on_the_schedule_and_adamw_keeps_learning_rate():
    model = tiny()
    opt = build_optimizer(model, settings(learning_rate=1e-3, muon_lr=0.02,
                                          muon_scale='original'), 'cpu')
    for group in opt.param_groups:  # what the loop does each step
        group['lr'] = 5e-4
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = model.transformer.h[0].mlp.c_proj.weight.detach().clone()
    opt.step()
    after = model.transformer.h[0].mlp.c_proj.weight.detach()
    # Muon's LR: 0.02 x 5e-4 / 1e-3 = 0.01; decay first, then the update (square: factor 1)
    update = orthogonalize(torch.ones(32, 128), 5)
    assert torch.equal(after, (before * (1 - 0.01 * 0.1)).add(update, alpha=-0.01))
    assert opt.parts['adamw'].param_groups[0]['lr'] == 5e-4


@pytest.mark.parametrize('dtype', ['float32', pytest.param('float16', marks=pytest.mark.slow)])
def test_a_muon_run_resumes_bit_exact_and_its_checkpoint_records_its_optimizer(
        data_root, tmp_path, dtype):
    full = run(data_root, tmp_path / 'full', dtype=dtype, **MUON)
    run(data_root, tmp_path / 'resumed', max_iters=10, dtype=dtype, **MUON)
    resumed = run(data_root, tmp_path / 'resumed', init_from='resume', dtype=dtype, **MUON)
    assert losses(resumed) == losses(full)  # dropout on: the RNG, Muon's momentum, AdamW's moments
    assert_same_state(final_state(tmp_path / 'full'), final_state(tmp_path / 'resumed'))
    ckpt = load_checkpoint(str(tmp_path / 'full' / 'ckpt.pt'))
    assert ckpt['config']['optimizer'] == 'muon' and set(ckpt['optimizer']) == {'adamw', 'muon'}
    assert all('momentum_buffer' in s for s in ckpt['optimizer']['muon']['state'].values())
    if dtype == 'float16':  # the scaler unscaled and stepped both parts, and resumed
        assert ckpt['scaler']['_growth_tracker'] == 20


@pytest.mark.parametrize('first,then', [('muon', 'adamw'), ('adamw', 'muon')])
def test_a_resume_with_another_optimizer_is_one_line(data_root, tmp_path, command_line,
                                                     first, then):
    run(data_root, tmp_path, max_iters=2, eval_interval=2, optimizer=first)
    code, err = command_line(train, argv(data_root, tmp_path, init_from='resume', max_iters=4,
                                         optimizer=then))
    ckpt = tmp_path / 'ckpt.pt'
    assert code == 2 and err == (
        f"error: {ckpt} was trained with optimizer='{first}', not '{then}': continue it with "
        f"--optimizer={first}, or start a run from its weights alone (--init_from={ckpt} "
        "--finetune=True)\n")
    assert load_checkpoint(str(ckpt))['iter_num'] == 2  # untouched


def test_a_muon_step_is_the_same_whatever_its_micro_batches(data_root, tmp_path):
    """Gradient accumulation: 2 micro-batches of 4 windows train as 1 of 8 (the same windows;
    the evaluations, whose batches are batch_size windows, differ), within Muon's tolerance."""
    two = run(data_root, tmp_path / 'two', dropout=0.0, max_iters=6, eval_interval=6, **MUON)
    one = run(data_root, tmp_path / 'one', dropout=0.0, max_iters=6, eval_interval=6,
              batch_size=8, gradient_accumulation_steps=1, **MUON)
    steps = [[e[k] for e in log if 'loss' in e for k in ('loss', 'grad_norm')]
             for log in (two, one)]
    assert len(steps[0]) == 12 and steps[0] == pytest.approx(steps[1], rel=1e-3)
    assert_near_state(final_state(tmp_path / 'two'), final_state(tmp_path / 'one'))


def test_a_compiled_muon_run_trains_as_the_eager_one(data_root, tmp_path, monkeypatch):
    eager = run(data_root, tmp_path / 'eager', max_iters=3, eval_interval=3, dropout=0.0,
                n_layer=1, **MUON)
    compile_ = torch.compile  # the eager backend: dynamo's graph, without inductor's kernels
    monkeypatch.setattr(torch, 'compile', lambda m, **kw: compile_(m, backend='eager', **kw))
    compiled = run(data_root, tmp_path / 'compiled', max_iters=3, eval_interval=3, dropout=0.0,
                   n_layer=1, compile=True, **MUON)
    for a, b in zip(losses(eager), losses(compiled), strict=True):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-4) for k in a)


@pytest.mark.parametrize('kw,message', [
    (dict(optimizer='sgd'), "optimizer must be one of adamw, muon, got 'sgd'"),
    (dict(muon_scale='rms'), "muon_scale must be one of match_rms_adamw, original"),
    (dict(muon_momentum=1.0), "muon_momentum must be at least 0 and below 1, got 1.0"),
    (dict(muon_lr=0.02, learning_rate=0), "muon_lr and learning_rate must be positive"),
])
def test_bad_muon_settings_are_one_line(kw, message):
    with pytest.raises(UserError, match=re.escape(message)):
        train.settings([f'--{k}={v}' for k, v in kw.items()])


@pytest.mark.xdist_group('torchrun')
@pytest.mark.long
@pytest.mark.slow
def test_muon_under_ddp_two_processes_match_one(data_root, tmp_path):
    common = dict(dropout=0.0, max_iters=6, eval_interval=3, lr_decay_iters=6,
                  gradient_accumulation_steps=2, **MUON)
    single = run(data_root, tmp_path / 'one', **common)
    cmd = [*TORCHRUN, '--standalone', '--nproc_per_node=2', 'train.py',
           *argv(data_root, tmp_path / 'two', **common)]
    r = subprocess.run(cmd, cwd=HERE, env=dict(os.environ, OMP_NUM_THREADS='1'),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for a, b in zip(losses(single), losses(read_log(tmp_path / 'two')), strict=True):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-3) for k in a)
    assert_near_state(final_state(tmp_path / 'one'), final_state(tmp_path / 'two'))


def test_optimizers_is_one_optimizer_to_the_grad_scaler():
    model = tiny()
    opt = build_optimizer(model, settings(), 'cpu')
    assert isinstance(opt, Optimizers)
    scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 4)
    idx = torch.randint(0, 64, (2, 16))
    scaler.scale(model(idx, idx)[1]).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    scaler.unscale_(opt)
    assert all(torch.allclose(p.grad * 16, grads[n]) for n, p in model.named_parameters())
    scaler.step(opt)
    assert len(opt.parts['muon'].state) == 8 and len(opt.parts['adamw'].state) > 0
