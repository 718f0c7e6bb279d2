"""The docs' commands, the layout (the card's files at the root, the lab beside them, no import
circle), the standalone model file, and variants defined by their config file alone."""
import ast
import glob
import inspect
import importlib
import os
import re
import shlex

import pytest

import bench
from kvgpt import config
from lab import report
from model import GPTConfig
import train

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
DOCS = [os.path.join(HERE, 'README.md')] + sorted(glob.glob(os.path.join(HERE, 'docs', '*.md')))
PARSERS = {'train.py': train.settings}  # the other scripts parse with their KEYS


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
    """The script a command runs (a .py or .sh file, or a module of `python -m`) and the arguments
    after it; None for pip and pytest."""
    for i, word in enumerate(argv):
        if word == '-m' and i and argv[i - 1].startswith('python'):  # pytest's -m is a marker
            if argv[i + 1] in ('pytest', 'pip'):
                return None, argv
            return argv[i + 1].replace('.', '/') + '.py', argv[i + 2:]
        script = word.endswith(('.py', '.sh')) and '=' not in word
        if script and not word.startswith('lab/studies'):
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
        if script.startswith('lab/'):
            # the others are run directories or study files
            for study in (a for a in args if a.startswith('lab/studies/') and '*' not in a):
                assert os.path.isfile(os.path.join(HERE, study)), line
            args = [a for a in args if a.startswith('--')]
        module = importlib.import_module(script[:-3].replace('/', '.'))
        parse = PARSERS.get(script) or (lambda a: config.parse_config(module.KEYS, a))
        parse(args)  # a UserError names the unknown key or the bad value


