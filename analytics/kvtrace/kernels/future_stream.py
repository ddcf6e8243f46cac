"""Chunked future-reuse kernels for streamed traces (``kvtrace value --stream``).

They give :func:`kvtrace.kernels.future.future_windows`'s outputs access by access,
with O(distinct blocks) state carried between chunks instead of O(accesses) arrays;
their twin is that kernel (``tests/test_value_stream.py`` compares a streamed run
with the in-memory one exactly). Conventions are :mod:`kvtrace.kernels.future`'s.

Two passes:

- :func:`next_access_chunk`, run over the chunks **last to first**, gives every
  access's next access of the same block (one index per block carried back).
- :func:`lead_lag_windows`, run over the trace by two cursors that read the same
  accesses: the *lead* counts each block's accesses and running token sums; the
  *lag* closes access ``s``'s window as soon as the lead meets the first access ``u``
  (of any block) with ``ts[u] - ts[s] > horizon``. Since ``ts`` is non-decreasing
  nothing from ``u`` on is in the window, and the lead's per-block running values at
  that moment are those through the window's last access: the window's reuses are
  their differences with the lag's own running values through ``s``, exactly as
  ``future_windows`` computes them when it closes ``s``. The end of the trace closes
  the rest (with ``horizon = inf``, the lead runs through the whole trace first: the
  closed form from the blocks' totals).
"""

from __future__ import annotations

from numba import njit

from kvtrace.config import NJIT


@njit(**NJIT)
def next_access_chunk(block, lo, nxt, next_t):
    """Next access of every access of one chunk, the chunks visited last to first.

    Parameters
    ----------
    block : int64[m]
        Dense block ids of accesses ``lo .. lo + m - 1``.
    lo : int
        Trace index of the chunk's first access.
    nxt : int32 or int64[M]
        Carried state: each block's earliest access after the chunk (-1: none). Updated.
    next_t : int64[m]
        Output: trace index of the next access of the same block, -1 for none.
    """
    for i in range(block.shape[0] - 1, -1, -1):
        b = block[i]
        next_t[i] = nxt[b]
        nxt[b] = lo + i


@njit(**NJIT)
def lead_lag_windows(lead_block, lead_ts, lead_tokens, lead_q, lead_lo, i,
                     lag_block, lag_ts, lag_tokens, lag_q, j, horizon, final,
                     count, cum_tokens, cum_q, latest, latest_ts, closed, closed_tokens, closed_q, prev_keep,
                     reuses, last_t, last_gap, reuse_tokens, reuse_q, starts_stay):
    """Advance both cursors until the lag's chunk is closed or the lead's is read.

    Parameters
    ----------
    lead_block, lead_ts, lead_tokens, lead_q : arrays of the lead's chunk
        Dense block id (int64), time (float64, seconds), tokens and position-token
        sum (int64) of accesses ``lead_lo ..``.
    i : int
        Next unread access of the lead's chunk.
    lag_block, lag_ts, lag_tokens, lag_q : arrays of the lag's chunk
        The same for the chunk whose windows are being closed.
    j : int
        Next open window of the lag's chunk.
    horizon : float
        Seconds, >= 0 (inf allowed).
    final : bool
        The lead has read the whole trace: close every window.
    count, cum_tokens, cum_q : per-block state of the lead, [M]
        Accesses (int32 when the trace has < 2**31 accesses, else int64), token sum
        and position-token sum (int64) read by the lead. Updated.
    latest : int32 or int64[M], or empty
        Trace index of each block's latest access read by the lead (-1: none).
        Updated. Empty: not tracked, and ``last_t`` is not written (may be empty).
    latest_ts : float64[M]
        Time of each block's latest access read by the lead. Updated.
    closed, closed_tokens, closed_q : per-block state of the lag, [M]
        Accesses (as ``count``), token sum and position-token sum closed by the lag.
        Updated.
    prev_keep : bool[M]
        Whether each block's latest closed window holds a reuse. Updated.
    reuses, last_t, last_gap, reuse_tokens, reuse_q : outputs per lag access
        As :func:`kvtrace.kernels.future.future_windows` (int64, int64, float64,
        int64, int64).
    starts_stay : bool[m]
        Output: the previous access of the block has no reuse within the horizon (or
        there is none): the time-to-live schedule writes the block here.

    Returns
    -------
    (i, j) : the cursors; ``j == len(lag_block)``: the lag's chunk is complete;
    else ``i == len(lead_block)``: the lead needs its next chunk.
    """
    n_lead = lead_block.shape[0]
    n_lag = lag_block.shape[0]
    track = latest.shape[0] > 0
    while j < n_lag:
        if not final:
            if i == n_lead:
                break
            if not lead_ts[i] - lag_ts[j] > horizon:
                # the lead's access is within the oldest open window: read it
                b = lead_block[i]
                count[b] += 1
                cum_tokens[b] += lead_tokens[i]
                cum_q[b] += lead_q[i]
                if track:
                    latest[b] = lead_lo + i
                latest_ts[b] = lead_ts[i]
                i += 1
                continue
        # close the window of lag access j
        b = lag_block[j]
        rank = closed[b]
        closed[b] = rank + 1
        closed_tokens[b] += lag_tokens[j]
        closed_q[b] += lag_q[j]
        r = count[b] - 1 - rank
        reuses[j] = r
        reuse_tokens[j] = cum_tokens[b] - closed_tokens[b]
        reuse_q[j] = cum_q[b] - closed_q[b]
        if r > 0:
            if track:
                last_t[j] = latest[b]
            last_gap[j] = latest_ts[b] - lag_ts[j]
        else:
            if track:
                last_t[j] = -1
            last_gap[j] = 0.0
        starts_stay[j] = not prev_keep[b]
        prev_keep[b] = r > 0
        j += 1
    return i, j


@njit(**NJIT)
def block_extent(block, local_req, req_lo, first_req, last_req):
    """First and last request of each block, one chunk of whole requests at a time.

    ``first_req`` starts at -1 (unseen); ``req_lo`` is the chunk's first request and
    ``local_req`` each access's request within the chunk. (A block's prefix family is
    read afterwards from its first request: :func:`kvtrace.analyses.value.family_roots`.)
    """
    for t in range(block.shape[0]):
        b = block[t]
        r = local_req[t]
        if first_req[b] < 0:
            first_req[b] = req_lo + r
        last_req[b] = req_lo + r
