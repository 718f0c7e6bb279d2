"""
The whole kvgpt model in one file: a GPT-2 style pre-LN decoder in which one of the attention
weights W_Q, W_K, W_V can be fixed to the identity. It imports only torch: copy it anywhere.

Karbevski & Mijoski, "Key and Value Weights Are Probably All You Need" (arXiv 2510.23912):
attention sees its input X only through XW_Q, XW_K, XW_V, so a change of basis moves W_Q into
the neighbouring weights. With `query='identity'` head h's query is the coordinate slice
[h*hd, (h+1)*hd) of the attention input (the ln_1 output), the input projection makes only K
and V, and every layer loses n_embd^2 weights, 25% of the attention. Module names follow
nanoGPT (transformer.wte, h.N.attn.c_attn, ...), so nanoGPT checkpoints load as baselines.
"""
import math
import os
from contextlib import nullcontext
from dataclasses import InitVar, dataclass, field, fields
from typing import Optional

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


# How head h's query is made from the attention input x (the ln_1 output):
#   linear         x W_Q                       GPT-2
#   identity       x                           the paper: W_Q = I, a coordinate slice per head
#   residual       x + x W_Q                   the authors' code
#   residual_gelu  x + GELU(x W_Q)             the authors' code
#   nonlinear      mix * (x + f(x)),           the follow-up (arXiv 2603.13381), mix = 1/2 and
#                  f = LN(GELU(RMSNorm(x) W1) W2), W1: d x r, W2: r x d, r = d/2: W_Q's d^2
QUERY_MODES = ('linear', 'identity', 'residual', 'residual_gelu', 'nonlinear')
POSITIONS = ('learned', 'rope')  # GPT-2's wpe table, or rotary q and k
ACTIVATIONS = {'gelu': lambda x: F.gelu(x), 'gelu_tanh': lambda x: F.gelu(x, approximate='tanh'),
               'relu': F.relu}


def setting(default, text, choices=None):
    """A GPTConfig field with the line `python train.py --help` shows for it."""
    return field(default=default, metadata=dict(help=text, choices=choices))


