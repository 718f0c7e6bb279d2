"""
The tokenizers: raw bytes (no download, ever) and tiktoken's GPT-2 BPE. prepare.py encodes with
them; sample.py and the evaluations decode with the same ones, named in meta.json.
"""

import codecs
import functools

from kvgpt.errors import UserError


class ByteTokenizer:
    """Raw UTF-8 bytes plus one end-of-document token: no download, ever."""
    name, vocab_size, eot = 'byte', 257, 256

    def encode(self, text):
        return list(text.encode('utf-8'))

    def decode_bytes(self, ids):
        return bytes(i for i in ids if i < 256)


class GPT2Tokenizer:
    """tiktoken's GPT-2 BPE; documents end with <|endoftext|> (50256) as in nanoGPT."""
    name, vocab_size, eot = 'gpt2', 50257, 50256

    def __init__(self):
        import tiktoken
        try:
            self.enc = tiktoken.get_encoding('gpt2')
        except Exception as e:
            raise UserError(f"cannot load the GPT-2 BPE ({type(e).__name__}); tiktoken "
                            "downloads it once: connect once, or set TIKTOKEN_CACHE_DIR to a "
                            "folder with its cached files (prepare.py: or --tokenizer=byte)"
                            ) from None

    def encode(self, text):
        return self.enc.encode_ordinary(text)  # special-token text in the corpus stays plain text

    def decode_bytes(self, ids):
        return self.enc.decode_bytes([i for i in ids if i < self.eot])


TOKENIZERS = {'byte': ByteTokenizer, 'gpt2': GPT2Tokenizer}


@functools.lru_cache(maxsize=None)
def get_tokenizer(name):
    if name not in TOKENIZERS:
        raise UserError(f"unknown tokenizer '{name}': choose one of {', '.join(TOKENIZERS)}")
    return TOKENIZERS[name]()


def stream_decoder():
    """Bytes in, text out, holding back an incomplete UTF-8 sequence split across tokens."""
    return codecs.getincrementaldecoder('utf-8')(errors='replace')
