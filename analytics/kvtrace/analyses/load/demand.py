"""What each request asks of the queues, read from one tier replay (:class:`Demand`).

The replay is :func:`kvtrace.analyses.whatif.simulate` with an ``on_chunk`` fold: each
chunk's per-request rows of the simulator (``kvtrace.kernels.tiers.REQUEST_COLUMNS``)
become the queue simulator's inputs (:data:`COLUMNS`), kept per request in memory, or
in a file in the spill directory of a streamed source (mapped, so its pages are the
page cache's, not the process's). Any number of load levels then run over it without
another replay.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
from numba import njit

from kvtrace.analyses.response import ResponseModel
from kvtrace.analyses.whatif.config import TierConfig
from kvtrace.config import NJIT
from kvtrace.kernels import tiers as K
from kvtrace.kernels.densify import mix_hash
from kvtrace.kernels.tier_table import (R_FL_Q, R_FL_TOK, R_PRE_Q, R_PRE_TOK, R_READS, R_SRC, R_TOTAL_Q,
                                        R_TOTAL_TOK, R_WRITES)

#: Per-request columns (float64), then ``flash_targets`` columns of bytes and as many of
#: reads per flash target.
COLUMNS = ("node", "dram_bytes", "local_bytes", "flash_bytes", "rest_work_s", "rest_tokens", "flash_work_s",
           "flash_tokens", "local_write_bytes", "flash_write_bytes", "flash_reads")
(D_NODE, D_BD, D_BL, D_BF, D_SREST, D_KREST, D_SFL, D_KFL, D_WL, D_WF, D_READS) = range(len(COLUMNS))
_ids = itertools.count()


@njit(**NJIT)
def _target_split(block, decision, lrs, size, T, bpt, out, first_col):
    """Per request of a chunk: usable-prefix FLASH accesses' bytes and reads by target
    (``mix_hash(block) % T``), into ``out[r, first_col + t]`` / ``[.., first_col + T + t]``.
    The usable prefix and the sizes are the tier simulator's (its ``src_flash_size``)."""
    for r in range(lrs.shape[0] - 1):
        for t in range(T):
            out[r, first_col + t] = 0.0
            out[r, first_col + T + t] = 0.0
        for i in range(lrs[r], lrs[r + 1]):
            d = decision[i] & 3
            if d == K.MISS:
                break
            if d == K.FLASH:
                b = block[i]
                tgt = np.int64(mix_hash(np.uint64(b), 0) % np.uint64(T))
                out[r, first_col + tgt] += np.float64(size[b]) * bpt
                out[r, first_col + T + tgt] += 1.0


class Transfers:
    """Background moves into nodes' DRAM (prefetches, prewarms) for the queue simulator's
    links (its *transfers*), collected piece by piece and read sorted by time.

    After :meth:`arrays`: ``time_s`` float64[K] (seconds after the trace's first
    request, non-decreasing; equal times in the order added), ``node`` int64[K],
    ``local_bytes`` float64[K] (from the node's local SSD), ``target_bytes`` and
    ``target_reads`` float64[K, T] (from each shared-flash target); ``measured``:
    whether each belongs to the measured window (a move landing before a measured
    request), for the figures; every transfer loads the links."""

    def __init__(self, targets: int) -> None:
        self.targets = int(targets)
        self._parts: list = []

    def add(self, time_s, node, local_bytes, target_bytes, target_reads, measured=True) -> None:
        t = np.atleast_1d(np.asarray(time_s, dtype=np.float64))
        keep = (np.asarray(local_bytes) > 0) | (np.asarray(target_bytes).reshape(t.shape[0], -1).sum(axis=1) > 0)
        if keep.any():
            T = self.targets
            self._parts.append((t[keep], np.broadcast_to(np.asarray(node, dtype=np.int64), t.shape)[keep],
                                np.asarray(local_bytes, dtype=np.float64).reshape(-1)[keep],
                                np.asarray(target_bytes, dtype=np.float64).reshape(-1, T)[keep],
                                np.asarray(target_reads, dtype=np.float64).reshape(-1, T)[keep],
                                np.broadcast_to(np.asarray(measured, dtype=bool), t.shape)[keep]))

    def __len__(self) -> int:
        return sum(p[0].shape[0] for p in self._parts)

    def arrays(self, measured: bool = False):
        """``(time_s, node, local_bytes, target_bytes, target_reads)``, sorted by time
        (``measured``: and the measured flags)."""
        T = self.targets
        k = 6 if measured else 5
        if not self._parts:
            return (np.zeros(0), np.zeros(0, np.int64), np.zeros(0), np.zeros((0, T)), np.zeros((0, T)),
                    np.zeros(0, bool))[:k]
        cols = [np.concatenate([p[i] for p in self._parts]) for i in range(k)]
        order = np.argsort(cols[0], kind="stable")
        return tuple(c[order] for c in cols)

    def bytes(self) -> tuple[float, float]:
        """Total ``(local SSD, shared flash)`` bytes moved."""
        return (float(sum(p[2].sum() for p in self._parts)), float(sum(p[3].sum() for p in self._parts)))


