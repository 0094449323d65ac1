"""The registry: every claim of both seeds, its command, its result file and its rule."""

from __future__ import annotations

from .base import SIZE, Claim

# ---- the registry ----------------------------------------------------------------------------------------------------

_DB = "--db $DB --cache $C"  # docs/sweep.md: scratch database and concept cache
_REPORT = "walklens report --db $DB --out docs/results/report"
_FULL = (
    "walklens hellaswag sweep --test 2 --grid full --model smollm2-135m --db $DB --cache concepts && "
    "walklens report --db $DB --out docs/results/report_full"
)
_T1_GRID = {
    ("smollm2-135m", 0): "test1_grid_1100.toml",
    ("smollm2-135m", 5): "test1_grid_hour_smollm2_5shot.toml",
    ("gemma3-270m", 0): "test1_grid_hour_gemma3_0shot.toml",
    ("gemma3-270m", 5): "test1_grid_hour_gemma3_5shot.toml",
}
_S000_T2 = (
    "000 sec. 5.1.1, Fig. 10b: the best Test 2 (concept similarity) scheme scores 82.6% / 80.5% of the ordinary run"
)
_S000_T1 = (
    "000 sec. 5.1.1, Fig. 10a: the best Test 1 (concept generation) scheme scores 84.5% / 84.9% of the ordinary run"
)


def _sweep_claims() -> list[Claim]:
    out = [
        Claim("T2-best-full", _S000_T2 + " (0 / 5-shot)", "Test 2 best reaches ~0.81 normalised", _FULL,
              "docs/results/report_full/summary.json", "heldout", {"test": 2, "shots": 0, "n_items": 10042},
              "reaches", 0.826),
        Claim("T2-below-full", _S000_T2, "Test 2 stays below the ordinary run", _FULL,
              "docs/results/report_full/summary.json", "heldout", {"test": 2, "shots": 0, "n_items": 10042},
              "below_baseline"),
        Claim("T2-above-chance-full", _S000_T2, "Test 2's best scheme is above chance", _FULL,
              "docs/results/report_full/summary.json", "heldout", {"test": 2, "shots": 0, "n_items": 10042},
              "above_chance"),
    ]  # fmt: skip
    for model, shots, target in (("smollm2-135m", 0, 0.826), ("gemma3-270m", 0, 0.826), ("smollm2-135m", 5, 0.805),
                                 ("gemma3-270m", 5, 0.805)):  # fmt: skip
        sel = {"model": model, "test": 2, "shots": shots, "n_items": 200}
        out.append(Claim(f"T2-best-{model}-{shots}shot-200", _S000_T2, "Test 2 best reaches ~0.81 normalised",
                         f"walklens hellaswag sweep --test 2 --grid full --model {model} --limit 200 --shots {shots} "
                         f"{_DB} && {_REPORT}",
                         "docs/results/report/summary.json", "heldout", sel, "reaches", target))  # fmt: skip
    for model, shots, target in (("smollm2-135m", 0, 0.845), ("gemma3-270m", 0, 0.845), ("smollm2-135m", 5, 0.849),
                                 ("gemma3-270m", 5, 0.849)):  # fmt: skip
        sel = {"model": model, "test": 1, "shots": shots, "n_items": 200}
        cmd = (f"walklens hellaswag sweep --test 1 --limit 200 {_DB} --model {model} --shots {shots} "
               f"--grid docs/results/{_T1_GRID[model, shots]} && {_REPORT}")  # fmt: skip
        out.append(Claim(f"T1-best-{model}-{shots}shot-200", _S000_T1, "Test 1 best reaches ~0.85 normalised",
                         cmd, "docs/results/report/summary.json", "heldout", sel, "reaches", target))  # fmt: skip
        out.append(Claim(f"T1-below-{model}-{shots}shot-200", _S000_T1, "Test 1 stays below the ordinary run",
                         cmd, "docs/results/report/summary.json", "heldout", sel, "below_baseline"))  # fmt: skip
    bf16 = "docs/results/test1_full_bf16/report/summary.json"
    for shots in (0, 5):
        sel = {"model": "smollm2-135m@bfloat16", "test": 1, "shots": shots, "n_items": 200}
        cmd = (f"walklens hellaswag sweep --test 1 --grid full --model smollm2-135m --dtype bfloat16 --limit 200 "
               f"--shots {shots} --db t1.sqlite --cache t1cache --backend ray --workers 2 && "
               f"walklens report --db t1.sqlite --out {bf16.rsplit('/', 1)[0]}")  # fmt: skip
        out.append(Claim(f"T1-below-full-grid-bf16-{shots}shot-200", _S000_T1,
                         "Test 1 stays below the ordinary run (4,400 schemes)", cmd, bf16, "heldout", sel,
                         "below_baseline"))  # fmt: skip
    # Test 1 on the full set, in two stages: the scheme the 200-item sweep chose (in sample and on all 5 folds) is
    # scored on the other 9,842 items, beside the baseline (the full grid on all items: ~33 h of both cores)
    scheme = "enc=concat_all_examples,layer=middle,word=w1mean,norm=None,seg=None,ex=None"
    full = "docs/results/test1_fullset/test1_heldout_smollm2_bf16.json"
    t1 = (f"walklens hellaswag test1 --model smollm2-135m --dtype bfloat16 --scheme {scheme} --db t1set.sqlite && "
          f"walklens hellaswag test1 --model smollm2-135m --dtype bfloat16 --scheme {scheme} --db t1set.sqlite "
          f"--skip 200 --json {full}")  # fmt: skip
    why = ("a resumable run of ~1 h 50 min of one thread on a shared machine, over two sessions "
           "(docs/results/test1_fullset/timings.txt)")  # fmt: skip
    out.append(Claim("T1-best-full-set", _S000_T1, "Test 1 best on all 10,042 items", t1, full, "scheme_heldout",
                     {}, "reaches", 0.845, why))  # fmt: skip
    out.append(Claim("T1-best-full-set-acc_norm", _S000_T1 + " (the seed names no metric)",
                     "Test 1 best on all 10,042 items, length-normalised", t1, full, "scheme_heldout",
                     {"metric": "acc_norm"}, "reaches", 0.845, why))  # fmt: skip
    out.append(Claim("T1-below-full-set", _S000_T1, "Test 1 stays below the ordinary run", t1, full,
                     "scheme_heldout", {}, "below_baseline", None, why))  # fmt: skip
    return out + _t2_full_set_claims()


