"""
HellaSwag-style multiple choice, scored from a checkpoint of any query mode, position scheme and
tokenizer, on the CPU or a GPU:

    python -m evals.hellaswag --out_dir=out-reduced                  # HellaSwag's val set (cached)
    python -m evals.hellaswag --out_dir=out-demo --data=items.jsonl --limit=500
    python -m evals.hellaswag --init_from=gpt2                        # GPT-2 124M: ~29.5% acc_norm

Each item is a context and four endings. An ending's score is its summed log-likelihood after the
context (`acc` picks the highest) and that sum per character of the ending (`acc_norm`). The
text is formed as lm-evaluation-harness's `hellaswag` task forms it, and each request is
tokenized and truncated as its causal models do, so the two give the same choices (tested on
an exported model). train.py runs it at the end and every hellaswag_interval steps when asked.
"""
import json
import os
import re
import sys
import time
import urllib.request

if not __package__:  # run as a file, not with -m: import from the repository root all the same
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from kvgpt.errors import quiet_imports  # first: Ctrl-C in the imports below is one line
quiet_imports(__name__)

import torch
import torch.nn.functional as F

from kvgpt.checkpoint import load_checkpoint
from kvgpt.config import Kind, defaults, keys, parse_config
from kvgpt.device import DTYPES, setup_device
from kvgpt.errors import UserError, run_main
from kvgpt.files import atomic_write, write_json
from kvgpt.tokenizer import get_tokenizer

KEYS = keys(
    out_dir=('out', "the run to score (out_dir/ckpt.pt); the result goes to "
             "out_dir/hellaswag.json"),
    init_from=('resume', "'resume' (out_dir/ckpt.pt), or 'gpt2'..'gpt2-xl' (the hub's weights)"),
    data=('download', "a .jsonl in HellaSwag's schema, or 'download': its val set, cached"),
    limit=(None, "score the first this many items; None: all (10,042 in the val set)",
           Kind(int, optional=True)),
    batch_size=(32, "endings per forward pass"),
    json_path=(None, "where the result goes; None: out_dir/hellaswag.json", Kind(str)),
    device=(None, "None: cuda when available, else cpu", Kind('device')),
    dtype=(None, "None: bfloat16 on a GPU with native bf16, float16 on an older one, "
                  "float32 on cpu", Kind(str, DTYPES)),
)
DEFAULTS = defaults(KEYS)
VAL_URL = 'https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl'
CACHE = os.path.join(os.path.expanduser('~'), '.cache', 'kvgpt')
FIELDS = ('ctx_a', 'ctx_b', 'activity_label', 'endings', 'label')


# -----------------------------------------------------------------------------
# the items

def download(url=VAL_URL, cache=CACHE, key='--data'):
    """HellaSwag's val set, downloaded once into the cache (complete before it has its name)."""
    from filelock import FileLock
    path = os.path.join(cache, os.path.basename(url))
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    with FileLock(path + '.lock'):  # ranks or runs started together download it once
        if not os.path.exists(path):
            print(f"downloading {url} to {cache}")
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    body = response.read()
            except OSError as e:
                raise UserError(f"cannot download HellaSwag ({e}); offline, pass a local copy: "
                                f"{key}=path/to/hellaswag_val.jsonl") from None
            atomic_write(path, lambda tmp: write_bytes(tmp, body))
    return path


def write_bytes(path, body):
    with open(path, 'wb') as f:
        f.write(body)


def clean(text):
    """The HellaSwag task's text cleaning: WikiHow's bracketed markup goes, ' [title]' ends a
    sentence, and doubled spaces become one."""
    text = text.strip().replace(' [title]', '. ')
    return re.sub(r'\[.*?\]', '', text).replace('  ', ' ')


def check_item(doc):
    """Why doc is not a HellaSwag record, or None: a wrong label or ending scores silently."""
    missing = [k for k in FIELDS if k not in doc]
    if missing:
        return f"it lacks {', '.join(missing)}"
    endings, label = doc['endings'], doc['label']
    if not isinstance(endings, list) or not all(isinstance(e, str) for e in endings):
        return "its endings are not a list of strings"
    if len(endings) < 2:
        return "it has fewer than two endings"
    if not all(isinstance(doc[k], str) for k in ('ctx_a', 'ctx_b', 'activity_label')):
        return "its ctx_a, ctx_b and activity_label are not all strings"
    if isinstance(label, bool) or not isinstance(label, (int, str)) or not (
            str(label).isdigit() and int(label) < len(endings)):
        return f"its label {label!r} is not the index of one of its {len(endings)} endings"
    return None


