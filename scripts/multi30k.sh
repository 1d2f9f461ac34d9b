#!/usr/bin/env bash
# The Multi30k English->German recipe (docs/training.md): train the `small`
# model for a wall-time budget, validating every 200 updates (loss, and the
# greedy BLEU of 500 validation sentences), keeping the 5 best checkpoints by
# that BLEU and stopping early after 5 validations without a new best;
# average the best 5 (all of them if fewer were kept), translate
# test_2016_flickr with beam 4 / alpha 0.6 and score it with sacreBLEU.
#
#   bash scripts/multi30k.sh                      # 30 minutes of training
#   MINUTES=120 RUN_DIR=runs/m30k-2h bash scripts/multi30k.sh
#   DATA=/path/to/multi30k bash scripts/multi30k.sh --batch-tokens 4096   # extra kt-train flags
#
# DATA is a directory with train/val/test_2016_flickr .en/.de files (.gz or
# not). Rerunning with the same RUN_DIR resumes training.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
DATA=${DATA:-../shared/data/multi30k}
RUN_DIR=${RUN_DIR:-runs/m30k}
MINUTES=${MINUTES:-30}
test_file() {
  for f in "$DATA/test_2016_flickr.$1.gz" "$DATA/test_2016_flickr.$1"; do
    if [ -f "$f" ]; then echo "$f"; return; fi
  done
  echo "error: no test_2016_flickr.$1[.gz] in $DATA" >&2; exit 2
}
SOURCE=$(test_file en)
REFERENCE=$(test_file de)
start=$(date +%s)
kt-train --run-dir "$RUN_DIR" --data "text:$DATA" --src-lang en --tgt-lang de \
    --config small --vocab-size 8000 --batch-tokens 3072 --max-length 128 \
    --max-minutes "$MINUTES" --train-steps 100000 --warmup-steps 500 --lr-scale 0.7 \
    --checkpoint-every 200 --keep-checkpoints 5 --validate-every 200 \
    --bleu-sentences 500 --bleu-search greedy --keep-best 5 --early-stopping-patience 5 \
    --cache-tokenized --verbose 2 "$@"
trained=$(date +%s)
# The best 5 checkpoints by validation BLEU, or all of them when a slow
# machine or a short budget validated fewer times.
kt-average --run-dir "$RUN_DIR" --from best --num 5 --allow-fewer
averaged=$(date +%s)
kt-evaluate --run-dir "$RUN_DIR" --beam-size 4 --alpha 0.6 --extra-length 50 \
    --source "$SOURCE" --reference "$REFERENCE" --hypotheses "$RUN_DIR/test_2016_flickr.hyp.de"
done_at=$(date +%s)
echo "wall time: training $((trained - start)) s (vocabulary included), averaging" \
     "$((averaged - trained)) s, test decoding and scoring $((done_at - averaged)) s"