_T2_CHOSEN = {  # the in-sample best of each 200-item 726,000-scheme sweep (docs/results/report/summary.json)
    ("gemma3-270m", 0): "enc=sentence_level_segmentation,layer=-2,word=last,norm=L2,seg=None,ex=None,sim=dot,"
    "out_layer=-1,out_word=relu|mean",
    ("smollm2-135m", 5): "enc=segment_each_example,layer=-2,word=relu|mean,norm=zNorm,seg=mean,ex=None,sim=cosine,"
    "out_layer=-1,out_word=relu|mean",
    ("gemma3-270m", 5): "enc=sentence_level_segmentation,layer=-2,word=w1mean,norm=varNorm,seg=None,ex=None,sim=dot,"
    "out_layer=-1,out_word=last",
}


#: each run's cost in thread time: measured where it is done (docs/results/test2_fullset/timings.txt), else estimated
_T2_COST = {
    ("gemma3-270m", 0): "~4 h 14 min",
    ("smollm2-135m", 5): "~7 h 15 min",
    ("gemma3-270m", 5): "~8 h 55 min",
}


def _t2_full_set_claims() -> list[Claim]:
    """Test 2 on all 10,042 items where the whole grid does not fit: the scheme the 200-item sweep chose, scored on
    the other 9,842 items beside the baseline (two stages, like Test 1's full set)."""
    out = []
    for (model, shots), scheme in _T2_CHOSEN.items():
        name = f"{model.split('-')[0]}_{shots}shot"
        full = f"docs/results/test2_fullset/test2_heldout_{name}_bf16.json"
        args = f"--model {model} --dtype bfloat16 --shots {shots} --scheme '{scheme}' --db t2set_{name}.sqlite"
        cmd = f"walklens hellaswag test2 {args} && walklens hellaswag test2 {args} --skip 200 --json {full}"
        why = (
            f"a resumable run (baseline and one scheme on all 10,042 items, bfloat16): "
            f"{_T2_COST[(model, shots)]} (one thread's time beside other jobs; docs/results/test2_fullset/timings.txt)"
        )
        out.append(Claim(f"T2-best-full-set-{name}", _S000_T2, "Test 2 best on all 10,042 items", cmd, full,
                         "scheme_heldout", {}, "reaches", 0.826 if shots == 0 else 0.805, why))  # fmt: skip
        out.append(Claim(f"T2-below-full-set-{name}", _S000_T2, "Test 2 stays below the ordinary run", cmd, full,
                         "scheme_heldout", {}, "below_baseline", None, why))  # fmt: skip
    return out


