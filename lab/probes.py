"""
Probes of a model, for the research around it: where its parameters sit, what its attention
does (the logits' spread and the softmax's entropy, which the paper's halved scale and lower
weight decay act on), the size of its weights, and whether it has formed induction heads.

train.py runs `probe` below at every evaluation with --probe=lab.probes and adds what it returns
to the evaluation's log line (`diagnostics`, `induction`, `repeat_loss`); lab/report.py draws
them. Each function walks the blocks itself, so the training path is untouched.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F

from kvgpt.data import key_generator
from model import causal_mask

# Keys of the probes' batches, next to the (data_seed, step) keys of the training batches: above
# 2**31, so no training step can draw the same windows (train.py's evaluation windows use 2**31).
DIAGNOSTICS_KEY = 2 ** 31 + 7  # the val windows the attention diagnostics are measured on
INDUCTION_KEY = 2 ** 31 + 8  # the repeated random tokens of the induction probe


def param_breakdown(model):
    """Parameters by part, each tensor once: shows where the 25% attention saving lands."""
    parts = dict(embeddings=0, attention=0, mlp=0, norms=0)
    for name, p in model.named_parameters():  # named_parameters() skips tied/shared duplicates
        if '.attn.' in name:
            parts['attention'] += p.numel()
        elif '.mlp.' in name:
            parts['mlp'] += p.numel()
        elif '.ln_' in name:
            parts['norms'] += p.numel()
        else:
            parts['embeddings'] += p.numel()  # wte, wpe, an untied lm_head
    parts['total'] = sum(parts.values())
    return parts


def attention_probs(block, x, rope=None):
    """(probabilities (B, n_head, T, T), scores, q, k) of block's attention on its input x, in at
    least fp32 (16-bit probabilities underflow to 0; float64 stays float64)."""
    attn, T = block.attn, x.size(1)
    q, k, _ = attn.qkv(block.ln_1(x), rope)
    dtype = torch.promote_types(q.dtype, torch.float32)
    q, k = q.to(dtype), k.to(dtype).repeat_interleave(attn.n_head // attn.n_kv_head, dim=1)
    scale = attn.scale if attn.log_scale is None else \
        attn.log_scale.detach().exp().view(1, -1, 1, 1).to(dtype)  # learn_scale: per head
    with torch.autocast(x.device.type, enabled=False):
        scores = scale * q @ k.transpose(-1, -2)
        probs = torch.softmax(scores.masked_fill(~causal_mask(T, T, x.device), float('-inf')),
                              dim=-1)
    return probs, scores, q, k


@torch.no_grad()
def diagnostics(model, idx):
    """On one batch idx (B, T), per layer: the std of the attention logits after the scale (over
    the causal entries), the mean attention entropy in nats and divided by its maximum ln(t) at
    position t (position 1, with one key, is left out of the latter), the RMS of q and k, and
    with learn_scale each head's learned softmax scale (`scale`). Then the Frobenius norm of each
    weight group. It materialises (B, n_head, T, T): keep B small."""
    T = idx.size(1)
    x, rope = model.embed(idx)
    causal = causal_mask(T, T, idx.device)
    max_entropy = torch.arange(1, T + 1, device=idx.device, dtype=torch.float32).log()
    out = dict(logit_std=[], entropy=[], entropy_norm=[], q_rms=[], k_rms=[])
    for block in model.blocks():
        probs, scores, q, k = attention_probs(block, x, rope)
        entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1)  # (B, nh, T); masked p adds 0
        out['logit_std'].append(scores[..., causal].std().item())
        out['entropy'].append(entropy.mean().item())
        out['entropy_norm'].append((entropy[..., 1:] / max_entropy[1:]).mean().item())
        out['q_rms'].append(q.pow(2).mean().sqrt().item())
        out['k_rms'].append(k.pow(2).mean().sqrt().item())
        if block.attn.log_scale is not None:  # learn_scale: where each head's scale has gone
            out.setdefault('scale', []).append(block.attn.log_scale.exp().tolist())
        x = block(x, rope=rope)
    out['weight_norm'] = weight_norms(model)
    return out


@torch.no_grad()
def induction(model, idx):
    """On idx (B, 2P): P random tokens, then the same P again. Per layer and head, the induction
    score: the mean attention that a token of the second copy pays to the token after its
    earlier occurrence (position i attends to i - P + 1), the pattern of an induction head. And
    repeat_loss, the mean loss on the second copy's targets, which such heads make predictable.
    Small models form these heads in one sudden drop of the loss."""
    P = idx.size(1) // 2
    (x, rope), scores = model.embed(idx), []
    rows = torch.arange(P, 2 * P, device=idx.device)
    for block in model.blocks():
        probs = attention_probs(block, x, rope)[0]
        scores.append(probs[:, :, rows, rows - P + 1].mean(dim=(0, 2)).tolist())
        x = block(x, rope=rope)
    logits = model.lm_head(model.transformer.ln_f(x))[:, P:-1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, P + 1:].reshape(-1))
    return dict(induction=scores, repeat_loss=loss.item())


def weight_norms(model):
    """Frobenius norm of each group of matrices, over all layers (each tensor once)."""
    groups = dict(attn_in=0.0, attn_out=0.0, mlp_in=0.0, mlp_out=0.0, embeddings=0.0)
    for name, p in model.named_parameters():
        if p.dim() < 2:
            continue
        group = ('attn_out' if 'attn.c_proj' in name else 'attn_in' if '.attn.' in name else
                 'mlp_in' if 'mlp.c_fc' in name else 'mlp_out' if 'mlp.c_proj' in name else
                 'embeddings')
        groups[group] += p.detach().double().pow(2).sum().item()
    return {k: math.sqrt(v) for k, v in groups.items()}


def repeated_tokens(data, count, *key):
    """(count, 2P) rows of P random tokens, then the same P again (2P: block_size rounded down to
    even), drawn from key alone: the induction probe's batch. The tokens are drawn uniformly from
    the ids that occur in the first 2^20 training tokens, never the end-of-document token: an id
    the model has never seen (a byte above 127 in source code) measures its surprise, not its
    copying."""
    seen = np.unique(data.read('train', 0, 2 ** 20))
    seen = torch.from_numpy(seen[seen != data.meta['eot']].astype(np.int64))
    g = key_generator(key)
    half = seen[torch.randint(len(seen), (count, data.block_size // 2), generator=g)]
    return torch.cat([half, half], dim=1)


def probe(data, c, device):
    """train.py's evaluation hook (--probe=lab.probes): the probes' batches, drawn once from
    (data_seed, key), and the function that measures a model on them at each evaluation."""
    count = min(4, c['batch_size'])
    windows = data.starts('val', count, c['data_seed'], DIAGNOSTICS_KEY)
    x = data.batch('val', windows, device)[0]
    repeated = repeated_tokens(data, count, c['data_seed'], INDUCTION_KEY).to(device)
    return lambda model: dict(diagnostics=diagnostics(model, x), **induction(model, repeated))
