"""
A study's write-up: the generated blocks of its docs (between `<!-- generated: NAME -->` and
`<!-- end -->`) and its figures, rewritten from the committed logs alone:

    python -m lab.study lab/studies/*.py --report=True

Each block is a kind of table (lab/tables.py) and each figure a kind of figure (lab/figures.py),
named with its parameters in the study file's `tables` and `figures`.
"""
import inspect
import os
import re

from kvgpt.errors import UserError
from kvgpt.files import write_text
from lab import figures, tables
from lab.tables import Context

TABLES = dict(tuning=tables.tuning_table, stability=tables.stability_table,
              verdicts=tables.verdicts_table, decisions=tables.decisions_table,
              trajectory=tables.trajectory_table,
              budget_gap=tables.budget_gap_table, induction=tables.induction_table,
              dtype=tables.dtype_table, claims=tables.claims_table, rerun=tables.rerun_table,
              lag=tables.lag_table, seed_lags=tables.seed_lag_table, logits=tables.logits_table,
              learned_scale=tables.learned_scale_table, seed_phase=tables.seed_phase_table,
              budgets=tables.budgets_table, climb=tables.climb_table,
              wd_lr_tuning=tables.wd_lr_tuning_table, arm_verdicts=tables.arm_verdicts_table,
              trend=tables.trend_table, geometry=tables.geometry_table,
              refine=tables.refine_table, diagnostics_note=tables.diagnostics_note,
              pilot=tables.pilot_table, tokens_gaps=tables.tokens_gaps_table,
              onsets=tables.onsets_table, gap_steps=tables.gap_steps_table,
              attention_lag=tables.attention_lag_table,
              tokens_schedule=tables.tokens_schedule_table, wsd_check=tables.wsd_check_table,
              wsd_budgets=tables.wsd_budgets_table, wsd_trend=tables.wsd_trend_table,
              wsd_cooldown=tables.wsd_cooldown_table)
BLOCK = re.compile(r'(<!-- generated: (\w+) -->\n)(.*?)(<!-- end -->)', re.S)


def fill(text, made):
    """The docs' text with each block named in made replaced by its new content."""
    return BLOCK.sub(lambda m: m.group(1) + made[m.group(2)] + m.group(4) if m.group(2) in made
                     else m.group(0), text)


def made_by(ctx, specs, kinds, what):
    """{name: kind(ctx, **parameters)} for each of the study's tables or figures."""
    out = {}
    for name, spec in specs.items():
        spec = dict(spec)
        kind = spec.pop('kind', None)
        if kind not in kinds:
            raise UserError(f"{ctx.s.path}: {what} {name} has unknown kind {kind!r} (one of "
                            f"{', '.join(kinds)})")
        signature = inspect.signature(kinds[kind])
        try:  # the parameters checked first: a TypeError from inside is the kind's own
            signature.bind(ctx, **spec)
        except TypeError as e:
            raise UserError(f"{ctx.s.path}: {what} {name} of kind {kind!r}: {e} (its parameters: "
                            f"{', '.join(list(signature.parameters)[1:])})") from None
        out[name] = kinds[kind](ctx, **spec)
    return out


def blocks(s, root, ctx=None):
    """{block name: markdown} of every table the study declares, from its committed logs."""
    return made_by(ctx or Context(s, root), s.tables, TABLES, 'table')


def write_figures(s, root, folder, ctx=None):
    """Each figure the study declares whose runs are committed (a kind returns None until
    then)."""
    ctx = ctx or Context(s, root)
    drawn = made_by(ctx, {name: dict(spec, path=os.path.join(folder, name))
                          for name, spec in s.figures.items()}, figures.FIGURES, 'figure')
    return [name for name, done in drawn.items() if done]


def write_report(s, root):
    """Rewrite the study's blocks of its docs, then its figures; return the blocks."""
    if not s.docs:
        raise UserError(f"{s.path} declares no docs: name the write-up whose generated blocks "
                        "--report rewrites (docs = 'docs/mine.md')")
    if not os.path.isfile(s.docs):
        raise UserError(f"{s.docs} not found: a study's docs is the write-up whose generated "
                        "blocks are rewritten")
    with open(s.docs) as f:
        text = f.read()
    ctx = Context(s, root)  # every committed log read once, for the tables and the figures
    made = blocks(s, root, ctx)
    missing = [name for name in made if f'<!-- generated: {name} -->' not in text]
    if missing:
        raise UserError(f"{s.docs} has no block for {', '.join(missing)}: add "
                        f"'<!-- generated: {missing[0]} -->' and '<!-- end -->' where it goes")
    write_text(s.docs, fill(text, made))
    print(f"wrote {len(made)} block{'' if len(made) == 1 else 's'} of {s.name} into {s.docs}")
    write_figures(s, root, os.path.join(os.path.dirname(s.docs), 'assets'), ctx)
    return made
