#!/usr/bin/env bash
# The bfloat16 / float32 agreement study of issue 14 (docs/dtype.md, "Agreement study"): the same HellaSwag
# items run in both dtypes into one results database, then the agreement report.
#
#   benchmarks/agreement_bf16.sh                          # the study: first 2,000 items, smollm2 and gemma3
#   N=5 DB=/tmp/agree.sqlite benchmarks/agreement_bf16.sh # a 5-item check of the whole chain
#
# Resumable: `walklens hellaswag` commits every chunk of items as it is scored and `walklens sweep` every
# scheme group, so running the script again (same DB) continues where it stopped and recomputes nothing stored.
# Steps run in this order, each for every model and dtype, so the cheap parts are complete first:
#   baseline    walklens hellaswag baseline          (lm-evaluation-harness scoring; log-likelihoods stored)
#   test1       walklens hellaswag test1             (Test 1, the standard scheme; log-likelihoods stored)
#   test1-grid  walklens sweep --test 1 --grid $T1_GRID  (the "best 20": the 20 best of this grid by float32
#               accuracy on the same items; default docs/results/test1_grid.toml, the 80 schemes every Test 1
#               grid of docs/sweep.md contains)
#   test2-grid  walklens sweep --test 2 --grid $T2_GRID  (default: full, 726,000 schemes)
# then benchmarks/agreement_bf16.py writes $OUT (Markdown) and $JSON (every number).
#
# Environment (defaults in brackets): N [2000] items; MODELS ["smollm2-135m gemma3-270m"]; DTYPES
# ["float32 bfloat16"] (the first is the reference); SHOTS [0]; DB [agreement_bf16.sqlite]; CACHE [none: a
# folder keeps the sweeps' segment vectors, so a resumed sweep skips its forward passes; ~2 GB per model and
# dtype for the full Test 2 grid]; T1_GRID; T2_GRID; STEPS ["baseline test1 test1-grid test2-grid"];
# OUT [agreement_bf16.md]; JSON [agreement_bf16.json]; WALKLENS [.venv/bin/walklens]; PYTHON [.venv/bin/python];
# DATA [the bundled validation set]; EXTRA [extra options for every walklens command, e.g. --no-progress].
# Two processes may share the database (e.g. DTYPES=float32 and DTYPES=bfloat16 at once, one core each, then
# a last run without DTYPES for the report); set OMP_NUM_THREADS to the cores each process may use.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-2000}
MODELS=${MODELS:-"smollm2-135m gemma3-270m"}
DTYPES=${DTYPES:-"float32 bfloat16"}
SHOTS=${SHOTS:-0}
DB=${DB:-agreement_bf16.sqlite}
CACHE=${CACHE:-}
T1_GRID=${T1_GRID:-docs/results/test1_grid.toml}
T2_GRID=${T2_GRID:-full}
STEPS=${STEPS:-"baseline test1 test1-grid test2-grid"}
OUT=${OUT:-agreement_bf16.md}
JSON=${JSON:-agreement_bf16.json}
WALKLENS=${WALKLENS:-.venv/bin/walklens}
PYTHON=${PYTHON:-.venv/bin/python}
DATA=${DATA:-}
EXTRA=${EXTRA:-}

read -r -a dtypes <<< "$DTYPES"
data=()
[ -n "$DATA" ] && data=(--data "$DATA")
cache=()
[ -n "$CACHE" ] && cache=(--cache "$CACHE")
parts=()
for step in $STEPS; do
  for model in $MODELS; do
    for dtype in "${dtypes[@]}"; do
      # shellcheck disable=SC2086  # $WALKLENS and $EXTRA may hold several words
      common=(--model "$model" --dtype "$dtype" --limit "$N" --shots "$SHOTS" --db "$DB" "${data[@]}" $EXTRA)
      echo "== $step: $model $dtype, $N items, $SHOTS-shot" >&2
      case $step in
        baseline) $WALKLENS hellaswag baseline "${common[@]}" ;;
        test1) $WALKLENS hellaswag test1 --scheme standard "${common[@]}" ;;
        test1-grid) $WALKLENS sweep --test 1 --grid "$T1_GRID" "${common[@]}" "${cache[@]}" ;;
        test2-grid) $WALKLENS sweep --test 2 --grid "$T2_GRID" "${common[@]}" "${cache[@]}" ;;
        *) echo "walklens: error: unknown step '$step' (use baseline, test1, test1-grid, test2-grid)" >&2; exit 2 ;;
      esac
    done
  done
  parts+=("$step")
done

if [ "${#dtypes[@]}" -lt 2 ]; then
  echo "only ${dtypes[*]} was run: run the other dtype too, then this script without DTYPES for the report" >&2
  exit 0
fi
models=()
for model in $MODELS; do models+=(--model "$model"); done
$PYTHON benchmarks/agreement_bf16.py --db "$DB" "${models[@]}" --limit "$N" --shots "$SHOTS" "${data[@]}" \
  --reference "${dtypes[0]}" --other "${dtypes[1]}" --parts "$(IFS=,; echo "${parts[*]}")" --out "$OUT" --json "$JSON"
