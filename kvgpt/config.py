"""
Settings, as nanoGPT's configurator makes them: a script's defaults, then config files and
--key=value in command-line order, each applied once. A script declares every key in one table,
with its default, its --help line and, where the default does not say it, its type: an unknown key
or a value of the wrong type is one line that names it.

A config file is plain Python, run with the settings so far in scope; the names it assigns are its
settings. It states choices (`mlp_ratio = 4.5`); what follows from other keys is left None and
derived where the model is built. `include = 'small.py'` applies that file (beside it) first, as
if named before it; `stacked_on = 'small.py'` refuses the file unless that one was named before.
The variants are the files in config/ that name a run and choose no data (`variants`).
"""
import difflib
import os
import pathlib
import re
import sys
import types
import typing
from ast import literal_eval

from kvgpt.errors import UserError


class Within(typing.NamedTuple):
    """The values a key takes, beyond its type: a test and the words that say it."""
    test: typing.Callable
    words: str


POSITIVE = Within(lambda v: v >= 1, "must be positive")  # counts of steps, windows, tokens
NOT_NEGATIVE = Within(lambda v: v >= 0, "must not be negative")
BELOW_ONE = Within(lambda v: 0 <= v < 1, "must be at least 0 and below 1")  # a decay rate
FRACTION = Within(lambda v: 0 <= v <= 1, "must be between 0 and 1")
STEPS = Within(lambda v: all(type(k) is int and k > 0 for k in v),
               "must be a tuple of positive steps")


class Kind(typing.NamedTuple):
    """A key's type: int, float, str, bool, tuple or 'device'; with choices, one of them; optional
    (None allowed) when the default is None, unless said otherwise; within, the values it takes
    (POSITIVE, NOT_NEGATIVE, ...), checked wherever it is set."""
    kind: object
    choices: tuple = None
    optional: bool = None
    within: Within = None

    def name(self):
        words = '|'.join(self.choices) if self.choices else getattr(self.kind, '__name__',
                                                                     self.kind)
        return words + ('|None' if self.optional else '')


class Key(typing.NamedTuple):
    """A setting: its default, its --help line, its Kind where that is not the default's type,
    and the --help section that lists it."""
    default: object
    help: str
    kind: Kind = None
    group: str = 'settings'


def keys(group='settings', **table):
    """{name: Key} from name=(default, help) or (default, help, Kind), listed under group."""
    return {name: Key(*entry, group=group) for name, entry in table.items()}


def defaults(table):
    return {name: key.default for name, key in table.items()}


def kind_of(key):
    kind = key.kind or Kind(type(key.default))
    return kind if kind.optional is not None else kind._replace(optional=key.default is None)


