#!/usr/bin/env bash
# The prepared GPU check: the CUDA path proven and measured in one go, in under 8 minutes on one
# GPU. Writes results.md and results.json (and the raw logs) into $OUT (default: gpu-check/).
#   bash tools/gpu_check.sh             # on a CUDA machine: GPT-2 small, bf16, compiled
#   DRY_RUN=1 bash tools/gpu_check.sh   # the same steps, tiny sizes, on CPU (the tests run it)
# Steps: 1. pytest -m cuda; 2. bench.py train steps, variants alternated; 3. torchrun training of
# config/reduced.py on the embedded corpus with GPT-2 BPE (bytes in the dry run) (NCCL, compile, bf16, checkpoint, resume);
# 4. KV-cache sampling against recomputation.
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository root
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
DATA=${DATA_ROOT:-data}  # where the embedded corpus is prepared; the dry run keeps it under $OUT
export PYTHONUNBUFFERED=1
if [ "${DRY_RUN:-0}" = 1 ]; then
  GEOM="--n_layer=2 --n_head=2 --n_embd=64 --block_size=64"
  BENCH="$GEOM --vocab_size=512 --batch_size=2 --steps=2 --warmup=1 --device=cpu"
  TRAIN="$GEOM --batch_size=2 --gradient_accumulation_steps=1 --device=cpu --compile=False --dtype=float32"
  STEPS=4; SAMPLE="$BENCH --max_new_tokens=20"; TOK=byte; export OMP_NUM_THREADS=1; DATA=${DATA_ROOT:-$OUT/data}
else
  BENCH="--block_size=1024 --batch_size=16 --steps=20 --warmup=3"
  TRAIN="--batch_size=16 --gradient_accumulation_steps=1"
  STEPS=60; SAMPLE="--max_new_tokens=500"; TOK=gpt2
fi
run() { echo "== $*" | tee -a "$OUT/log.txt"; "$@" 2>&1 | tee -a "$OUT/log.txt"; }

# 1. the CUDA-marked tests (each skipped with its reason on a machine without CUDA)
run python -m pytest -m cuda -q -rs -n 0 -p no:cacheprovider tests/test_gpu.py > "$OUT/pytest.txt" || true
# 2. training steps, side by side
run python bench.py --variants=baseline,reduced,reduced_mlp,nonlinear $BENCH --json_out="$OUT/bench_train.jsonl"
# 3. a short real run under torchrun, then a resume
run python prepare.py --dataset=pydocs --tokenizer=$TOK --out_name=pydocs_$TOK --progress=False --data_root="$DATA"
R="$OUT/run"; rm -rf "$R"
run torchrun --standalone --nproc_per_node=1 train.py config/reduced.py --dataset=pydocs_$TOK --data_root="$DATA" --out_dir="$R" $TRAIN \
    --max_iters=$((STEPS / 2)) --eval_interval=$((STEPS / 2)) --eval_iters=5 --log_interval=5 --keep_checkpoints="()"
run torchrun --standalone --nproc_per_node=1 train.py config/reduced.py --dataset=pydocs_$TOK --data_root="$DATA" --out_dir="$R" $TRAIN \
    --max_iters=$STEPS --eval_interval=$((STEPS / 2)) --eval_iters=5 --log_interval=5 --keep_checkpoints="()" \
    --init_from=resume
# 4. KV-cache decoding against recomputing the context
run python -m lab.costs --mode=sample --variants=reduced $SAMPLE --json_out="$OUT/bench_sample.jsonl"
run python -m lab.costs --mode=summary --json_out="$OUT" --run_dir="$R"
echo "wrote $OUT/results.md and $OUT/results.json"
