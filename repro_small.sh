#!/usr/bin/env bash
# The small reproduction designed in the README ("Experiments"): baseline, reduced (W_Q = I)
# and the follow-up's nonlinear query at head size 64 and the paper's schedule shape, each arm
# tuned over weight decay, then compared at its own best weight decay over 3 paired seeds.
# About 2 hours on 2 CPU cores (18 runs, 2 at a time). Finished runs are skipped and an interrupted one resumes, so
# the script can be stopped and run again (in a later session too); FORCE=1 starts over.
set -euo pipefail
cd "$(dirname "$0")"
R=${REPRO_DIR:-out-repro}
WDS=${REPRO_WDS:-"0.03125 0.1 0.316 1.0"}
ARMS=${REPRO_ARMS:-"baseline:linear reduced:identity nonlinear:nonlinear"}
SEEDS=${REPRO_SEEDS:-"1 2 3"}
EXTRA=${REPRO_EXTRA:-}   # more --key=value for every run (the tests use it to shrink the runs)
A=${REPRO_ASSETS:-assets}  # where the tables and figures go
JOBS=${REPRO_JOBS:-2}    # runs at a time, each on nproc/JOBS threads: small matmuls use 2 cores better as 2 jobs
export OMP_NUM_THREADS=$(( $(nproc) / JOBS > 0 ? $(nproc) / JOBS : 1 ))
mkdir -p "$R" "$A"
[ "${FORCE:-0}" = 1 ] && rm -rf "${R:?}"/*

finished() {  # the run's log has its final evaluation
  python -c "import sys, train; sys.exit(0 if train.run_finished(sys.argv[1]) else 1)" "$1"
}
start() {  # start a run in the background once fewer than JOBS are running
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  run "$@" &
}
run() {  # run NAME QUERY WEIGHT_DECAY SEED
  local out=$R/$1 init=scratch
  finished "$out" && return 0
  [ -f "$out/ckpt.pt" ] && init=resume
  echo "$(date +%T) $1"
  python train.py config/small.py config/repro.py --out_dir="$out" --init_from=$init --query="$2" \
      --weight_decay="$3" --seed="$4" --data_seed="$4" $EXTRA > "$R/$1.txt" 2>&1
}

first=${SEEDS%% *}
# 1. weight-decay sweep, one seed: every arm at every value
for wd in $WDS; do
  for arm in $ARMS; do start "${arm%%:*}_wd${wd}_s$first" "${arm#*:}" "$wd" "$first"; done
done
while [ -n "$(jobs -rp)" ]; do wait -n; done
# 2. every arm at its own best weight decay, paired seeds (seed = data_seed)
finals=(); second=()
for arm in $ARMS; do
  name=${arm%%:*}
  best=$(python report.py --best=True $R/${name}_wd*_s$first)  # the run with the lowest final val loss
  best=${best##*_wd}; best=${best%_s*}
  for seed in $SEEDS; do
    start "${name}_wd${best}_s$seed" "${arm#*:}" "$best" "$seed"
    finals+=("$R/${name}_wd${best}_s$seed")
  done
  second+=("$R/${name}_wd${best}_s$(echo $SEEDS | cut -d' ' -f2)")
done
while [ -n "$(jobs -rp)" ]; do wait -n; done
# 3. the figures and tables in the README
python report.py "${finals[@]}" --png=$A/repro.png --md=$A/repro.md --gap_png=$A/repro_gap.png
python report.py $R/*_s$first --md=$A/repro_sweep.md --sweep=True --png=$A/repro_sweep.png
python report.py "${second[@]}" --diag_png=$A/repro_diag.png > /dev/null  # one seed: the diagnostics side by side
