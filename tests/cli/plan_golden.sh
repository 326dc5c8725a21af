# plan_golden.sh - all 134 golden DeepSeek EPLB cases through `epx plan
# --algorithm deepseek | deepseek-hierarchical`, checked by the parity rules
# of shared/golden/README.md: logical_count identical; the sorted experts of
# every GPU identical in `float` cases; per-layer balancedness within 1e-9.
. "$(dirname "$0")/../util/cli_lib.sh"
command -v python3 >/dev/null || { echo "skip: python3 not installed"; exit 77; }
G=${EPX_SHARED:-}/golden/eplb
[ -f "$G/index.json" ] || { echo "skip: shared/golden/eplb not found (EPX_SHARED=${EPX_SHARED:-unset})"; exit 77; }
python3 - "$EPX" "$G" "$TMP" <<'PY' || fail "golden parity through epx plan"
import json, os, subprocess, sys
epx, gdir, tmp = sys.argv[1:4]

def gpu_loads(w, p2l, gpus):
    cnt = {}
    for e in p2l:
        cnt[e] = cnt.get(e, 0) + 1
    per = len(p2l) // gpus
    loads = [0.0] * gpus
    for p, e in enumerate(p2l):
        loads[p // per] += w[e] / cnt[e]
    return loads

def balancedness(w, p2l, gpus):
    loads = gpu_loads(w, p2l, gpus)
    m = max(loads)
    return 1.0 if m == 0 else (sum(loads) / gpus) / m

cases = json.load(open(os.path.join(gdir, "index.json")))["cases"]
bad = 0
for name in cases:
    d = json.load(open(os.path.join(gdir, name + ".json")))
    L, E, G, P = d["num_layers"], d["num_logical_experts"], d["num_gpus"], d["num_physical_experts"]
    groups, nodes = d["num_groups"], d["num_nodes"]
    counts = os.path.join(tmp, "counts.json")
    json.dump({"logical_count": d["weight"]}, open(counts, "w"))
    out = os.path.join(tmp, "map.json")
    cmd = [epx, "plan", "--counts", counts, "--gpus", str(G), "--physical", str(P), "-o", out]
    if groups == 1 and nodes == 1:
        cmd += ["--algorithm", "deepseek"]
    else:
        cmd += ["--algorithm", "deepseek-hierarchical", "--groups", str(groups), "--nodes", str(nodes)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(name, "epx plan failed:", r.stderr); bad += 1; continue
    m = json.load(open(out))
    if list(m) != ["physical_to_logical_map"]:
        print(name, "mapping file keys", list(m)); bad += 1; continue
    p2l = m["physical_to_logical_map"]
    ref = d["physical_to_logical_map"]
    per = P // G
    for l in range(L):
        cnt = [p2l[l].count(e) for e in range(E)]
        if cnt != d["logical_count"][l]:
            print(name, "layer", l, "logical_count differs"); bad += 1; break
        if d["weight_kind"] == "float":
            mine = [sorted(p2l[l][g * per:(g + 1) * per]) for g in range(G)]
            theirs = [sorted(ref[l][g * per:(g + 1) * per]) for g in range(G)]
            if mine != theirs:
                print(name, "layer", l, "experts per GPU differ"); bad += 1; break
        a = balancedness(d["weight"][l], p2l[l], G)
        b = balancedness(d["weight"][l], ref[l], G)
        if abs(a - b) > 1e-9:
            print(name, "layer", l, "balancedness", a, "vs", b); bad += 1; break
print(f"{len(cases)} golden cases through epx plan, {bad} failing")
sys.exit(1 if bad or len(cases) != 134 else 0)
PY
