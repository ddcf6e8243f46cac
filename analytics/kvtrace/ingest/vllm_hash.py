"""Prompt token ids -> block ids hashed exactly like vLLM v1's prefix cache.

What vLLM does (followed byte for byte)
---------------------------------------
Source read: ``vllm/v1/core/kv_cache_utils.py`` (vllm-project/vllm, stored commit
``001cabc1be16``), ``vllm/utils/hashing.py`` (commit ``ac621345a4eb``) and
``vllm/config/cache.py`` (commit ``002f10e0cfa1``); the v1 engine of vLLM 0.11 and
later, where a block hash is raw ``bytes``.

- A full block of ``block_size`` tokens (default ``CacheConfig.DEFAULT_BLOCK_SIZE =
  16``) is hashed by ``hash_block_tokens``::

      if not parent_block_hash:
          parent_block_hash = NONE_HASH
      curr_block_token_ids_tuple = tuple(curr_block_token_ids)
      return BlockHash(hash_function((parent_block_hash, curr_block_token_ids_tuple, extra_keys)))

  ``BlockHash = NewType("BlockHash", bytes)``: a NewType is the identity at run time,
  so the tuple holds the parent's raw 32-byte digest (pickle writes ``SHORT_BINBYTES``,
  CBOR a byte string), not a wrapper object. (vLLM 0.8-0.10 used a ``BlockHash``
  NamedTuple with an ``int`` hash value: ids from those versions differ.)
- ``request_block_hasher`` hashes full blocks only (``if end_token_idx > num_tokens:
  break``): the trailing partial block never gets a vLLM hash.
- ``init_none_hash``: ``hash_seed = os.getenv("PYTHONHASHSEED")``; unset ->
  ``NONE_HASH = os.urandom(32)`` (not reproducible: a trace cannot match it); set ->
  ``NONE_HASH = hash_fn(hash_seed)``, the hash of the environment variable's *text*.
  So ``seed=0`` here means ``PYTHONHASHSEED=0``: ``NONE_HASH = sha256(pickle.dumps("0",
  protocol=5))`` or ``sha256(cbor2.dumps("0", canonical=True))`` (the string ``"0"``,
  not the integer 0; ``"00"`` would be a different seed).
- ``generate_block_hash_extra_keys``: ``lora_extra_keys + mm_extra_keys +
  cache_salt_keys + prompt_embeds_keys``, where ``lora_extra_keys = [lora_name]`` on
  every block of a LoRA request and ``cache_salt_keys = [cache_salt] if
  (start_token_idx == 0 and request.cache_salt) else []`` (salt on the first block
  only; an empty salt counts as none); ``None`` when the list is empty, else
  ``tuple(extra_keys)``: ``(lora,)``, ``(salt,)`` or ``(lora, salt)``. Multimodal and
  prompt-embedding keys are not supported (token logs do not carry them).
- ``sha256(input) = hashlib.sha256(pickle.dumps(input,
  protocol=pickle.HIGHEST_PROTOCOL)).digest()``; ``sha256_cbor(input) =
  hashlib.sha256(cbor2.dumps(input, canonical=True)).digest()``. The default algorithm
  is ``CacheConfig.prefix_caching_hash_algo = "sha256"`` (pickle).
- 64-bit ids: vLLM publishes a block in its KV-cache events (``BlockStored`` /
  ``BlockRemoved`` built in ``vllm/v1/core/block_pool.py``) through
  ``maybe_convert_block_hash``: ``int.from_bytes(hash_bytes, byteorder="big") & ((1 <<
  64) - 1)`` when ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` is set (``vllm/envs.py``:
  default ``"1"``). kvtrace stores the same low 64 bits, so ids equal the ones in vLLM's
  KV events.

kvtrace's addition: the partial tail
------------------------------------
kvtrace's model gives a request's last block ``input_tokens - B*(n-1)`` tokens, so a
prompt whose length is not a multiple of B needs an id for its tail. It is the same
formula applied to the short block, ``hash_fn((parent or NONE_HASH, tuple(tail
tokens), extra_keys))`` with the extra keys of a block starting there (the salt when
the tail is the whole prompt). vLLM never computes it; it is deterministic and differs
from every full block's id (a tuple of fewer tokens). Two requests share a tail id only
when their whole prompts are equal.

How it is fast and still byte-exact
-----------------------------------
The serialised bytes of every block of a chunk are built at once with numpy (each token
id is one pickle opcode, ``BININT1`` / ``BININT2`` / ``BININT`` by magnitude, or one CBOR
unsigned integer of 1, 2, 3 or 5 bytes); the constant parts (the extra keys, pickle's
memo and ``STOP`` opcodes) come from pickling a template with the request's own extra
keys, so they are pickle's own bytes. Only the chain is sequential: a tight loop writes
the parent digest into the next block's slot and calls ``hashlib.sha256`` on a slice
of the buffer. A block whose pickle would exceed one 64 KiB pickle frame (more than
~12,000 tokens per block) is pickled by ``pickle.dumps`` itself.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass

import numpy as np

from kvtrace.errors import UsageError
from kvtrace.kernels.tokenhash import block_lengths, fill_blocks

HASH_FUNCTIONS = ("sha256", "sha256_cbor")
#: vLLM's ``CacheConfig.prefix_caching_hash_algo`` default.
DEFAULT_HASH = "sha256"
#: vLLM's ``CacheConfig.DEFAULT_BLOCK_SIZE``.
DEFAULT_BLOCK_TOKENS = 16
#: Largest token id accepted (pickle writes ids up to this bound as a 4-byte BININT).
MAX_TOKEN_ID = 2**31 - 1

_MASK64 = (1 << 64) - 1
_PICKLE_PROTOCOL = 5
#: pickle commits a frame once it reaches 64 KiB: keep the fast path below it.
_FRAME_LIMIT = 60_000
_PLACEHOLDER = bytes(32)


def _cbor2():
    try:
        import cbor2
    except ImportError:  # pragma: no cover - a declared dependency
        raise UsageError("--hash sha256_cbor needs the cbor2 package (pip install cbor2)", field="hash") from None
    return cbor2


def serialize(obj, hash_fn: str) -> bytes:
    """The bytes vLLM's ``hash_fn`` feeds to SHA-256 for ``obj``."""
    if hash_fn == "sha256":
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _cbor2().dumps(obj, canonical=True)


