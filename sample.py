"""
Sample from a trained model, streaming tokens as they come:

    python sample.py --out_dir=out-demo
    python sample.py --out_dir=out-reduced --start="FILE:prompt.txt" --num_samples=3 --top_p=0.9
    python sample.py --init_from=gpt2 --start="The meaning of life is"

The checkpoint carries the model and the tokenizer, so nothing is repeated here. Decoding
uses model.py's KV cache: the prompt is prefilled once, then one token per step.
"""
from kvgpt.errors import quiet_imports  # first: Ctrl-C in the imports below is one line
quiet_imports(__name__)

import os
import sys
import torch

from kvgpt.checkpoint import model_from_checkpoint
from kvgpt.config import Kind, defaults, keys, parse_config
from kvgpt.device import DTYPES, setup_device
from kvgpt.errors import UserError, model_errors, quiet_hub, run_main
from kvgpt.tokenizer import get_tokenizer, stream_decoder
from model import GPT

KEYS = keys(
    out_dir=('out', "the run to sample from (out_dir/ckpt.pt)"),
    init_from=('resume', "'resume' (out_dir/ckpt.pt), a checkpoint file (a kept "
               "ckpt_<step>.pt), 'gpt2'..'gpt2-xl' or a local HF GPT-2 folder"),
    start=('\n', "the prompt, or FILE:path to read it from a file"),
    num_samples=(3, "samples drawn, one after another"),
    max_new_tokens=(500, "tokens generated per sample at most"),
    temperature=(0.8, "0 is greedy"),
    top_k=(200, "None: no top-k filtering", Kind(int, optional=True)),
    top_p=(None, "nucleus sampling, in (0, 1]", Kind(float)),
    stop_at_eot=(True, "end a sample at the end-of-text token"),
    seed=(1337, "the sampling generator's seed: the same seed, the same samples"),
    device=(None, "None: cuda when available, else cpu", Kind('device')),
    dtype=(None, "None: bfloat16 on cuda where native, float16 on older GPUs, float32 on cpu",
           Kind(str, DTYPES)),
    compile=(False, "True: torch.compile the decoding steps"),
    use_cache=(True, "False: recompute the whole context for every token (for comparison)"),
)
DEFAULTS = defaults(KEYS)


def check_settings(c):
    if not isinstance(c['num_samples'], int) or c['num_samples'] < 1:
        raise UserError(f"num_samples must be a positive integer, got {c['num_samples']!r}")
    if not isinstance(c['max_new_tokens'], int) or c['max_new_tokens'] < 0:
        raise UserError("max_new_tokens must be a non-negative integer, "
                        f"got {c['max_new_tokens']!r}")
    if c['temperature'] < 0:
        raise UserError(f"temperature must be >= 0 (0 is greedy), got {c['temperature']}")
    if c['top_k'] is not None and (not isinstance(c['top_k'], int) or c['top_k'] <= 0):
        raise UserError(f"top_k must be a positive integer or None, got {c['top_k']!r}")
    top_p = c['top_p']
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise UserError(f"top_p must be in (0, 1] or None, got {c['top_p']!r}")


def load_model(c):
    """(model, tokenizer) from out_dir/ckpt.pt, a checkpoint file or GPT-2 weights."""
    resume = c['init_from'] == 'resume'
    path = os.path.join(c['out_dir'], 'ckpt.pt') if resume else c['init_from']
    if resume or os.path.isfile(path):
        model, ckpt = model_from_checkpoint(path)
        # nanoGPT checkpoints carry no tokenizer: theirs are GPT-2 BPE (OpenWebText, Shakespeare)
        name = ckpt['meta'].get('tokenizer', 'gpt2')
        return model, get_tokenizer(name)
    if c['init_from'] in ('scratch', 'auto'):
        raise UserError(f"sample.py's init_from is resume (out_dir's checkpoint), a checkpoint "
                        f"file, gpt2..gpt2-xl or a local GPT-2 folder, got {c['init_from']!r}")
    quiet_hub('transformers')  # its import resets the hub's logger
    with model_errors():
        return GPT.from_pretrained(c['init_from']), get_tokenizer('gpt2')


def read_prompt(start):
    if not start.startswith('FILE:'):
        return start
    path = start[5:]
    if not os.path.isfile(path):
        raise UserError(f"prompt file {path} not found")
    try:
        with open(path, encoding='utf-8') as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"prompt file {path} is not UTF-8 text (byte {e.start}): save it as "
                        "UTF-8") from None
    except OSError as e:
        raise UserError(f"cannot read prompt file {path} ({e.strerror})") from None


def encode_prompt(text, tok, model):
    ids = tok.encode(text)
    if not ids:
        print("warning: empty prompt: starting from the end-of-text token", file=sys.stderr)
        ids = [tok.eot]
    vocab = model.config.vocab_size
    if max(ids) >= vocab:
        raise UserError(f"the prompt has token {max(ids)}, outside the model's vocabulary of "
                        f"{vocab}: this checkpoint was not trained with the {tok.name} tokenizer")
    block = model.config.block_size
    if len(ids) > block:
        print(f"warning: the prompt has {len(ids)} tokens, more than block_size {block}: "
              f"keeping the last {block}", file=sys.stderr)
        ids = ids[-block:]
    return ids


def sample(c):
    check_settings(c)
    prompt = read_prompt(c['start'])
    dev = setup_device(c['device'], c['dtype'], c['compile'])
    model, tok = load_model(c)
    dev.for_inference(model)
    if dev.compile:
        # in place, so generate()'s own calls run compiled; positions vary
        model.compile(dynamic=True)
    ids = encode_prompt(prompt, tok, model)
    generator = torch.Generator(device=dev.device).manual_seed(c['seed'])
    texts = []
    for i in range(c['num_samples']):
        print(f"---------- sample {i + 1} of {c['num_samples']} ----------")
        decoder, pieces = stream_decoder(), []
        print(decoder.decode(tok.decode_bytes(ids)), end='', flush=True)
        x = torch.tensor([ids], dtype=torch.long, device=dev.device)
        with dev.ctx:
            eot = tok.eot if c['stop_at_eot'] else None
            stream = model.generate_stream(x, c['max_new_tokens'], c['temperature'], c['top_k'],
                                           c['top_p'], c['use_cache'], generator, eot)
            for nxt in stream:  # end-of-text decodes to nothing
                piece = decoder.decode(tok.decode_bytes([nxt.item()]))
                pieces.append(piece)
                print(piece, end='', flush=True)
        tail = decoder.decode(b'', final=True)
        print(tail)
        texts.append(''.join(pieces) + tail)
    return texts


def main(argv=None):
    return sample(parse_config(KEYS, argv, usage=__doc__))


if __name__ == '__main__':
    run_main(main)