def closest(word, words, cutoff=0.6):
    """The one of words most like word, if any is alike enough (difflib's ratio, 0 to 1)."""
    close = difflib.get_close_matches(word, words, n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(word, words):
    close = closest(word, words)
    return f" (did you mean '{close}'?)" if close else ""


BOOL_WORDS = {'true': True, 'false': False}  # --compile=false means False, as --compile=False


def check_value(name, value, table, source):
    """value made the key's type (an int for a float, a word true/false for a bool), or a one-line
    error that names the key and what it takes."""
    if name not in table:
        raise UserError(f"{source}: unknown config key '{name}'{did_you_mean(name, table)}")
    kind = kind_of(table[name])
    want = kind.kind
    if value is None and kind.optional:
        return None
    if want is bool and isinstance(value, str) and value.lower() in BOOL_WORDS:
        value = BOOL_WORDS[value.lower()]
    if want is float and type(value) is int or want is tuple and type(value) is list:
        value = want(value)
    ok = (isinstance(value, str) and re.fullmatch(r'cpu|mps|cuda(:\d+)?', value)
          if want == 'device' else type(value) is want)
    if not ok:
        number = type(value) in (int, float) and want in (str, 'device')
        quote = " (quote a name that looks like a number)" if number else ""
        takes = 'cpu, cuda, cuda:N or mps' if want == 'device' else kind.name()
        raise UserError(f"{source}: {name} must be {takes}, got {value!r}{quote}")
    if kind.choices and value not in kind.choices:
        raise UserError(f"{source}: {name} must be one of {', '.join(kind.choices)}, got "
                        f"{value!r}{did_you_mean(str(value), kind.choices)}")
    if kind.within and not kind.within.test(value):
        raise UserError(f"{source}: {name} {kind.within.words}, got {value!r}")
    return value


CONFIG_ARGUMENTS = 'Arguments are config files (plain Python) and --key=value, applied in order.'


def parse_config(table, argv=None, show=False, usage='', arguments=CONFIG_ARGUMENTS):
    """The settings: the table's defaults, then each argument of argv (None: the command line)
    applied once, in order. -h or --help prints usage (the script's docstring), what the
    arguments are (a script that takes other files says so) and every key, and exits 0; show
    prints the settings that differ from the defaults."""
    argv = sys.argv[1:] if argv is None else argv
    if '-h' in argv or '--help' in argv:
        print(help_text(table, usage, arguments))
        sys.exit(0)
    config, files = defaults(table), []
    for arg in argv:
        if arg.startswith('--'):
            made = dict([key_value(arg, table)])
        else:
            made = run_config_file(arg, config, files, table)
            files.append(arg)
        for name, value in made.items():
            config[name] = check_value(name, value, table, arg)
    if show:
        print_overrides(config, defaults(table))
    return config


def parse_value(text):
    try:
        return literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string: --dataset=openwebtext


def key_value(arg, table):
    """(name, value) of --name=value; a text key takes a number as written (--start=2024)."""
    name, eq, text = arg[2:].partition('=')
    if not eq:
        raise UserError(f"expected --key=value, got '{arg}'")
    value = parse_value(text)
    if type(value) in (int, float) and name in table and kind_of(table[name]).kind is str:
        value = text
    if is_path_key(name) and isinstance(value, str) and (value == '~' or value.startswith('~/')):
        value = os.path.expanduser(value)  # the shell leaves a ~ after --key= as it is
    return name, value


def is_path_key(name):
    """A key that names a file or folder (out_dir, data_root, json_path, init_from, ...)."""
    return name.endswith(('_dir', '_root', '_path', '_out')) or name == 'init_from'


def run_config_file(path, config, applied=None, table=None):
    """The settings a config file assigns, after those of the files it includes. It runs with
    config in scope; applied: the files named before it, among which its stacked_on must be
    (None checks nothing); table: the script's keys, which say how it names a run."""
    # a run's folder is --out_dir, or --in_dir in the tools that read one run and write another
    run = 'in_dir' if table and 'in_dir' in table else 'out_dir'
    if os.path.isdir(path):  # a run folder, given as `python sample.py out-demo`
        raise UserError(f"'{path}' is a folder, not a config file: a run's folder is named "
                        f"with --{run}={path}")
    if not os.path.isfile(path):
        raise UserError(f"config file '{path}' not found (arguments are config files and "
                        "--key=value)")
    if is_checkpoint(path):
        as_file = f", or the file itself with --init_from={path}" if not table or \
            'init_from' in table else ''
        raise UserError(f"'{path}' is a checkpoint, not a config file: name its run with "
                        f"--{run}={os.path.dirname(path) or '.'}{as_file}")
    # one namespace, as a module has: a comprehension or def in the file reads what the file set
    # before it, not the value the file replaced
    namespace = Assignments(config)
    try:
        exec(compile(pathlib.Path(path).read_text(), path, 'exec'), namespace)
    except SystemExit:  # not an Exception: it would end the script with nothing done
        raise UserError(f"config file '{path}' calls exit(): a config file only sets values"
                        ) from None
    except Exception as e:
        raise UserError(f"config file '{path}' failed: {type(e).__name__}: {e}") from None
    made = {k: namespace[k] for k in dict.fromkeys(namespace.assigned) if k in namespace
            and not k.startswith('_') and not isinstance(namespace[k], types.ModuleType)
            and not callable(namespace[k])}
    for base in named_files(path, made.pop('stacked_on', ())):
        if applied is not None and os.path.abspath(base) not in map(os.path.abspath, applied):
            raise UserError(f"{path} is stacked on {base}: name that file before it, as in "
                            f"`python train.py {base} {path}`")
    included = {}
    for base in named_files(path, made.pop('include', ())):
        included.update(run_config_file(base, config, applied, table))
        if applied is not None:  # an include is its base named first, for a later stacked_on too
            applied.append(base)
    return {**included, **made}


def is_checkpoint(path):
    """A file torch.save wrote: a zip archive (torch's format since 1.6) or a .pt name."""
    with open(path, 'rb') as f:
        return path.endswith('.pt') or f.read(4) == b'PK\x03\x04'


class Assignments(dict):
    """A config file's namespace that records the names the file assigns, in order (a value
    equal to the one before is still the file's choice)."""
    def __init__(self, config):
        super().__init__(config)
        self.assigned = []

    def __setitem__(self, name, value):
        self.assigned.append(name)
        super().__setitem__(name, value)


def named_files(path, names):
    """The files a config file's include or stacked_on names (a name or a tuple), beside it."""
    names = (names,) if isinstance(names, str) else names
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
        raise UserError(f"{path}: include and stacked_on name files as strings")
    return [os.path.normpath(os.path.join(os.path.dirname(path), name)) for name in names]


def print_overrides(config, defaults):
    """The settings that differ from the defaults, one a line (config.json holds them all)."""
    changed = {k: v for k, v in config.items() if k not in defaults or v != defaults[k]}
    width = max(map(len, changed), default=0)
    print("settings that differ from the defaults:" if changed else "the default settings")
    for key, value in changed.items():
        print(f"  {key:<{width}} = {value!r}")


def help_text(table, usage='', arguments=CONFIG_ARGUMENTS):
    """Usage, then every key of the table under its group: default, type and help line."""
    flags = {name: f"--{name}={key.default!r}" for name, key in table.items()}
    width = max(map(len, flags.values()))
    lines = [usage.strip(), '', arguments, 'A bool takes True or False (or true, false); None '
             'unsets a key whose type ends in |None. Keys:']
    for group in dict.fromkeys(key.group for key in table.values()):
        lines.append(f"\n{group}:")
        lines += [f"  {flags[name]:<{width}}  {kind_of(key).name():<8} {key.help}".rstrip()
                  for name, key in table.items() if key.group == group]
    return '\n'.join(lines)


# -----------------------------------------------------------------------------
# the variants: config/<name>.py files that name a run and choose no data

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'config')


def config_file(name):
    return os.path.join(CONFIG_DIR, f'{name}.py')


def variants(geometry):
    """The model variants, in name order: every config/<name>.py that names a run (out_dir) without
    choosing data (the CPU bases set dataset, directly or by stacking). A variant is defined by its
    file alone: bench.py, lab.report and the studies read this list, nothing else names them."""
    names = []
    for f in sorted(os.listdir(CONFIG_DIR)):
        if f.endswith('.py'):
            made = run_config_file(os.path.join(CONFIG_DIR, f), geometry)
            if 'out_dir' in made and 'dataset' not in made:
                names.append(f[:-3])
    return names


def variant_settings(name, geometry, wanted):
    """The settings among wanted (the model's keys) that config/<name>.py makes, run with the
    geometry in scope (config/baseline_small.py takes 31/32 of its width)."""
    known = variants(geometry)
    if name not in known:
        raise UserError(f"unknown variant '{name}': choose from {', '.join(known)} "
                        "(a file config/<name>.py)")
    return {k: v for k, v in run_config_file(config_file(name), geometry).items() if k in wanted}