def _other_claims() -> list[Claim]:
    out = []
    for model, shots in (("smollm2", 5), ("smollm2", 10), ("gemma3", 5), ("gemma3", 10)):
        cmd = (
            f"walklens hellaswag compaction --model {model}-{SIZE[model]} --shots 5,10 --what examples,context "
            f"--limit 1000 --tune 200 --db $OUT/compaction.sqlite --cache $OUT/concepts --out $OUT/compaction-{model} "
            f"--json $OUT/{model}.json"
        )
        out.append(Claim(
            f"compaction-{model}-{shots}shot", "000 footnote 11: concept vectors can compact long contexts",
            "context compacted into concept vectors keeps the task", cmd,
            f"docs/results/compaction_{model}_{shots}shot/curves.csv", "compaction", {"model": model, "ratio": 8},
            "compaction"))  # fmt: skip
    missing = [
        ("shared-weights", "002: trained shared-weight models converge to v1 at rate |lambda2/lambda1|",
         "walklens power --model M --shared-layer L --json shared.json",
         "untested: docs/power.md repeats one layer of a model never trained to repeat it; ALBERT (the one trained "
         "shared-weight family) has no weights reachable here"),
    ]  # fmt: skip
    for model, shared in (("smollm2", "15 --shared-depth 30"), ("gemma3", "9 --shared-depth 18")):
        out.append(Claim(
            f"power-alignment-{model}", "002: tokens align with the principal eigenvector v1 of F = W_V W_O through "
            "depth", "passing through a layer, tokens tilt toward v1 of the layer's F",
            f"walklens power TEXTS... --model {model}-{SIZE[model]} --shared-layer {shared} --skip-first "
            f"--json docs/results/power_{model}.json (TEXTS: the eight texts of docs/power.md)",
            f"docs/results/power_{model}.json", "alignment", {}, "tilt"))  # fmt: skip
    out.append(Claim(
        "eigen-steering-smollm2", "002: a rank-one edit along v1 steers the output toward an arbitrary direction",
        "eigen-steering makes an arbitrary token the next one",
        "walklens steer PROMPTS... --toward ' Paris' --layers 5,10,15 --layers 20 --alpha=-3000,-1000,0,1000,3000 "
        "--add-alpha 0,50,100,200 --max-new-tokens 8 --model smollm2-135m --json docs/results/steer_smollm2.json "
        "(PROMPTS: the five prompts of docs/power.md)",
        "docs/results/steer_smollm2.json", "steering", {}, "steer"))  # fmt: skip
    out.append(Claim(
        "eigen-steering-gemma3", "002: a rank-one edit along v1 steers the output toward an arbitrary direction",
        "eigen-steering makes an arbitrary token the next one",
        "walklens steer PROMPTS... --toward ' Paris' --layers 3,6,9 --layers 12 --alpha=-10000,-1000,0,1000,10000 "
        "--add-alpha 0,1000,3000,10000 --max-new-tokens 8 --max-work 10 --model gemma3-270m "
        "--json docs/results/steer_gemma3.json (PROMPTS: the five prompts of docs/power.md)",
        "docs/results/steer_gemma3.json", "steering", {}, "steer"))  # fmt: skip
    out.append(Claim(
        "low-self-mass", "000 A.2: a query attends to itself less than to its context (read as negative self-bias)",
        "most heads put less mass on the query itself than uniform attention",
        'walklens heads "The capital of France is Paris, and the river that runs through it is the Seine." '
        "--maps -1 --json docs/results/heads_smollm2_sink.json", "docs/results/heads_smollm2_sink.json", "self_mass",
        {"model": "smollm2-135m"}, "sink"))  # fmt: skip
    out += [Claim(i, s, s.split(": ", 1)[1], c, why=w) for i, s, c, w in missing]
    return out + _walk_claims() + _association_claims()


