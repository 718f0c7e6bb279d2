"""
A run over several processes (torchrun), and what keeps them in step: the process group (with
torchrun's elastic restarts), each process's share of a step, the collectives every rank must call
(and a clear failure when one rank calls one alone), the ranks' agreement on failures, and each
rank's RNG state. The signals that stop a run are kvgpt/signals.py's.
"""

import datetime
import functools
import gc
import os
import re
from typing import NamedTuple

import torch
import torch.distributed as dist

from kvgpt.device import pick_device
from kvgpt.errors import SameOnEveryRank, UserError


# -----------------------------------------------------------------------------
# the process group

class Dist(NamedTuple):
    ddp: bool  # under torchrun
    rank: int
    world: int  # processes in all
    device: str  # this process's

    @property
    def master(self):  # rank 0 logs, checkpoints and probes
        return self.rank == 0

    def micro_steps(self, total):
        """This process's share of a step's micro-batches: the global batch is the same at every
        world size, so the count must divide by it."""
        if total % self.world:
            fits = -(-total // self.world) * self.world
            raise SameOnEveryRank(f"gradient_accumulation_steps {total} is not divisible by the "
                                  f"world size {self.world}: use a multiple of it, such as "
                                  f"--gradient_accumulation_steps={fits} (the global batch is "
                                  "the same at every world size)")
        return total // self.world


TIMEOUT_ENV = 'KVGPT_COLLECTIVE_TIMEOUT'  # seconds a rank waits in a collective for the others


def setup_distributed(device, backend=None):
    """This process's Dist; torchrun sets RANK, LOCAL_RANK and WORLD_SIZE. KVGPT_COLLECTIVE_TIMEOUT
    (seconds; unset: torch's default, 30 minutes for gloo, 10 for nccl) bounds a rank's wait for
    the others in a collective: past it a gloo rank fails with a RanksApart; under NCCL torch's
    watchdog handles it (by default it ends the process)."""
    device = pick_device(device)
    if int(os.environ.get('RANK', -1)) == -1:
        return Dist(False, 0, 1, device)
    rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    if device.startswith('cuda'):
        device = f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(device)
    backend = backend or ('nccl' if device.startswith('cuda') else 'gloo')
    seconds = os.environ.get(TIMEOUT_ENV)
    if seconds and not re.fullmatch(r'\d+(\.\d*)?', seconds):
        raise UserError(f"{TIMEOUT_ENV} must be a number of seconds, got {seconds!r}")
    options = dict(timeout=datetime.timedelta(seconds=float(seconds))) if seconds else {}
    if backend == 'nccl':  # else NCCL's barrier warns that it uses whichever GPU is current
        options['device_id'] = torch.device(device)
    store = restart_store(world)
    if store is None:
        dist.init_process_group(backend=backend, **options)
    else:
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world,
                                **options)
    return Dist(True, rank, world, device)


def close(process, finished):
    """The process group's end. After a finished run, first free what still holds gloo work
    (the DDP wrapper's reducer, dropped by the caller) and let rank 0 finish writing: either torn
    down late aborts the process (SIGABRT) at exit."""
    if not process.ddp:
        return
    if finished:
        gc.collect()
        dist.barrier()
    dist.destroy_process_group()


# -----------------------------------------------------------------------------
# collectives: calls every rank must make, in the same order

class RanksApart(UserError):
    """A collective that failed on this rank: another rank never joined it within the process
    group's timeout (it skipped the call, as under nanoGPT's `if master_process:`, or it stopped).
    Its one line names the outermost @all_ranks call it failed in: the one the caller made."""

    def __init__(self, op, cause):
        super().__init__(op)
        self.call, self.op, self.rank = op, op, dist.get_rank()  # read while the group lives
        # gloo's first line opens with its source file: [.../unbound_buffer.cc:129] Timed out...
        first = (str(cause).strip() or type(cause).__name__).splitlines()[0]
        self.cause = re.sub(r'^\[[^]]*\]\s*', '', first)

    def __str__(self):
        return (f"{self.call} on rank {self.rank}: the other ranks did not join its {self.op} "
                f"({self.cause}): every rank must make this call, never rank 0 alone (train.py's "
                "docstring lists them)")


def all_ranks(fn):
    """Marks fn as a call every rank must make: one that fails because another rank stayed away
    is a RanksApart naming fn (or the @all_ranks call around it), within the process group's
    timeout, not a hang."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RanksApart as e:
            e.call = fn.__qualname__  # each caller out renames it: the outermost's name stays
            raise
    return call


def collective(op):
    """torch.distributed's op, whose failure (gloo raises a RuntimeError when the others never
    come) is a RanksApart."""
    @functools.wraps(op)
    def call(*args, **kwargs):
        try:
            return op(*args, **kwargs)
        except RuntimeError as e:
            raise RanksApart(op.__name__, e) from None
    return call


all_reduce = collective(dist.all_reduce)
all_gather_object = collective(dist.all_gather_object)


def any_rank(process, flag):
    """True when flag (a bool or a device tensor) is set on any rank: every rank takes the same
    branch, so none is left waiting in a collective the others never reach. Outside DDP, no
    sync for a Python bool."""
    if not process.ddp:
        return bool(flag)
    t = flag.float().reshape(1) if torch.is_tensor(flag) else \
        torch.tensor([float(flag)], device=process.device)
    all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item() > 0


class RankRNG:
    """Every rank's torch (and cuda) RNG state, as a checkpoint field: state_dict() gathers them
    all as tensors (they load under weights_only=True), a collective; load_state_dict() sets this
    rank's own (a rank beyond the saved world size keeps its seed)."""

    def __init__(self, process):
        self.process = process

    @all_ranks
    def state_dict(self):
        process, state = self.process, {'torch': torch.get_rng_state()}
        if process.device.startswith('cuda'):
            state['cuda'] = torch.cuda.get_rng_state(process.device)
        if not process.ddp:
            return [state]
        gathered = [None] * process.world
        all_gather_object(gathered, {k: v.cpu() for k, v in state.items()})
        return gathered

    def load_state_dict(self, states):
        process = self.process
        if process.rank < len(states):
            torch.set_rng_state(states[process.rank]['torch'])
            if 'cuda' in states[process.rank] and process.device.startswith('cuda'):
                torch.cuda.set_rng_state(states[process.rank]['cuda'], process.device)


# -----------------------------------------------------------------------------
# torchrun's elastic restarts

def restart_store(world):
    """The store for the process group's handshake, or None for torchrun's own. torchrun's agent
    keeps one store for all restarts, so a restarted round's gloo or NCCL handshake can read the
    previous round's addresses and fail with 'Connection refused' (pytorch/pytorch#135712): each
    round gets keys of its own. On one node every worker's restart count names the round. Across
    nodes the agents' counts can differ (pytorch/pytorch#108158), so there the round is counted in
    the store itself: every rank of a round adds 1 to one key as it starts, so the first round's
    ranks read 1..world, the next round's world+1..2 world, and so on, on every node alike."""
    if os.environ.get('TORCHELASTIC_USE_AGENT_STORE') != 'True':
        return None  # torchrun's store is fresh for every round (or there is no torchrun)
    store = dist.TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']), world,
                          is_master=False)
    if os.environ.get('GROUP_WORLD_SIZE', '1') == '1':
        generation = os.environ['TORCHELASTIC_RESTART_COUNT']
    else:
        generation = (store.add('kvgpt/ranks_started', 1) - 1) // world
    return dist.PrefixStore(f"kvgpt/restart_{generation}", store)
