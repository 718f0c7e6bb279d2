"""--help and -h on every script: every key its parser accepts, with default, type and one line."""
import importlib
import json
import os
import re
import subprocess
import sys

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
    assert listed == set(script.DEFAULTS), name  # every key the parser accepts, and no other
    lines = {re.match(r'  --(\w+)=', line).group(1): line
             for line in out.splitlines() if line.startswith('  --')}
    types = getattr(script, 'TYPES', {})
    for key, default in script.DEFAULTS.items():
        assert lines[key].startswith(f"  --{key}={default!r} "), key
        kind = config.kind_of(key, script.DEFAULTS, types).name()
        assert 'NoneType' not in kind, f"{name}: --{key} has no declared type"
        assert re.search(rf"  {re.escape(kind)}\s+\S", lines[key]), \
            f"{name}: --{key} lacks its type or description"
    assert out.splitlines()[0] == script.__doc__.strip().splitlines()[0]
    assert 'A bool takes True or False (or true, false)' in out
    usage = out.split('Arguments are config files')[0]
    # an example continued with a backslash in the docstring is joined there: a run of spaces
    assert not re.search(r'\S {4,}--', usage), name


def test_train_help_groups_its_keys():
    import model
    import train
    text = config.help_text(train.DEFAULTS, (train.__file__, model.__file__), train.TYPES)
    groups = re.findall(r'^(\w+):$', text, re.M)
    assert groups == ['run', 'data', 'model', 'optimiser', 'schedule', 'system']


# every script run as `__main__` with --help, in one interpreter (torch imported once): each
# entry point, as `python train.py --help` or `python -m lab.study --help` runs it
MAINS = """
import contextlib, io, json, runpy, sys
said = {}
for name in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [name, '--help']
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if '.' in name:
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
    """--help on every script's entry point, and -h on train.py's real command line (the same
    branch of config.parse_config)."""
    r = subprocess.run([sys.executable, '-c', MAINS, *SCRIPTS], cwd=HERE, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for name, (code, out, err) in json.loads(r.stdout.splitlines()[-1]).items():
        assert code == 0 and err == '' and '  --' in out, (name, code, err[-300:])
    r = subprocess.run(command('train') + ['-h'], cwd=HERE, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stderr == '' and '  --' in r.stdout, r.stderr[-300:]
