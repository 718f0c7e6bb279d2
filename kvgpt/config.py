"""
Settings, nanoGPT-style: defaults, then config files and --key=value in command-line order, each
key typed (a wrong type or an unknown key is one line that names it), -h/--help built from the
defaults' source comments; and the model variants, one config file each.

Stacking: files and --key=value apply in the order given. A file runs with the settings so far in
scope, so it can derive a value (`mlp_hidden = 9 * n_embd // 2`); a key that a later argument
sets is already at its final value there, so a later --n_embd never leaves a derived width stale.
A file that needs a base says `stacked_on = 'small.py'` and is refused without it; a file that is
a whole setting of its own says `include = 'small.py'`, the same as naming that file first.
"""

import ast
import dataclasses
import difflib
import os
import pathlib
import re
import sys
import types
import typing

from kvgpt.errors import UserError


# -----------------------------------------------------------------------------
# values and their types

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


# -----------------------------------------------------------------------------
# the command line: config files and --key=value, in order

def parse_config(defaults, argv=None, show=False, described_in=(), types=None):
    """nanoGPT's configurator made strict: an unknown key or a value of the wrong type (see Kind)
    is a one-line error that names the key. argv None is the command line; show prints the
    settings that differ from the defaults. -h or --help prints every key with its default, type
    and description (from the sources described_in, the caller's file by default) and exits 0.
    A config file sees every key that a later argument sets at its final value (the module's
    docstring): the arguments are applied again until nothing changes."""
    types = types or {}
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ('-h', '--help') for a in argv):
        sources = described_in or (sys._getframe(1).f_globals['__file__'],)
        print(help_text(defaults, sources, types))
        sys.exit(0)
    config, sets = apply_arguments(defaults, argv, types)
    for _ in range(3):  # a derivation that feeds another settles in a pass or two
        again, sets = apply_arguments(defaults, argv, types, config, sets)
        if again == config:
            break
        config = again
    if show:
        print_overrides(config, defaults)
    return config


def apply_arguments(defaults, argv, types, final=None, sets=None):
    """(the config, the keys each argument set): the arguments in order, each config file run
    with the final value (from the pass before) of every key an argument after it sets."""
    config, made_by, applied = dict(defaults), [], []
    for i, arg in enumerate(argv):
        if arg.startswith('--'):
            key, eq, text = arg[2:].partition('=')
            if not eq:
                raise UserError(f"expected --key=value, got '{arg}'")
            value = parse_value(text)
            if type(value) in (int, float) and key in defaults and \
                    kind_of(key, defaults, types).kind is str:
                value = text  # a text key takes a number as written: --start=2024
            config[key] = check_value(key, value, defaults, arg, types)
            made_by.append({key})
            continue
        later = set().union(*sets[i + 1:]) if sets else set()
        seen = dict(config, **{k: final[k] for k in later if k in final})
        made = run_config_file(arg, seen, applied)
        for key, value in made.items():
            config[key] = check_value(key, value, defaults, arg, types)
        made_by.append(set(made))
        applied.append(arg)
    return config, made_by


DECLARATIONS = ('include', 'stacked_on')  # what a config file says about other files


def run_config_file(path, config, applied=None):
    """The settings a config file makes. It runs with the config so far in scope, as nanoGPT's
    configurator does, so a file can derive a value (`mlp_hidden = 9 * n_embd // 2`) from the
    geometry that earlier files or defaults set; what it leaves alone is not returned. Its
    `include = 'small.py'` runs that file (beside it) first, as if named before it; its
    `stacked_on = 'small.py'` refuses it unless that file was applied before it (applied: the
    files so far; None checks nothing, as when listing the variants)."""
    if not os.path.isfile(path):
        raise UserError(f"config file '{path}' not found (arguments are config files and "
                        "--key=value)")
    text = pathlib.Path(path).read_text()
    declared = declarations(path, text)
    base = os.path.dirname(path)
    made = {}
    for name in as_tuple(declared.get('include')):
        made.update(run_config_file(os.path.join(base, name), dict(config, **made), applied))
    for name in as_tuple(declared.get('stacked_on')):
        wanted = os.path.join(base, name)
        if applied is not None and os.path.abspath(wanted) not in map(os.path.abspath, applied):
            raise UserError(f"{path} is stacked on {wanted}: name that file before it, as in "
                            f"`python train.py {wanted} {path}`")
    namespace = dict(config, **made)
    try:
        exec(compile(text, path, 'exec'), namespace)
    except SystemExit:  # not an Exception: it would end the script with nothing done
        raise UserError(f"config file '{path}' calls exit(): a config file only sets values"
                        ) from None
    except Exception as e:
        raise UserError(f"config file '{path}' failed: {type(e).__name__}: {e}") from None
    own = {key: value for key, value in namespace.items()
           if not key.startswith('_') and key not in DECLARATIONS
           and not isinstance(value, (types.ModuleType, types.FunctionType, type))
           and not (key in config and value is config[key])}
    return dict(made, **own)


def declarations(path, text):
    """{include, stacked_on} as the file writes them: plain strings (or tuples of them)."""
    found = {}
    try:
        body = ast.parse(text, path).body
    except SyntaxError as e:
        raise UserError(f"config file '{path}' failed: SyntaxError: {e}") from None
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name) and node.targets[0].id in DECLARATIONS:
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                raise UserError(f"{path}: {node.targets[0].id} must name files as plain "
                                "strings") from None
    return found


def as_tuple(value):
    return () if value is None else (value,) if isinstance(value, str) else tuple(value)


def print_overrides(config, defaults):
    """The settings that differ from the defaults, one a line (config.json holds them all)."""
    changed = {k: v for k, v in config.items() if k not in defaults or v != defaults[k]}
    width = max(map(len, changed), default=0)
    print("settings that differ from the defaults:" if changed else "the default settings")
    for key, value in changed.items():
        print(f"  {key:<{width}} = {value!r}")


# -----------------------------------------------------------------------------
# --help: every key with its default, type and source comment

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


# -----------------------------------------------------------------------------
# the model variants: every config/<name>.py that names a run without choosing data

# the repository's config/ folder, beside lab/
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'config')


def variants(config):
    """The model variants, in name order: every config/<name>.py that names a run (out_dir) without
    choosing data (the CPU bases set dataset, directly or by stacking). A variant is defined by its
    file alone: bench.py, lab.report and the studies read this list, nothing else names them."""
    names = []
    for f in sorted(os.listdir(CONFIG_DIR)):
        if f.endswith('.py'):
            made = run_config_file(os.path.join(CONFIG_DIR, f), config)
            if 'out_dir' in made and 'dataset' not in made:
                names.append(f[:-3])
    return names


def variant_settings(name, config, keys):
    """The settings among keys (the model's) that config/<name>.py makes, evaluated against config,
    so a file written against n_embd fits any geometry."""
    known = variants(config)
    if name not in known:
        raise UserError(f"unknown variant '{name}': choose from {', '.join(known)} "
                        "(a file config/<name>.py)")
    made = run_config_file(os.path.join(CONFIG_DIR, f'{name}.py'), config)
    return {k: v for k, v in made.items() if k in keys}
