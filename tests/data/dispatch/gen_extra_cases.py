#!/usr/bin/env python3
"""Write crafted static-dispatch cases in the golden format (tests/data/dispatch/*.json).

The shared goldens never reach CPython sample()'s set method (it needs an expert
with more than 21 replicas and at most 5 GPUs without one); these cases do, and
mix replica counts, orders and node layouts. Tables come from
shared/tools/dispatch_model.py (CPython's random, seed 42).
Run: python3 tests/data/dispatch/gen_extra_cases.py ../shared/tools tests/data/dispatch
"""
import json
import os
import random
import sys

sys.path.insert(0, sys.argv[1])
import dispatch_model  # noqa: E402


def case(name, G, E, p2l_layers, seed):
    rnd = random.Random(seed)
    P = len(p2l_layers[0])
    l2p = []
    for p2l in p2l_layers:
        reps = [[p for p in range(P) if p2l[p] == e] for e in range(E)]
        for r in reps:  # a replica-rank order that is not ascending
            rnd.shuffle(r)
        X = max(len(r) for r in reps)
        l2p.append(reps)
    X = max(len(r) for L in l2p for r in L)
    l2p = [[r + [-1] * (X - len(r)) for r in L] for L in l2p]
    asc = dispatch_model.all_physical_ascending(p2l_layers, E)
    XA = max(len(r) for L in asc for r in L)
    asc = [[r + [-1] * (XA - len(r)) for r in L] for L in asc]
    return name, {
        "name": name, "num_layers": len(p2l_layers), "num_logical_experts": E,
        "num_groups": 1, "num_nodes": 1, "num_gpus": G, "num_physical_experts": P,
        "physical_to_logical_map": p2l_layers, "logical_to_physical_map": l2p,
        "rank_dispatch_from_eplb": dispatch_model.rank_dispatch(l2p, G, P),
        "logical_to_all_physical_map_from_mapping": asc,
        "rank_dispatch_from_mapping": dispatch_model.rank_dispatch(asc, G, P),
    }


out = []
# 16 GPUs x 2 slots, 10 experts: expert 0 holds 22 or 23 of the 32 slots, at
# random, so only a few GPUs lack it and sample(n >= 22 replicas, k <= 5)
# takes the set method in nearly every layer. Layer 0 is hand-made: 22
# replicas on GPUs 0..10, 5 GPUs remain.
G, P, E = 16, 32, 10
rnd = random.Random(7)
layers = [[0] * 22 + list(range(1, 10)) + [1]]
for _ in range(40):
    n0 = rnd.choice([22, 23])
    m = [0] * n0 + list(range(1, E)) + [rnd.randrange(1, E) for _ in range(P - n0 - (E - 1))]
    rnd.shuffle(m)
    layers.append(m)
out.append(case("set_method_16gpu", G, E, layers, 1))
# 64 GPUs x 2 slots, one expert with 100 replicas on 50 GPUs: k = 14 > 5 and
# n = 100 > 21 + 64, the set method with a large sample.
G, P, E = 64, 128, 29
l0 = [0] * 100 + list(range(1, 29))
l1 = list(l0)
rnd.shuffle(l1)
out.append(case("set_method_big", G, E, [l0, l1], 2))
for name, d in out:
    with open(os.path.join(sys.argv[2], name + ".json"), "w") as f:
        json.dump(d, f, separators=(",", ":"))
    print("wrote", name)
