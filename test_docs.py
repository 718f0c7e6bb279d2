"""The docs' commands, the standalone model file, and variants defined by their config file
alone."""
import ast
import glob
import importlib
import os
import re
import shlex

import pytest

import bench
import common
import report
import train
from model import GPTConfig

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = [os.path.join(HERE, 'README.md')] + sorted(glob.glob(os.path.join(HERE, 'docs', '*.md')))
PARSERS = {'train.py': train.settings}  # the other scripts parse with their DEFAULTS


def bash_commands(path):
    """(line, argv) of every command in the file's fenced bash blocks, comments and continuations
    joined."""
    text = open(path).read()
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
        for line in block.replace('\\\n', ' ').splitlines():
            line = line.split(' #')[0].strip()
            if line and not line.startswith('#'):
                for part in line.split('&&'):
                    yield line, shlex.split(part)


def script_and_args(argv):
    """The .py or .sh script a command runs and the arguments after it; None for pip and pytest."""
    for i, word in enumerate(argv):
        if word.endswith(('.py', '.sh')) and '=' not in word:
            return word, argv[i + 1:]
    return None, argv


@pytest.mark.parametrize('path', DOCS, ids=os.path.basename)
def test_every_documented_command_names_a_real_script_config_and_flag(path):
    """A dry parse of each command: the script exists, its config files exist and every --key is
    one of its settings with a value of the right type. Nothing runs, so the offline-only ones
    pass too."""
    commands = list(bash_commands(path))
    if os.path.basename(path) == 'README.md':
        assert len(commands) >= 12
    for line, argv in commands:
        script, args = script_and_args(argv)
        if script is None:
            if argv[:2] == ['pip', 'install'] and '-r' in argv:
                assert os.path.isfile(os.path.join(HERE, argv[argv.index('-r') + 1])), line
            elif argv[:2] == ['pip', 'install']:
                cpu = ['torch', '--index-url', 'https://download.pytorch.org/whl/cpu']
                assert argv[2:] == cpu, line
            continue
        assert os.path.isfile(os.path.join(HERE, script)), line
        if script.endswith('.sh'):
            continue
        args = [os.path.join(HERE, a) if a.startswith('config/') else a for a in args]
        if script == 'report.py':
            args = [a for a in args if a.startswith('--')]  # the others are run directories
        defaults = lambda: importlib.import_module(script[:-3]).DEFAULTS
        parse = PARSERS.get(script) or (lambda a: common.parse_config(defaults(), a))
        parse(args)  # a UserError names the unknown key or the bad value


def test_model_py_imports_nothing_from_the_project():
    tree = ast.parse(open(os.path.join(HERE, 'model.py')).read())
    nodes = list(ast.walk(tree))
    imported = {alias.name.split('.')[0] for node in nodes if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split('.')[0] for node in nodes if isinstance(node, ast.ImportFrom)}
    ours = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(HERE, '*.py'))} | {'config'}
    assert imported and not imported & ours, imported & ours
    # the last: optional, for GPT-2 weights
    assert imported <= {'torch', 'inspect', 'math', 'os', 'dataclasses', 'typing', 'transformers'}


def test_a_new_variant_is_one_file_in_config(tmp_path, monkeypatch):
    """A file added to the config folder (here a copy of config/ under tmp_path) is a variant
    everywhere."""
    import shutil
    folder = tmp_path / 'config'
    shutil.copytree(common.CONFIG_DIR, folder)
    monkeypatch.setattr(common, 'CONFIG_DIR', str(folder))
    name = 'zz_test_variant'
    (folder / f'{name}.py').write_text("out_dir = 'out-zz'\nquery = 'identity'\n"
                                       "mlp_hidden = 5 * n_embd\n")
    report.known_variants.cache_clear()
    try:
        geometry = dict(GPTConfig().__dict__)
        assert name in common.variants(geometry) and name in report.known_variants()
        cfg = bench.variant_config(name, dict(bench.DEFAULTS, n_embd=64, n_head=2))
        assert (cfg.query, cfg.mlp_hidden, cfg.n_embd) == ('identity', 320, 64)
        assert bench.main(['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16',
                           '--vocab_size=64', '--batch_size=2', '--steps=1', '--warmup=1',
                           f'--variants=baseline,{name}'])
        colour = report.variant_color(name)
        assert report.variant_color(f'{name}_s1') == colour != report.variant_color('baseline')
    finally:
        report.known_variants.cache_clear()
    monkeypatch.undo()
    assert name not in common.variants(geometry)  # the checkout's config/ never held it


def test_each_variant_keeps_one_colour_and_the_demo_bases_are_not_variants():
    names = report.known_variants()
    assert {'baseline', 'reduced', 'reduced_mlp', 'nonlinear'} <= set(names)
    assert not {'demo', 'small', 'repro', 'theory'} & set(names)
    assert (report.variant_color('reduced_mlp_lr0.002_wd0_s101')
            == report.variant_color('reduced_mlp'))
    assert report.variant_color('reduced_lr0.002_wd0_s101') == report.variant_color('reduced')
    assert len({report.variant_color(n) for n in names}) == len(names)
    assert report.variant_color('some_run', 3) == 'C3'


def test_readme_cost_figures_are_the_models_own_counts():
    """The README's parameter and FLOP savings at GPT-2 small, recomputed from model.py."""
    import torch
    from model import GPT
    text = open(os.path.join(HERE, 'README.md')).read()
    found = re.search(r'(\d+\.\d+)% fewer parameters, and (\d+\.\d+)% \(block 256\) to '
                      r'(\d+\.\d+)% \(block 1024\) fewer\s+training FLOPs per token', text)
    assert found, "the README's cost sentence changed: keep it tested"
    with torch.device('meta'):
        base, reduced = (GPT(GPTConfig(query=q), verbose=False) for q in ('linear', 'identity'))
    saving = lambda a, b: f"{100 * (1 - b / a):.{len(found.group(1).split('.')[1])}f}"
    assert found.group(1) == saving(base.get_num_params(), reduced.get_num_params())
    flops = lambda T: f"{100 * (1 - reduced.flops_per_token(T) / base.flops_per_token(T)):.1f}"
    assert found.group(2) == flops(256)
    assert found.group(3) == flops(1024)
    assert '124.37M' in text and '117.30M' in text
    assert (base.get_num_params(), reduced.get_num_params()) == (124_373_760, 117_295_872)


@pytest.mark.parametrize('path', DOCS, ids=os.path.basename)
def test_docs_name_no_path_outside_the_repository(path):
    assert not re.search(r'(^|[\s`(])\.\./', open(path).read(), re.M), path


PYTHON_FILES = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, '*.py'))
                      + glob.glob(os.path.join(HERE, 'config', '*.py')))


@pytest.mark.parametrize('name', PYTHON_FILES)
def test_every_python_file_keeps_lines_within_100_characters(name):
    lines = enumerate(open(os.path.join(HERE, name), encoding='utf-8'), 1)
    long = [i for i, line in lines if len(line.rstrip('\n')) > 100]
    assert not long, f"{name}: lines {long} are over 100 characters"
