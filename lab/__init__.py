"""The lab beside the trainer: studies (the runner and its study files), their tables and figures,
the probes train.py's evaluations can log, and the benchmarks. Run its scripts from the
repository root as modules: `python -m lab.study`, `python -m lab.report`, `python -m lab.costs`.
"""
