# GPT-2 small (124,373,760 parameters with vocab 50304) on OpenWebText: the paper's baseline.
# Everything else is train.py's default, which are the authors' settings: micro-batch 12 x
# block 1024 x 40 accumulation = 491,520 tokens per step; AdamW lr 6e-4, betas (0.9, 0.95),
# grad clip 1.0; 2000 warmup steps, cosine to 6e-5 over 600k steps but stopped after 105,002
# steps (51.6B tokens) as the authors' runs were, at 93.6% of the peak LR; eval every 1000 steps
# on 200 batches; checkpoints kept at steps 50k, 100k and 105k; bf16.
out_dir = 'out-baseline'
weight_decay = 0.1
