"""epx's own test of SGLang >= 0.5.17's call shape of
compute_logical_to_rank_dispatch_physical_map (no server_args; the node
count read from SGLang's runtime context), run by tools/peer_test.py under
its shim: the function under test is imported from
sglang.srt.eplb.expert_location (the release's own in mode engine, epx's in
mode epx) and compared, rank by rank, with the release's own function on
random maps, node counts and join modes. SGLang publishes no unit test of
this shape; this one is epx's."""
import inspect
import random

import torch

import _epx_peer
from sglang.srt import runtime_context
from sglang.srt.eplb.expert_location import compute_logical_to_rank_dispatch_physical_map

REFERENCE = _epx_peer.engine_expert_location()["compute_logical_to_rank_dispatch_physical_map"]


def _random_map(rng, G, per_gpu, L, E):
    """logical_to_all_physical_map [L][E][X] for P = G * per_gpu slots: every
    expert at least once, the rest random, -1 padded."""
    P = G * per_gpu
    rows = []
    for _ in range(L):
        p2l = list(range(E)) + [rng.randrange(E) for _ in range(P - E)]
        rng.shuffle(p2l)
        lists = [[p for p in range(P) if p2l[p] == e] for e in range(E)]
        rng.shuffle(lists[0])  # some lists not ascending, as DeepSeek's order gives
        rows.append(lists)
    X = max(len(x) for lay in rows for x in lay)
    return torch.tensor([[x + [-1] * (X - len(x)) for x in lay] for lay in rows]), P


def _cases():
    rng = random.Random(523)
    for G, nodes in [(4, 1), (4, 2), (8, 2), (8, 4), (16, 2), (16, 8)]:
        for join_mode in ["normal", "scale"]:
            for _ in range(3):
                per_gpu = rng.choice([2, 3, 4])
                E = rng.randrange(max(1, G * per_gpu // 2), G * per_gpu + 1)
                yield G, nodes, join_mode, _random_map(rng, G, per_gpu, rng.choice([1, 2]), E)


def test_signature_is_the_releases():
    assert list(inspect.signature(compute_logical_to_rank_dispatch_physical_map).parameters) == \
        list(inspect.signature(REFERENCE).parameters)


def test_tables_equal_the_releases_on_every_rank():
    n = 0
    for G, nodes, join_mode, (l2a, P) in _cases():
        runtime_context.set_parallel(G, nodes, join_mode)
        for seed in (42, 7):
            for r in range(G):
                want = REFERENCE(l2a.clone(), G, P, r, seed)
                got = compute_logical_to_rank_dispatch_physical_map(l2a.clone(), G, P, r, seed)
                assert got.dtype == want.dtype and torch.equal(got, want), \
                    "G=%d nodes=%d %s seed=%d rank %d" % (G, nodes, join_mode, seed, r)
                n += 1
    assert n > 500


def test_the_node_count_is_read_from_the_context():
    """The cases can tell node counts apart, so reading the context matters:
    with 2 nodes some table differs from 1 node (in the release's code)."""
    differs = False
    for G, nodes, join_mode, (l2a, P) in _cases():
        if nodes == 1 or join_mode == "scale":
            continue
        runtime_context.set_parallel(G, nodes)
        many = [compute_logical_to_rank_dispatch_physical_map(l2a, G, P, r) for r in range(G)]
        runtime_context.set_parallel(G, 1)
        one = [compute_logical_to_rank_dispatch_physical_map(l2a, G, P, r) for r in range(G)]
        differs = differs or any(not torch.equal(a, b) for a, b in zip(many, one))
    assert differs


def test_expanded_elastic_world_drops_the_node_preference():
    G, nodes = 8, 4
    l2a, P = _random_map(random.Random(1), G, 3, 2, 16)
    runtime_context.set_parallel(G, nodes, expanded=True)
    for r in range(G):
        assert torch.equal(compute_logical_to_rank_dispatch_physical_map(l2a, G, P, r),
                           REFERENCE(l2a, G, P, r))
