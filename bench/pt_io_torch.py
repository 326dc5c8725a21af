"""pt_io_torch.py - the peer of bench_pt_io: torch.load(weights_only=True) on
the same files, converted to what epx returns (float64 counts; for the
per_pass dump, ranks summed per pass and slots scatter-added onto experts as
SGLang's reader does). Best of 7 after a warm-up, one torch thread.

usage: python bench/pt_io_torch.py [DIR]   (after bench_pt_io DIR)
"""
import sys
import time
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402

torch.set_num_threads(1)
d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/epx-bench-pt"


def best(fn):
    fn()
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def counts(path):
    return torch.load(path, weights_only=True)["logical_count"].double()


def mapping(path):
    return torch.load(path, weights_only=True)["physical_to_logical_map"].int()


def per_pass(path):
    pack = torch.load(path, weights_only=True)
    m = pack["last_physical_to_logical_map"]
    by = {}
    for r in pack["records"]:
        by.setdefault(r["forward_pass_id"], []).append(r["global_physical_count"])
    g = torch.stack([torch.stack(v).sum(0) for _, v in sorted(by.items())])
    out = torch.zeros(g.shape[0], m.shape[0], int(m.max()) + 1, dtype=torch.float64)
    return out.scatter_add_(2, m.unsqueeze(0).expand(g.shape[0], -1, -1), g.double())


print("| file | torch.load + convert ms |\n| --- | ---: |")
for name, fn in [("stat_dump_B1.pt", counts), ("stat_dump_B16.pt", counts),
                 ("stat_dump_B128.pt", counts), ("init_mapping.pt", mapping),
                 ("per_pass_rank0.pt", per_pass)]:
    print("| %s | %.3f |" % (name, 1e3 * best(lambda: fn(d + "/" + name))))