@dataclass
class GPTConfig:
    """The model's settings. A setting left None is derived here from the others (in
    __post_init__, or `scale` for the softmax scale), so config files state choices only and a
    later --n_embd or --n_head never leaves a derived width or scale stale."""
    block_size: int = setting(1024, "the longest sequence: positions 0..block_size-1")
    vocab_size: int = setting(50304, "GPT-2's 50257 padded up to a multiple of 64 for speed")
    n_layer: int = setting(12, "transformer blocks")
    n_head: int = setting(12, "attention heads per block; head size n_embd // n_head")
    n_embd: int = setting(768, "width of the residual stream")
    dropout: float = setting(
        0.0, "on attention weights, residual writes and embeddings (training only)")
    bias: bool = setting(False, "biases in Linears and LayerNorms")
    tie_weights: bool = setting(True, "lm_head shares the token embedding")
    mlp_hidden: Optional[int] = setting(None, "the MLP's width; None: mlp_ratio x n_embd")
    mlp_ratio: float = setting(4.0, "the MLP's width over n_embd, rounded toward 4 (the paper's "
                               "larger MLP: 4.5, 3456 at n_embd 768)")
    query: str = setting('linear', "how queries are made; 'identity' is the paper's reduced "
                         "model", QUERY_MODES)
    query_rank: Optional[int] = setting(
        None, "nonlinear query: bottleneck width r; None: query_ratio x n_embd")
    query_ratio: float = setting(0.5, "nonlinear query: r over n_embd (the follow-up's 1/2)")
    query_mix: float = setting(
        0.5, "nonlinear query: q = query_mix * (x + f(x)); follow-up's code: 1.0")
    key_identity: bool = setting(False, "W_K = I (theory: any one of the three may go)")
    value_identity: bool = setting(False, "W_V = I")
    attn_scale: Optional[float] = setting(
        None, "the softmax scale; None: attn_scale_factor / sqrt(head size)")
    attn_scale_factor: Optional[float] = setting(
        None, "None: 1/2 when Q or K is I (the paper's halved scale), else 1")
    n_kv_head: Optional[int] = setting(None, "None: n_head; fewer is grouped-query attention")
    pos: str = setting('learned', "'learned' (GPT-2's wpe table) or 'rope' (rotary q and k, no "
                       "wpe)", POSITIONS)
    rope_base: float = setting(10000.0, "RoPE: the wavelength base of its frequencies")
    qk_norm: bool = setting(False, "RMSNorm (learned gain) of q and k per head, before RoPE")
    learn_scale: bool = setting(
        False, "a learned softmax scale per head, exp(theta_h) from ln(scale)")
    # the paper's theoretical settings (section 4), off by default
    norm: bool = setting(True, "False: no LayerNorm anywhere (where the theorems are exact)")
    mlp_residual: bool = setting(True, "False: the skip connection surrounds only the attention")
    share_layers: bool = setting(False, "one block's weights reused n_layer times (ALBERT-style)")
    activation: str = setting('gelu', "'gelu_tanh': OpenAI GPT-2's approximation; 'relu': "
                              "theorem 8.4's", tuple(ACTIVATIONS))
    init_std: Optional[float] = setting(None, "every weight's init std (residual projections "
                                        "/√(2 n_layer)); None: 0.02, GPT-2's, or see init_width")
    init_width: Optional[int] = setting(None, "init_std None: 0.02 * sqrt(init_width / n_embd), "
                                        "GPT-2's σ·√d at this width (config/gpt2_init.py)")
    query_identity: InitVar[bool] = False  # the paper's flag: True is query='identity', not stored

    def __post_init__(self, query_identity=False):
        if query_identity:  # 'linear' is the unset default here
            self.query = upgrade_query(dict(query_identity=True, query=None if self.query ==
                                            'linear' else self.query))['query']
        self.check_positive('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd',
                            'init_width', 'attn_scale_factor', 'attn_scale')
        width = self.n_embd
        if self.mlp_hidden is None:  # rounded toward 4x: 3.5 and 4.5 are n_embd // 2 either side
            self.mlp_hidden = 4 * width + int((self.mlp_ratio - 4) * width)
        if self.query_rank is None:
            self.query_rank = int(self.query_ratio * width)
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.init_std is None:  # GPT-2's 0.02, or its σ·√d kept at init_width
            self.init_std = 0.02 * (self.init_width / width) ** 0.5 if self.init_width else 0.02
        self.check_positive('mlp_hidden', 'n_kv_head', 'query_rank', 'query_mix', 'init_std')
        identities = ([f"query='{self.query}'"] if self.query != 'linear' else []) + [
            n for n in ('key_identity', 'value_identity') if getattr(self, n)]
        rope_ok = self.pos != 'rope' or (self.head_dim % 2 == 0 and self.rope_base > 0)
        for ok, problem in (
                (self.query in QUERY_MODES,
                 f"query must be one of {', '.join(QUERY_MODES)}, got {self.query!r}"),
                (len(identities) <= 1, "at most one of query='identity' (or another non-linear "
                 f"query), key_identity, value_identity may be set, got {identities}"),
                (self.n_embd % self.n_head == 0,
                 f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"),
                (self.n_head % self.n_kv_head == 0,
                 f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})"),
                (not (self.key_identity or self.value_identity) or self.n_kv_head == self.n_head,
                 "key_identity/value_identity need n_kv_head == n_head (with grouped-query "
                 "attention K and V are narrower than the input)"),
                (self.activation in ACTIVATIONS, f"activation must be one of "
                 f"{', '.join(ACTIVATIONS)}, got {self.activation!r}"),
                (0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}"),
                (self.pos in POSITIONS,
                 f"pos must be 'learned' or 'rope', got {self.pos!r}"),
                (rope_ok, f"pos='rope' needs an even head size and rope_base > 0, got head size "
                 f"{self.head_dim} and rope_base {self.rope_base}")):
            if not ok:
                raise ValueError(problem)

    @classmethod
    def from_dict(cls, args):
        """A config from saved model_args (read by upgrade_query), ignoring keys nanoGPT adds."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in upgrade_query(args).items() if k in known})

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def scale(self):
        """attn_scale, or attn_scale_factor / sqrt(hd), the factor 1/2 for W_Q = I (or W_K = I) as
        the paper does: with one learned matrix in the logits they start with a larger variance."""
        if self.attn_scale is not None:
            return float(self.attn_scale)
        factor = self.attn_scale_factor
        if factor is None:
            factor = 0.5 if self.query == 'identity' or self.key_identity else 1.0
        return factor / math.sqrt(self.head_dim)

    def check_positive(self, *names):
        for name in names:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")


def upgrade_query(args):
    """The one reading of old settings: query_identity=True (the paper's flag, and kvgpt's before
    `query`) is query='identity'; query None is 'linear'; a contradiction is an error."""
    args = dict(args)
    legacy, query = args.pop('query_identity', False), args.get('query')
    if legacy and query not in (None, 'identity'):
        raise ValueError(f"query_identity=True contradicts query='{query}': set query only")
    if legacy or query is None:
        args['query'] = 'identity' if legacy else 'linear'
    return args


class KVCache:
    """K and V of every layer, one tensor each, written in place (a 5-D one compile would copy)."""

    def __init__(self, config, batch_size, device=None, dtype=torch.float32):
        shape = (batch_size, config.n_kv_head, config.block_size, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.pos = 0  # number of positions filled

    def nbytes(self):  # the cache's memory
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class QueryMLP(nn.Module):
    """The follow-up's nonlinear query f(x) = LN(GELU(RMSNorm(x) W1) W2): W_Q's d^2 at r = d/2."""

    def __init__(self, config):
        super().__init__()
        self.norm = nn.RMSNorm(config.n_embd)
        self.fc = nn.Linear(config.n_embd, config.query_rank, bias=config.bias)
        self.proj = nn.Linear(config.query_rank, config.n_embd, bias=config.bias)
        self.ln = nn.LayerNorm(config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.ln(self.proj(F.gelu(self.fc(self.norm(x)))))


def causal_mask(T, S, device=None):
    """(T, S) boolean of allowed entries for T queries at the last T of S positions: each sees
    every key up to its own position."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)


