#!/usr/bin/env bash
# The paper's five variants and its weight-decay choice at a CPU scale, batch-matched,
# then the plot and table in the README. About 20 minutes on 2 cores.
#   reduced removes n_embd^2 = 16384 weights per layer; the larger MLP gives them back
#   (576 = 4.5 x 128 hidden units); the two baselines match the reduced count.
set -euo pipefail
cd "$(dirname "$0")"
python prepare.py --dataset=pydocs
R=out-small
run() { name=$1; shift; [ -f $R/$name/ckpt.pt ] && [ "${FORCE:-0}" != 1 ] || python train.py config/small.py --out_dir=$R/$name "$@"; }
run baseline            --weight_decay=0.1
run reduced             --query_identity=True --weight_decay=0.03125
run reduced_mlp         --query_identity=True --weight_decay=0.03125 --mlp_hidden=576
run baseline_small_mlp  --weight_decay=0.1 --mlp_hidden=448
run baseline_small      --weight_decay=0.1 --n_embd=124 --mlp_hidden=496
run reduced_wd0.1       --query_identity=True --weight_decay=0.1
run baseline_seed2      --weight_decay=0.1 --seed=2
python report.py $R/baseline $R/reduced $R/reduced_mlp $R/baseline_small_mlp $R/baseline_small $R/reduced_wd0.1 \
    $R/baseline_seed2 --png=assets/small_repro.png --md=assets/small_repro.md
