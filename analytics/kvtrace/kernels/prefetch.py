"""A software prefetch for kernels whose next memory reads are known early.

Linked-list LRU updates chase pointers to rows of a table far larger than the CPU
caches (one row per distinct block). When a kernel knows a row it will touch a few
hundred nanoseconds from now (the next request's blocks, the next eviction victim), it
asks for the row's cache line now, so the miss overlaps useful work instead of
stalling it. A prefetch never changes results; without the JIT it does nothing.
"""

from __future__ import annotations

import llvmlite.ir as ir
from numba import config as numba_config
from numba.core import cgutils, types
from numba.extending import intrinsic


def _prefetch_row_python(arr, i):  # pragma: no cover - the NUMBA_DISABLE_JIT path
    return None


@intrinsic
def _prefetch_row_jit(typingctx, arr, i):
    """Prefetch (for writing, into all cache levels) the first cache line of row ``i``
    of a C-contiguous array."""
    if not isinstance(arr, types.Array) or not isinstance(i, types.Integer):
        return None
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        aryty, idxty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        stride = cgutils.unpack_tuple(builder, ary.strides)[0]
        idx = context.cast(builder, args[1], idxty, types.intp)
        byte_ptr = ir.IntType(8).as_pointer()
        ptr = builder.gep(builder.bitcast(ary.data, byte_ptr), [builder.mul(idx, stride)])
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


prefetch_row = _prefetch_row_python if numba_config.DISABLE_JIT else _prefetch_row_jit