def imports_of(path):
    """The top modules and the project's own modules (dotted) that a Python file imports."""
    tree = ast.parse(open(path).read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def project_modules():
    """{dotted module name: file} of every Python module of the project but the tests."""
    found = {}
    for path in glob.glob(os.path.join(HERE, '**', '*.py'), recursive=True):
        rel = os.path.relpath(path, HERE)
        if rel.startswith(('tests', 'config', '.')) or os.path.basename(rel).startswith('test_') \
                or rel == 'conftest.py':
            continue
        found[rel[:-3].replace(os.sep, '.').removesuffix('.__init__')] = path
    return found


def import_graph():
    modules = project_modules()
    return {name: {m for m in imports_of(path) if m in modules and m != name}
            for name, path in modules.items()}


CORE = ('model', 'train', 'prepare', 'sample', 'bench', 'evals.hellaswag', 'kvgpt.errors',
        'kvgpt.config', 'kvgpt.device', 'kvgpt.files', 'kvgpt.checkpoint', 'kvgpt.distributed',
        'kvgpt.tracking', 'kvgpt.tokenizer', 'kvgpt.data', 'kvgpt.optimizer')


def test_the_readme_stays_short():
    assert os.path.getsize(os.path.join(HERE, 'README.md')) <= 14 * 1024  # the details: docs/


def test_the_root_holds_the_cards_scripts_and_the_shared_modules_sit_in_kvgpt():
    root = sorted(f for f in os.listdir(HERE) if f.endswith('.py'))
    assert set(root) == {'model.py', 'train.py', 'prepare.py', 'sample.py', 'bench.py',
                         'test_model.py', 'conftest.py'}, root
    assert os.path.isdir(os.path.join(HERE, 'lab', 'studies'))
    # every shared module sits one hop from the scripts and opens by saying what it holds (a
    # module added here needs only that, not an entry in this test)
    shared = sorted(f for f in os.listdir(os.path.join(HERE, 'kvgpt')) if f.endswith('.py'))
    assert {'checkpoint.py', 'config.py', 'data.py', 'distributed.py'} <= set(shared)
    for name in shared:
        source = open(os.path.join(HERE, 'kvgpt', name)).read()
        assert ast.get_docstring(ast.parse(source)), f"kvgpt/{name} has no docstring"


def test_each_job_lives_in_the_module_named_for_it_and_train_py_does_none_of_them_itself():
    """The process group starts in kvgpt/distributed.py, the checkpoint is written in
    kvgpt/checkpoint.py, Dataset lives in kvgpt/data.py, the typed keys are parsed in
    kvgpt/config.py, the signal handlers are set in kvgpt/signals.py; train.py calls them and does
    none of these itself."""
    from kvgpt import checkpoint, config, data, distributed, signals
    assert 'init_process_group' in inspect.getsource(distributed.setup_distributed)
    assert 'signal.signal(' in inspect.getsource(signals.Signals)
    assert 'torch.save' in inspect.getsource(checkpoint.save_checkpoint)
    assert data.Dataset.__module__ == 'kvgpt.data'
    assert 'check_value' in inspect.getsource(config.parse_config)
    train_py = open(os.path.join(HERE, 'train.py')).read()
    for own in ('init_process_group', 'torch.save(', 'np.memmap', 'def parse_config',
                'def check_value', 'class Dataset', 'signal.signal('):
        assert own not in train_py, own
    assert 'prepare' not in imports_of(os.path.join(HERE, 'train.py'))  # reads bins, never writes


def test_the_core_imports_nothing_from_the_lab_and_nothing_imports_in_a_circle():
    graph = import_graph()
    for name in CORE:
        assert not {m for m in graph[name] if m.startswith(('lab', 'tools', 'tests'))}, name
    for path in glob.glob(os.path.join(HERE, '*.py')):  # the core's own files, tests included
        if os.path.basename(path)[:-3] in CORE:
            assert not any(m.startswith(('lab', 'tools')) for m in imports_of(path)), path
            # nor by a string (importlib): the lab's probes are named by a setting, in a config
            strings = [n.value for n in ast.walk(ast.parse(open(path).read()))
                       if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            assert not [t for t in strings if re.match(r'(lab|tools|tests)\.\w', t)], path
    state = {}

    def visit(name, trail):
        if state.get(name) == 'done':
            return
        assert state.get(name) != 'open', f"import circle: {' -> '.join(trail + [name])}"
        state[name] = 'open'
        for other in graph[name]:
            visit(other, trail + [name])
        state[name] = 'done'
    for name in graph:
        visit(name, [])


def test_model_py_imports_only_torch_and_holds_no_probe():
    path = os.path.join(HERE, 'model.py')
    top = {m.split('.')[0] for m in imports_of(path)}
    # the last: optional, for GPT-2 weights
    assert top <= {'torch', 'contextlib', 'inspect', 'math', 'os', 'dataclasses', 'typing',
                   'transformers'}, top
    text = open(path).read()
    for probe in ('def diagnostics', 'def induction', 'def weight_norms', 'def param_breakdown',
                  'def attention_probs'):
        assert probe not in text
    assert text.count('.tril(') == 1  # one causal-mask helper


def test_a_new_variant_is_one_file_in_config(tmp_path, monkeypatch):
    """A file added to the config folder (here a copy of config/ under tmp_path) is a variant
    everywhere."""
    import shutil
    folder = tmp_path / 'config'
    shutil.copytree(config.CONFIG_DIR, folder)
    monkeypatch.setattr(config, 'CONFIG_DIR', str(folder))
    name = 'zz_test_variant'
    (folder / f'{name}.py').write_text("out_dir = 'out-zz'\nquery = 'identity'\n"
                                       "mlp_hidden = 5 * n_embd\n")
    report.known_variants.cache_clear()
    try:
        geometry = dict(GPTConfig().__dict__)
        assert name in config.variants(geometry) and name in report.known_variants()
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
    assert name not in config.variants(geometry)  # the checkout's config/ never held it


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
    found = re.search(r'(\d+\.\d+)% fewer\s+parameters, and (\d+\.\d+)%\s+\(block 256\)\s+to\s+'
                      r'(\d+\.\d+)%\s+\(block 1024\)\s+fewer\s+training FLOPs per token', text)
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


PYTHON_FILES = sorted(os.path.relpath(p, HERE) for pattern in ('*.py', '*/*.py', '*/*/*.py')
                      for p in glob.glob(os.path.join(HERE, pattern)))


@pytest.mark.parametrize('name', PYTHON_FILES)
def test_every_python_file_keeps_lines_under_100_characters(name):
    lines = enumerate(open(os.path.join(HERE, name), encoding='utf-8'), 1)
    long = [i for i, line in lines if len(line.rstrip('\n')) >= 100]
    assert not long, f"{name}: lines {long} are 100 characters or more"


def test_the_docs_say_what_a_cpu_user_and_a_launcher_see():
    """A busy CPU wants one thread, said beside the first run and its sample; two processes on
    a CPU; llm.c shards on a CPU are slow; torchrun's own exit code on a signal is not the
    run's."""
    readme = open(os.path.join(HERE, 'README.md')).read()
    training = open(os.path.join(HERE, 'docs', 'training.md')).read()
    first_run = readme[readme.index('## Install'):readme.index('## The variants')]
    assert 'OMP_NUM_THREADS=1' in first_run and 'python sample.py' in first_run  # beside both
    assert 'torchrun --standalone --nproc_per_node=2 train.py config/cpu/demo.py' in first_run
    shards = training[training.index('A folder of llm.c'):]
    assert 'seconds a step' in shards[:1200]
    assert 'SIGTERM to one worker' in training and 'SignalException' in training
