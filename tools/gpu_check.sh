#!/usr/bin/env bash
# The prepared GPU check: the CUDA path proven and measured in one go, in about 8 minutes on one
# GPU. Writes results.md and results.json (and the raw logs) into $OUT (default: gpu-check/).
#   bash tools/gpu_check.sh             # on a CUDA machine: GPT-2 small, bf16, compiled
#   DRY_RUN=1 bash tools/gpu_check.sh   # the same steps, tiny sizes, on CPU (the tests run it)
#   PARTS="bench run" bash tools/gpu_check.sh   # only these parts (a rerun after one failed)
# Steps: 1. pytest -m cuda; 2. bench.py train steps, variants alternated, and Muon beside AdamW; 3. torchrun training of
# config/reduced.py on the embedded corpus with GPT-2 BPE (bytes in the dry run) (NCCL, compile, bf16, checkpoint, resume);
# 4. KV-cache sampling against recomputation, generate()'s attention kernels beside torch's choice.
# Every part runs even when one before it fails (a GPU lease is short: one call should tell all it
# can); log.txt gives each part's wall time, failed.txt the parts that failed, and the exit code is
# non-zero if any did.
set -uo pipefail
cd "$(dirname "$0")/.."  # the repository root
OUT=${OUT:-gpu-check}
DATA=${DATA_ROOT:-data}  # where the embedded corpus is prepared; the dry run keeps it under $OUT
export PYTHONUNBUFFERED=1
if [ "${DRY_RUN:-0}" = 1 ]; then
  GEOM="--n_layer=2 --n_head=2 --n_embd=64 --block_size=64"
  BENCH="$GEOM --vocab_size=512 --batch_size=2 --steps=2 --warmup=1 --device=cpu"
  TRAIN="$GEOM --batch_size=2 --gradient_accumulation_steps=1 --device=cpu --compile=False --dtype=float32"
  STEPS=4; SAMPLE="$BENCH --max_new_tokens=20"; TOK=byte; export OMP_NUM_THREADS=1; DATA=${DATA_ROOT:-$OUT/data}
elif ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "error: torch sees no CUDA GPU here: run this on a CUDA machine, or DRY_RUN=1 for the CPU rehearsal" >&2
  exit 2
else
  BENCH="--block_size=1024 --batch_size=16 --steps=60 --warmup=3"  # 20 steps left reduced and baseline overlapping
  TRAIN="--batch_size=16 --gradient_accumulation_steps=1"
  STEPS=60; SAMPLE="--max_new_tokens=500"; TOK=gpt2
fi
mkdir -p "$OUT"  # after the check: a machine without a GPU is left as it was
PARTS=${PARTS:-tests bench muon run sample}
: > "$OUT/failed.txt"
run() { echo "== $*" | tee -a "$OUT/log.txt"; "$@" 2>&1 | tee -a "$OUT/log.txt"; }
# part NAME COMMAND...: runs a part if PARTS names it, times it, records a failure and goes on
part() {
  local name=$1; shift
  case " $PARTS " in *" $name "*) ;; *) return 0 ;; esac
  local start=$SECONDS
  if "$@"; then echo "== part $name: ok in $((SECONDS - start)) s" | tee -a "$OUT/log.txt"
  else echo "== part $name: FAILED after $((SECONDS - start)) s" | tee -a "$OUT/log.txt"
       echo "$name" >> "$OUT/failed.txt"; fi
}

# 1. the CUDA-marked tests (each skipped with its reason on a machine without CUDA)
tests() {
  python -m pytest -m cuda -q -rs -n 0 -p no:cacheprovider tests/test_gpu.py > "$OUT/pytest.txt"
  local rc=$?; tail -n 15 "$OUT/pytest.txt" | tee -a "$OUT/log.txt"; return $rc
}
# 2. training steps, side by side; then a Muon step beside AdamW's (each its own compiled model)
bench_steps() {
  run python bench.py --variants=baseline,reduced,reduced_mlp,nonlinear $BENCH --json_out="$OUT/bench_train.jsonl"
}
bench_muon() {
  run python bench.py --variants=baseline,reduced --optimizers=adamw,muon $BENCH --json_out="$OUT/bench_muon.jsonl"
}
# 3. a short real run under torchrun, then a resume
R=${RUN_DIR:-$OUT/run}  # the run's folder (its checkpoint is large: RUN_DIR can put it elsewhere)
short_run() {
  run python prepare.py --dataset=pydocs --tokenizer=$TOK --out_name=pydocs_$TOK --progress=False --data_root="$DATA" || return
  run torchrun --standalone --nproc_per_node=1 train.py config/reduced.py --dataset=pydocs_$TOK --data_root="$DATA" --out_dir="$R" $TRAIN \
      --max_iters=$((STEPS / 2)) --eval_interval=$((STEPS / 2)) --eval_iters=5 --log_interval=5 --keep_checkpoints="()" \
      --overwrite=True || return  # a run there before is replaced, and nothing else in the folder
  run torchrun --standalone --nproc_per_node=1 train.py config/reduced.py --dataset=pydocs_$TOK --data_root="$DATA" --out_dir="$R" $TRAIN \
      --max_iters=$STEPS --eval_interval=$((STEPS / 2)) --eval_iters=5 --log_interval=5 --keep_checkpoints="()" \
      --init_from=resume
}
# 4. KV-cache decoding against recomputing the context, each in a process of its own (cold): with
# generate()'s attention kernels, then with torch's choice (cuDNN's included) beside it
sample_speed() {
  run python -m lab.costs --mode=sample --variants=reduced $SAMPLE --json_out="$OUT/bench_sample.jsonl" &&
  run python -m lab.costs --mode=sample --variants=reduced $SAMPLE --json_out="$OUT/bench_sample.jsonl" \
      --decoding_attention=torch
}
part tests tests
part bench bench_steps
part muon bench_muon
part run short_run
part sample sample_speed
# the summary of whatever the parts above wrote
run python -m lab.costs --mode=summary --json_out="$OUT" --run_dir="$R" || echo summary >> "$OUT/failed.txt"
echo "wrote $OUT/results.md and $OUT/results.json"
if [ -s "$OUT/failed.txt" ]; then echo "failed: $(tr '\n' ' ' < "$OUT/failed.txt")"; exit 1; fi
