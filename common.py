"""
What more than one script needs: one-line user errors, nanoGPT-style configuration
(`script.py config/x.py --key=value`), the device and precision rule, atomic file writes and
checkpoint I/O. (Making a model is model.py's; the data format and its tokenizers are
prepare.py's.)
"""
import ast
import dataclasses
import difflib
import errno
import json
import os
import pathlib
import re
import shutil
import sys
import types
import typing
from contextlib import contextmanager, nullcontext

import torch


class UserError(Exception):
    """A failure the user can fix: printed as one line, no traceback, exit code 2."""


@contextmanager
def model_errors(source=None):
    """model.py imports nothing from this project (copy it anywhere), so it raises ValueError,
    TypeError or ImportError with a clear message; around a call into it, this makes them the
    one-line error."""
    try:
        yield
    except (ValueError, TypeError, ImportError) as e:
        raise UserError(f"{source}: {e}" if source else str(e)) from None


ELSEWHERE = "free space, or choose a folder on another disk"
PERMISSIONS = "fix its permissions, or choose a folder you can write"
IN_THE_WAY = "a file is in the way where a folder should be: move it, or choose another folder"
FS_ADVICE = {  # what to do about a filesystem failure, by its errno
    errno.ENOSPC: f"the disk is full: {ELSEWHERE}",
    errno.EDQUOT: f"the disk quota is used up: {ELSEWHERE}",
    errno.EROFS: "the filesystem is read-only: choose a writable folder",
    errno.EACCES: f"permission denied: {PERMISSIONS}",
    errno.EPERM: f"not permitted: {PERMISSIONS}",
    errno.EEXIST: IN_THE_WAY, errno.ENOTDIR: IN_THE_WAY,
    errno.EIO: "the write failed: check the disk's free space and health",
}


def fs_error(e, path=None):
    """The one line for an OSError at the filesystem boundary: the path, what went wrong and what
    to do about it."""
    advice = FS_ADVICE.get(e.errno, "check the path and the disk")
    return f"cannot write {path or e.filename or 'a file'} ({e.strerror or e}): {advice}"


