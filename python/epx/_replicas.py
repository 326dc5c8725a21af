"""Replica lists as the Python API takes them: per expert, its slot ids
first and -1 padding after (SGLang's logical_to_all_physical_map form).

One reader for epx.dispatch's [L][E][X], the balancer's [E][W] and
epx.torch's Mapping rows, so the three agree on what a list is and name the
same place when one is wrong. The C API takes the counts beside the lists
(num_valid); a Python caller never sees that array, so no message names it.
"""
import numpy as np


def _where(name, idx):
    return name + "".join("[%d]" % int(i) for i in idx)


def valid_counts(reps, P, name="replicas"):
    """The number of slots at the head of each list of reps [..., X] (an
    integer ndarray), checked: every entry a slot id in [0, P) or -1, the
    -1s only after the slots, and every list holding one slot at least.
    Raises ValueError naming the first entry or list that breaks a rule."""
    bad = (reps < -1) | (reps >= P)
    if bad.any():
        at = tuple(np.argwhere(bad)[0])
        raise ValueError("%s = %d is outside [-1, %d) (P)" % (_where(name, at), int(reps[at]), P))
    valid = reps >= 0
    gap = np.argwhere(valid[..., 1:] & ~valid[..., :-1])
    if len(gap):
        at = tuple(gap[0])
        raise ValueError("%s has a -1 before slot %d: each list holds its slots first, -1 "
                         "padding only at the tail"
                         % (_where(name, at[:-1]), int(reps[at[:-1] + (at[-1] + 1,)])))
    nv = valid.sum(axis=-1).astype(np.int32)
    empty = np.argwhere(nv == 0)
    if len(empty):
        raise ValueError("%s has no slot: every expert needs a replica"
                         % _where(name, empty[0]))
    return np.ascontiguousarray(nv)
