"""Markdown tables, as every generated block and report writes them: one header-and-separator
helper, so that a table's columns are named once."""


def row(cells):
    """`| a | b |`; an empty cell is `| |`."""
    return '|' + '|'.join(f' {c} ' if c != '' else ' ' for c in cells) + '|'


def head(*cells):
    """A table's first two lines: its header row and the separator under it."""
    return [row(cells), '|' + '---|' * len(cells)]