def run_main(main):
    """Run a script's main(): a user error, or a filesystem failure no caller explained more
    closely, is one line on stderr and exit code 2 (KVGPT_DEBUG=1 shows the traceback instead)."""
    try:
        main()
    except BrokenPipeError:  # `python sample.py ... | head`: the reader has gone, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush works
        sys.exit(141)
    except (UserError, OSError) as e:
        if os.environ.get('KVGPT_DEBUG') == '1':
            raise
        print(f"error: {e if isinstance(e, UserError) else fs_error(e)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


# -----------------------------------------------------------------------------
# configuration: defaults, then config files, then --key=value, in command-line order

def parse_value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string: --dataset=openwebtext


class Kind(typing.NamedTuple):
    """The type of a key: int, float, str or bool, or 'device'; with choices, one of them; optional
    (None allowed) when the default is None unless said otherwise. Every key has one: its
    default's type, or the one a script's TYPES declares beside its DEFAULTS."""
    kind: object
    choices: tuple = None
    optional: bool = None

    def name(self):
        words = ('|'.join(self.choices) if self.choices
                 else getattr(self.kind, '__name__', self.kind))
        return words + ('|None' if self.optional else '')


def field_kinds(cls):
    """{field: Kind} of a dataclass's fields, from their annotations (Optional[int]: an int)."""
    return {f.name: Kind(next(a for a in (*typing.get_args(f.type), f.type)
                              if a is not type(None))) for f in dataclasses.fields(cls)}


def kind_of(key, defaults, types):
    """The Kind of a key: types[key] where declared, else its default's type."""
    kind = types.get(key) or Kind(type(defaults[key]))
    optional = defaults[key] is None if kind.optional is None else kind.optional
    return kind._replace(optional=optional)


def did_you_mean(word, words):
    close = difflib.get_close_matches(word, words, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


BOOL_WORDS = {'true': True, 'false': False}  # --compile=false means False, as --compile=False


def check_value(key, value, defaults, source, types=None):
    """value made the key's type (an int for a float, a word true/false for a bool), or a one-line
    error that names the key and what it takes."""
    if key not in defaults:
        raise UserError(f"{source}: unknown config key '{key}'{did_you_mean(key, defaults)}")
    kind = kind_of(key, defaults, types or {})
    want = kind.kind
    if value is None and (kind.optional or want is type(None)):
        return None
    if want is bool and isinstance(value, str) and value.lower() in BOOL_WORDS:
        value = BOOL_WORDS[value.lower()]
    if want is float and type(value) is int:
        value = float(value)  # an int for a float setting is fine
    if want in (tuple, list) and isinstance(value, (tuple, list)):
        value = want(value)
    if want == 'device':
        ok = isinstance(value, str) and re.fullmatch(r'cpu|mps|cuda(:\d+)?', value)
    else:
        ok = type(value) is want or want is type(None)
    if not ok:
        number = type(value) in (int, float) and want in (str, 'device')
        quote = " (quote a name that looks like a number)" if number else ""
        takes = 'cpu, cuda, cuda:N or mps' if want == 'device' else kind.name()
        raise UserError(f"{source}: {key} must be {takes}, got {value!r}{quote}")
    if kind.choices and value not in kind.choices:
        raise UserError(f"{source}: {key} must be one of {', '.join(kind.choices)}, got {value!r}"
                        f"{did_you_mean(str(value), kind.choices)}")
    return value


def parse_config(defaults, argv=None, show=False, described_in=(), types=None):
    """nanoGPT's configurator made strict: an unknown key or a value of the wrong type (see Kind)
    is a one-line error that names the key. argv None is the command line; show prints the
    settings that differ from the defaults. -h or --help prints every key with its default, type
    and description (from the sources described_in, the caller's file by default) and exits 0."""
    config, types = dict(defaults), types or {}
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ('-h', '--help') for a in argv):
        sources = described_in or (sys._getframe(1).f_globals['__file__'],)
        print(help_text(defaults, sources, types))
        sys.exit(0)
    for arg in argv:
        if arg.startswith('--'):
            key, eq, text = arg[2:].partition('=')
            if not eq:
                raise UserError(f"expected --key=value, got '{arg}'")
            config[key] = check_value(key, parse_value(text), defaults, arg, types)
            continue
        for key, value in run_config_file(arg, config).items():
            config[key] = check_value(key, value, defaults, arg, types)
    if show:
        print_overrides(config, defaults)
    return config


def key_comments(path):
    """[(key, group, description)] in source order: each `key=value,  # text` line of the file's
    `DEFAULTS = dict(...)` and each `name: type = value  # text` field of a dataclass. A comment
    alone on a line among them names the group of the keys below it (up to a colon; a
    dataclass's fields start as 'model'); an indented comment continues the one above."""
    entries, group, block, previous = [], None, None, ''
    for line in open(path, encoding='utf-8'):
        if line.startswith('DEFAULTS = dict('):
            block, group = re.compile(r'    (\w+)='), None
        elif line.startswith('class ') and previous.startswith('@dataclass'):
            block, group = re.compile(r'    (\w+): '), 'model'
        elif block and (not line.startswith('    ') or line.startswith('    def ')):
            block = None  # the dict's closing line, or the class's first method
        elif block and re.match(r'    # \S', line):
            group = line.strip()[2:].split(':')[0]
        elif block and entries and re.match(r'     +# \S', line):  # continues the line above
            key, key_group, text = entries[-1]
            entries[-1] = (key, key_group, f"{text} {line.strip()[2:]}")
        elif block and block.match(line):
            entries.append((block.match(line).group(1), group, line.partition('  # ')[2].strip()))
        previous = line
    return entries


def help_text(defaults, sources, types=None):
    """Usage (the first source's docstring) and every key of defaults, in the sources' groups,
    with its default, its type and the one line its source's comment says about it."""
    usage = (ast.get_docstring(ast.parse(pathlib.Path(sources[0]).read_text())) or '').strip()
    described, groups = {}, {}
    for key, group, text in (entry for path in sources for entry in key_comments(path)):
        groups.setdefault(group or 'settings', [])  # in the order the sources name them
        if key in defaults and not described.get(key, ('', ''))[1]:
            described[key] = (group or 'settings', text)
    for key in defaults:
        group, text = described.get(key, ('settings', ''))
        groups.setdefault(group, []).append((key, text))
    width = max(len(f"--{k}={defaults[k]!r}") for k in defaults)
    lines = [usage, '', 'Arguments are config files (plain Python) and --key=value, applied in '
             'order.', 'A bool takes True or False (or true, false); None unsets a key whose type '
             'ends in |None. Keys:']
    for group, keys in ((g, k) for g, k in groups.items() if k):
        lines.append(f"\n{group}:")
        for key, text in keys:
            kind = kind_of(key, defaults, types or {}).name()
            lines.append(f"  {f'--{key}={defaults[key]!r}':<{width}}  {kind:<8} {text}".rstrip())
    return '\n'.join(lines)


def run_config_file(path, config):
    """The settings a config file makes. It runs with the config so far in scope, as nanoGPT's
    configurator does, so a file can derive a value (`mlp_hidden = 9 * n_embd // 2`) from the
    geometry that earlier files or defaults set; what it leaves alone is not returned."""
    if not os.path.isfile(path):
        raise UserError(f"config file '{path}' not found (arguments are config files and "
                        "--key=value)")
    namespace = dict(config)
    try:
        exec(compile(pathlib.Path(path).read_text(), path, 'exec'), namespace)
    except SystemExit:  # not an Exception: it would end the script with nothing done
        raise UserError(f"config file '{path}' calls exit(): a config file only sets values"
                        ) from None
    except Exception as e:
        raise UserError(f"config file '{path}' failed: {type(e).__name__}: {e}") from None
    return {key: value for key, value in namespace.items()
            if not key.startswith('_')
            and not isinstance(value, (types.ModuleType, types.FunctionType, type))
            and not (key in config and value is config[key])}


def print_overrides(config, defaults):
    """The settings that differ from the defaults, one a line (config.json holds them all)."""
    changed = {k: v for k, v in config.items() if k not in defaults or v != defaults[k]}
    width = max(map(len, changed), default=0)
    print("settings that differ from the defaults:" if changed else "the default settings")
    for key, value in changed.items():
        print(f"  {key:<{width}} = {value!r}")


# -----------------------------------------------------------------------------
# device and precision: one rule for every script

def pick_device(device):
    """The device to use: cuda when available (None), or the one named, if this torch has it."""
    if device is None:
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    if device.startswith('cuda') and not torch.cuda.is_available():
        raise UserError(f"device {device}: this torch has no CUDA device (a CPU-only build, or no "
                        "GPU visible): use --device=cpu")
    index = int(device.partition(':')[2] or 0)
    if device.startswith('cuda') and index >= torch.cuda.device_count():
        raise UserError(f"device {device}: there are {torch.cuda.device_count()} CUDA devices")
    if device == 'mps' and not torch.backends.mps.is_available():
        raise UserError("device mps: this torch has no MPS device: use --device=cpu")
    return device


DTYPES = ('float32', 'bfloat16', 'float16')


def pick_precision(dtype, device):
    """A dtype name: bfloat16 on a CUDA device with native bf16, float16 (with a GradScaler in
    train.py) on an older one, float32 on CPU, unless one is named. torch counts emulated bf16 as
    supported by default: V100/T4 would then train eager (inductor skips it) with slow bf16."""
    if dtype is None and device.startswith('cuda'):
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        dtype = 'bfloat16' if native else 'float16'
    if (dtype or 'float32') not in DTYPES:
        raise UserError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    return dtype or 'float32'


@dataclasses.dataclass
class DeviceSetup:
    device: str  # 'cpu', 'cuda', 'cuda:3'
    dtype: str  # 'float32' | 'bfloat16' | 'float16'
    compile: bool
    ctx: object  # autocast context for forward passes

    @property
    def type(self):
        return 'cuda' if self.device.startswith('cuda') else 'cpu'

    def for_inference(self, model):
        """model in eval mode on the device; on a GPU its weights (and so its KV cache) in the
        16-bit dtype, so decoding casts nothing per token."""
        model.eval().to(self.device)
        if self.type == 'cuda' and self.dtype != 'float32':
            return model.to(getattr(torch, self.dtype))
        return model


def setup_device(device=None, dtype=None, compile=None):
    """The one rule every script follows: cuda when available; bf16 autocast where native,
    fp16 on older GPUs, fp32 on CPU; torch.compile on for CUDA only; TF32 matmuls on CUDA."""
    device = pick_device(device)
    dtype = pick_precision(dtype, device)
    if device.startswith('cuda'):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    compile = device.startswith('cuda') if compile is None else bool(compile)
    return DeviceSetup(device, dtype, compile, autocast(device, dtype))


# Dense 16-bit tensor-core peaks (FLOP/s), by the full name torch.cuda.get_device_name() reports.
# Full names, not substrings: 'L4' is inside 'L40', and the H100's PCIe and NVL parts are slower
# than its SXM part. A device not listed has no MFU: never a made-up number.
PEAK_FLOPS = {
    'NVIDIA H200': 989e12, 'NVIDIA H200 NVL': 835e12, 'NVIDIA H100 80GB HBM3': 989e12,
    'NVIDIA H100 PCIe': 756e12, 'NVIDIA H100 NVL': 835e12, 'NVIDIA A100-SXM4-80GB': 312e12,
    'NVIDIA A100-SXM4-40GB': 312e12, 'NVIDIA A100 80GB PCIe': 312e12,
    'NVIDIA A100-PCIE-40GB': 312e12, 'NVIDIA L40S': 362e12, 'NVIDIA L40': 181e12,
    'NVIDIA L4': 121e12, 'NVIDIA A10': 125e12, 'NVIDIA A10G': 70e12,
    'NVIDIA GeForce RTX 4090': 165e12, 'NVIDIA GeForce RTX 3090': 71e12,
    'Tesla V100-SXM2-16GB': 125e12, 'Tesla V100-SXM2-32GB': 125e12, 'Tesla V100-PCIE-16GB': 112e12,
    'Tesla V100-PCIE-32GB': 112e12, 'Tesla T4': 65e12,
}


def device_peak_flops(device=None):
    """The accelerator's dense 16-bit peak, or None (CPU or a device not in PEAK_FLOPS)."""
    on_cuda = device is None or torch.device(device).type == 'cuda'
    if not (torch.cuda.is_available() and on_cuda):
        return None
    return PEAK_FLOPS.get(torch.cuda.get_device_name(device))


def autocast(device, dtype):
    """Mixed precision for a dtype name; float32 runs as it is."""
    if dtype == 'float32':
        return nullcontext()
    return torch.autocast('cuda' if device.startswith('cuda') else 'cpu', getattr(torch, dtype))


# -----------------------------------------------------------------------------
# files: write to a temporary name, then rename, so nothing is ever half-written

def atomic_write(path, write, before_replace=None):
    """write(tmp_path) produces the file; it appears at path only once complete. before_replace:
    called once the new file is whole and before it replaces the old one; if it raises, the old
    file stays (a checkpoint's record is written there, so it never lags the checkpoint)."""
    tmp = f"{path}.tmp"
    try:
        write(tmp)
        with open(tmp, 'rb+') as f:
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path, text):
    atomic_write(path, lambda tmp: pathlib.Path(tmp).write_text(text))


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2) + '\n')


