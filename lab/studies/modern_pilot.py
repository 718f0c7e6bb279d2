"""The modern block's pilot (not a verdict): baseline and reduced, with and without
config/modern.py, seeds 1 and 2, on the demo's geometry (docs/experiments.md).

Its eight runs were started by hand with the command the docs give; this file names their
table. It plans no runs.
"""
name = 'modern_pilot'
docs = 'docs/experiments.md'
base = ('config/cpu/small.py',)
arms = dict(baseline=dict(), reduced=dict())
tables = dict(modern_pilot=dict(kind='pilot', folder='modern_pilot'))
