"""
The modules the scripts share, each named for what it holds:

    errors       one-line user errors, and how every script reports them
    config       settings: defaults, config files and --key=value, typed keys, --help, and
                 the variants (the config/<name>.py files that name a run)
    device       the device and precision rule, autocast, peak FLOPs
    files        files written whole (a temporary name, then a rename); JSON and JSON lines;
                 the lock that gives a run's folder or a dataset's one writer
    checkpoint   ckpt.pt saved and loaded, the resume policy, one run per out_dir
    optimizer    the optimizer built from the settings: AdamW, or Muon with AdamW
    distributed  the process group, the collectives, the ranks' agreement, RNG states
    signals      SIGTERM and Ctrl-C: save and stop, the ranks agreeing first
    tracking     a run's record (config.json, log.jsonl) and its trackers (W&B, TensorBoard)
    tokenizer    bytes and the GPT-2 BPE
    data         the bin format read and written whole, the Dataset train.py draws from, llm.c
                 shards

The scripts at the root (train.py, prepare.py, sample.py, bench.py) compose them; model.py
imports none of them (it is torch only).
"""