def read_json(path, what):
    try:
        return json.loads(pathlib.Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{what} not found at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{what} at {path} is not valid JSON ({e}); delete it and regenerate it"
                        ) from None


def read_jsonl(path):
    """The entries of a JSON-lines log, without a last line cut short by a crash (or ending in
    bytes that are not text); a damaged line before the last is one line of error."""
    lines = pathlib.Path(path).read_bytes().splitlines()
    entries = []
    for n, line in enumerate(lines, 1):
        try:
            entries.append(json.loads(line.decode('utf-8')))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if n < len(lines):
                raise UserError(f"{path} is damaged at line {n} of {len(lines)} "
                                f"({type(e).__name__}): repair or remove that line, then run "
                                "again") from None
    return entries


def save_checkpoint(ckpt, path, before_replace=None):
    """Atomically; a failed write is an OSError naming path (torch reports a full disk as a
    RuntimeError of its zip writer), and the file there before stays as it was, as it does when
    before_replace (atomic_write's) raises."""
    try:
        atomic_write(path, lambda tmp: torch.save(ckpt, tmp), before_replace)
    except RuntimeError as e:
        folder = os.path.dirname(os.path.abspath(path))
        free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
        raise OSError(write_failure(folder, free),
                      f"{str(e).strip().splitlines()[0][:120]}; {free / 2 ** 20:.0f} MiB free",
                      path) from None