def item(doc):
    """(context, endings, gold) of one HellaSwag record."""
    context = clean(f"{doc['activity_label']}: {doc['ctx_a']} {doc['ctx_b'].capitalize()}")
    return context, [clean(e) for e in doc['endings']], int(doc['label'])


def load(data, limit=None, key='--data'):
    """The items of a HellaSwag-format .jsonl (or 'download'), each line checked; key: the
    setting that names the file, in the advice (train.py's is --hellaswag)."""
    path = download(key=key) if data == 'download' else data
    if not os.path.isfile(path):
        raise UserError(f"no HellaSwag file at {path}: pass {key}=path/to/file.jsonl, or "
                        f"{key}=download")
    items = []
    with open(path, 'rb') as f:  # bytes, so that a line that is not UTF-8 is named
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode('utf-8-sig' if number == 1 else 'utf-8')
            except UnicodeDecodeError:
                raise UserError(f"{path} line {number} is not UTF-8 text: save the file as "
                                "UTF-8") from None
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                reason = check_item(doc) if isinstance(doc, dict) else "it is not an object"
                if reason:
                    raise ValueError(reason)
                items.append(item(doc))
            except (ValueError, TypeError, AttributeError) as e:
                raise UserError(f"{path} line {number} is not a HellaSwag item ({e}): it needs "
                                f"{', '.join(FIELDS)}") from None
            if limit is not None and len(items) == limit:
                break
    if not items:
        raise UserError(f"{path} holds no items")
    return items


# -----------------------------------------------------------------------------
# the scores

def request(tok, context, ending):
    """(the ids of context, a space and the ending; how many of the last are scored), as
    lm-eval's causal models make them: the scored ids are those of the whole text past the
    context's own, and a context's trailing spaces (' [title]' leaves one) count as the
    ending's."""
    whole = tok.encode(f"{context} {ending}")
    return whole, len(whole) - len(tok.encode(context.rstrip()))


@torch.no_grad()
def log_likelihoods(model, requests, ctx, device):
    """The summed log-probability of each request's last n tokens, (ids, n) each. A request
    longer than the model's block keeps its last block_size + 1 ids, as lm-eval truncates (an
    ending longer than the block is scored on its last block_size tokens)."""
    block = model.config.block_size
    windows = [(ids[-(block + 1):], min(n, block)) for ids, n in requests]
    T = max(len(ids) for ids, _ in windows) - 1
    x = torch.zeros(len(windows), T, dtype=torch.long)
    y = torch.full((len(windows), T), -1, dtype=torch.long)
    for row, (ids, _) in enumerate(windows):
        x[row, :len(ids) - 1] = torch.tensor(ids[:-1])
        y[row, :len(ids) - 1] = torch.tensor(ids[1:])  # right padding: causal, so it is unseen
    with ctx:
        logits, _ = model(x.to(device), y.to(device))
    sums = []
    for row, (ids, n) in enumerate(windows):
        end = len(ids) - 1
        logp = F.log_softmax(logits[row, end - n:end].float(), dim=-1)
        sums.append(logp.gather(1, y[row, end - n:end, None].to(device)).sum().item())
    return sums


