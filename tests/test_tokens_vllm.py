"""vLLM v1 prefix-cache block hashing (kvtrace.ingest.vllm_hash) against its slow twin.

The twin is the specification, written straight from vLLM's source
(``hash_block_tokens``, ``init_none_hash``, ``generate_block_hash_extra_keys``,
``sha256`` / ``sha256_cbor``): ``pickle.dumps`` / ``cbor2.dumps`` of the real tuple,
one block at a time, plus kvtrace's partial-tail rule (the same formula on the short
last block).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import cbor2
import numpy as np
import numpy.testing as npt
import pytest

from kvtrace.errors import UsageError
from kvtrace.ingest.vllm_hash import HashSpec, hash_prompts, none_hash

ROOT = Path(__file__).resolve().parents[1]


def vllm_twin(prompts, hash_fn="sha256", seed=0, block=16, lora=None, salt=None):
    """Block ids of ``prompts`` (lists of ints), one block at a time (see module doc)."""
    if hash_fn == "sha256":
        def H(obj):
            return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    else:
        def H(obj):
            return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
    none = H(str(seed))  # init_none_hash: hash_fn(os.getenv("PYTHONHASHSEED"))
    ids, counts = [], []
    for r, prompt in enumerate(prompts):
        parent = None
        n = 0
        for start in range(0, len(prompt), block):
            keys = []
            if lora is not None and lora[r] is not None:
                keys.append(lora[r])
            if start == 0 and salt is not None and salt[r]:
                keys.append(salt[r])
            digest = H((parent if parent else none, tuple(prompt[start:start + block]),
                        tuple(keys) if keys else None))
            ids.append(int.from_bytes(digest, "big") & (2**64 - 1))
            parent = digest
            n += 1
        counts.append(n)
    return np.array(ids, dtype=np.uint64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def fast(prompts, hash_fn="sha256", seed=0, block=16, lora=None, salt=None):
    starts = np.concatenate([[0], np.cumsum([len(p) for p in prompts])]).astype(np.int64)
    tokens = np.array([t for p in prompts for t in p], dtype=np.int64)
    return hash_prompts(tokens, starts, HashSpec(hash_fn, seed, block), lora, salt)


def test_none_hash_by_hand():
    # pickle protocol 5 of the str "0": PROTO 5, FRAME(5), SHORT_BINUNICODE len 1 "0", MEMOIZE, STOP
    by_hand = b"\x80\x05\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8c\x01\x30\x94\x2e"
    assert none_hash("sha256", 0) == hashlib.sha256(by_hand).digest()
    # CBOR of the text string "0": major type 3, length 1, then "0"
    assert none_hash("sha256_cbor", 0) == hashlib.sha256(b"\x61\x30").digest()
    assert none_hash("sha256", 0) != none_hash("sha256", 1)


def test_one_block_by_hand():
    """One block of (1, 2, 3, 4) at block size 4, no extra keys, both serialisations
    written out opcode by opcode."""
    root = none_hash("sha256", 0)
    body = (b"\x43\x20" + root + b"\x94" + b"\x28\x4b\x01\x4b\x02\x4b\x03\x4b\x04\x74\x94"
            + b"\x4e\x87\x94\x2e")
    blob = b"\x80\x05\x95" + len(body).to_bytes(8, "little") + body
    expect = int.from_bytes(hashlib.sha256(blob).digest()[24:], "big")
    ids, _ = fast([[1, 2, 3, 4]], block=4)
    assert int(ids[0]) == expect
    croot = none_hash("sha256_cbor", 0)
    cblob = b"\x83\x58\x20" + croot + b"\x84\x01\x02\x03\x04\xf6"
    ids, _ = fast([[1, 2, 3, 4]], hash_fn="sha256_cbor", block=4)
    assert int(ids[0]) == int.from_bytes(hashlib.sha256(cblob).digest()[24:], "big")


EDGE = {
    "empty": [[]],
    "one block": [list(range(16))],
    "partial only": [[5, 6, 7]],
    "block + tail": [list(range(40))],
    "mixed": [[], [1] * 16, [2] * 17, [3], [70000, 2**31 - 1, 0, 255, 256, 65535, 65536, 23, 24] * 5],
}


@pytest.mark.parametrize("hash_fn", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("case", sorted(EDGE))
@pytest.mark.parametrize("keys", ["none", "salt", "lora", "both"])
def test_edge_cases_match_twin(hash_fn, case, keys):
    prompts = EDGE[case]
    n = len(prompts)
    lora = ["adapter-a"] * n if keys in ("lora", "both") else None
    salt = ["tenant-salt"] * n if keys in ("salt", "both") else None
    got, gs = fast(prompts, hash_fn, 0, 16, lora, salt)
    exp, es = vllm_twin(prompts, hash_fn, 0, 16, lora, salt)
    npt.assert_array_equal(gs, es)
    npt.assert_array_equal(got, exp)


@pytest.mark.parametrize("hash_fn", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("block", [1, 2, 3, 4, 5, 16, 23, 24, 25, 255, 256, 300])
def test_random_prompts_match_twin(hash_fn, block):
    rng = np.random.default_rng(block)
    prompts, lora, salt = [], [], []
    for _ in range(25):
        hi = int(rng.choice([24, 256, 65536, 2**31]))
        prompts.append(rng.integers(0, hi, int(rng.integers(0, 3 * block + 5))).tolist())
        lora.append([None, "l", "lora-x", "é" * 200][int(rng.integers(4))])
        salt.append([None, "", "s", "x" * 300][int(rng.integers(4))])
    seed = int(rng.integers(0, 2**32))
    got, _ = fast(prompts, hash_fn, seed, block, lora, salt)
    exp, _ = vllm_twin(prompts, hash_fn, seed, block, lora, salt)
    npt.assert_array_equal(got, exp)


def test_salt_only_on_first_block_and_prefix_sharing():
    p = list(range(48))
    a, _ = fast([p, p[:32] + [9] * 16], salt=[None, None])
    assert a[0] == a[3] and a[1] == a[4] and a[2] != a[5]  # shared prefix, different third block
    s, _ = fast([p, p], salt=["x", "y"])
    assert (s[:3] != s[3:]).all()  # a salt changes block 0, and so every chained block after it


def test_blocks_beyond_one_pickle_frame_use_pickle_itself():
    rng = np.random.default_rng(3)
    prompts = [rng.integers(65536, 2**31, 14000).tolist(), rng.integers(0, 100, 20000).tolist()]
    got, _ = fast(prompts, block=14000, lora=["a", None])
    exp, _ = vllm_twin(prompts, block=14000, lora=["a", None])
    npt.assert_array_equal(got, exp)


def test_many_pieces_match_one(monkeypatch):
    import kvtrace.ingest.vllm_hash as vh

    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 50000, int(rng.integers(1, 200))).tolist() for _ in range(60)]
    whole, ws = fast(prompts)
    monkeypatch.setattr(vh, "PIECE_TOKENS", 100)
    parts, ps = fast(prompts)
    npt.assert_array_equal(parts, whole)
    npt.assert_array_equal(ps, ws)


def test_bad_options():
    with pytest.raises(UsageError, match="unknown hash function"):
        HashSpec("md5")
    with pytest.raises(UsageError, match="PYTHONHASHSEED"):
        HashSpec(seed="random")
    with pytest.raises(UsageError, match="block size"):
        HashSpec(block_tokens=0)


def test_kernels_without_jit():
    code = ("import numpy as np\n"
            "from kvtrace.ingest.vllm_hash import HashSpec, hash_prompts\n"
            "t = np.array([1, 300, 70000, 5] * 9, dtype=np.int64)\n"
            "for fn in ('sha256', 'sha256_cbor'):\n"
            "    print(hash_prompts(t, np.array([0, 20, 36]), HashSpec(fn), ['a', None], [None, 's'])[0].tolist())\n")
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout.split("\n")
    prompts = [[1, 300, 70000, 5] * 5, [1, 300, 70000, 5] * 4]
    for line, fn in zip(out, ("sha256", "sha256_cbor")):
        exp, _ = vllm_twin(prompts, fn, lora=["a", None], salt=[None, "s"])
        assert line == str(exp.tolist())


@pytest.mark.slow
def test_hashing_speed_10m_tokens():
    """Reported, not a pass/fail bar below 1M tokens/s (a shared machine)."""
    rng = np.random.default_rng(0)
    T = 10_000_000
    tokens = rng.integers(0, 150_000, T)
    starts = np.arange(0, T + 1, 2000)
    hash_prompts(tokens[:4000], starts[:3], HashSpec())  # compile / load the kernels
    for fn in ("sha256", "sha256_cbor"):
        t0 = time.perf_counter()
        hash_prompts(tokens, starts, HashSpec(fn))
        rate = T / (time.perf_counter() - t0)
        print(f"{fn}: {rate / 1e6:.1f} M tokens/s")
        assert rate > 1e6