class Demand:
    """Per-request inputs of the queue simulator for one configuration's replay.

    Attributes
    ----------
    arrival_s : float64[R]
        Request times minus the first one's (trace order, non-decreasing).
    rows : float64[R, len(COLUMNS) + 2 T]
    first : int
        First measured request (the warm-up ones load the queues, unmeasured).
    targets : int
    """

    def __init__(self, trace, config: TierConfig, first: int, targets: int, bpt: int, a: float, b: float,
                 response: ResponseModel, tokens_per_s: float | None, block_size=None) -> None:
        R = trace.n_requests
        ts = np.asarray(trace.request_timestamp, dtype=np.float64)
        self.arrival_s = ts - ts[0] if R else ts.copy()
        self.first = int(first)
        self.targets = int(targets)
        self.config = config
        self.width = len(COLUMNS) + 2 * self.targets
        spill = trace.spill
        self.path = None
        if spill is not None:
            self.path = os.path.join(str(spill), f"load-demand-{os.getpid()}-{next(_ids)}.f64")
            self.rows = np.memmap(self.path, dtype=np.float64, mode="w+", shape=(max(R, 1), self.width))[:R]
        else:
            self.rows = np.zeros((R, self.width), dtype=np.float64)
        self._bpt, self._a, self._b = float(bpt), float(a), float(b)
        self._rate = response.recompute_flops_per_s
        self._tps = tokens_per_s
        self._size = trace.block_size if block_size is None else block_size  # a scenario's renumbered blocks

    def add(self, ch, decision, req_out, node) -> None:
        """One chunk of the replay (``on_chunk`` of :func:`kvtrace.analyses.whatif.simulate`)."""
        r0, r1 = ch.r, ch.r_end
        if r1 <= r0:
            return
        q = req_out[: r1 - r0]
        out = self.rows[r0:r1]
        bpt, a, b = self._bpt, self._a, self._b
        out[:, D_NODE] = node[r0:r1]
        out[:, D_BD] = q[:, R_SRC] * bpt
        out[:, D_BL] = q[:, R_SRC + 1] * bpt
        out[:, D_BF] = q[:, R_SRC + 2] * bpt
        rest_tok = q[:, R_TOTAL_TOK] - q[:, R_PRE_TOK]
        rest_q = q[:, R_TOTAL_Q] - q[:, R_PRE_Q]
        if self._tps is None:
            out[:, D_SREST] = (a * rest_tok + b * rest_q) / self._rate
            out[:, D_SFL] = (a * q[:, R_FL_TOK] + b * q[:, R_FL_Q]) / self._rate
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                tps = self._tps if self._tps > 0 else 0.0
                out[:, D_SREST] = np.where(rest_tok > 0, rest_tok / tps if tps else np.inf, 0.0)
                out[:, D_SFL] = np.where(q[:, R_FL_TOK] > 0, q[:, R_FL_TOK] / tps if tps else np.inf, 0.0)
        out[:, D_KREST] = rest_tok
        out[:, D_KFL] = q[:, R_FL_TOK]
        out[:, D_WL] = q[:, R_WRITES] * bpt
        out[:, D_WF] = q[:, R_WRITES + 1] * bpt
        out[:, D_READS] = q[:, R_READS + 1]
        T, c0 = self.targets, len(COLUMNS)
        if T == 1:
            out[:, c0] = out[:, D_BF]
            out[:, c0 + 1] = out[:, D_READS]
        else:
            tmp = np.empty((r1 - r0, self.width), dtype=np.float64)
            _target_split(ch.block, decision, ch.lrs, self._size, T, bpt, tmp, c0)
            out[:, c0:] = tmp[:, c0:]

    def close(self) -> None:
        """Remove a spilled demand file."""
        if self.path is not None:
            rows, self.rows = self.rows, None
            del rows
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None


__all__ = ["COLUMNS", "Demand", "Transfers"]