def none_hash(hash_fn: str = DEFAULT_HASH, seed: int | str = 0) -> bytes:
    """vLLM's ``NONE_HASH`` under ``PYTHONHASHSEED=seed``: ``hash_fn(str(seed))``."""
    check_hash_fn(hash_fn)
    return hashlib.sha256(serialize(str(seed), hash_fn)).digest()


def check_hash_fn(hash_fn: str) -> None:
    if hash_fn not in HASH_FUNCTIONS:
        raise UsageError(f"unknown hash function '{hash_fn}': expected one of {', '.join(HASH_FUNCTIONS)}",
                         field="hash")


def extra_keys(lora_name: str | None, cache_salt: str | None, first: bool) -> tuple | None:
    """vLLM's ``generate_block_hash_extra_keys`` for a text-only request."""
    keys = ([lora_name] if lora_name is not None else []) + ([cache_salt] if first and cache_salt else [])
    return tuple(keys) if keys else None


@dataclass(frozen=True)
class HashSpec:
    """How block ids are derived: vLLM's hash function, seed and block size.

    Attributes
    ----------
    hash_fn : str
        ``sha256`` (pickle, vLLM's default) or ``sha256_cbor``.
    seed : int or str
        The ``PYTHONHASHSEED`` vLLM ran with (its text is hashed into ``NONE_HASH``).
    block_tokens : int
        vLLM's ``block_size`` in tokens.
    """

    hash_fn: str = DEFAULT_HASH
    seed: int | str = 0
    block_tokens: int = DEFAULT_BLOCK_TOKENS

    def __post_init__(self) -> None:
        check_hash_fn(self.hash_fn)
        if isinstance(self.block_tokens, bool) or not isinstance(self.block_tokens, (int, np.integer)) \
                or self.block_tokens < 1:
            raise UsageError(f"expected a block size of at least 1 token, got {self.block_tokens!r}",
                             field="block-tokens")
        seed = str(self.seed)
        if seed.lower() == "random" or not seed.strip():
            raise UsageError("vLLM draws NONE_HASH from os.urandom without a fixed PYTHONHASHSEED: "
                             "give the seed the server ran with", field="hash-seed")


