#!/usr/bin/env bash
# The Multi30k English->German recipe (docs/training.md): train the `small`
# model (for 2 hours, the narrower one below) for a wall-time budget,
# translate test_2016_flickr with beam 4 / alpha 1.0 (chosen on the
# validation split; ALPHA overrides, 1.5 for the 2-hour model) and score it
# with sacreBLEU and the Multi30k papers' metric. What is shipped:
#
#   SELECTION=last (default): the average of the last 5 checkpoints (100
#       updates apart), for budgets in which the model is still improving;
#   SELECTION=best: validate every 100 updates (loss on the whole
#       validation split), keep the 5 checkpoints with the lowest validation
#       loss, stop after 10 validations without a new lowest, average those
#       5: for budgets long enough to overfit (docs/training.md: the greedy
#       BLEU of a few hundred sentences is too noisy to stop on).
#
#   bash scripts/multi30k.sh                      # 30 minutes of training
#   MINUTES=120 SELECTION=best ALPHA=1.5 RUN_DIR=runs/m30k-2h bash scripts/multi30k.sh \
#       --dropout 0.3 --set d_model=128 --set d_ff=256 --set num_layers=4 \
#       --batch-tokens 4096 --warmup-steps 2000 --lr-scale 2.53 --r-drop 1   # 2 hours
#   DATA=/path/to/multi30k bash scripts/multi30k.sh --batch-tokens 4096   # extra kt-train flags
#
# MEMBERS=N trains N models at the same time, one core each (taskset, when
# the machine has N cores), into RUN_DIR, RUN_DIR-2, ..., RUN_DIR-N: member
# k > 1 with --seed k and RUN_DIR's vocabulary. Each is averaged as above,
# and test_2016_flickr is translated by all of them as one ensemble
# (kt-evaluate --ensemble). Their log lines start with "[k] ".
#
# DATA is a directory with train/val/test_2016_flickr .en/.de files (.gz or
# not). Rerunning with the same RUN_DIR resumes training. kt-train picks the
# precision (mixed_bfloat16 where the CPU or GPU multiplies bfloat16 in
# hardware, else float32) and prints it; `--precision float32` overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
DATA=${DATA:-../shared/data/multi30k}
RUN_DIR=${RUN_DIR:-runs/m30k}
MINUTES=${MINUTES:-30}
SELECTION=${SELECTION:-last}
ALPHA=${ALPHA:-1.0}
MEMBERS=${MEMBERS:-1}
case "$MEMBERS" in
  ''|*[!0-9]*|0*) echo "error: MEMBERS must be a positive integer, not '$MEMBERS'" >&2; exit 2 ;;
esac
case "$SELECTION" in
  last) SELECT_FLAGS=(--checkpoint-every 100 --validate-every 200 --bleu-sentences 0 --keep-best 0) ;;
  best) SELECT_FLAGS=(--checkpoint-every 200 --validate-every 100 --bleu-sentences 0
                      --best-metric loss --keep-best 5 --early-stopping-patience 10) ;;
  *) echo "error: SELECTION must be last or best, not '$SELECTION'" >&2; exit 2 ;;
esac
test_file() {
  for f in "$DATA/test_2016_flickr.$1.gz" "$DATA/test_2016_flickr.$1"; do
    if [ -f "$f" ]; then echo "$f"; return; fi
  done
  echo "error: no test_2016_flickr.$1[.gz] in $DATA" >&2; exit 2
}
SOURCE=$(test_file en)
REFERENCE=$(test_file de)
train() {  # kt-train with the recipe's flags into run directory $1
  local run_dir=$1; shift
  kt-train --run-dir "$run_dir" --data "text:$DATA" --src-lang en --tgt-lang de \
      --config small --vocab-size 8000 --batch-tokens 3072 --max-length 128 \
      --max-minutes "$MINUTES" --train-steps 100000 --warmup-steps 500 --lr-scale 0.7 \
      --keep-checkpoints 5 --cache-tokenized --verbose 2 "${SELECT_FLAGS[@]}" "$@"
}
member() {  # member $1 (from 1) of MEMBERS, on core $1 - 1, its lines prefixed
  local k=$1; shift
  (
    if command -v taskset >/dev/null && [ "$(nproc)" -ge "$MEMBERS" ]; then
      taskset -p -c "$((k - 1))" "$BASHPID" >/dev/null  # inherited by kt-train
    fi
    train "$@"
  ) 2>&1 | sed -u "s/^/[$k] /"
}
start=$(date +%s)
RUNS=("$RUN_DIR")
if [ "$MEMBERS" = 1 ]; then
  train "$RUN_DIR" "$@"
else
  member 1 "$RUN_DIR" "$@" &
  pids=($!)
  # The other members read the first one's vocabulary, once it is written.
  until [ -f "$RUN_DIR/vocab.model" ] || ! kill -0 "${pids[0]}" 2>/dev/null; do sleep 1; done
  for ((k = 2; k <= MEMBERS; k++)); do
    RUNS+=("$RUN_DIR-$k")
    member "$k" "$RUN_DIR-$k" "$@" --seed "$k" --vocab "$RUN_DIR/vocab.model" &
    pids+=($!)
  done
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=$?; done
  if [ "$failed" != 0 ]; then exit "$failed"; fi
fi
trained=$(date +%s)
# The last (or best) 5 checkpoints, or all of them when a slow machine or a
# short budget kept fewer (one is always saved when training stops).
for run in "${RUNS[@]}"; do
  kt-average --run-dir "$run" --from "$SELECTION" --num 5 --allow-fewer
done
averaged=$(date +%s)
ENSEMBLE=()
for run in "${RUNS[@]:1}"; do ENSEMBLE+=(--ensemble "$run"); done
kt-evaluate --run-dir "$RUN_DIR" "${ENSEMBLE[@]}" --beam-size 4 --alpha "$ALPHA" \
    --extra-length 50 --source "$SOURCE" --reference "$REFERENCE" \
    --hypotheses "$RUN_DIR/test_2016_flickr.hyp.de" --tokenized-bleu de
done_at=$(date +%s)
echo "wall time: training $((trained - start)) s (vocabulary included), averaging" \
     "$((averaged - trained)) s, test decoding and scoring $((done_at - averaged)) s"
