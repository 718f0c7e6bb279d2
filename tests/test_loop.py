"""train.py's loop: its state saved and restored from one structure."""
from dataclasses import dataclass, field

from kvgpt.checkpoint import load_checkpoint
import train
from test_train import argv

# the keys sample.py, the tools and older runs read
CHECKPOINT_KEYS = {'model', 'optimizer', 'model_args', 'config', 'meta', 'wandb_run_id',
                   'iter_num', 'best_val_loss', 'tokens_seen', 'rng', 'scaler'}


@dataclass
class Counter:  # loop state with a state_dict(), as the scaler and the RNG have
    count: int = 0

    def state_dict(self):
        return {'count': self.count}

    def load_state_dict(self, saved):
        self.count = saved['count']


def test_a_field_added_to_the_loop_state_alone_is_saved_and_resumed(data_root, tmp_path,
                                                                    monkeypatch):
    @dataclass
    class MoreState(train.LoopState):  # what a change adds: a number and an object
        spikes: int = 0
        ema: Counter = field(default_factory=Counter)
    monkeypatch.setattr(train, 'LoopState', MoreState)
    real_setup = train.setup

    def setup(*args):  # a fresh run sets them; a resume must find them in its checkpoint
        run = real_setup(*args)
        if run.state.iter_num == 0:
            run.state.spikes, run.state.ema.count = 7, 3
        return run
    monkeypatch.setattr(train, 'setup', setup)
    train.main(argv(data_root, tmp_path, max_iters=2, eval_interval=2))
    ckpt = load_checkpoint(str(tmp_path / 'ckpt.pt'))
    assert ckpt.keys() == CHECKPOINT_KEYS | {'spikes', 'ema'}
    assert (ckpt['spikes'], ckpt['ema']) == (7, {'count': 3})
    resumed = train.main(argv(data_root, tmp_path, init_from='resume', max_iters=4,
                              eval_interval=2))
    assert (resumed.state.iter_num, resumed.state.spikes, resumed.state.ema) == (4, 7, Counter(3))
