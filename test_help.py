"""--help and -h on every script: every key its parser accepts, with default, type and one line."""
import importlib
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = ('train', 'sample', 'prepare', 'bench', 'report', 'experiment', 'convert', 'export')


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
    for key, default in script.DEFAULTS.items():
        assert lines[key].startswith(f"  --{key}={default!r} "), key
        kind = type(default).__name__ if default is not None else 'optional'
        assert re.search(rf"  {kind}\s+\S", lines[key]), \
            f"{name}: --{key} lacks its type or description"
    assert out.splitlines()[0] == importlib.import_module(name).__doc__.strip().splitlines()[0]


def test_train_help_groups_its_keys():
    import common
    import model
    import train
    text = common.help_text(train.DEFAULTS, (train.__file__, model.__file__))
    groups = re.findall(r'^(\w+):$', text, re.M)
    assert groups == ['run', 'data', 'model', 'optimiser', 'schedule', 'system']


@pytest.mark.slow
def test_help_from_the_command_line_exits_zero():
    """--help on every script's command line, -h on one (the same branch of common.parse_config)."""
    calls = [(name, '--help') for name in SCRIPTS] + [('train', '-h')]
    procs = [subprocess.Popen([sys.executable, f'{name}.py', flag], cwd=HERE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, flag in calls]
    for (name, flag), proc in zip(calls, procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and err == '' and '  --' in out, (name, flag, err[-300:])
