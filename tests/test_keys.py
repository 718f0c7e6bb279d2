"""Every key of train.py, sample.py and prepare.py has a type: a value of the wrong type is one
line on stderr, exit code 2, no traceback, and nothing written; and a run that fails before it
starts leaves its out_dir as it found it."""
import glob
import importlib
import os
import subprocess
import sys

import pytest
import torch

from kvgpt import config, errors
import prepare
import sample
import train

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
SCRIPTS = {'train': train, 'sample': sample, 'prepare': prepare}


def wrong_value(key, script):
    """A value of the wrong type for key: a word for a number, a misspelled choice, a word that is
    not a bool; None for a text key, which takes any text (a number too, as written)."""
    kind = config.kind_of(script.KEYS[key])
    if kind.choices:
        return kind.choices[0] + 'x'
    if kind.kind == 'device':
        return 'gpu'
    if kind.kind is bool:
        return 'maybe'
    if kind.kind is str:
        return None
    return 'abc'  # int, float, tuple


@pytest.mark.parametrize('name,key', [(name, key) for name, script in SCRIPTS.items()
                                      for key in script.DEFAULTS
                                      if wrong_value(key, script) is not None])
def test_a_wrong_type_is_one_line_exit_2_and_writes_nothing(name, key, tmp_path,
                                                              command_line):
    script, out = SCRIPTS[name], tmp_path / 'out'
    where = dict(train='out_dir', sample='out_dir', prepare='data_root')[name]
    argv = [f'--{where}={out}', f'--{key}={wrong_value(key, script)}']
    code, err = command_line(script, argv)
    assert code == 2 and err.count('\n') == 1 and err.startswith(f'error: --{key}='), err
    assert 'Traceback' not in err and f' {key} must be' in err
    assert not out.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize('value,expected', [('false', False), ('False', False), ('true', True),
                                            ('True', True)])
def test_a_bool_takes_true_and_false_in_either_case(value, expected):
    assert train.settings([f'--compile={value}'])['compile'] is expected
    assert train.settings([f'--overwrite={value}'])['overwrite'] is expected


def test_a_text_key_takes_a_number_as_written():
    """The shell cannot quote for Python: --start=2024 is the text 2024, and 1.50 keeps its 0."""
    c = train.settings(['--out_dir=2024', '--wandb_run_name=1.50'])
    assert c['out_dir'] == '2024' and c['wandb_run_name'] == '1.50'
    prompt = config.parse_config(sample.KEYS, ['--start=2024'])['start']
    assert prompt == '2024'
    with pytest.raises(errors.UserError, match="dtype must be one of"):
        train.settings(['--dtype=16'])  # a choice stays a choice


def test_none_unsets_only_a_key_that_can_be_unset():
    assert train.settings(['--compile=None'])['compile'] is None
    with pytest.raises(errors.UserError, match="overwrite must be bool, got None"):
        train.settings(['--overwrite=None'])


def test_compile_false_never_compiles(monkeypatch, data_root, tmp_path):
    monkeypatch.setattr(torch, 'compile', lambda *a, **kw: pytest.fail('compiled'))
    r = train.main(['--dataset=tiny', f'--data_root={data_root}', f'--out_dir={tmp_path}/r',
                    '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=32',
                    '--batch_size=2', '--gradient_accumulation_steps=1', '--max_iters=2',
                    '--eval_interval=2', '--eval_iters=1', '--device=cpu', '--compile=false'])
    assert r.device_setup.compile is False and r.settings['compile'] is False


@pytest.mark.parametrize('script', [train, sample])
@pytest.mark.parametrize('device,message', [
    ('gpu', 'device must be cpu, cuda, cuda:N or mps'),
    ('cuda', 'this torch has no CUDA device')])
def test_a_device_this_torch_lacks_is_one_line(script, device, message, tmp_path, command_line,
                                               monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)  # as on a CPU-only torch
    code, err = command_line(script, [f'--out_dir={tmp_path}/out', f'--device={device}'])
    assert code == 2 and err.count('\n') == 1 and message in err, err
    assert not (tmp_path / 'out').exists()


