"""The HellaSwag-style evaluator: every query mode and both tokenizers score a checkpoint, batched
scores equal one ending at a time, it runs during training into log.jsonl (shared over ranks),
and its choices and accuracies equal lm-evaluation-harness's on the exported model."""
import json
import os

import numpy as np
import pytest
import torch

import train
from kvgpt.checkpoint import load_checkpoint
from kvgpt.errors import UserError
from evals import hellaswag
from model import GPT, QUERY_MODES
from test_export import Runs
from test_train import argv, read_log
from kvgpt.tokenizer import get_tokenizer

WORDS = ('the man picks up a brush and paints the fence while the dog watches from the porch '
         'then she [title] Rinse the bowl. [step] Fill it with   warm water and soap').split()


def write_items(path, n=8, seed=0):
    """HellaSwag's schema, with WikiHow's markup and contexts longer than a tiny model's block."""
    rng = np.random.default_rng(seed)
    with open(path, 'w') as f:
        for i in range(n):
            words = lambda k: ' '.join(rng.choice(WORDS, k))  # noqa: E731
            f.write(json.dumps(dict(
                ind=i, activity_label=f'Painting {i}', ctx_a=words(5 + 6 * (i % 5)),
                ctx_b=words(3), ctx='unused', split='val', split_type='indomain',
                endings=[words(1 + (i + k) % 6) for k in range(4)], label=str(i % 4),
                source_id=f'x{i}')) + '\n')
    return str(path)


def one_at_a_time(model, tok, items):
    """Each ending's log-likelihood from its own forward pass, with no batching or padding."""
    out = []
    for context, endings, _ in items:
        row = []
        for ending in endings:
            ids, n = hellaswag.request(tok, context, ending)
            ids, n = ids[-(model.config.block_size + 1):], min(n, model.config.block_size)
            x, y = torch.tensor([ids[:-1]]), torch.tensor([ids[1:]])
            logits, _ = model(x, y)
            logp = torch.log_softmax(logits[0, -n:], -1).gather(1, y[0, -n:, None])
            row.append(logp.sum().item())
        out.append(row)
    return out


CASES = [('byte', q) for q in QUERY_MODES] + [  # the GPT-2 BPE cases train 50k-token embeddings
    pytest.param('gpt2', q, marks=[pytest.mark.slow, pytest.mark.gpt2_bpe])
    for q in ('linear', 'identity')]


@pytest.mark.parametrize('tokenizer, query', CASES)
def test_every_query_mode_and_tokenizer_scores_a_checkpoint(data_root, tmp_path, query,
                                                            tokenizer, capsys):
    items_path = write_items(tmp_path / 'items.jsonl')
    if tokenizer == 'gpt2':  # test_export's tiny GPT-2 BPE runs: block_size 32, so truncated
        out = Runs(tmp_path)['baseline' if query == 'linear' else 'reduced']
    else:
        out = str(tmp_path / 'out')
        train.main(argv(data_root, out, query=query, max_iters=4, eval_interval=4,
                        pos='rope' if query == 'nonlinear' else 'learned'))
    result = hellaswag.main([f'--out_dir={out}', f'--data={items_path}', '--batch_size=5'])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('hellaswag: acc ')
    assert result['items'] == 8 and 0 <= result['acc'] <= 1 and 0 <= result['acc_norm'] <= 1
    assert json.load(open(os.path.join(out, 'hellaswag.json')))['acc'] == result['acc']
    model = GPT.from_checkpoint(load_checkpoint(os.path.join(out, 'ckpt.pt')), verbose=False)
    items = hellaswag.load(items_path)
    expected = one_at_a_time(model.eval(), get_tokenizer(tokenizer), items)
    for got, want, (_, endings, gold) in zip(result['per_item'], expected, items):
        assert np.allclose(got['lls'], want, atol=1e-4) and got['gold'] == gold
        assert got['pred'] == int(np.argmax(want))
        assert got['pred_norm'] == int(np.argmax(np.array(want) / [len(e) for e in endings]))


# -----------------------------------------------------------------------------
# the reference: lm-evaluation-harness scores the exported model on the same items

LM_EVAL_TASK = """include: {hellaswag_yaml}
task: kvgpt_local_hellaswag
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    validation: {items}
training_split: null
"""