def score(model, tok, items, ctx, device, batch_size=32, indices=None):
    """Per item: its endings' log-likelihoods, the choices by sum and per character, the gold.
    indices: which items (a rank's share); None: all."""
    model.eval()
    results = {}
    chosen = list(range(len(items))) if indices is None else list(indices)
    per_batch = max(1, batch_size // len(items[0][1]))
    for first in range(0, len(chosen), per_batch):
        batch = chosen[first:first + per_batch]
        requests = [request(tok, items[i][0], e) for i in batch for e in items[i][1]]
        lls = log_likelihoods(model, requests, ctx, device)
        for i in batch:
            context, endings, gold = items[i]
            mine, lls = lls[:len(endings)], lls[len(endings):]
            per_char = [ll / len(e) if e else float('-inf') for ll, e in zip(mine, endings)]
            results[i] = dict(lls=mine, pred=argmax(mine), pred_norm=argmax(per_char), gold=gold)
    return results


def argmax(values):  # the first of equal maxima, as numpy's
    return max(range(len(values)), key=lambda k: (values[k], -k))


def correct(results):
    """(right by sum, right per character, items) of scored items."""
    return (sum(r['pred'] == r['gold'] for r in results.values()),
            sum(r['pred_norm'] == r['gold'] for r in results.values()), len(results))


def accuracies(results):
    by_sum, by_char, n = correct(results)
    return dict(acc=by_sum / n, acc_norm=by_char / n, items=n)


def during_training(model, tok, items, ctx, device, batch_size, share, reduce):
    """The accuracies for train.py's log line: each rank scores its share of the items (share,
    which stops on a signal), then reduce sums the counts over ranks."""
    per_round = max(1, batch_size // len(items[0][1]))
    rounds = [range(i, min(i + per_round, len(items))) for i in range(0, len(items), per_round)]
    counts = torch.zeros(3, dtype=torch.float64, device=device)
    for chunk in share(rounds):
        results = score(model, tok, items, ctx, device, batch_size, chunk)
        counts += torch.tensor(correct(results), dtype=torch.float64, device=device)
    model.train()
    reduce(counts)
    return dict(hellaswag_acc=(counts[0] / counts[2]).item(),
                hellaswag_acc_norm=(counts[1] / counts[2]).item())


def scorer(c, tokenizer, dev, ddp):
    """train.py's hook for its hellaswag settings: scorer(model, share) gives the log line's
    accuracies, the items shared over the ranks (summed by an all-reduce under DDP)."""
    from kvgpt.distributed import all_reduce  # one that fails clearly when a rank stays away
    items = load(c['hellaswag'], c['hellaswag_items'], '--hellaswag')
    tok = get_tokenizer(tokenizer)
    reduce = all_reduce if ddp else (lambda counts: None)
    return lambda model, share: during_training(model, tok, items, dev.ctx, dev.device,
                                                4 * c['batch_size'], share, reduce)


# -----------------------------------------------------------------------------
# the script

def evaluate(c):
    from sample import load_model
    if c['limit'] is not None and (not isinstance(c['limit'], int) or c['limit'] < 1):
        raise UserError(f"limit must be a positive number of items or None, got {c['limit']!r}")
    if not isinstance(c['batch_size'], int) or c['batch_size'] < 1:
        raise UserError(f"batch_size must be a positive integer, got {c['batch_size']!r}")
    if c['data'] == 'download' and c['init_from'] == 'resume':  # a wrong run folder: before it
        load_checkpoint(os.path.join(c['out_dir'], 'ckpt.pt'), mmap=True)
    items = load(c['data'], c['limit'])
    dev = setup_device(c['device'], c['dtype'], compile=False)
    model, tok = load_model(c)
    model.to(dev.device)
    t0, results, step = time.time(), {}, max(1, len(items) // 10)
    for first in range(0, len(items), step):
        results.update(score(model, tok, items, dev.ctx, dev.device, c['batch_size'],
                             range(first, min(first + step, len(items)))))
        a = accuracies(results)
        print(f"{a['items']}/{len(items)} items: acc {a['acc']:.4f}, acc_norm "
              f"{a['acc_norm']:.4f} ({time.time() - t0:.0f} s)", flush=True)
    a = accuracies(results)
    path = c['json_path'] or os.path.join(c['out_dir'], 'hellaswag.json')
    out = dict(a, data=c['data'], init_from=c['init_from'], seconds=time.time() - t0,
               per_item=[results[i] for i in range(len(items))])
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)  # --init_from=gpt2: a new folder
    write_json(path, out)
    print(f"hellaswag: acc {a['acc']:.4f}, acc_norm {a['acc_norm']:.4f} over {a['items']} items "
          f"(chance {sum(1 / len(e) for _, e, _ in items) / len(items):.4f}); wrote {path}")
    return out


def main(argv=None):
    return evaluate(parse_config(KEYS, argv, show=True, usage=__doc__))


if __name__ == '__main__':
    run_main(main)