def test_help_says_what_each_key_takes():
    text = config.help_text(train.KEYS)
    for key, kind in (('compile', 'bool|None'), ('device', 'device|None'),
                      ('attn_scale', 'float|None'),
                      ('mlp_hidden', 'int|None'), ('dtype', 'float32|bfloat16|float16|None')):
        line = next(l for l in text.splitlines() if l.startswith(f'  --{key}='))
        assert f' {kind} ' in line, line
    assert 'A bool takes True or False (or true, false)' in text


def test_a_run_that_fails_before_it_starts_leaves_nothing(data_root, tmp_path, command_line):
    tiny = ['--dataset=tiny', f'--data_root={data_root}', '--n_layer=1', '--n_embd=32',
            '--block_size=32', '--batch_size=2', '--gradient_accumulation_steps=1',
            '--max_iters=2', '--eval_interval=2', '--eval_iters=1', '--device=cpu']
    bad = '--n_head=3'  # 32 is not divisible by 3: the model cannot be made, after the lock
    code, err = command_line(train, tiny + [f'--out_dir={tmp_path}/new', bad])
    assert code == 2 and 'n_embd (32) must be divisible by n_head (3)' in err
    assert not (tmp_path / 'new').exists()
    kept = tmp_path / 'kept'
    kept.mkdir()
    (kept / 'notes.txt').write_text('mine')
    code, err = command_line(train, tiny + [f'--out_dir={kept}', bad])
    assert code == 2 and sorted(os.listdir(kept)) == ['notes.txt']
    # a run that starts writes its config, log and lock as before
    train.main(tiny + [f'--out_dir={tmp_path}/ok', '--n_head=2'])
    assert {'config.json', 'log.jsonl', 'ckpt.pt', '.lock'} <= set(os.listdir(tmp_path / 'ok'))


def test_a_resume_that_fails_before_it_starts_keeps_the_runs_files(data_root, tmp_path,
                                                                   command_line):
    tiny = ['--dataset=tiny', f'--data_root={data_root}', '--n_layer=1', '--n_embd=32',
            '--n_head=2', '--block_size=32', '--batch_size=2', '--gradient_accumulation_steps=1',
            '--eval_interval=2', '--device=cpu', f'--out_dir={tmp_path}/run']
    train.main(tiny + ['--max_iters=2', '--eval_iters=1'])
    before = {f: (tmp_path / 'run' / f).read_bytes()
              for f in ('config.json', 'log.jsonl', 'ckpt.pt', '.lock')}
    # refused after the lock and the checkpoint's reading: nothing the run wrote changes
    code, err = command_line(train, tiny + ['--max_iters=4', '--init_from=resume',
                                            '--eval_iters=0'])
    assert code == 2 and 'eval_iters must be positive' in err
    assert {f: (tmp_path / 'run' / f).read_bytes() for f in before} == before


def test_train_prints_only_what_differs_from_its_defaults_and_how_to_sample(data_root, tmp_path,
                                                                           capsys):
    train.main(['--dataset=tiny', f'--data_root={data_root}', f'--out_dir={tmp_path}/r',
                '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=2',
                '--gradient_accumulation_steps=1', '--max_iters=2', '--eval_interval=2',
                '--eval_iters=1', '--device=cpu'])
    out = capsys.readouterr().out
    listed = [line.split('=')[0].strip() for line in out.split('\n\n')[0].splitlines()
              if line.startswith('  ') and ' = ' in line]
    assert 'n_layer' in listed and 'learning_rate' not in listed and 'beta1' not in listed
    assert f'sample from it: python sample.py --out_dir={tmp_path}/r' in out
    assert 'finished at iter 2 in ' in out


