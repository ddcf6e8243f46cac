"""kernels.bits against Python's own int.bit_length."""

from __future__ import annotations

import numpy as np

from kvtrace.kernels.bits import bit_length


def test_bit_length_equals_python():
    xs = list(range(0, 4097)) + [2**k + d for k in range(1, 63) for d in (-1, 0, 1) if 2**k + d < 2**63]
    for x in xs:
        assert bit_length(np.int64(x)) == int(x).bit_length(), x
