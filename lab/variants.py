"""
The model variants: every config/<name>.py that names a run (out_dir) without choosing data
defines one. bench.py, lab.report and the studies read this list; nothing else names them.
"""
import os

from common import UserError, run_config_file

# the repository's config/ folder, beside lab/
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'config')


def variants(config):
    """The model variants, in name order: every config/<name>.py that names a run (out_dir) without
    choosing data (the CPU bases set dataset, directly or by stacking). A variant is defined by its
    file alone: bench.py, lab.report and the studies read this list, nothing else names them."""
    names = []
    for f in sorted(os.listdir(CONFIG_DIR)):
        if f.endswith('.py'):
            made = run_config_file(os.path.join(CONFIG_DIR, f), config)
            if 'out_dir' in made and 'dataset' not in made:
                names.append(f[:-3])
    return names


def variant_settings(name, config, keys):
    """The settings among keys (the model's) that config/<name>.py makes, evaluated against config,
    so a file written against n_embd fits any geometry."""
    known = variants(config)
    if name not in known:
        raise UserError(f"unknown variant '{name}': choose from {', '.join(known)} "
                        "(a file config/<name>.py)")
    made = run_config_file(os.path.join(CONFIG_DIR, f'{name}.py'), config)
    return {k: v for k, v in made.items() if k in keys}
