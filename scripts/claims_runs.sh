#!/usr/bin/env bash
# The long runs behind docs/claims.md's full-set, pools, folds and selection rows (docs/sweep.md, "Test 1 on the
# full set for every configuration" and "How much the pick matters"), each resumable:
#   - a step whose --json is in the repository is skipped;
#   - a step interrupted resumes from its database in RUNS (nothing stored is computed again);
#   - a machine that lost RUNS starts the step again from nothing: only committed files survive a new machine.
# Usage, from the repository root:
#   scripts/claims_runs.sh RUNS STEP [ARGS]     one step
#   STEP: fullset NAME [CONTROLS]   Test 1 on items 200-10,041 for one configuration (NAME below), then each control
#         pools MODEL               the 5-shot baseline with both few-shot pools on the first 200 items
#         folds T MODEL SHOTS       a sweep's 5-fold held-out best on its 200 items, with the three controls
#         selection T MODEL SHOTS [LIMIT]
#                                   the sweep's ten best schemes on the items after the 200 (LIMIT: only the first
#                                   LIMIT of them)
# Every step runs one thread at nice 19 and prints its start, end and seconds (the costs in timings.txt).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,16p' "$0"; exit 2; }
runs=$1 step=$2
shift 2
mkdir -p "$runs"
W=${WALKLENS:-.venv/bin/walklens}
export OMP_NUM_THREADS=1
summary=docs/results/report/summary.json

run() {  # run OUT.json COMMAND...: skipped when OUT.json is there
  local out=$1
  shift
  if [ -f "$out" ]; then echo "== $out is there: skipped"; return 0; fi
  echo "== $(date -u +%FT%TZ) start: $* --json $out"
  local t0=$SECONDS
  nice -n 19 "$@" --no-progress --json "$out"
  echo "== $(date -u +%FT%TZ) done in $((SECONDS - t0)) s: $out"
}

case $step in
  fullset)
    name=$1 controls=${2:-ending,shuffled,random}
    case $name in  # the scheme each 200-item sweep ranked first (docs/results/report/summary.json)
      smollm2) set -- smollm2-135m 0 validation 'enc=concat_all_examples,layer=middle,word=w1mean,norm=None,seg=None,ex=None' ;;
      gemma3_0shot) set -- gemma3-270m 0 validation 'enc=concat_all_examples,layer=-2,word=last,norm=None,seg=None,ex=None' ;;
      smollm2_5shot) set -- smollm2-135m 5 reserved 'enc=merge_all_segments,layer=middle,word=w1mean,norm=None,seg=None,ex=mean' ;;
      gemma3_5shot) set -- gemma3-270m 5 reserved 'enc=merge_all_segments,layer=-1,word=w1mean,norm=None,seg=None,ex=mean' ;;
      *) echo "claims_runs.sh: error: fullset NAME: smollm2, gemma3_0shot, smollm2_5shot or gemma3_5shot" >&2; exit 2 ;;
    esac
    model=$1 shots=$2 pool=$3 scheme=$4
    common=(hellaswag test1 --model "$model" --dtype bfloat16 --shots "$shots" --pool "$pool" --scheme "$scheme"
      --db "$runs/t1set_$name.sqlite" --cache "$runs/cache_fs_$name" --skip 200)
    out=docs/results/test1_fullset/test1_heldout_${name}_bf16
    run "$out.json" "$W" "${common[@]}"
    for c in ${controls//,/ }; do run "${out}_$c.json" "$W" "${common[@]}" --control "$c"; done
    ;;
  pools)
    run "docs/results/pools/$1_5shot_200.json" "$W" hellaswag pools --model "$1" --shots 5 --limit 200 \
      --db "$runs/pools.sqlite"
    ;;
  folds)
    run "docs/results/folds/T$1_$2_$3shot.json" "$W" hellaswag folds --summary "$summary" --test "$1" --model "$2" \
      --shots "$3" --limit 200 --db "$runs/folds$1.sqlite" --cache "$runs/cache$1"
    ;;
  selection)
    t=$1 model=$2 shots=$3 limit=${4:-}
    pool=validation
    [ "$shots" = 0 ] || pool=reserved
    run "docs/results/selection/T${t}_${model}_${shots}shot.json" "$W" hellaswag selection --summary "$summary" \
      --test "$t" --model "$model" --summary-model "$model" --dtype bfloat16 --shots "$shots" --pool "$pool" \
      ${limit:+--limit "$limit"} --db "$runs/sel_T${t}_${model}_${shots}.sqlite" --cache "$runs/cache_sel_${model}_${shots}"
    ;;
  *)
    echo "claims_runs.sh: error: STEP is fullset, pools, folds or selection, not '$step'" >&2
    exit 2
    ;;
esac