@pytest.mark.slow
def test_a_wrong_type_on_the_command_line_is_one_line_and_no_traceback(tmp_path, command_line):
    calls = [['train.py', '--attn_scale=abc'], ['sample.py', '--top_p=high'],
             ['prepare.py', '--tokenizer=bytes']]  # one command line for each script
    procs = [subprocess.Popen([sys.executable, *argv, f'--out_dir={tmp_path}/o'] if 'prepare'
                              not in argv[0] else [sys.executable, *argv], cwd=HERE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in calls]
    for argv, proc in zip(calls, procs):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and err.count('\n') == 1 and 'Traceback' not in err, err
    assert "did you mean 'byte'" in err  # --tokenizer=bytes: one of byte, gpt2
    code, err = command_line(train, ['--vocab_size=1e3', f'--out_dir={tmp_path}/o'])
    assert code == 2 and err.count('\n') == 1 and 'Traceback' not in err, err  # not an int


# -----------------------------------------------------------------------------
# config files state choices; the model derives its values from the final settings

def model_of(argv):
    import train
    from model import GPTConfig
    c = train.settings(argv)
    return c, GPTConfig(**train.model_args_from(c, {'vocab_size': 256}))


def test_the_reduced_model_followed_by_a_smaller_head_trains_at_its_own_halved_scale():
    from model import GPT
    c, cfg = model_of(['config/cpu/small.py', 'config/reduced.py', '--n_head=2'])
    assert cfg.head_dim == 64 and cfg.scale == 1 / (2 * 64 ** 0.5)  # not 1/(2 sqrt(32))
    model = GPT(cfg, verbose=False)
    assert model.transformer.h[0].attn.scale == 1 / 16
    _, cfg = model_of(['config/cpu/small.py', 'config/nonlinear.py', '--n_head=2'])
    assert cfg.scale == 1 / 16  # the follow-up's halved scale, at the final head size too


@pytest.mark.parametrize('n_embd', [256, 384])
def test_a_width_a_file_derives_follows_a_later_n_embd(n_embd):
    _, cfg = model_of(['config/baseline_small.py', f'--n_embd={n_embd}', '--n_head=4'])
    assert cfg.n_embd == n_embd and cfg.mlp_hidden == 4 * n_embd  # the MLP of its own width
    _, cfg = model_of(['config/cpu/small.py', 'config/reduced_mlp.py', f'--n_embd={n_embd}'])
    assert cfg.mlp_hidden == 4 * n_embd + n_embd // 2  # 4.5 x the width, as the file says
    _, cfg = model_of(['config/cpu/small.py', 'config/baseline_small_mlp.py',
                       f'--n_embd={n_embd}'])
    assert cfg.mlp_hidden == 4 * n_embd - n_embd // 2  # 3.5 x
    _, cfg = model_of(['config/cpu/small.py', 'config/gpt2_init.py', f'--n_embd={n_embd}'])
    assert cfg.init_std == 0.02 * (768 / n_embd) ** 0.5
    _, cfg = model_of(['config/cpu/small.py', 'config/gpt2_init.py'])  # no later key: as before
    assert cfg.init_std == 0.02 * (768 / 128) ** 0.5


def test_each_argument_is_applied_once_in_order(tmp_path):
    """nanoGPT's order: a config file runs once, with the settings the arguments before it
    left, and a later argument wins over it."""
    ran = tmp_path / 'ran.txt'
    f = tmp_path / 'count.py'
    f.write_text(f"open({str(ran)!r}, 'a').write(str(n_embd) + ' ')\nn_layer = 3\n")
    import train
    c = train.settings(['--n_embd=64', str(f), '--n_embd=96', '--n_layer=5'])
    assert ran.read_text() == '64 ' and (c['n_embd'], c['n_layer']) == (96, 5)
    base = ['--n_embd=256', '--n_head=4']
    assert train.settings(base + ['config/baseline_small.py'])['n_embd'] == 248


def test_a_tilde_after_a_path_keys_equals_sign_is_the_home_folder(monkeypatch, tmp_path):
    """The shell expands ~ only at a word's start: --out_dir=~/runs reaches us as written."""
    import train
    monkeypatch.setenv('HOME', str(tmp_path))
    c = train.settings(['--out_dir=~/runs/a', '--data_root=~', '--init_from=~/x/ckpt_5.pt'])
    assert c['out_dir'] == str(tmp_path / 'runs' / 'a') and c['data_root'] == str(tmp_path)
    assert c['init_from'] == str(tmp_path / 'x' / 'ckpt_5.pt')
    c = config.parse_config(sample.KEYS, ['--start=~/not/a/path', '--out_dir=~user_x'])
    assert c['start'] == '~/not/a/path'  # a prompt is text, not a path
    assert c['out_dir'] == '~user_x'  # another user's home: only ~ and ~/ are expanded


def test_a_config_file_reads_what_it_set_as_a_module_does(tmp_path):
    """A comprehension or function in a config file sees the file's own earlier settings, not the
    ones it replaced; a value the file sets equal to the one before is still its choice, and wins
    over a file it includes."""
    import train
    (tmp_path / 'base.py').write_text("max_iters = 300\nn_layer = 3\n")
    (tmp_path / 'run.py').write_text(
        "include = 'base.py'\nmax_iters = 400\n"
        "keep_checkpoints = tuple(k * max_iters // 4 for k in range(1, 4))\n"
        "def half():\n    return max_iters // 2\n"
        "eval_interval = half()\n"
        f"n_layer = {train.DEFAULTS['n_layer']}\n"  # the default again, over base.py's 3
        "if False:\n    n_head = 1\n")
    c = train.settings([str(tmp_path / 'run.py')])
    assert c['max_iters'] == 400 and c['keep_checkpoints'] == (100, 200, 300)
    assert c['eval_interval'] == 200 and c['n_layer'] == train.DEFAULTS['n_layer']
    assert c['n_head'] == train.DEFAULTS['n_head']


def test_config_files_state_choices_not_values_derived_from_other_keys():
    """A config file sets choices, never a value the model derives from the final settings (the
    MLP width, the scale, the init std, the query rank, the K/V heads), so none goes stale."""
    import train
    from kvgpt.config import CONFIG_DIR
    from kvgpt.config import run_config_file
    for name in sorted(glob.glob(os.path.join(CONFIG_DIR, '**', '*.py'), recursive=True)):
        made = run_config_file(name, dict(train.DEFAULTS))
        derived = {'mlp_hidden', 'attn_scale', 'init_std', 'query_rank', 'n_kv_head'} & set(made)
        assert not derived, (name, derived)


def test_a_file_stacked_on_another_is_refused_alone_in_one_line(command_line):
    import train
    code, err = command_line(train, ['config/lab/repro.py', '--max_iters=1'])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert 'config/lab/repro.py is stacked on config/cpu/small.py: name that file before it' in err
    code, err = command_line(train, ['config/cpu/small.py', 'config/lab/repro_v3.py'])
    assert code == 2 and 'config/lab/repro_v3.py is stacked on config/lab/repro.py' in err
    c = train.settings(['config/cpu/small.py', 'config/lab/repro.py', 'config/gpt2_init.py',
                        'config/lab/repro_v3.py'])
    assert c['dataset'] == 'pysource' and c['n_head'] == 2


def test_an_include_that_names_no_file_is_one_line(tmp_path, command_line):
    import train
    (tmp_path / 'bad.py').write_text("include = 5\n")
    code, err = command_line(train, [str(tmp_path / 'bad.py')])
    assert code == 2 and err.count('\n') == 1 and 'include and stacked_on name files' in err


def test_a_file_that_includes_its_base_is_that_base_named_first():
    import train
    alone = train.settings(['config/cpu/demo.py'])
    stacked = train.settings(['config/cpu/small.py', 'config/cpu/demo.py'])
    assert alone == stacked and alone['dataset'] == 'pydocs' and alone['query'] == 'identity'
    # so a file stacked on that base may follow it, as it may follow the base itself
    assert train.settings(['config/cpu/demo.py', 'config/lab/repro.py']) == train.settings(
        ['config/cpu/small.py', 'config/cpu/demo.py', 'config/lab/repro.py'])
    for f in glob.glob(os.path.join(HERE, 'config', '*.py')):  # none stacks by a Python import
        assert 'import' not in open(f).read(), f


@pytest.mark.parametrize('script', ['train', 'sample', 'tools.export', 'tools.convert'])
def test_a_run_folder_or_checkpoint_given_as_a_config_file_says_how_to_name_it(script, tmp_path,
                                                                               command_line):
    """In the key the script names a run with: the tools read one run (--in_dir) and write another
    (--out_dir), and they take no --init_from."""
    script = importlib.import_module(script)
    key = 'in_dir' if 'in_dir' in script.KEYS else 'out_dir'
    run = tmp_path / 'out-demo'
    run.mkdir()
    torch.save({'iter_num': 1}, run / 'ckpt.pt')
    code, err = command_line(script, [str(run)])
    assert code == 2 and err.count('\n') == 1
    assert f"'{run}' is a folder, not a config file: a run's folder is named with " \
           f"--{key}={run}\n" in err
    code, err = command_line(script, [str(run / 'ckpt.pt')])
    assert code == 2 and err.count('\n') == 1
    as_file = f", or the file itself with --init_from={run / 'ckpt.pt'}" \
        if 'init_from' in script.KEYS else ''
    assert err.endswith(f"is a checkpoint, not a config file: name its run with --{key}={run}"
                        f"{as_file}\n")
    os.rename(run / 'ckpt.pt', run / 'saved')  # torch's zip format, whatever the name
    code, err = command_line(script, [str(run / 'saved')])
    assert code == 2 and 'is a checkpoint, not a config file' in err


# a script run as a user runs it, with the hub's library made to fail as it does offline: it logs
# a warning for each retry (to stderr, through its own handler) before the error. transformers is
# a stand-in (the real one takes seconds to import) that does what matters here: its import sets
# the hub's logger back to warnings, and its from_pretrained calls into the hub
OFFLINE = """import logging, runpy, sys
sys.path[:0] = [{root!r}, {stand_in!r}]
import huggingface_hub
def offline(*args, **kwargs):
    logging.getLogger('huggingface_hub.utils._http').warning('Retrying in 1s [Retry 1/5].')
    raise OSError('[Errno -2] Name or service not known')
{patch}
sys.argv = {argv!r}
runpy.run_path({script!r}, run_name='__main__')
"""
TRANSFORMERS = """import logging
logging.getLogger('huggingface_hub').setLevel(logging.WARNING)
class GPT2LMHeadModel:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        logging.getLogger('huggingface_hub.utils._http').warning('Retrying in 1s [Retry 1/5].')
        raise OSError('[Errno -2] Name or service not known')
"""


@pytest.mark.slow
@pytest.mark.parametrize('patch,script,argv,message', [
    ('', 'sample.py', ['--init_from=gpt2', '--start=Hi'],
     "error: cannot load GPT-2 weights 'gpt2' (OSError)"),
    ('import datasets; datasets.load_dataset = offline', 'prepare.py',
     ['--dataset=someone/corpus', '--tokenizer=byte', '--data_root={tmp}'],
     "error: cannot load 'someone/corpus' from the Hugging Face hub (OSError"),
    ('', 'train.py', ['--init_from=gpt2', '--dataset=tiny', '--data_root={data}',
                      '--out_dir={tmp}/out', '--device=cpu', '--compile=False'],
     "error: cannot load GPT-2 weights 'gpt2' (OSError)"),
])
def test_the_hubs_retries_offline_leave_one_line(patch, script, argv, message, tmp_path,
                                                 data_root):
    pytest.importorskip('huggingface_hub', reason='the code path under test needs it')
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [script, *(a.format(tmp=tmp_path, data=data_root) for a in argv)]
    (tmp_path / 'stand_in').mkdir()
    (tmp_path / 'stand_in' / 'transformers.py').write_text(TRANSFORMERS)
    code = OFFLINE.format(root=root, stand_in=str(tmp_path / 'stand_in'), patch=patch, argv=argv,
                          script=os.path.join(root, script))
    env = {k: v for k, v in os.environ.items() if k != 'HF_HUB_VERBOSITY'}
    r = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True, text=True,
                       env=env)
    assert r.returncode == 2 and r.stderr.count('\n') == 1, r.stderr
    assert r.stderr.startswith(message)
