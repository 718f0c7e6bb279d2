"""
The optimizer a run trains with, built in one place from its settings (build_optimizer): AdamW,
nanoGPT's; or Muon on the matrices inside the blocks and AdamW on the rest (the embeddings, the
head, norms and biases), as nanochat and modded-nanogpt train. The loop, the GradScaler and the
checkpoint take what build_optimizer returns, one optimizer or several as one (Optimizers),
without knowing which. A new optimizer is one more branch of build_optimizer and its keys.
"""
import math

import torch

OPTIMIZERS = ('adamw', 'muon')
MUON_SCALES = ('match_rms_adamw', 'original')
# the settings an optimizer's state dict holds in its param groups, which load_state_dict
# restores: a resume or a branch goes on with its checkpoint's (the LR is the schedule's)
STATE_SETTINGS = {'adamw': ('weight_decay', 'beta1', 'beta2'),
                  'muon': ('weight_decay', 'beta1', 'beta2', 'muon_momentum', 'muon_scale')}


def build_optimizer(model, c, device_type):
    """The optimizer c['optimizer'] names, over every trainable parameter of model. The loop sets
    each param group's 'lr' to the schedule's LR; Muon's own peak (muon_lr) is its lr_scale."""
    betas = (c['beta1'], c['beta2'])
    if c['optimizer'] == 'adamw':
        return model.configure_optimizers(c['weight_decay'], c['learning_rate'], betas,
                                          device_type)
    groups = muon_groups(model)
    on_muon = {id(p) for group in groups for p in group['params']}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in on_muon]
    adamw = torch.optim.AdamW(
        [{'params': [p for p in rest if p.dim() >= 2], 'weight_decay': c['weight_decay']},
         {'params': [p for p in rest if p.dim() < 2], 'weight_decay': 0.0}],
        lr=c['learning_rate'], betas=betas, fused=True if device_type == 'cuda' else None)
    muon = Muon(groups, lr=c['learning_rate'], weight_decay=c['weight_decay'],
                momentum=c['muon_momentum'], scale=c['muon_scale'],
                lr_scale=muon_lr_scale(c))
    return Optimizers(adamw=adamw, muon=muon)


def muon_lr_scale(c):
    """Muon's LR over the schedule's: muon_lr / learning_rate, or 1 where muon_lr is unset."""
    return 1.0 if c['muon_lr'] is None else c['muon_lr'] / c['learning_rate']


def muon_groups(model):
    """Muon's param groups: the 2-D parameters inside the blocks, and among them the attention's
    fused input projections (c_attn), whose split gives the rows of the W_Q, W_K and W_V the model
    has: Muon orthogonalizes each of those on its own."""
    blocks, attn = model.transformer.h, model.transformer.h[0].attn
    fused = [block.attn.c_attn.weight for block in blocks]
    whole = [p for block in blocks for p in block.parameters()
             if p.dim() == 2 and all(p is not f for f in fused)]
    split = tuple(n for n in (attn.q_dim, attn.k_dim, attn.v_dim) if n)
    return [{'params': whole}, {'params': fused, 'split': split}]


class Muon(torch.optim.Optimizer):
    """Muon (Keller Jordan, 2024): Nesterov momentum whose update of each matrix is orthogonalized
    by Newton-Schulz steps, with decoupled weight decay; torch.optim.Muon's arithmetic (torch 2.9
    on; tests/test_optimizer.py checks the two equal), on any torch, and two things more:
    - a group's `split` (rows) stacks several matrices in one parameter, each orthogonalized and
      scaled on its own: the fused c_attn's W_Q, W_K, W_V are three matrices, not one;
    - lr_scale multiplies the group's 'lr', which the schedule sets: Muon's peak over AdamW's.
    scale: the LR per matrix shape, torch's adjust_lr_fn ('original' or 'match_rms_adamw')."""

    def __init__(self, params, lr, weight_decay, momentum=0.95, nesterov=True, ns_steps=5,
                 scale='original', split=None, lr_scale=1.0):
        if scale not in MUON_SCALES:
            raise ValueError(f"scale must be one of {', '.join(MUON_SCALES)}, got {scale!r}")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                      nesterov=nesterov, ns_steps=ns_steps, scale=scale,
                                      split=split))
        self.lr_scale = lr_scale  # the settings', not the state dict's: a resume takes today's

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, momentum = group['lr'] * self.lr_scale, group['momentum']
            for p in group['params']:
                if p.grad is None:
                    continue
                state = self.state[p]
                if 'momentum_buffer' not in state:
                    state['momentum_buffer'] = torch.zeros_like(p.grad)
                buf = state['momentum_buffer']
                buf.lerp_(p.grad, 1 - momentum)  # the gradients' moving average
                update = p.grad.lerp(buf, momentum) if group['nesterov'] else buf
                p.mul_(1 - lr * group['weight_decay'])
                rows = group['split'] or (p.size(0),)
                for matrix, u in zip(p.split(rows), update.split(rows)):
                    matrix.add_(orthogonalize(u, group['ns_steps']),
                                alpha=-lr * shape_scale(matrix.shape, group['scale']))


NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)  # Jordan's quintic: steep at 0, near 1 after 5 steps


def orthogonalize(g, steps):
    """About U V^T of g = U S V^T, in bfloat16: each step maps every singular value s to
    a s + b s^3 + c s^5, so that after 5 steps all but the tiny ones are near 1, though not at 1
    (which would take more steps and trains no better). Divided by its Frobenius norm first, so
    that every s starts at most 1."""
    a, b, c = NEWTON_SCHULZ
    x = g.bfloat16()
    wide = g.size(0) <= g.size(1)  # the Gram matrix of the shorter side is the cheaper
    x = x if wide else x.T
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x if wide else x.T


def shape_scale(shape, scale):
    """The LR's factor for a matrix of shape (rows, cols)."""
    rows, cols = shape
    if scale == 'match_rms_adamw':  # Moonshot: the update's RMS about AdamW's, 0.2
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1, rows / cols))  # Jordan: a tall matrix's update as large per entry


class Optimizers:
    """Several optimizers, each over its own parameters, used as one: their param groups, state,
    steps, zero_grad and state dicts in turn. torch's GradScaler unscales and steps it as it
    does one."""

    def __init__(self, **parts):
        self.parts = parts

    @property
    def param_groups(self):
        return [g for part in self.parts.values() for g in part.param_groups]

    @property
    def state(self):  # each parameter's, whichever part holds it
        return {p: s for part in self.parts.values() for p, s in part.state.items()}

    def step(self):
        for part in self.parts.values():
            part.step()

    def zero_grad(self, set_to_none=True):
        for part in self.parts.values():
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {name: part.state_dict() for name, part in self.parts.items()}

    def load_state_dict(self, state):
        for name, part in self.parts.items():
            part.load_state_dict(state[name])