def decoding_attention(device):
    """Attention kernels for decoding, whose key length grows by one each step: on CUDA any but
    cuDNN's, which builds a plan for each new shape (on an H200, decoding GPT-2 small with it ran
    at about 20 tokens/s over new lengths, about 390 compiled over lengths seen: docs/gpu.md).
    Elsewhere torch's own choice."""
    if torch.device(device).type != 'cuda':
        return nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def rope_tables(positions, head_dim, base):
    """(cos, sin), each (T, head_dim), of rotary embeddings at positions: pair (i, i + hd/2) turns
    by position * base^(-2i/hd). In float64: a float32 angle at 10^4 is off by ~10^-3 rad."""
    freqs = base ** (-torch.arange(0, head_dim, 2, device=positions.device).double() / head_dim)
    angles = positions.double()[:, None] * freqs[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x, rope):
    """x (B, heads, T, head_dim) rotated by rope = (cos, sin): the dot product of a rotated q at
    position m and a rotated k at position n depends on m - n only."""
    cos, sin = rope
    half = x.size(-1) // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + turned * sin.to(x.dtype)


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        C, hd = config.n_embd, config.head_dim
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, hd
        self.query, self.query_mix = config.query, config.query_mix
        kv_dim = config.n_kv_head * hd
        # The fused input projection makes only the linear parts, in q, k, v order: a W_Q for
        # the linear and residual queries, none for identity and nonlinear; no W_K or W_V where
        # that one is the identity.
        self.key_identity, self.value_identity = config.key_identity, config.value_identity
        self.q_dim = C if config.query in ('linear', 'residual', 'residual_gelu') else 0
        self.k_dim = 0 if config.key_identity else kv_dim
        self.v_dim = 0 if config.value_identity else kv_dim
        self.c_attn = nn.Linear(C, self.q_dim + self.k_dim + self.v_dim, bias=config.bias)
        self.q_mlp = QueryMLP(config) if config.query == 'nonlinear' else None
        self.c_proj = nn.Linear(C, C, bias=config.bias)
        # QK-norm: each head's q and k to RMS 1 (a learned gain per dimension, shared by the
        # heads): the logits start at std scale * sqrt(hd) whatever the stream's size.
        self.q_norm = nn.RMSNorm(hd) if config.qk_norm else None
        self.k_norm = nn.RMSNorm(hd) if config.qk_norm else None
        self.scale, self.dropout = config.scale, config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        # learn_scale: n_head parameters per layer, 1-D so without weight decay
        self.log_scale = nn.Parameter(torch.full((config.n_head,), math.log(config.scale))) \
            if config.learn_scale else None

    def make_query(self, x, xq):
        """The query of every query mode, from x and x W_Q (empty when there is no W_Q)."""
        if self.query == 'linear':
            return xq
        if self.query == 'identity':
            return x
        if self.query == 'residual':
            return x + xq
        if self.query == 'residual_gelu':
            return x + F.gelu(xq)
        if self.query == 'nonlinear':
            return self.query_mix * (x + self.q_mlp(x))
        raise ValueError(f"query must be one of {', '.join(QUERY_MODES)}, got {self.query!r}")

    def qkv(self, x, rope=None):
        """Heads of q (B, nh, T, hd), k and v (B, nkv, T, hd); an identity one is x itself. Then
        QK-norm and the rotation by rope = (cos, sin) where the model has them."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split([self.q_dim, self.k_dim, self.v_dim], dim=2)
        q = self.make_query(x, q)
        k, v = (x if self.key_identity else k), (x if self.value_identity else v)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate(q, rope), rotate(k, rope)
        return q, k, v

    def forward(self, x, cache=None, layer=0, rope=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x, rope)  # under RoPE the cache holds k rotated at its own position
        mask, causal = None, True
        if cache is not None:
            k, v, mask, causal = self.cached(cache, layer, k, v)
        scale = self.scale
        if self.log_scale is not None:  # per head, on q; SDPA's own scale is then 1
            q, scale = q * self.log_scale.exp().view(1, -1, 1, 1).to(q.dtype), 1.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           scale=scale, enable_gqa=k.size(1) != q.size(1),
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    @staticmethod
    def cached(cache, layer, k, v):
        """k, v written into the KV cache at its position p: (every key and value so far, the mask,
        whether SDPA's causal mask fits). Queries at p..p+T-1 see every key up to themselves."""
        p, T = cache.pos, k.size(2)
        cache.k[layer][:, :, p:p + T], cache.v[layer][:, :, p:p + T] = k, v
        if p == 0:  # the first chunk: SDPA's own causal mask (a branch, not a traced bool)
            return cache.k[layer][:, :, :T], cache.v[layer][:, :, :T], None, True
        mask = causal_mask(T, p + T, k.device) if T > 1 else None
        return cache.k[layer][:, :, :p + T], cache.v[layer][:, :, :p + T], mask, False


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.act = ACTIVATIONS[config.activation]

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


def make_norm(config):
    return nn.LayerNorm(config.n_embd, bias=config.bias) if config.norm else nn.Identity()


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)
        self.mlp_residual = config.mlp_residual

    def forward(self, x, cache=None, layer=0, rope=None):
        x = x + self.attn(self.ln_1(x), cache, layer, rope)
        m = self.mlp(self.ln_2(x))
        return x + m if self.mlp_residual else m


