"""DeepEP's normal-mode rows on epx's low-latency engine: what a row
carries, and how a rank's receive becomes DeepEP's outputs.

DeepEP's normal dispatch sends each token once to every rank that holds one
of its experts (rank-deduplicated) and returns, per receiving rank, the
tokens in (source rank, token) order with their top-k ids made local. The
engine does exactly that when the "experts" are the ranks: an engine with
one slot per rank and top-k = R columns, where column r names rank r when
the token goes there and -1 when not. Its receive keeps the (source, token)
order, its combine sums each token's rows over the ranks in column order, in
fp32. What DeepEP sends beside the row travels in the row's tail:

  columns (bf16 units) of a dispatch row, width `row_width`:
    [0, H)             x (bf16); with fp8 input the e4m3 bytes in [0, H/2)
                       and the fp32 scales in [H/2, H/2 + H/64)
    [H, H + 2 KCAP)    the token's top-k ids as int32 (-1 past its top-k)
    [H + 2 KCAP, + 2 KCAP)  its top-k weights as fp32
  plus one more row per source, after its tokens (the "count row", sent to
  every rank): num_tokens_per_rank [R] and num_tokens_per_expert [E] as
  int32, from which the receiver builds DeepEP's rank_prefix_matrix and the
  per-expert counts without another exchange.

  columns of a combine row: [0, H) x; [H, H + 3K) the top-k weights split in
  three bf16 parts (hi, mid, lo: their fp32 sum is the weight exactly). The
  engine sums each part over the ranks in fp32: where one rank holds a
  token's weight for a k (what dispatch hands out: 0 on the others) that is
  the weight exactly; where several do, each part's sum is rounded on its
  own, so the result is within fp32 rounding of DeepEP's single sum.

Everything here is plain torch on any device (the CPU tests drive it with a
receive built by hand); epx.torch.Buffer runs it on the engine's views."""
import torch

KCAP = 32  # the widest top-k a row carries
META_COLS = 4 * KCAP  # ids then weights, two bf16 columns per 32-bit value


def row_width(hidden, num_experts, num_ranks):
    """Columns of one row: the data, the top-k tail, and room for the count
    row; a multiple of 8 (16-byte rows for the engine's vector copies)."""
    w = max(hidden + META_COLS, 2 * (num_ranks + num_experts))
    return (w + 7) // 8 * 8


def words(t):
    """t (2-byte elements, rows possibly strided) as int64 words, 4 values a
    word, where its row length and offsets allow, else t itself. Moving
    rows of a wider buffer is a strided copy, which torch runs per element:
    8-byte elements make it about four times faster (measured on the H200,
    bench/RESULTS.md), and an integer view keeps every bit as it is."""
    if t.shape[-1] % 4 == 0 and t.element_size() == 2:
        try:
            return t.view(torch.int64)
        except RuntimeError:  # an offset or a stride not a multiple of 8 bytes
            pass
    return t


def copy_rows(dst, src):
    """dst.copy_(src) for rows of 2-byte values, a word at a time where both
    allow it."""
    d, s = words(dst), words(src)
    if d.dtype != s.dtype:
        d, s = dst, src
    d.copy_(s)


def _cols32(rows, first, n):
    """Columns [first, first + 2n) of bf16 rows as n int32 per row (a copy,
    contiguous)."""
    return rows[:, first:first + 2 * n].contiguous().view(torch.int32)