class _Layout:
    """Byte layout of one block's serialisation for a hash function: the constant
    header before the parent digest, where the digest goes, the token-tuple framing,
    and per-token encodings."""

    def __init__(self, hash_fn: str):
        self.hash_fn = hash_fn
        self.pickle = hash_fn == "sha256"
        self._tails: dict = {}
        if self.pickle:
            # \x80\x05 PROTO, \x95 FRAME + 8-byte length, C\x20 SHORT_BINBYTES(32)
            self.parent_at = 13
            self.after_parent = 46  # digest, then \x94 MEMOIZE
        else:
            # \x83 array(3), \x58\x20 bytes(32)
            self.parent_at = 3
            self.after_parent = 35

    def tail(self, keys: tuple | None) -> bytes:
        """Bytes after the token tuple: pickle's ``MEMOIZE``, the extra keys, ``TUPLE3
        MEMOIZE STOP``; CBOR's extra keys. Taken from serialising a template whose
        token tuple has the same memo footprint (one slot), so they are the
        serialiser's own bytes."""
        got = self._tails.get(keys)
        if got is None:
            if self.pickle:
                t = pickle.dumps((_PLACEHOLDER, (0,), keys), protocol=_PICKLE_PROTOCOL)
                got = t[self.after_parent + 3:]  # after K\x00 \x85 (one-token tuple): \x94 ...
            else:
                t = _cbor2().dumps((_PLACEHOLDER, (), keys), canonical=True)
                got = t[self.after_parent + 1:]  # after \x80 (empty array)
            self._tails[keys] = got
        return got


#: Tokens hashed per piece (the per-token work arrays cost ~60 bytes per token).
PIECE_TOKENS = 1 << 20