def lm_eval_scores(hf_dir, items_path, tmp_path):
    """lm-eval's per-item log-likelihoods and choices, and its accuracies, through a local task
    that includes its own hellaswag task (its text processing) with the items as the data."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    tasks = tmp_path / 'tasks'
    tasks.mkdir()
    hellaswag_yaml = os.path.join(os.path.dirname(lm_eval.__file__), 'tasks', 'hellaswag',
                                  'hellaswag.yaml')
    (tasks / 'kvgpt_local_hellaswag.yaml').write_text(
        LM_EVAL_TASK.format(hellaswag_yaml=hellaswag_yaml, items=items_path))
    out = lm_eval.simple_evaluate(
        model='hf', model_args=f'pretrained={hf_dir},dtype=float32', device='cpu', batch_size=4,
        tasks=['kvgpt_local_hellaswag'], task_manager=TaskManager(include_path=str(tasks)),
        log_samples=True)
    samples = sorted(out['samples']['kvgpt_local_hellaswag'], key=lambda s: s['doc_id'])
    lls = [[float(r[0][0]) for r in s['resps']] for s in samples]
    return out['results']['kvgpt_local_hellaswag'], lls, samples


@pytest.mark.slow  # trains, exports and runs lm-eval (its import alone takes seconds)
@pytest.mark.reference
@pytest.mark.gpt2_bpe
@pytest.mark.parametrize('name', ['baseline', 'reduced'])
def test_choices_and_accuracies_equal_lm_evaluation_harness(tmp_path, name, capsys):
    pytest.importorskip('lm_eval', reason='lm-eval, the reference, is in requirements-dev.txt')
    from tools import export
    items_path = write_items(tmp_path / 'items.jsonl', n=24, seed=1)
    out = Runs(tmp_path)[name]
    hf_dir = str(tmp_path / 'hf')
    export.export(dict(export.DEFAULTS, in_dir=out, out_dir=hf_dir))
    ours = hellaswag.main([f'--out_dir={out}', f'--data={items_path}', '--batch_size=8'])
    results, lls, samples = lm_eval_scores(hf_dir, items_path, tmp_path)
    for mine, theirs, sample in zip(ours['per_item'], lls, samples):
        assert np.allclose(mine['lls'], theirs, atol=1e-3)
        assert mine['pred'] == int(np.argmax(theirs)) and mine['gold'] == int(sample['target'])
        assert float(mine['pred'] == mine['gold']) == sample['acc']
        assert float(mine['pred_norm'] == mine['gold']) == sample['acc_norm']
    assert ours['acc'] == pytest.approx(results['acc,none'], abs=1e-12)
    assert ours['acc_norm'] == pytest.approx(results['acc_norm,none'], abs=1e-12)
    assert len(samples) == 24


# -----------------------------------------------------------------------------
# during training, the item file, the download

def test_train_scores_hellaswag_at_the_end_and_every_interval(data_root, tmp_path):
    items_path = write_items(tmp_path / 'items.jsonl')
    out = tmp_path / 'out'
    train.main(argv(data_root, out, hellaswag=items_path, hellaswag_interval=10,
                    hellaswag_items=6))
    scored = [e for e in read_log(out) if 'hellaswag_acc' in e]
    assert [e['iter'] for e in scored] == [0, 10, 20] and 'val_loss_full' in scored[-1]
    model = GPT.from_checkpoint(load_checkpoint(out / 'ckpt.pt'), verbose=False)
    items = hellaswag.load(items_path, limit=6)
    results = hellaswag.score(model, get_tokenizer('byte'), items, torch.no_grad(), 'cpu')
    assert scored[-1]['hellaswag_acc'] == hellaswag.accuracies(results)['acc']
    assert scored[-1]['hellaswag_acc_norm'] == hellaswag.accuracies(results)['acc_norm']
    out2 = tmp_path / 'end_only'
    train.main(argv(data_root, out2, hellaswag=items_path))
    assert [e['iter'] for e in read_log(out2) if 'hellaswag_acc' in e] == [20]


def test_ranks_share_the_items_and_their_counts_sum_to_one_process(tmp_path):
    torch.manual_seed(0)
    from model import GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=257),
                verbose=False)
    tok, items = get_tokenizer('byte'), hellaswag.load(write_items(tmp_path / 'i.jsonl'))
    one = hellaswag.during_training(model, tok, items, torch.no_grad(), 'cpu', 8, iter,
                                    lambda counts: None)
    # two ranks, as Signals.all_ranks_share shares them
    shares = [lambda rounds, r=r: rounds[r::2] for r in range(2)]
    totals = []
    for share in shares:
        hellaswag.during_training(model, tok, items, torch.no_grad(), 'cpu', 8, share,
                                  totals.append)
    counts = totals[0] + totals[1]
    assert counts[2] == len(items) and totals[0][2] > 0 and totals[1][2] > 0
    assert one == dict(hellaswag_acc=(counts[0] / counts[2]).item(),
                       hellaswag_acc_norm=(counts[1] / counts[2]).item())


def test_the_val_set_downloads_once_into_the_cache(tmp_path, monkeypatch, capsys):
    source = write_items(tmp_path / 'hellaswag_val.jsonl')
    cache = tmp_path / 'cache'
    path = hellaswag.download(f'file://{source}', str(cache))
    assert open(path, 'rb').read() == open(source, 'rb').read()
    os.remove(source)  # the second time, the cache answers
    assert hellaswag.download(f'file://{source}', str(cache)) == path
    assert len(hellaswag.load(path)) == 8
    with pytest.raises(UserError, match="cannot download HellaSwag .*--data=path"):
        hellaswag.download(f'file://{tmp_path}/missing.jsonl', str(cache))
    assert not os.path.exists(cache / 'missing.jsonl')


def test_a_run_folder_without_a_checkpoint_is_said_before_the_download(tmp_path, monkeypatch,
                                                                      command_line):
    def download(*a, **k):
        raise AssertionError('downloaded HellaSwag for a run that has no checkpoint')
    monkeypatch.setattr(hellaswag, 'download', download)
    code, err = command_line(hellaswag, [f'--out_dir={tmp_path}/nope'])
    assert code == 2 and err.strip().splitlines() == [
        f"error: no checkpoint at {tmp_path}/nope/ckpt.pt: train one first, or name a run "
        "directory that holds one"]


@pytest.mark.parametrize('line, message', [
    ('{"ctx_a": "a"}', 'line 2 is not a HellaSwag item (it lacks ctx_b, activity_label'),
    ('not json', 'line 2 is not a HellaSwag item'),
    ('{"ctx_a": "a", "ctx_b": "b", "activity_label": "c", "endings": ["x"], "label": 0}',
     'it has fewer than two endings'),
    # each of these once scored silently, as a wrong answer or a mangled item
    ('{"ctx_a": "a", "ctx_b": "b", "activity_label": "c", "endings": ["x", "y"], "label": 7}',
     'its label 7 is not the index of one of its 2 endings'),
    ('{"ctx_a": "a", "ctx_b": "b", "activity_label": "c", "endings": ["x", "y"], "label": -1}',
     'its label -1 is not the index'),
    ('{"ctx_a": "a", "ctx_b": "b", "activity_label": "c", "endings": "abcd", "label": 0}',
     'its endings are not a list of strings'),
    ('{"ctx_a": null, "ctx_b": "b", "activity_label": "c", "endings": ["x", "y"], "label": 0}',
     'its ctx_a, ctx_b and activity_label are not all strings'),
    ('[1, 2]', 'it is not an object'),
])
def test_a_bad_item_file_is_one_line(tmp_path, command_line, line, message):
    path = tmp_path / 'items.jsonl'
    good = open(write_items(tmp_path / 'good.jsonl')).readline()
    path.write_text(good + line + '\n')
    code, err = command_line(hellaswag, [f'--data={path}', f'--out_dir={tmp_path}'])
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err
    code, err = command_line(hellaswag, [f'--data={tmp_path}/none.jsonl'])
    assert code == 2 and 'no HellaSwag file at' in err


def test_a_file_that_is_not_utf8_is_one_line_and_a_bom_is_read(tmp_path, command_line):
    good = open(write_items(tmp_path / 'good.jsonl')).readline()
    path = tmp_path / 'items.jsonl'
    path.write_bytes(good.encode() + good.replace('"label"', '"lab\u00e9l"').encode('latin-1'))
    code, err = command_line(hellaswag, [f'--data={path}', f'--out_dir={tmp_path}'])
    assert code == 2 and err.strip() == f"error: {path} line 2 is not UTF-8 text: save the file " \
        "as UTF-8"
    path.write_bytes(b'\xef\xbb\xbf' + good.encode())  # a BOM, as some editors save
    assert hellaswag.load(str(path)) == hellaswag.load(str(tmp_path / 'good.jsonl'))[:1]