def write_failure(folder, free):
    """The errno behind a write torch reports only as a RuntimeError: a read-only filesystem, a
    folder this process may not write, a full disk, or else an I/O error."""
    if os.path.isdir(folder) and os.statvfs(folder).f_flag & os.ST_RDONLY:
        return errno.EROFS
    if os.path.isdir(folder) and not os.access(folder, os.W_OK):
        return errno.EACCES
    return errno.ENOSPC if free < 2 ** 30 else errno.EIO


def load_checkpoint(path, map_location='cpu', mmap=False):
    """weights_only=True: a checkpoint from someone else cannot run code on load. mmap=True
    reads tensors lazily (cheap when only model_args are wanted)."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: train one first, or point --out_dir at a run "
                        "directory")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if 'Weights only load failed' in first:  # torch's advice to load it unsafely: not ours
            first = "it holds objects other than tensors and plain values"
        raise UserError(f"cannot read checkpoint {path}: {first[:200]} (corrupt, truncated, "
                        "or not a checkpoint)") from None
    if not isinstance(ckpt, dict) or 'model' not in ckpt or 'model_args' not in ckpt:
        raise UserError(f"{path} is not a kvgpt/nanoGPT checkpoint (it needs 'model' and "
                        "'model_args')")
    return ckpt


def load_optimizer_state(optimizer, model, state, path):
    """Load a checkpoint's AdamW state into optimizer, once it is checked to fit model: a state
    of another model would fail at the first step, deep in torch; here it is one line naming the
    parameter."""
    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group['params']]
    saved = [i for group in state.get('param_groups', []) for i in group['params']]
    advice = ("the checkpoint is damaged or its optimizer is another model's: resume from another "
              "checkpoint, or start with --init_from=<its folder> to fine-tune with a fresh AdamW")
    if len(saved) != len(params):
        raise UserError(f"{path}: its optimizer state holds {len(saved)} tensors for a model of "
                        f"{len(params)}: {advice}")
    for i, p in zip(saved, params):
        for key, value in state.get('state', {}).get(i, {}).items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != p.shape:
                raise UserError(f"{path}: its optimizer state does not fit its model ({key} of "
                                f"{names.get(id(p), 'a parameter')} is {tuple(value.shape)}, the "
                                f"parameter {tuple(p.shape)}): {advice}")
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as e:
        raise UserError(f"{path}: its optimizer state cannot be loaded ({e}): {advice}") from None


def model_from_checkpoint(path, verbose=True):
    """(model, checkpoint) of a checkpoint file: reading it is this module's, making the model
    model.py's (GPT.from_checkpoint); either failing is one line that names the file."""
    from model import GPT
    ckpt = load_checkpoint(path)
    with model_errors(path):
        return GPT.from_checkpoint(ckpt, verbose=verbose), ckpt
