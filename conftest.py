"""Test environment: offline, with the byte-exact GPT-2 BPE cache when one is laid beside the
checkout."""
import atexit
import functools
import json
import os
import shutil
import tempfile

import pytest

_root = os.path.dirname(os.path.abspath(__file__))
_cache = os.path.join(_root, '..', 'shared', 'tiktoken_cache')
if 'TIKTOKEN_CACHE_DIR' not in os.environ and os.path.isdir(_cache):
    os.environ['TIKTOKEN_CACHE_DIR'] = os.path.abspath(_cache)
# Never touch the user's Hugging Face cache, and never wait on a hub that cannot be reached.
os.environ['HF_HOME'] = tempfile.mkdtemp(prefix='kvgpt-hf-')
atexit.register(shutil.rmtree, os.environ['HF_HOME'], ignore_errors=True)  # each process its own
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_DISABLE_PROGRESS_BARS', '1')
if os.environ.get('PYTEST_XDIST_WORKER'):
    # one thread per pytest-xdist worker (and per process it starts): OpenMP threads spin while
    # they wait, so two workers of two threads each on two cores run several times slower than one
    os.environ['OMP_NUM_THREADS'] = '1'
    import torch
    torch.set_num_threads(1)


@functools.lru_cache(maxsize=None)
def gpt2_bpe_problem():
    """None when tiktoken loads the GPT-2 BPE (from its cache, or by downloading it once), else
    why not."""
    import prepare
    from kvgpt.errors import UserError
    try:
        prepare.get_tokenizer('gpt2')
    except UserError as e:
        return str(e)
    return None


def pytest_runtest_setup(item):
    """A test marked gpt2_bpe is skipped, with the reason printed, where the BPE cannot be had
    (offline with no cache): the suite passes on a machine without the network."""
    if item.get_closest_marker('gpt2_bpe') and gpt2_bpe_problem():
        pytest.skip(f"needs the GPT-2 BPE: {gpt2_bpe_problem()}")


@pytest.fixture(scope='session')
def data_root(tmp_path_factory):
    """A small byte-level dataset 'tiny' (~140k tokens of stdlib docs), prepared once a session."""
    import prepare
    root = tmp_path_factory.mktemp('data')
    docs = root / 'docs.jsonl'
    text = ' '.join(prepare.pydocs_topics()[:60])
    with open(docs, 'w') as f:
        for i in range(0, len(text), 2000):
            f.write(json.dumps({'text': text[i:i + 2000]}) + '\n')
    prepare.prepare(dict(prepare.DEFAULTS, dataset=str(docs), tokenizer='byte',
                         data_root=str(root), num_proc=1, out_name='tiny'))
    return str(root)


@pytest.fixture
def command_line(capsys):
    """Run script.main(argv) under run_main, as its command line does: (exit code, stderr)."""
    from kvgpt import errors

    def run(script, argv):
        with pytest.raises(SystemExit) as stop:
            errors.run_main(lambda: script.main(argv))
        return stop.value.code, capsys.readouterr().err
    return run
