# model_config.sh - `--model PATH`: a HuggingFace config.json (or its folder)
# names a model wherever a built-in name does. For the configs under
# tests/data/hf/, one per built-in model (Kimi-K2.5 nests its language model
# under text_config), `epx advise`, `epx trace synth` and `epx demo` print
# and write the same bytes as with the built-in name; bad paths and bad
# configs exit 2 with the key, the value and the fix.
. "$(dirname "$0")/../util/cli_lib.sh"
HF=${EPX_SOURCE:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/data/hf

for m in deepseek-v3 kimi-k2 kimi-k2.5 glm-4.5 qwen3-235b-a22b qwen3-30b-a3b mixtral-8x7b gpt-oss-120b; do
    for form in "$HF/$m" "$HF/$m/" "$HF/$m/config.json"; do
        for j in "" --json; do
            expect_exit 0 "$EPX" advise --model "$m" --gpus 8 --link nvlink4 $j
            mv "$TMP/out" "$TMP/name.txt"
            expect_exit 0 "$EPX" advise --model "$form" --gpus 8 --link nvlink4 $j
            cmp -s "$TMP/out" "$TMP/name.txt" || fail "advise --model $form differs from $m"
        done
    done
    expect_exit 0 "$EPX" trace synth --model "$m" --windows 2 --tokens 512 --seed 3 -o "$TMP/a.json"
    expect_exit 0 "$EPX" trace synth --model "$HF/$m" --windows 2 --tokens 512 --seed 3 -o "$TMP/b.json"
    cmp -s "$TMP/a.json" "$TMP/b.json" || fail "trace synth --model $HF/$m differs from $m"
    (cd "$TMP" && "$EPX" demo --model "$m" --windows 3 --tokens 2048 --out d1 >d1.txt 2>&1) ||
        fail "demo --model $m failed: $(cat "$TMP/d1.txt")"
    (cd "$TMP" && "$EPX" demo --model "$HF/$m/config.json" --windows 3 --tokens 2048 --out d2 \
        >d2.txt 2>&1) || fail "demo --model $HF/$m/config.json failed: $(cat "$TMP/d2.txt")"
    # The same text and files, but for the output folder and the planning
    # times (the last column of the table, plan_seconds in report.json).
    for d in d1 d2; do
        sed -E "s/$d/DIR/g; s/[[:space:]]+[0-9]+\.[0-9]+\$//" "$TMP/$d.txt" >"$TMP/$d.norm"
        sed -E 's/"plan_seconds": [0-9.e+-]+/"plan_seconds": T/g' "$TMP/$d/report.json" >"$TMP/$d.rep"
    done
    cmp -s "$TMP/d1.norm" "$TMP/d2.norm" || fail "demo output for $m differs: $(diff "$TMP/d1.norm" "$TMP/d2.norm")"
    cmp -s "$TMP/d1.rep" "$TMP/d2.rep" || fail "demo report.json for $m differs from the built-in name's"
    for f in placement.json report.svg placement_deepseek.json trace.json; do
        cmp -s "$TMP/d1/$f" "$TMP/d2/$f" || fail "demo $f for $m differs from the built-in name's"
    done
    rm -rf "$TMP/d1" "$TMP/d2"
done

# (bench comm with a config path runs in bench_comm.sh, kept out of the ASan
# pass because of Open MPI's own allocations.)
# Refusals: exit 2, the path or key, the value and the fix.
expect_exit 2 "$EPX" advise --model "$HF/no-such-model" --gpus 8 --link nvlink4
expect_in "$TMP/err" "no-such-model" "neither a built-in name nor an existing path"
expect_exit 2 "$EPX" trace synth --model "$HF" -o "$TMP/x.json"
expect_in "$TMP/err" "holds no config.json"
expect_exit 2 "$EPX" demo --model no-such-model --out "$TMP/d3"
expect_in "$TMP/err" "the built-in models are" "or give a path to a config.json"
mkdir -p "$TMP/bad"
echo '[1, 2, 3]' >"$TMP/bad/config.json"
expect_exit 2 "$EPX" advise --model "$TMP/bad" --gpus 8 --link nvlink4
expect_in "$TMP/err" "must be a JSON object"
echo '{"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_experts_per_tok": 8}' \
    >"$TMP/bad/config.json"
expect_exit 2 "$EPX" trace synth --model "$TMP/bad/config.json" -o "$TMP/x.json"
expect_in "$TMP/err" "no 'num_experts'" "qwen-moe" "model_type 'qwen3_moe'"
echo '{"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": -1}' >"$TMP/bad/config.json"
expect_exit 2 "$EPX" demo --model "$TMP/bad" --out "$TMP/d4"
expect_in "$TMP/err" "'hidden_size'" "is -1" "plain JSON integer"
# a whole number written as a real is named as such, not as a fraction (issue 29)
echo '{"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "n_routed_experts": 256, "num_experts_per_tok": 1e1}' >"$TMP/bad/config.json"
expect_exit 2 "$EPX" trace synth --model "$TMP/bad" -o "$TMP/x.json"
expect_in "$TMP/err" "'num_experts_per_tok'" "is 10.0 (a real number, with a point or an exponent)"
echo '{"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "n_routed_experts": 256, "num_experts_per_tok": 8.5}' >"$TMP/bad/config.json"
expect_exit 2 "$EPX" trace synth --model "$TMP/bad" -o "$TMP/x.json"
expect_in "$TMP/err" "is 8.5 (a fraction)"
echo '{"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": "4096"}' >"$TMP/bad/config.json"
expect_exit 2 "$EPX" bench comm --backend mpi --model "$TMP/bad" --tokens 1
expect_in "$TMP/err" "'hidden_size'" '"4096"'
[ ! -e "$TMP/x.json" ] || fail "a refused model still wrote its output"
exit 0
