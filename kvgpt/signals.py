"""
SIGTERM and Ctrl-C while a run trains: the first saves at the next safe point and stops, a second
stops at once. Under torchrun the ranks agree first, so every rank saves and stops at one step.
"""
import os
import signal
import sys

import torch

from kvgpt import distributed


class Interrupted(Exception):
    """A signal arrived during an evaluation: it is left unfinished, and the run saves."""


class Signals:
    """SIGTERM and SIGINT while a run trains. The first asks for a save at the next safe point
    (the end of the step, or of an evaluation batch; under DDP the next log step, where the ranks
    agree) and a stop; a second stops at once without saving: the checkpoint on disk stays
    whole, since every write of one is a rename. `number` is the first signal's, None until one
    arrives."""

    def __init__(self, process, out_dir):
        self.process, self.out_dir, self.number, self.previous = process, out_dir, None, {}
        self.agreed_stop = None  # (rank, signal number) once the ranks agreed to stop

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.arrived)
                         for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def arrived(self, number, frame=None):
        name = signal.Signals(number).name
        if self.number is not None:
            print(f"{name} again: stopping now, without saving; the last checkpoint in "
                  f"{self.out_dir} is kept", file=sys.stderr, flush=True)
            return os._exit(128 + number)
        self.number = number
        where = f" on rank {self.process.rank}" if self.process.ddp else ""
        print(f"{name}{where}: saving a checkpoint and stopping (a second one stops at once)",
              file=sys.stderr, flush=True)

    @distributed.all_ranks
    def all_ranks_agree_to_stop(self, step, log_interval):
        """A signal arrived on any rank. Under DDP that is one all-reduce, so it is asked only at
        log steps: still well inside torchrun's grace period, and no per-step host sync."""
        if self.process.ddp and step % log_interval:
            return False
        return self.agree() is not None

    def agree(self):
        """(rank, signal number) of the lowest rank a signal arrived on, the same on every rank,
        or None: under DDP one all-reduce of each rank's signal number."""
        if not self.process.ddp:
            found = [(0, self.number)] if self.number is not None else []
        else:
            numbers = torch.zeros(self.process.world, device=self.process.device)
            numbers[self.process.rank] = self.number or 0
            distributed.all_reduce(numbers)
            found = [(rank, int(n)) for rank, n in enumerate(numbers.tolist()) if n]
        self.agreed_stop = found[0] if found else None
        return self.agreed_stop

    @property
    def stopped(self):
        """(rank, signal number) when the run stopped for a signal on any rank, else None."""
        if self.agreed_stop is None and self.number is not None and not self.process.ddp:
            return (0, self.number)
        return self.agreed_stop

    def describe(self):
        """The stop's signal, and under DDP the rank it arrived on: 'SIGTERM on rank 1'."""
        rank, number = self.stopped
        return signal.Signals(number).name + (f" on rank {rank}" if self.process.ddp else "")

    def all_ranks_share(self, items):  # a generator: its callers' @all_ranks names a failure
        """This rank's items (every world-th, from its rank), asking before each round whether a
        signal arrived on any rank: an evaluation stops within one batch of it (every rank asks
        equally often, so none waits in a collective the others skip)."""
        for first in range(0, len(items), self.process.world):
            if self.agree() is not None:
                raise Interrupted
            if first + self.process.rank < len(items):
                yield items[first + self.process.rank]