class GPT(nn.Module):

    def __init__(self, config, verbose=True):
        super().__init__()
        self.config = config
        n_blocks = 1 if config.share_layers else config.n_layer
        # in this order, which sets the order of the init's draws
        layers = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.pos == 'learned':  # RoPE has no position table
            layers['wpe'] = nn.Embedding(config.block_size, config.n_embd)
        layers.update(drop=nn.Dropout(config.dropout),
                      h=nn.ModuleList([Block(config) for _ in range(n_blocks)]),
                      ln_f=make_norm(config))
        self.transformer = nn.ModuleDict(layers)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, 0.0, config.init_std / math.sqrt(2 * config.n_layer))
        if verbose:
            print(f"number of parameters: {self.get_num_params() / 1e6:.2f}M")

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def get_num_params(self):  # each tensor once: tied embeddings, shared blocks
        return sum(p.numel() for p in self.parameters())

    def blocks(self):  # the block applied at each layer (the same one n_layer times if shared)
        h = self.transformer.h
        return [h[0] if self.config.share_layers else h[i] for i in range(self.config.n_layer)]

    def embed(self, idx, start=0):
        """(the token embeddings plus learned positions, RoPE's (cos, sin) or None)."""
        pos = torch.arange(start, start + idx.size(1), dtype=torch.long, device=idx.device)
        if self.config.pos == 'rope':
            return self.transformer.wte(idx), rope_tables(pos, self.config.head_dim,
                                                          self.config.rope_base)
        return self.transformer.wte(idx) + self.transformer.wpe(pos), None

    def forward(self, idx, targets=None, cache=None, offset=0):
        """Logits (and with targets the loss) of idx (B, T) from position offset or the cache's."""
        B, T = idx.shape
        start = cache.pos if cache is not None else offset
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than block_size "
                             f"{self.config.block_size}")
        x, rope = self.embed(idx, start)
        x = self.transformer.drop(x)
        for layer, block in enumerate(self.blocks()):
            x = block(x, cache, layer, rope)
        x = self.transformer.ln_f(x)
        if cache is not None:
            cache.pos += T
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None  # inference: only the last position is needed
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW: decay on every tensor of 2+ dims (matmuls, embeddings), none on norms, biases."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{'params': [p for p in params if p.dim() >= 2], 'weight_decay': weight_decay},
                  {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.0}]
        # on CUDA the fused AdamW (one kernel for all tensors); elsewhere torch's default
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas,
                                 fused=True if device_type == 'cuda' else None)

    def flops_per_token(self, T=None):
        """Training FLOPs per token (forward + backward, PaLM appendix B): 6 per matmul weight as
        applied (a shared block n_layer times) plus the attention scores and sums."""
        cfg, T = self.config, T or self.config.block_size
        per_layer = sum(p.numel() for p in self.blocks()[0].parameters() if p.dim() == 2)
        matmul = cfg.n_layer * per_layer + self.lm_head.weight.numel()
        return 6 * matmul + 12 * cfg.n_layer * cfg.n_embd * T

    def estimate_mfu(self, tokens_per_iter, dt, peak_flops, T=None):
        """Model FLOPs utilization against a device's peak FLOP/s; None where that is unknown."""
        if peak_flops is None or dt <= 0:
            return None
        return self.flops_per_token(T) * tokens_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate_stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                        use_cache=True, generator=None, eos_token=None):
        """Yield the next tokens (B, 1) one step at a time; temperature 0 is greedy; with eos_token
        it stops once every row has made it. The cache prefills the prompt, then takes a token a
        step. Past block_size both paths slide a window of the last block_size tokens (the cache
        rebuilt from it each step): learned positions end there; under RoPE no logit changes."""
        block, cache = self.config.block_size, None
        done = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
        for _ in range(max_new_tokens):
            with decoding_attention(idx.device):
                if not use_cache:
                    logits, _ = self(idx[:, -block:])
                elif cache is None or cache.pos >= block:
                    cache = KVCache(self.config, idx.size(0), idx.device,
                                    self.cache_dtype(idx.device))
                    logits, _ = self(idx[:, -block:], cache=cache)
                else:
                    logits, _ = self(idx[:, -1:], cache=cache)
            nxt = sample_next(logits[:, -1, :].float(), temperature, top_k, top_p, generator)
            idx = torch.cat((idx, nxt), dim=1)
            yield nxt
            if eos_token is not None:
                done |= nxt[:, 0] == eos_token
                if done.all():
                    return

    def cache_dtype(self, device):  # the autocast dtype when one is active, else the weights'
        kind = torch.device(device).type
        return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else \
            self.lm_head.weight.dtype

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                 eos_token=None, use_cache=True, generator=None):
        """idx (B, T) extended by up to max_new_tokens (see generate_stream)."""
        steps = self.generate_stream(idx, max_new_tokens, temperature, top_k, top_p, use_cache,
                                     generator, eos_token)
        return torch.cat([idx, *steps], dim=1)

    @classmethod
    def from_checkpoint(cls, ckpt, verbose=True):
        """The model of a checkpoint dict: kvgpt's, or nanoGPT's (kvgpt's defaults describe it)."""
        state = {k.removeprefix('module.').removeprefix('_orig_mod.'): v
                 for k, v in ckpt['model'].items()}
        try:
            model = cls(GPTConfig.from_dict(ckpt['model_args']), verbose=verbose)
            model.load_state_dict(state)
        except (ValueError, RuntimeError, TypeError) as e:
            # torch's first line only names the model; the tensor and its shapes come after it
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            if len(lines) > 1 and lines[0].startswith('Error(s) in loading'):
                lines = lines[1:]
            more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
            raise ValueError(f"checkpoint weights do not fit its model_args: {lines[0][:300]}"
                             + more) from None
        return model

    @classmethod
    def from_pretrained(cls, name_or_path, dropout=0.0):
        """OpenAI GPT-2 weights: a hub name (gpt2..gpt2-xl) or a folder saved by transformers."""
        hf = load_hf_gpt2(name_or_path)
        h = hf.config  # its Conv1D weights are stored transposed; GPT-2's MLP uses tanh GELU
        act = {'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh', 'gelu': 'gelu',
               'relu': 'relu'}.get(h.activation_function)
        if act is None:
            raise ValueError(f"unsupported GPT-2 activation {h.activation_function!r}")
        model = cls(GPTConfig(n_layer=h.n_layer, n_head=h.n_head, n_embd=h.n_embd,
                              block_size=h.n_positions, vocab_size=h.vocab_size, bias=True,
                              tie_weights=True, dropout=dropout,
                              mlp_hidden=h.n_inner or 4 * h.n_embd, activation=act))
        ours = model.state_dict()
        with torch.no_grad():
            for k, v in hf.state_dict().items():
                if k.endswith(('.attn.bias', '.attn.masked_bias')):
                    continue  # the causal mask buffers
                if k not in ours:
                    raise ValueError(f"unexpected tensor {k} in the GPT-2 weights")
                ours[k].copy_(v.T if k.endswith(HF_TRANSPOSED) else v)
        return model


