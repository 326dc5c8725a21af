#!/usr/bin/env python3
"""Balanced dispatch beside a general LP solver on the same per-batch LP
(SGLang 0.5.23's `lp` dispatch objective: min z s.t. each expert's tokens
split over its replicas, every GPU's load <= z): epx's exact max-flow
solver (epx.dispatch.Balancer.solve, one call per layer through ctypes)
against scipy's linprog (HiGHS) on one CPU. Not SGLang's own GPU
interior-point solver, which needs a GPU. Placements are epx's plans of a
trace's windows 0..3; batches of T tokens are drawn from windows 4..7. The
optimum is checked to agree (relative 1e-6) before anything is reported.

  python bench_balanced_lp.py [--shared ../shared] [--batches 16]
"""
import argparse
import json
import os
import statistics
import time

import numpy as np
from scipy.optimize import linprog

import epx
from epx import dispatch

SETUPS = (("kimi_k2", 8, 1, 416, None), ("deepseek_v3", 32, 4, 288, 8))


def lp(rep, P, G, counts):
    per = P // G
    e_idx, j_idx = np.nonzero(rep >= 0)
    n = len(e_idx) + 1
    c = np.zeros(n)
    c[-1] = 1.0
    a_eq = np.zeros((rep.shape[0], n))
    a_eq[e_idx, np.arange(len(e_idx))] = 1.0
    a_ub = np.zeros((G, n))
    a_ub[rep[e_idx, j_idx] // per, np.arange(len(e_idx))] = 1.0
    a_ub[:, -1] = -1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(G), A_eq=a_eq, b_eq=counts.astype(float),
                  bounds=[(0, None)] * n, method="highs")
    assert res.status == 0, res.message
    return res.fun


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.environ.get("EPX_SHARED", "../shared"))
    ap.add_argument("--batches", type=int, default=16)
    args = ap.parse_args()
    rng = np.random.default_rng(27)
    print("%-12s %5s %7s | %10s %10s" % ("trace", "T", "batches", "epx ms", "linprog ms"))
    for name, G, N, P, groups in SETUPS:
        counts = np.array(json.load(open("%s/traces/%s.json" % (args.shared, name)))
                          ["logical_count"], dtype=np.float64)
        S, L, E = counts.shape
        plan = epx.plan(counts[:4], G, num_physical_experts=P, num_nodes=N, num_groups=groups)
        maps = plan.layout.logical_to_all_physical_map()
        b = dispatch.Balancer(E, maps.shape[2], P, G)
        layers = [l for l in range(L) if counts[4:, l].sum() > 0]
        for T in (128, 4096):
            te, tl = [], []
            for i in range(args.batches):
                w, l = 4 + i % 4, layers[(i * 7) % len(layers)]
                p = counts[w, l] / counts[w, l].sum()
                ids = np.stack([rng.choice(E, 8, replace=False, p=p) for _ in range(T)])
                c = dispatch.count_ids(ids, E)
                t0 = time.perf_counter()
                split = b.solve(maps[l], c)
                te.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                z = lp(maps[l], P, G, c)
                tl.append(time.perf_counter() - t0)
                assert abs(float(split.max_load) - z) <= 1e-6 * max(1.0, z), (name, T, i)
            print("%-12s %5d %7d | %10.3f %10.3f" % (name, T, args.batches,
                                                     1e3 * statistics.median(te),
                                                     1e3 * statistics.median(tl)))


if __name__ == "__main__":
    main()