def pack(stage, ids, x, x_scales, topk_idx, topk_weights, in_rank, per_rank, per_expert):
    """Fill the sender's rows stage[:T + 1] [.., W] bf16 and its columns
    ids[:T + 1] [.., R] int32 for T tokens: token rows, then the count row.
    topk_* may be None (DeepEP's dispatch without top-k); per_rank and
    per_expert may be None (a cached dispatch: the count row is not read)."""
    T, H = x.shape
    if x_scales is None:
        copy_rows(stage[:T, :H], x)
    else:
        copy_rows(stage[:T, :H // 2], x.view(torch.uint8).view(torch.bfloat16))
        stage[:T, H // 2:H // 2 + H // 64].copy_(
            x_scales.to(torch.float32).contiguous().view(torch.bfloat16))
    if topk_idx is not None:
        # written in place through an int32 view of the tail; the columns past
        # K are never read
        K = topk_idx.shape[1]
        meta = stage[:T, H:H + META_COLS].view(torch.int32)
        meta[:, :K].copy_(topk_idx)
        if topk_weights is None:
            meta[:, KCAP:KCAP + K].zero_()
        else:
            meta[:, KCAP:KCAP + K].copy_(topk_weights.view(torch.int32))
    route(ids, in_rank)
    if per_rank is not None:
        counts = torch.cat([per_rank.to(torch.int32), per_expert.to(torch.int32)])
        stage[T, :counts.numel() * 2].copy_(counts.view(torch.bfloat16))


def route(ids, in_rank):
    """The engine's columns for T tokens, ids[:T + 1]: column r names rank r
    where in_rank[t][r], else -1; the count row (T) goes to every rank."""
    T, R = in_rank.shape
    ranks = torch.arange(R, dtype=torch.int32, device=ids.device)
    torch.where(in_rank, ranks, torch.full_like(ranks[:1], -1), out=ids[:T])
    ids[T].copy_(ranks)


def count_rows(layout_range):
    """Each source's count row (its last row here) among the engine's rows."""
    return (layout_range >> 32) + (layout_range & 0xFFFFFFFF) - 1


def row_map(layout_range, n_out=None):
    """Where the received tokens are among the engine's rows. layout_range
    [R] int64 holds (first row << 32) | rows per source, each source's count
    row last. Returns (rows [n] int64: the engine row of received token i, in
    (source, token) order; valid [n] bool; real [R] int64: tokens per source
    without the count rows; count_rows [R] int64). n_out (DeepEP's
    num_worst_tokens) fixes n without reading the count on the host; rows
    past the real ones then point at the last count row (never read as a
    token) and are invalid."""
    first = layout_range >> 32
    n = layout_range & 0xFFFFFFFF
    real = (n - 1).clamp(min=0)
    cum = torch.cumsum(real, 0)
    if n_out is None:
        n_out = int(cum[-1])
    i = torch.arange(n_out, dtype=torch.int64, device=layout_range.device)
    src = torch.searchsorted(cum, i, right=True)
    valid = i < cum[-1]
    src = src.clamp(max=layout_range.numel() - 1)
    rows = torch.where(valid, first[src] + i - (cum[src] - real[src]), first[-1] + n[-1] - 1)
    return rows, valid, real, count_rows(layout_range)


def counts_of(recv, count_rows, num_ranks, num_experts):
    """The sources' count rows: (per_rank [R src][R dst], per_expert [R src][E])
    int32."""
    c = _cols32(recv.index_select(0, count_rows), 0, num_ranks + num_experts)
    return c[:, :num_ranks], c[:, num_ranks:]


def unpack(recv, rows, valid, hidden, fp8, topk, rank, local_experts):
    """DeepEP's received tensors, fresh: (x bf16 [n, H] or (e4m3 [n, H], fp32
    scales [n, H / 128])), and with topk = K the local top-k ids int64 [n, K]
    (-1 where the expert is not on this rank, or past the real tokens) and
    weights fp32 [n, K] (0 there). Rows past the real ones (valid False;
    valid None: every row is real) are zeros."""
    H = hidden
    keep = None if valid is None else valid.unsqueeze(1)
    if fp8:
        # masked as int16: the e4m3 bytes are not bf16 values
        data = recv[:, :H // 2].index_select(0, rows)
        scales = recv[:, H // 2:H // 2 + H // 64].index_select(0, rows).view(torch.float32)
        if keep is not None:  # masked as integers: e4m3 bytes are no bf16 values
            data = torch.where(keep, words(data), 0).view(torch.bfloat16)
            scales = torch.where(keep, scales, 0.0)
        x = (data.view(torch.float8_e4m3fn), scales)
    else:
        x = recv[:, :H].index_select(0, rows)
        if keep is not None:
            x = torch.where(keep, words(x), 0).view(torch.bfloat16)
    if topk is None:
        return x, None, None
    meta = recv[:, H:H + META_COLS].index_select(0, rows).view(torch.int32)
    local = meta[:, :topk].to(torch.int64) - rank * local_experts
    # negative ids stay negative: an id is local when it falls in [0, L)
    mine = (local >= 0) & (local < local_experts)
    if keep is not None:
        mine &= keep
    return x, torch.where(mine, local, -1), \
        torch.where(mine, meta[:, KCAP:KCAP + topk].view(torch.float32), 0.0)


def split3(w):
    """fp32 w as three bf16 parts whose fp32 sum (hi + mid) + lo is w (for
    every finite w whose parts stay above bf16's smallest normal)."""
    hi = w.to(torch.bfloat16)
    r = w - hi.float()
    mid = r.to(torch.bfloat16)
    lo = (r - mid.float()).to(torch.bfloat16)
    return hi, mid, lo


def fill_combine(y, rows, x, topk_weights):
    """Put a rank's combine input into the engine's rows y [S, W] bf16: row
    rows[i] gets x[i] and, with topk_weights [n, K], its three-part split."""
    H = x.shape[1]
    d, s = words(y[:, :H]), words(x)
    if d.dtype != s.dtype:
        d, s = y[:, :H], x
    d.index_copy_(0, rows, s)
    if topk_weights is not None:
        K = topk_weights.shape[1]
        parts = torch.cat(split3(topk_weights.to(torch.float32)), dim=1)
        y[:, H:H + 3 * K].index_copy_(0, rows, parts)


def combined(out, T, hidden, topk, bias):
    """DeepEP's combine outputs from the engine's sums out [T + 1, W]: x bf16
    [T, H] (bias terms added in fp32 before the one rounding) and with topk
    = K the summed weights fp32 [T, K]. out is fp32, or bf16 (the engine
    rounded once) where neither weights nor bias are asked for."""
    H = hidden
    if out.dtype == torch.bfloat16:
        x = torch.empty((T, H), dtype=out.dtype, device=out.device)
        copy_rows(x, out[:T, :H])
        return x, None
    acc = out[:T, :H]
    for b in bias:
        if b is not None:
            acc = acc + b.float()
    x = acc.to(torch.bfloat16)
    if topk is None:
        return x, None
    p = out[:T, H:H + 3 * topk]
    return x, (p[:, :topk] + p[:, topk:2 * topk]) + p[:, 2 * topk:]


# ---- the plain-torch definition of DeepEP's normal mode --------------------------


def reference_dispatch(xs, in_ranks, topk_idxs, topk_ws, per_experts, rank):
    """What rank `rank` receives in DeepEP's normal mode, by definition, from
    every rank s's x [T_s, H] (bf16, or an (e4m3, fp32 scales) tuple),
    is_token_in_rank [T_s, R], topk ids and weights (or None) and
    num_tokens_per_expert [E]: the tokens t with in_ranks[s][t][rank], in
    (s, t) order. Returns (x, ids int64 (local, -1 elsewhere), weights fp32
    (0 elsewhere), src_idx int32, rank_prefix_matrix int32 [R][R],
    per-expert counts [E / R] (int list))."""
    R = len(xs)
    E = per_experts[0].numel()
    L = E // R
    picks = [in_ranks[s][:, rank].cpu().nonzero().flatten() for s in range(R)]
    fp8 = isinstance(xs[0], tuple)

    def rows(t, s):
        return t.cpu()[picks[s]]

    if fp8:
        x = (torch.cat([rows(xs[s][0], s) for s in range(R)]),
             torch.cat([rows(xs[s][1], s) for s in range(R)]))
    else:
        x = torch.cat([rows(xs[s], s) for s in range(R)])
    ids = w = None
    if topk_idxs is not None:
        gid = torch.cat([rows(topk_idxs[s], s).to(torch.int64) for s in range(R)])
        mine = (gid >= rank * L) & (gid < (rank + 1) * L)
        ids = torch.where(mine, gid - rank * L, torch.full_like(gid, -1))
        if topk_ws is not None:
            wv = torch.cat([rows(topk_ws[s], s).float() for s in range(R)])
            w = torch.where(mine, wv, torch.zeros_like(wv))
    src = torch.cat([picks[s].to(torch.int32) for s in range(R)])
    counts = torch.stack([in_ranks[s].cpu().sum(0, dtype=torch.int32) for s in range(R)])
    prefix = torch.cumsum(counts, 0, dtype=torch.int32)
    got = sum(per_experts[s].cpu().to(torch.int64)[rank * L:(rank + 1) * L] for s in range(R))
    return x, ids, w, src, prefix, [int(v) for v in got]


def reference_combine(ys, ws, in_ranks, source, rounded=True):
    """What source rank `source` gets back in DeepEP's normal combine, by
    definition: for each of its tokens t, the rows every rank r received for
    it (ys[r] [n_r, H] bf16 in r's receive order, (s, t) ascending) summed in
    fp32 over r ascending, rounded once to bf16; with ws (each rank's [n_r, K]
    fp32 weights) their fp32 sums in the same order. rounded=False: x's fp32
    sums, before the rounding."""
    R = len(ys)
    T = in_ranks[source].shape[0]
    H = ys[0].shape[1]
    out = torch.zeros((T, H), dtype=torch.float32)
    wout = None if ws is None else torch.zeros((T, ws[0].shape[1]), dtype=torch.float32)
    for r in range(R):
        before = sum(int(in_ranks[s][:, r].sum()) for s in range(source))
        picks = in_ranks[source][:, r].cpu().nonzero().flatten()
        for i, t in enumerate(picks.tolist()):
            out[t] += ys[r][before + i].cpu().float()
            if ws is not None:
                wout[t] += ws[r][before + i].cpu().float()
    return out.to(torch.bfloat16) if rounded else out, wout