GPT2_SIZES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')
HF_TRANSPOSED = ('attn.c_attn.weight', 'attn.c_proj.weight',  # GPT-2's Conv1D weights,
                 'mlp.c_fc.weight', 'mlp.c_proj.weight')  # stored transposed


def load_hf_gpt2(name_or_path):
    if name_or_path not in GPT2_SIZES and not os.path.isdir(str(name_or_path)):
        raise ValueError(f"init_from {name_or_path!r} is no file or folder here, nor one of "
                         f"{', '.join(GPT2_SIZES)}: name one of those, a local GPT-2 folder or a "
                         "checkpoint file (train.py also takes scratch, resume and auto)")
    if os.path.isfile(os.path.join(str(name_or_path), 'ckpt.pt')):  # a kvgpt run's folder
        raise ValueError(f"{name_or_path} is a run folder, not GPT-2 weights: name its "
                         f"checkpoint (init_from={os.path.join(str(name_or_path), 'ckpt.pt')}), "
                         f"or pass out_dir={name_or_path} with init_from=resume (sample.py: "
                         "out_dir alone)")
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        raise ImportError("loading GPT-2 weights needs transformers: pip install transformers")
    try:
        return GPT2LMHeadModel.from_pretrained(name_or_path)
    except Exception as e:
        raise ValueError(f"cannot load GPT-2 weights '{name_or_path}' ({type(e).__name__}): "
                         "without network, save them once with transformers and pass the folder"
                         ) from None


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """One token per row from logits (B, V): greedy at temperature 0, else top-k, then nucleus."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    # less the row's largest first: a tiny temperature then sends the others to -inf, not inf/inf
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = logits.masked_fill(logits < v[:, [-1]], float('-inf'))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # keep the smallest prefix reaching top_p
        logits = torch.full_like(logits, float('-inf')).scatter(
            -1, order, sorted_logits.masked_fill(drop, float('-inf')))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)
