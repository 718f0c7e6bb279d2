import json
import os
import re
import subprocess
import sys

import pytest
import torch

from kvgpt.checkpoint import load_checkpoint
from kvgpt.tokenizer import get_tokenizer
from model import GPT
import prepare
from tools import export
import train

pytestmark = pytest.mark.gpt2_bpe  # every test exports a model trained on GPT-2 BPE data
transformers = pytest.importorskip(
    'transformers', reason='transformers is the optional Hugging Face export dependency')
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
VARIANTS = {
    'baseline': [],
    # the halved scale is folded into W_Q
    'reduced': ['--query=identity', '--weight_decay=0.03125'],
    'reduced_mlp': ['--query=identity', '--mlp_hidden=144', '--tie_weights=False'],
    'key_identity_bias': ['--key_identity=True', '--bias=True', '--activation=relu'],
    # a learned scale per head, folded into each head's rows of W_Q
    'learned_scale': ['--query=identity', '--learn_scale=True'],
}


class Runs(dict):
    """Tiny models trained a few steps on GPT-2 tokens, each the first time a test asks for it
    (pytest-xdist spreads the tests over workers: each trains only the variants it tests)."""

    def __init__(self, root):
        super().__init__()
        self.root = root
        docs = root / 'docs.jsonl'
        with open(docs, 'w') as f:
            for d in prepare.pydocs_topics()[:30]:
                f.write(json.dumps({'text': d}) + '\n')
        prepare.prepare(dict(prepare.DEFAULTS, dataset=str(docs), tokenizer='gpt2',
                             data_root=str(root), num_proc=1, out_name='d'))

    def __missing__(self, name):
        out = self[name] = str(self.root / name)
        train.main([f'--data_root={self.root}', '--dataset=d', f'--out_dir={out}', '--n_layer=2',
                    '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
                    '--gradient_accumulation_steps=1', '--max_iters=4', '--eval_interval=4',
                    '--eval_iters=1', '--device=cpu', '--compile=False', '--dtype=float32',
                    '--learning_rate=1e-2', *VARIANTS[name]])
        return out


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp('export'))


@pytest.mark.slow  # each trains a model and loads it in transformers
@pytest.mark.parametrize('name', VARIANTS)
def test_export_round_trips_exactly(runs, tmp_path, name):
    before = open(os.path.join(runs[name], 'ckpt.pt'), 'rb').read()
    res = export.export(dict(export.DEFAULTS, in_dir=runs[name], out_dir=str(tmp_path / 'hf')))
    # the checkpoint is only read
    assert open(os.path.join(runs[name], 'ckpt.pt'), 'rb').read() == before
    assert sorted(os.listdir(tmp_path)) == ['hf']  # no temporary folder left behind
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / 'hf').eval()
    ckpt = load_checkpoint(os.path.join(runs[name], 'ckpt.pt'))
    ours = GPT.from_checkpoint(ckpt, verbose=False).eval()
    idx = torch.randint(50257, (3, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (ours(idx, targets=idx)[0] - hf(idx).logits).abs().max().item()
    assert diff < 1e-5 and res['max_logit_diff'] < 1e-5
    prompt = idx[:1, :5]
    greedy = hf.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=50256)
    assert torch.equal(greedy, ours.generate(prompt, 20, temperature=0.0))
    if name == 'reduced':  # W_Q = I written out, scaled by the folded 1/2
        q = hf.transformer.h[0].attn.c_attn.weight[:, :32]
        torch.testing.assert_close(q, torch.eye(32) / 2)


def test_exported_tokenizer_is_gpt2s(runs, tmp_path):
    export.export(dict(export.DEFAULTS, in_dir=runs['baseline'], out_dir=str(tmp_path / 'hf')))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / 'hf')
    text = "def encode(self, text):\n    return ids  # naïve café"
    assert tok.encode(text) == get_tokenizer('gpt2').encode(text)
    assert tok.eos_token_id == 50256
    umask = os.umask(0)
    os.umask(umask)
    modes = {f: os.stat(tmp_path / 'hf' / f).st_mode & 0o777 for f in os.listdir(tmp_path / 'hf')}
    assert modes == dict.fromkeys(modes, 0o666 & ~umask)  # as any file this user writes


