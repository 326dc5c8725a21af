"""Drop-in for vLLM's EPLB placement (vllm.distributed.eplb.rebalance_algo):
the same DeepSeek EPLB, with vLLM's two differences from SGLang's entry
point: the policy is chosen by num_groups % num_nodes == 0 (no flag), and
logical_to_physical_map always has P - E + 1 columns. Tensors come back on
the input's device, as vLLM keeps them."""
from . import _arrays as A
from . import sglang as _sglang

__all__ = ["rebalance_experts"]


def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus, *,
                      algorithm="deepseek", as_torch=None, **plan_kw):
    """vLLM's rebalance_experts(weight, num_replicas, num_groups, num_nodes,
    num_gpus) -> (phy2log [L][P], log2phy [L][E][P-E+1], logcnt [L][E]), int64."""
    hierarchical = int(num_groups) % int(num_nodes) == 0
    torch_out = A.want_torch(as_torch, weight)
    out = _sglang.rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus,
                                    hierarchical, algorithm=algorithm, log2phy_width="full",
                                    as_torch=False, **plan_kw)
    device = weight.device if A.is_torch(weight) else None
    return tuple(A.wrap(a, torch_out, device) for a in out)
