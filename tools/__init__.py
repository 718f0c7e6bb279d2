"""
Tools that read a finished run and write something new from it: tools.convert (W_Q eliminated
exactly) and tools.export (a Hugging Face folder). Each reads in_dir/ckpt.pt and writes out_dir,
a folder of its own; these are the two keys they share.
"""
import os

from kvgpt.config import Kind, keys


def run_keys(reads, writes, suffix):
    """in_dir, the run a tool reads, and out_dir, where it writes (None: in_dir + suffix)."""
    return keys(in_dir=('out', f"{reads} (in_dir/ckpt.pt)"),
                out_dir=(None, f"{writes}; None: in_dir + '{suffix}'", Kind(str)))


def read_run(c, suffix, check_out_dir):
    """(the folder the tool writes, the run's model, its checkpoint): out_dir (or in_dir with the
    tool's suffix), checked by the tool's own check_out_dir before anything is read; then
    in_dir/ckpt.pt."""
    from kvgpt.checkpoint import model_from_checkpoint  # torch: after the tool's quiet_imports
    out_dir = c['out_dir'] or c['in_dir'].rstrip('/') + suffix
    check_out_dir(out_dir, c['in_dir'])
    model, ckpt = model_from_checkpoint(os.path.join(c['in_dir'], 'ckpt.pt'), verbose=False)
    return out_dir, model, ckpt