def _association_claims() -> list[Claim]:
    """Result 4 and the blocks of the similarity maps (seed 000, sec. 2.2, Figs. 3, 11, 12), per model."""
    out = []
    for model in ("smollm2", "gemma3"):
        name = f"{model}-{SIZE[model]}"
        out.append(Claim(
            f"similarity-cooccurrence-{model}", "000 Result 4: similarity <-> co-occurrence <-> angular proximity",
            "token pairs that co-occur more have more similar vectors",
            f"walklens cooccur --model {name} --json docs/results/cooccur_{model}.json",
            f"docs/results/cooccur_{model}.json", "cooccur", {}, "associative"))  # fmt: skip
        out.append(Claim(
            f"similarity-maps-{model}", "000 Figs. 3, 11, 12: similarity maps show blocks (numbers, brackets alike; "
            "separators unlike)", "numbers alike, brackets alike, separators unlike",
            f"walklens simmap --example grading --model {name} --blocks docs/results/simblocks_{model}.json",
            f"docs/results/simblocks_{model}.json", "blocks", {"map": "V/cosine"}, "blocks"))  # fmt: skip
    return out


_TEXT9 = (
    "the king ran to the river and the queen of france was in paris with her dog and his cat by the house in the city"
)


def _walk_claims() -> list[Claim]:
    """Seed 000 A.2 (kernels), Fig. 9 and footnote 12, each with its committed file."""
    return [
        *(Claim(f"negative-self-bias{'' if m == 'smollm2' else '-' + m}",
                "000 A.2, Figs. 5-8: position kernels with negative self-bias", "heads attenuate the query's own "
                "position", f"walklens kernels --model {m}-{SIZE[m]} --sink-control --json "
                f"docs/results/kernels_{m}.json", f"docs/results/kernels_{m}.json", "self_bias", {}, "self_bias")
          for m in ("smollm2", "gemma3")),
        Claim("encoder-fig9", "000 Fig. 9, A.2: an encoder's c_t stays near w_t", "c_t ranks w_t high",
              f'walklens walk "{_TEXT9}" --model t5-random... --self-rank --json '
              "docs/results/selfrank_t5_random.json (t5-random: walklens.testing.tiny_model('t5') saved by "
              "save_pretrained, docs/walks.md)", "docs/results/selfrank_t5_random.json", "self_rank",
              {"trained": 0, "note": "random weights: proves the command runs"}, "self_rank"),
        Claim("concept-walk-eval", "000 Property 2, footnote 12: a concept-level walk to evaluate a model's output",
              "the concept score of a continuation tells own from off-topic", "walklens hellaswag concept-eval "
              "--model smollm2-135m --limit 100 --json docs/results/concept_eval_smollm2.json",
              "docs/results/concept_eval_smollm2.json", "concept_eval", {}, "concept_eval"),
    ]  # fmt: skip


CLAIMS: tuple[Claim, ...] = (*_sweep_claims(), *_other_claims())