@pytest.mark.slow
def test_models_gpt2_cannot_hold_are_refused_in_one_line(runs, tmp_path):
    ckpt = load_checkpoint(os.path.join(runs['baseline'], 'ckpt.pt'))
    Config = GPT.from_checkpoint(ckpt, verbose=False).config.__class__
    nonlinear = GPT(Config(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=50304,
                           query='nonlinear'), verbose=False)
    os.makedirs(tmp_path / 'nl')
    torch.save(dict(model=nonlinear.state_dict(), model_args=nonlinear.config.__dict__,
                    meta=ckpt['meta']), tmp_path / 'nl' / 'ckpt.pt')
    r = subprocess.run([sys.executable, '-m', 'tools.export', f'--in_dir={tmp_path / "nl"}',
                        f'--out_dir={tmp_path / "x"}'], cwd=HERE, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: cannot export {tmp_path / 'nl'} to GPT-2's format: its query is 'nonlinear', "
        "not a matrix: GPT-2's attention has a linear query only"]
    assert not (tmp_path / 'x').exists()
    for kw, words in [(dict(n_kv_head=1), 'grouped-query'),
                      (dict(norm=False), 'theoretical block'),
                      (dict(share_layers=True), 'share one block'),
                      (dict(pos='rope'), "'rope' (rotary)"),
                      (dict(qk_norm=True), 'normalises q and k per head')]:
        assert words in export.refusal(Config(n_head=2, n_embd=32, **kw), 'gpt2')
    assert 'no GPT-2 tokenizer' in export.refusal(Config(), 'byte')


@pytest.mark.parametrize('modern', [dict(pos='rope'), dict(qk_norm=True)])
def test_rope_and_qk_norm_checkpoints_are_refused_and_nothing_is_written(runs, tmp_path, modern):
    ckpt = load_checkpoint(os.path.join(runs['baseline'], 'ckpt.pt'))
    cfg = GPT.from_checkpoint(ckpt, verbose=False).config.__class__(
        n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=50304, **modern)
    model = GPT(cfg, verbose=False)
    os.makedirs(tmp_path / 'm')
    torch.save(dict(model=model.state_dict(), model_args=cfg.__dict__, meta=ckpt['meta']),
               tmp_path / 'm' / 'ckpt.pt')
    with pytest.raises(export.UserError, match="cannot export .* to GPT-2's format"):
        export.export(dict(export.DEFAULTS, in_dir=str(tmp_path / 'm'),
                           out_dir=str(tmp_path / 'x')))
    assert not (tmp_path / 'x').exists()


def test_an_export_replaces_only_an_earlier_export(runs, tmp_path, monkeypatch):
    # out_dir is replaced whole: a mistyped one must not take a run or anyone's files with it
    run = runs['baseline']
    before = sorted(os.listdir(run))
    mine = tmp_path / 'mine'
    mine.mkdir()
    (mine / 'notes.txt').write_text('important')
    monkeypatch.chdir(tmp_path)
    for out_dir, words in [(run, 'is or holds the run it exports'),
                           (os.path.dirname(run), 'is or holds the run it exports'),
                           ('.', 'is or holds the working folder'),
                           (str(mine), 'holds files that are not an earlier export'),
                           (str(mine / 'notes.txt'), 'is a file')]:
        with pytest.raises(export.UserError, match=f"^--out_dir={re.escape(out_dir)} {words}"):
            export.export(dict(export.DEFAULTS, in_dir=run, out_dir=out_dir))
    assert sorted(os.listdir(run)) == before and (mine / 'notes.txt').read_text() == 'important'
    export.export(dict(export.DEFAULTS, in_dir=run, out_dir='hf'))
    (tmp_path / 'hf' / 'stale.txt').write_text('from the earlier export')
    export.export(dict(export.DEFAULTS, in_dir=run, out_dir='hf'))  # an earlier export: replaced
    assert 'stale.txt' not in os.listdir('hf') and os.path.isfile('hf/model.safetensors')


def test_a_failed_export_leaves_no_temporary_folder(runs, tmp_path, monkeypatch):
    def no_tokenizer(folder, block_size):
        raise export.UserError("GPT-2's tokenizer files are not cached")
    monkeypatch.setattr(export, 'write_tokenizer', no_tokenizer)
    with pytest.raises(export.UserError, match="not cached"):
        export.export(dict(export.DEFAULTS, in_dir=runs['baseline'], out_dir=str(tmp_path / 'hf')))
    assert os.listdir(tmp_path) == []
