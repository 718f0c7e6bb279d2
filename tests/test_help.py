"""--help and -h on every script: every key its parser accepts, with default, type and one line."""
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from kvgpt import config


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
# every script, as it is run: `python train.py`, `python -m lab.study`
# evals.hellaswag before train, which imports it: runpy warns when a module it runs as __main__
# is already imported in the same process (MAINS below runs them all in one)
SCRIPTS = ('evals.hellaswag', 'train', 'sample', 'prepare', 'bench', 'lab.report', 'lab.study',
           'lab.costs', 'tools.convert', 'tools.export')


def command(name):
    return [sys.executable, '-m', name] if '.' in name else [sys.executable, f'{name}.py']


@pytest.mark.parametrize('name', SCRIPTS)
def test_help_lists_every_key_with_its_default_type_and_a_description(name, capsys):
    script = importlib.import_module(name)
    with pytest.raises(SystemExit) as stop:
        script.main(['--help'])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    listed = set(re.findall(r'^  --(\w+)=', out, re.M))
    assert listed == set(script.KEYS) == set(script.DEFAULTS), name  # every key it accepts
    lines = {re.match(r'  --(\w+)=', line).group(1): line
             for line in out.splitlines() if line.startswith('  --')}
    for key, declared in script.KEYS.items():
        assert lines[key].startswith(f"  --{key}={declared.default!r} "), key
        kind = config.kind_of(declared).name()
        assert 'NoneType' not in kind, f"{name}: --{key} has no declared type"
        assert declared.help and re.search(
            rf" {re.escape(kind)} +{re.escape(declared.help)}$", lines[key]), f"{name}: --{key}"
    assert out.splitlines()[0] == script.__doc__.strip().splitlines()[0]
    assert 'A bool takes True or False (or true, false)' in out
    # what the arguments are: config files, but study files for the study runner
    assert ('Arguments are study files' in out) == (name == 'lab.study') != (
        'Arguments are config files' in out), name
    usage = re.split(r'\nArguments are ', out)[0]
    # an example continued with a backslash in the docstring is joined there: a run of spaces
    assert not re.search(r'\S {4,}--', usage), name


def test_train_help_groups_its_keys():
    import train
    groups = re.findall(r'^(\w+):$', config.help_text(train.KEYS), re.M)
    assert groups == ['run', 'data', 'model', 'optimiser', 'schedule', 'system']


def test_help_is_the_table_of_keys_and_every_model_field_has_its_line():
    """--help prints what each key's entry declares, in the table's order within its group;
    GPTConfig's fields carry theirs, so every model key has one."""
    from dataclasses import fields
    from model import GPTConfig
    table = config.keys('paths', out=('out', "where it goes")) | config.keys(
        'sizes', width=(None, "None: chosen for you", config.Kind(int)), depth=(2, "layers"))
    text = config.help_text(table, 'Usage line.\n')
    assert text.splitlines()[0] == 'Usage line.'
    assert re.findall(r'^(\w+):\n  --(\w+)=', text, re.M) == [('paths', 'out'), ('sizes', 'width')]
    assert re.search(r"^  --width=None +int\|None None: chosen for you$", text, re.M)
    assert all(f.metadata['help'] for f in fields(GPTConfig))


# every script run as `__main__` with --help, in one interpreter (torch imported once): each
# entry point, as `python train.py --help` or `python -m lab.study --help` runs it
MAINS = """
import contextlib, io, json, os, runpy, sys
PROJECT = {'kvgpt', 'lab', 'tools', 'evals', 'model', 'train', 'sample', 'prepare', 'bench'}
said = {}
for name in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [name, '--help']
    if '/' in name:  # as `python tools/export.py` runs it: its folder on the path, no -m
        sys.path[0] = os.path.dirname(os.path.abspath(name))
        for module in [m for m in sys.modules if m.split('.')[0] in PROJECT]:
            del sys.modules[module]  # imported afresh, as a new interpreter would
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if '/' in name:
                runpy.run_path(name, run_name='__main__')
            elif '.' in name:
                runpy.run_module(name, run_name='__main__', alter_sys=True)
            else:
                runpy.run_path(name + '.py', run_name='__main__')
            code = None
        except SystemExit as stop:
            code = stop.code
    said[name] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(said))
"""


@pytest.mark.slow
def test_help_from_the_command_line_exits_zero():
    """--help on every script's entry point, the package's scripts also run as files (python
    tools/export.py), and -h on train.py's real command line (the same branch of parse_config)."""
    as_files = [name.replace('.', '/') + '.py' for name in SCRIPTS if '.' in name]  # no -m
    r = subprocess.run([sys.executable, '-c', MAINS, *SCRIPTS, *as_files], cwd=HERE,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for name, (code, out, err) in json.loads(r.stdout.splitlines()[-1]).items():
        assert code == 0 and err == '' and '  --' in out, (name, code, err[-300:])
    r = subprocess.run(command('train') + ['-h'], cwd=HERE, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stderr == '' and '  --' in r.stdout, r.stderr[-300:]


@pytest.mark.slow
@pytest.mark.parametrize('name', SCRIPTS)
def test_ctrl_c_during_a_scripts_imports_is_one_line(name, tmp_path):
    """SIGINT while the script imports torch (a stand-in torch that marks its import and waits,
    first on the path): "interrupted", exit code 130, nothing on stdout, no traceback."""
    fake = tmp_path / 'slow' / 'torch'
    fake.mkdir(parents=True)
    mark = tmp_path / 'importing'
    (fake / '__init__.py').write_text(f"import time\nopen({str(mark)!r}, 'w').close()\n"
                                      "time.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake.parent), HERE]))
    proc = subprocess.Popen(command(name) + ['--help'], cwd=HERE, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 30
    while not mark.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert mark.exists(), proc.communicate(timeout=60)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, '', 'interrupted\n')
