"""Test environment: offline, with the byte-exact GPT-2 BPE cache when one is laid beside the checkout."""
import os
import tempfile

_root = os.path.dirname(os.path.abspath(__file__))
_cache = os.path.join(_root, '..', 'shared', 'tiktoken_cache')
if 'TIKTOKEN_CACHE_DIR' not in os.environ and os.path.isdir(_cache):
    os.environ['TIKTOKEN_CACHE_DIR'] = os.path.abspath(_cache)
# Never touch the user's Hugging Face cache, and never wait on a hub that cannot be reached.
os.environ['HF_HOME'] = tempfile.mkdtemp(prefix='kvgpt-hf-')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_DISABLE_PROGRESS_BARS', '1')