def hash_prompts(tokens: np.ndarray, starts: np.ndarray, spec: HashSpec,
                 lora: list | None = None, salt: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Block ids of many prompts, as vLLM v1 hashes them (see the module docstring).

    Parameters
    ----------
    tokens : int array [T]
        The prompts' token ids, concatenated; each in [0, ``MAX_TOKEN_ID``] (the caller
        validates, naming the row).
    starts : int64 [R+1]
        Offsets: prompt r is ``tokens[starts[r]:starts[r+1]]``.
    spec : HashSpec
    lora, salt : list of (str or None), optional
        LoRA name and cache salt of each prompt.

    Returns
    -------
    ids : uint64 [N]
        Block ids, request after request, in chain order: ``ceil(len / B)`` per prompt
        (full blocks, then the partial tail when there is one). The low 64 bits of each
        block's SHA-256 digest (big-endian), as vLLM's KV events publish them.
    block_starts : int64 [R+1]
        Offsets of each prompt's ids in ``ids``.
    """
    tokens = np.asarray(tokens)
    starts = np.asarray(starts, dtype=np.int64)
    R = starts.shape[0] - 1
    lora = lora if lora is not None else [None] * R
    salt = salt if salt is not None else [None] * R
    if R == 0 or int(starts[-1] - starts[0]) <= PIECE_TOKENS:
        return _hash_piece(tokens, starts, spec, lora, salt)
    ids, counts = [], [np.zeros(1, dtype=np.int64)]
    r = 0
    while r < R:  # pieces of whole requests of about PIECE_TOKENS tokens
        e = int(np.searchsorted(starts, starts[r] + PIECE_TOKENS, side="right")) - 1
        e = min(max(e, r + 1), R)
        got, bs = _hash_piece(tokens, starts[r:e + 1], spec, lora[r:e], salt[r:e])
        ids.append(got)
        counts.append(np.diff(bs))
        r = e
    return np.concatenate(ids), np.cumsum(np.concatenate(counts))


def _hash_piece(tokens, starts, spec, lora, salt):
    tokens = tokens[int(starts[0]):int(starts[-1])]
    starts = starts - starts[0]
    B = int(spec.block_tokens)
    R = starts.shape[0] - 1
    lens = np.diff(starts)
    nblocks = -(-lens // B)
    block_starts = np.zeros(R + 1, dtype=np.int64)
    np.cumsum(nblocks, out=block_starts[1:])
    n = int(block_starts[-1])
    if n == 0:
        return np.empty(0, dtype=np.uint64), block_starts
    layout = _Layout(spec.hash_fn)
    root = none_hash(spec.hash_fn, spec.seed)

    # Blocks: owner request, first token, token count.
    breq = np.repeat(np.arange(R, dtype=np.int64), nblocks)
    bpos = np.arange(n, dtype=np.int64) - block_starts[breq]
    bstart = starts[breq] + bpos * B
    bcount = np.minimum(B, starts[breq + 1] - bstart)

    # Tails: one per distinct (extra keys), the first block's and the others'.
    tail_ids: dict = {}
    tail_list: list[bytes] = []
    first_tail = np.empty(R, dtype=np.int64)
    rest_tail = np.empty(R, dtype=np.int64)
    for r in range(R):
        for first, out in ((True, first_tail), (False, rest_tail)):
            keys = extra_keys(lora[r], salt[r], first)
            key = (keys, first) if keys is None else keys
            k = tail_ids.get(key)
            if k is None:
                k = tail_ids[key] = len(tail_list)
                tail_list.append(layout.tail(keys))
            out[r] = k
    btail = np.where(bpos == 0, first_tail[breq], rest_tail[breq])

    ids = np.empty(n, dtype=np.uint64)
    tail_len = np.array([len(t) for t in tail_list], dtype=np.int64)
    tok64 = np.ascontiguousarray(tokens, dtype=np.int64)
    blen = block_lengths(tok64, bstart, bcount, tail_len[btail], layout.pickle)
    if layout.pickle and (int(blen.max()) > _FRAME_LIMIT or pickle.HIGHEST_PROTOCOL != _PICKLE_PROTOCOL):
        return _hash_with_pickle(tok64, bstart, bcount, bpos, breq, lora, salt, root, ids), block_starts
    boff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(blen, out=boff[1:])
    scratch = int(boff[-1])
    buf = np.empty(scratch + 32, dtype=np.uint8)  # + a scratch slot for the last digests
    toff = np.zeros(len(tail_list) + 1, dtype=np.int64)
    np.cumsum(tail_len, out=toff[1:])
    first = bpos == 0
    fill_blocks(buf, boff, tok64, bstart, bcount, first, np.frombuffer(b"".join(tail_list), dtype=np.uint8),
                toff, btail, np.frombuffer(root, dtype=np.uint8), layout.pickle)
    # each block's digest goes to its successor's parent slot, or to the scratch slot
    # after the last block of a request
    o = boff[:-1]
    nxt = np.full(n, scratch, dtype=np.int64)
    same = ~first[1:]
    nxt[:-1][same] = o[1:][same] + layout.parent_at
    ids[:] = _chain(buf, o.tolist(), boff[1:].tolist(), nxt.tolist())
    return ids, block_starts


def _chain(buf: np.ndarray, begin: list, end: list, nxt: list) -> np.ndarray:
    """The sequential part: hash each block's bytes, write the digest into the next
    block's parent slot. Returns the low 64 bits of each digest."""
    mv = memoryview(buf)
    sha = hashlib.sha256
    out = []
    push = out.append
    for a, b, s in zip(begin, end, nxt):
        d = sha(mv[a:b]).digest()
        mv[s:s + 32] = d
        push(d)
    return _low64(out)


def _low64(digests: list) -> np.ndarray:
    raw = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 32)
    return raw[:, 24:].copy().view(">u8").ravel().astype(np.uint64)


def _hash_with_pickle(tok64, bstart, bcount, bpos, breq, lora, salt, root, ids) -> np.ndarray:
    """Blocks too long for one pickle frame: ``pickle.dumps`` of the real tuple."""
    digests = []
    d = root
    for k in range(bstart.shape[0]):
        r = int(breq[k])
        first = bpos[k] == 0
        parent = root if first else d
        block = tuple(tok64[bstart[k]:bstart[k] + bcount[k]].tolist())
        obj = (parent, block, extra_keys(lora[r], salt[r], bool(first)))
        d = hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
        digests.append(d)
    ids[:] = _low64(digests)
    return ids
