"""Request-log ingestion throughput: vLLM block hashing of token-id logs, tokenization of chat logs.

Product requirement: token-id request logs are hashed into vLLM v1 prefix-cache block
ids at >= 5M prompt tokens/s on one core; the tokenization of OpenAI chat logs is
reported separately.

What is measured (every figure is best / median of ``--runs``; within a round every
command runs once, in turn, so drift on a noisy machine hits them alike):

1. Token-id log (``--format tokens``): a seeded synthetic log of ``--requests`` prompts
   of about ``--prompt-tokens`` tokens that share prefixes as chat traffic does (a few
   system prompts, Zipf-popular; multi-turn sessions whose turn k's prompt extends turn
   k-1's), written as JSONL and as Parquet.

   - End to end: ``kvtrace ingest LOG --format tokens --hash H -o OUT`` as a child
     process (interpreter start, reading, hashing, the canonical table, the Parquet
     write), both file formats, both hash functions; prompt tokens per second of wall
     time. The output is checked: same token count, and the same block ids as below.
   - Hashing alone: ``kvtrace.ingest.vllm_hash.hash_prompts`` over the whole log, the
     tokens already in memory, with this thread pinned to one CPU
     (``os.sched_setaffinity``). The kernels it calls are serial ``@njit`` functions and
     the chain is a Python loop, so it never uses a second thread; the process's CPU
     time / wall time is printed to show it (1.0 = one core busy).
   - Where that time goes: one run under ``cProfile`` (Python functions only, so
     ``hashlib`` calls are not instrumented): the sequential SHA-256 chain against the
     serialisation (Numba) and index arithmetic (numpy).
   - Where the end-to-end time goes: one in-process run of what the command calls
     (``load_requests``, ``write_canonical``, ``distinct_blocks``) under cProfile, per
     file format: hashing, reading and parsing, token-list checks, and the rest.
   - A pure-Python reference on the first ``--check-requests`` prompts, vLLM's formula
     one block at a time (``hashlib.sha256(pickle.dumps((parent, tuple(tokens), None),
     protocol=5))``, or ``cbor2.dumps(..., canonical=True)``; parent = ``NONE_HASH`` of
     ``PYTHONHASHSEED=0`` for a first block; low 64 bits, big-endian): ids asserted
     equal, and the speed ratio.

2. OpenAI chat log (``--format openai``): a byte-level BPE tokenizer (8,192 tokens)
   trained here with the ``tokenizers`` trainer on generated text (nothing is
   downloaded), a chat template in its ``tokenizer_config.json``, and a seeded log of
   ``--chat-requests`` wrapped chat-completions bodies from multi-turn sessions.

   - End to end: ``kvtrace ingest CHAT.jsonl --format openai --tokenizer tokenizer -o
     OUT``; requests and prompt tokens per second.
   - Apart, in this process: rendering the template (``ChatTokenizer.render``),
     tokenization (``ChatTokenizer.encode``, which is ``encode_batch``: both cores as
     the command runs it, and one core with ``TOKENIZERS_PARALLELISM=false``), and
     hashing the tokens it produced (one core). JSON parsing is not in these three.

Run from the repository root::

    python benchmarks/hashing.py [--requests 20000] [--prompt-tokens 2000] [--chat-requests 2000]
                                 [--runs 3] [--check-requests 1000] [--keep DIR]

Inputs and outputs go to a temporary directory, or to ``--keep DIR``, which is kept and
whose inputs a later run with the same sizes and seed reuses. A quick check of the
script: ``--requests 2000 --chat-requests 500 --runs 1``.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pickle
import pstats
import shlex
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from common import kvtrace_argv, print_table, record, run_measured

HASH_TARGET = 5e6  # prompt tokens per second, hashing alone, one core
HASHES = ("sha256", "sha256_cbor")
BLOCK_TOKENS = 16  # vLLM's default block size, kvtrace's default for request logs
VOCAB = 128_256  # Llama 3's vocabulary
N_SYSTEM = 32  # distinct system prompts
ARRIVALS_PER_S = 20.0  # sessions start uniformly over requests / ARRIVALS_PER_S seconds
TURN_GAP_S = 60.0  # mean seconds between the turns of a session (exponential)
EPOCH_S = 1.7e9  # timestamps are Unix seconds
CHAT_MODEL = "bench-bpe-8k"
# What `kvtrace ingest` loads before it reads a byte: its share of the end-to-end time.
IMPORTS = [sys.executable, "-c", "import kvtrace.cli, kvtrace.ingest"]


# --------------------------------------------------------------------------- workload
@dataclass
class Sessions:
    """Arrival plan shared by both logs: request i (in arrival order) is turn ``turn[i]``
    (0-based) of session ``session[i]``, arriving at ``timestamp[i]`` (Unix seconds)."""

    session: np.ndarray  # int64 [R]
    turn: np.ndarray  # int64 [R]
    timestamp: np.ndarray  # float64 [R], ascending
    turns: np.ndarray  # int64 [S], turns of each session

    @property
    def n_sessions(self) -> int:
        return int(self.turns.shape[0])


def plan_sessions(rng: np.random.Generator, requests: int) -> Sessions:
    """Sessions of 1-8 turns (uniform) until there are ``requests`` turns; sessions start
    uniformly over the log's span, turns follow at exponential gaps."""
    turns = rng.integers(1, 9, size=requests)
    ends = np.cumsum(turns)
    n = int(np.searchsorted(ends, requests)) + 1
    turns = turns[:n].copy()
    turns[-1] -= int(ends[n - 1]) - requests  # the last session is cut to fit
    first = np.cumsum(turns) - turns  # index of each session's first turn
    session = np.repeat(np.arange(n, dtype=np.int64), turns)
    turn = np.arange(requests, dtype=np.int64) - first[session]
    gaps = np.where(turn == 0, 0.0, rng.exponential(TURN_GAP_S, size=requests))
    since = np.cumsum(gaps)
    since -= since[first][session]
    t = EPOCH_S + rng.random(n)[session] * (requests / ARRIVALS_PER_S) + since
    order = np.argsort(t, kind="stable")
    return Sessions(session[order], turn[order], t[order], turns)


def zipf_choice(rng: np.random.Generator, k: int, size: int) -> np.ndarray:
    """``size`` draws from ``range(k)`` with probability proportional to 1 / (rank + 1)."""
    w = 1.0 / np.arange(1, k + 1)
    return rng.choice(k, size=size, p=w / w.sum())


def token_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` token ids, log-uniform over a Llama-3-sized vocabulary: about half below 256
    and 6 % above 65,535 (frequent BPE tokens have small ids), so pickle's 2-, 3- and
    5-byte integer opcodes all occur."""
    return (np.exp(rng.random(n) * np.log(VOCAB)) - 1).astype(np.int64)


@dataclass
class TokenLog:
    """A generated token-id log, in arrival order: prompt r is
    ``tokens[starts[r]:starts[r + 1]]``."""

    tokens: np.ndarray  # int64 [T]
    starts: np.ndarray  # int64 [R + 1]
    timestamp: np.ndarray  # float64 [R], Unix seconds
    session: np.ndarray  # int64 [R]
    output_tokens: np.ndarray  # int64 [R]

    @property
    def n_requests(self) -> int:
        return int(self.starts.shape[0] - 1)

    @property
    def n_tokens(self) -> int:
        return int(self.starts[-1])


def make_token_log(requests: int, prompt_tokens: int, seed: int) -> TokenLog:
    """A seeded token log of ``requests`` prompts of about ``prompt_tokens`` tokens.

    A session's conversation is a system prompt (one of ``N_SYSTEM``, 0.15-0.45 x
    ``prompt_tokens``) then, per turn, a user message (0.05-0.2 x) and a reply (0.05-0.25
    x); turn k's prompt is the system prompt and the conversation up to and including
    the k-th user message, so it extends turn k-1's prompt (the prefix vLLM reuses)."""
    rng = np.random.default_rng(seed)
    plan = plan_sessions(rng, requests)
    p = int(prompt_tokens)
    systems = [token_ids(rng, int(n)) for n in rng.integers(int(0.15 * p), int(0.45 * p) + 1, size=N_SYSTEM)]
    system_of = zipf_choice(rng, N_SYSTEM, plan.n_sessions)
    user = rng.integers(max(1, int(0.05 * p)), int(0.2 * p) + 1, size=int(plan.turns.sum()))
    reply = rng.integers(max(1, int(0.05 * p)), int(0.25 * p) + 1, size=int(plan.turns.sum()))
    talk = np.empty(2 * user.shape[0], dtype=np.int64)  # user, reply, user, reply, ... of all sessions
    talk[0::2], talk[1::2] = user, reply
    ends = np.cumsum(talk)
    doc = token_ids(rng, int(ends[-1]))  # every session's conversation, one after another
    turn0 = np.cumsum(plan.turns) - plan.turns
    s, k = plan.session, plan.turn
    doc_start = np.where(turn0[s] > 0, ends[2 * turn0[s] - 1], 0)
    doc_end = ends[2 * (turn0[s] + k)]  # the end of the k-th user message
    sys_len = np.array([x.shape[0] for x in systems], dtype=np.int64)[system_of[s]]
    lens = sys_len + doc_end - doc_start
    starts = np.zeros(requests + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    tokens = np.empty(int(starts[-1]), dtype=np.int64)
    for r in range(requests):
        a, m = int(starts[r]), int(sys_len[r])
        tokens[a:a + m] = systems[system_of[s[r]]]
        tokens[a + m:int(starts[r + 1])] = doc[int(doc_start[r]):int(doc_end[r])]
    out = rng.integers(16, 1025, size=requests)
    return TokenLog(tokens, starts, plan.timestamp, s, out)


def write_token_log(log: TokenLog, jsonl: Path, parquet: Path) -> None:
    """The log as JSONL and as Parquet (vLLM-style field names; written atomically)."""
    import polars as pl
    import pyarrow as pa

    ids = pa.LargeListArray.from_arrays(pa.array(log.starts), pa.array(log.tokens.astype(np.int32)))
    df = pl.DataFrame({
        "request_id": np.arange(log.n_requests, dtype=np.int64),
        "timestamp": log.timestamp,
        "session_id": log.session,
        "output_tokens": log.output_tokens,
        "prompt_token_ids": pl.from_arrow(ids),
    })
    for path, write in ((jsonl, df.write_ndjson), (parquet, df.write_parquet)):
        tmp = path.with_name(path.name + ".tmp")
        write(tmp)
        tmp.replace(path)


# Pseudo-English for the chat log: syllables make words the BPE trainer can merge.
SYLLABLES = ("ka ri to na me su lo vi de ta mo ne ra si ku pe la tu ni sa po re mi "
             "an el is on ur at en ol ir as").split()

TEMPLATE = """{{- bos_token }}
{% for m in messages %}
<|{{ m['role'] }}|>
{{ m['content'] }}</s>
{% endfor %}
{% if add_generation_prompt %}
<|assistant|>
{% endif %}
"""
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


def make_words(rng: np.random.Generator, n: int = 6_000) -> np.ndarray:
    """``n`` distinct pseudo-words of 1-4 syllables."""
    words: set[str] = set()
    while len(words) < n:
        k = int(rng.integers(1, 5))
        words.add("".join(SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), size=k)))
    return np.array(sorted(words), dtype=object)


class Text:
    """Seeded Zipf-distributed text over a word list."""

    def __init__(self, rng: np.random.Generator, words: np.ndarray):
        self.rng, self.words = rng, words
        w = 1.0 / np.arange(1, words.shape[0] + 1) ** 1.05
        self.p = w / w.sum()

    def __call__(self, n_words: int) -> str:
        idx = self.rng.choice(self.words.shape[0], size=int(n_words), p=self.p)
        parts = self.words[idx].tolist()
        for i in range(0, len(parts), 12):  # sentences: capitalised, full stop
            parts[i] = parts[i].capitalize()
            j = min(i + 11, len(parts) - 1)
            parts[j] = parts[j] + "."
        return " ".join(parts)


def train_tokenizer(directory: Path, seed: int) -> None:
    """A byte-level BPE tokenizer (8,192 tokens, BOS added by its post-processor as
    Llama's is) with the chat template, written to ``directory`` as ``tokenizer.json`` +
    ``tokenizer_config.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rng = np.random.default_rng(seed + 1)
    text = Text(rng, make_words(rng))
    corpus = [text(int(n)) for n in rng.integers(8, 40, size=20_000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=8_192, special_tokens=SPECIAL, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def write_chat_log(path: Path, requests: int, prompt_tokens: int, seed: int) -> None:
    """A seeded OpenAI chat log: one wrapped chat-completions body per line, turn k of a
    session carrying the system prompt (one of ``N_SYSTEM``) and the whole conversation
    so far (message sizes in words are those of :func:`make_token_log` in tokens / 1.3)."""
    rng = np.random.default_rng(seed + 2)
    text = Text(rng, make_words(np.random.default_rng(seed + 1)))  # the tokenizer's words
    plan = plan_sessions(rng, requests)
    w = prompt_tokens / 1.3
    systems = [text(n) for n in rng.integers(int(0.15 * w), int(0.45 * w) + 1, size=N_SYSTEM)]
    system_of = zipf_choice(rng, N_SYSTEM, plan.n_sessions)
    talk: dict[int, list[dict]] = {}  # session -> messages so far
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for i in range(requests):
            s, k = int(plan.session[i]), int(plan.turn[i])
            msgs = talk.setdefault(s, [{"role": "system", "content": systems[system_of[s]]}])
            if k > 0:
                msgs.append({"role": "assistant", "content": text(rng.integers(int(0.05 * w), int(0.25 * w) + 1))})
            msgs.append({"role": "user", "content": text(rng.integers(int(0.05 * w), int(0.2 * w) + 1))})
            body = {"model": CHAT_MODEL, "messages": msgs, "max_tokens": 512}
            fh.write(json.dumps({"timestamp": float(plan.timestamp[i]), "request_id": f"chat-{i}",
                                 "session_id": s, "body": body}) + "\n")
            if k + 1 == int(plan.turns[s]):
                del talk[s]  # the session is over
    tmp.replace(path)


# --------------------------------------------------------------------------- reference
def reference_ids(prompts: list[list[int]], hash_fn: str, seed: int = 0, block: int = BLOCK_TOKENS) -> np.ndarray:
    """vLLM's ``hash_block_tokens`` one block at a time (the partial tail too, as kvtrace
    hashes it): uint64 low 64 bits (big-endian) of each digest, prompt after prompt."""
    if hash_fn == "sha256":
        def dumps(obj) -> bytes:
            return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    else:
        import cbor2

        def dumps(obj) -> bytes:
            return cbor2.dumps(obj, canonical=True)
    none_hash = hashlib.sha256(dumps(str(seed))).digest()  # NONE_HASH under PYTHONHASHSEED=seed
    out = []
    for prompt in prompts:
        parent = none_hash
        for a in range(0, len(prompt), block):
            parent = hashlib.sha256(dumps((parent, tuple(prompt[a:a + block]), None))).digest()
            out.append(int.from_bytes(parent, "big") & 0xFFFF_FFFF_FFFF_FFFF)
    return np.array(out, dtype=np.uint64)


# --------------------------------------------------------------------------- measuring
@contextmanager
def one_core(serial_tokenizers: bool = False):
    """Pin the calling thread (which runs the kernels and the hashing loop) to one CPU;
    optionally run ``tokenizers`` serially on it. Yields the CPU, or None where
    affinity cannot be set."""
    before = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else None
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    if before is not None:
        os.sched_setaffinity(0, {min(before)})
    if serial_tokenizers:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # read by tokenizers at each call
    try:
        yield None if before is None else min(before)
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)
        if serial_tokenizers:
            if old is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = old


@dataclass
class Timed:
    """Wall seconds of each run, process CPU seconds / wall seconds of each (in-process
    jobs), the largest peak RSS (child processes), and what the last run returned."""

    seconds: list[float] = field(default_factory=list)
    cpu_ratio: list[float] = field(default_factory=list)
    peak_rss_bytes: int = 0
    result: object = None

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def in_process(fn: Callable[[], object], pinned: bool = False, serial_tokenizers: bool = False) -> Callable:
    """A job timing one call of ``fn`` (wall and process CPU time), optionally on one
    core (``pinned``), optionally with ``tokenizers`` serial."""

    def job(t: Timed) -> None:
        with one_core(serial_tokenizers) if pinned else nullcontext():
            c0, t0 = time.process_time(), time.perf_counter()
            t.result = fn()
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0
        t.seconds.append(wall)
        t.cpu_ratio.append(cpu / wall)

    return job


def child(args: list[str], cwd: Path) -> Callable:
    """A job running ``kvtrace ARGS`` in ``cwd`` as a measured child process."""

    def job(t: Timed) -> None:
        run = run_measured(kvtrace_argv() + args, cwd=cwd)
        if run.returncode != 0:
            raise RuntimeError(f"kvtrace {shlex.join(args)} exited {run.returncode}:\n{run.stderr[-4000:]}")
        t.seconds.append(run.seconds)
        t.peak_rss_bytes = max(t.peak_rss_bytes, run.peak_rss_bytes)

    return job


def alternate(jobs: dict[str, Callable], runs: int) -> dict[str, Timed]:
    """Run every job once per round, in turn, for ``runs`` rounds."""
    times = {name: Timed() for name in jobs}
    for _ in range(max(1, runs)):
        for name, job in jobs.items():
            job(times[name])
    return times


def profile_split(fn: Callable[[], object]) -> dict[str, float]:
    """Shares of one ``fn()`` call (``hash_prompts``) by where the time goes, from a
    cProfile of Python functions only (builtins off, so each ``hashlib`` call is not
    instrumented and the loop around it keeps its speed). Keys: ``chain`` (the
    sequential SHA-256 loop), ``digests`` (digests -> uint64 ids), ``serialise`` (the
    rest: Numba kernels filling the byte buffer, numpy index arithmetic)."""
    prof = cProfile.Profile(builtins=False)
    with one_core():
        t0 = time.perf_counter()
        prof.runcall(fn)
        total = time.perf_counter() - t0
    by_name: dict[str, float] = {}
    for (filename, _, name), (_, _, _, cum, _) in pstats.Stats(prof).stats.items():
        if filename.endswith("vllm_hash.py"):
            by_name[name] = by_name.get(name, 0.0) + cum
    chain, low = by_name.get("_chain", 0.0), by_name.get("_low64", 0.0)
    low_in_chain = low if chain else 0.0  # _chain calls _low64: its time is inside _chain's
    return {"total_s": total, "chain": (chain - low_in_chain) / total, "digests": low / total,
            "serialise": 1.0 - (chain - low_in_chain + low) / total}


#: What ``kvtrace ingest`` spends its time on, by the functions that do it (cumulative
#: time of each; generators count over all their resumptions).
INGEST_PARTS = (("hashing", ("hash_prompts",)), ("parsing", ("_jsonl_chunks", "_parquet_chunks")),
                ("token checks", ("_token_lists",)), ("prepare", ("prepare_requests",)),
                ("write", ("write_canonical",)), ("distinct", ("distinct_blocks",)))


def profile_ingest(path: Path, hash_fn: str, out: Path) -> dict[str, float]:
    """Shares of one in-process run of what ``kvtrace ingest LOG --format tokens`` calls
    (``load_requests``, ``write_canonical``, ``distinct_blocks``; no interpreter start, no
    printing) by :data:`INGEST_PARTS`, from a cProfile of Python functions; ``other`` is
    the rest, ``total_s`` the profiled wall time."""
    from kvtrace.ingest import LogOptions, distinct_blocks, load_requests, write_canonical

    def ingest() -> None:
        df, meta, _ = load_requests(path, fmt="tokens", workload="ingest", log=LogOptions(hash_fn=hash_fn))
        write_canonical(df, meta, out)
        distinct_blocks(df, meta)

    prof = cProfile.Profile(builtins=False)
    t0 = time.perf_counter()
    prof.runcall(ingest)
    total = time.perf_counter() - t0
    cum: dict[str, float] = {}
    for (_, _, name), (_, _, _, ct, _) in pstats.Stats(prof).stats.items():
        cum[name] = max(cum.get(name, 0.0), ct)  # one function of each name matters here
    shares = {part: sum(cum.get(n, 0.0) for n in names) / total for part, names in INGEST_PARTS}
    shares["other"] = 1.0 - sum(shares.values())
    shares["total_s"] = total
    return shares


# --------------------------------------------------------------------------- reporting
@dataclass
class Table:
    """Rows of (what, figure, unit, command), printed as one Markdown table."""

    title: str
    reproduce: str
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool]] = field(default_factory=list)

    def add(self, what: str, figure: str, unit: str, command: str | None = None) -> None:
        self.rows.append((what, figure, unit, f"`{command or self.reproduce}`"))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def rate(self, what: str, work: float, t: Timed, unit: str, command: str | None = None,
             scale: float = 1e6) -> None:
        """A throughput row: ``work`` per second, best / median of the runs."""
        prefix = "M " if scale == 1e6 else ""
        best, median = work / t.best / scale, work / t.median / scale
        digits = 2 if scale == 1e6 else (0 if best >= 100 else 1)
        self.add(what, f"{best:,.{digits}f} / {median:,.{digits}f}", f"{prefix}{unit}, best / median of "
                 f"{len(t.seconds)}", command)

    def print(self) -> bool:
        print_table(self.title, ("what", "figure", "unit", "command"), ("---", "--:", "---", "---"), self.rows,
                    self.notes)
        record(self.reproduce, [(what, f"{figure} {unit}", "-") for what, figure, unit, _ in self.rows])
        for text, ok in self.checks:
            print(f"{'PASS' if ok else 'FAIL'}: {text}")
        print(f"\nreproduce: {self.reproduce}")
        return all(ok for _, ok in self.checks)


def fmt_size(n: float) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def show_runs(name: str, t: Timed) -> None:
    ratio = f"; CPU/wall {', '.join(f'{r:.2f}' for r in t.cpu_ratio)}" if t.cpu_ratio else ""
    print(f"  {name}: {', '.join(f'{s:.3f}' for s in t.seconds)} s{ratio}", flush=True)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000, help="token log: requests (default 20,000)")
    ap.add_argument("--prompt-tokens", type=int, default=2_000, help="token log: mean prompt tokens, about "
                                                                     "(default 2,000)")
    ap.add_argument("--chat-requests", type=int, default=2_000, help="chat log: requests (default 2,000; 0 skips)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs of every measurement (default 3)")
    ap.add_argument("--check-requests", type=int, default=1_000,
                    help="prompts hashed by the pure-Python reference (default 1,000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", metavar="DIR", type=Path, help="write inputs and outputs here and keep them "
                                                             "(inputs already there are reused)")
    args = ap.parse_args(argv)
    here = ["python", "benchmarks/hashing.py", "--requests", str(args.requests), "--prompt-tokens",
            str(args.prompt_tokens), "--chat-requests", str(args.chat_requests), "--runs", str(args.runs)]
    if args.seed:
        here += ["--seed", str(args.seed)]
    reproduce = shlex.join(here)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        return run(args, args.keep.resolve(), reproduce)
    with tempfile.TemporaryDirectory(prefix="kvtrace-hashing-") as tmp:
        return run(args, Path(tmp), reproduce)


@dataclass
class Inputs:
    """The generated files (in ``dir``) and the token log they hold."""

    dir: Path
    log: TokenLog
    small: TokenLog  # the first --check-requests prompts: warm-up runs and the reference
    jsonl: Path
    parquet: Path
    gen_s: float  # seconds to generate (and write) the token log
    written: bool  # False: the files were already in ``dir``
    chat: Path | None = None
    tok_dir: Path | None = None
    chat_gen_s: float = 0.0
    chat_written: bool = False


def prepare_inputs(args, d: Path) -> Inputs:
    """Generate the logs (and train the tokenizer) into ``d``; files already there with
    the same sizes and seed are kept. The token log is always generated in memory: the
    in-process timings need its tokens."""
    t0 = time.perf_counter()
    log = make_token_log(args.requests, args.prompt_tokens, args.seed)
    stem = f"tokens-{args.requests}x{args.prompt_tokens}-seed{args.seed}"
    jsonl, parquet = d / f"{stem}.jsonl", d / f"{stem}.parquet"
    written = not (jsonl.is_file() and parquet.is_file())
    if written:
        write_token_log(log, jsonl, parquet)
    gen_s = time.perf_counter() - t0
    k = max(1, min(args.check_requests, log.n_requests))
    end = int(log.starts[k])
    small = TokenLog(log.tokens[:end], log.starts[:k + 1], log.timestamp[:k], log.session[:k], log.output_tokens[:k])
    write_token_log(small, d / "warm-up.jsonl", d / "warm-up.parquet")
    inp = Inputs(d, log, small, jsonl, parquet, gen_s, written)
    if args.chat_requests > 0:
        t0 = time.perf_counter()
        inp.tok_dir = d / "tokenizer"
        inp.chat = d / f"chat-{args.chat_requests}x{args.prompt_tokens}-seed{args.seed}.jsonl"
        inp.chat_written = not ((inp.tok_dir / "tokenizer_config.json").is_file() and inp.chat.is_file())
        if inp.chat_written:
            train_tokenizer(inp.tok_dir, args.seed)
            write_chat_log(inp.chat, args.chat_requests, args.prompt_tokens, args.seed)
        with open(inp.chat, encoding="utf-8") as fh, open(d / "warm-up-chat.jsonl", "w", encoding="utf-8") as out:
            out.writelines(line for _, line in zip(range(100), fh))
        inp.chat_gen_s = time.perf_counter() - t0
    return inp


def ingest_args(src: Path, out: str, *extra: str) -> list[str]:
    """``kvtrace ingest`` arguments, files named relative to the work directory."""
    return ["ingest", src.name, *extra, "-o", out]


def end_to_end(inp: Inputs, runs: int) -> tuple[dict[str, list[str]], dict[str, Timed]]:
    """The commands (name -> arguments) and their timings, ``runs`` alternated rounds.

    Each command is run once untimed on a small log first: the on-disk JIT cache, the
    shared libraries and the files are then as a user's second command finds them."""
    commands: dict[str, list[str]] = {}
    warm: list[list[str]] = []
    for h in HASHES:
        for src in (inp.jsonl, inp.parquet):
            fmt = src.suffix[1:]
            commands[f"{fmt} {h}"] = ingest_args(src, f"out-{fmt}-{h}.parquet", "--format", "tokens", "--hash", h)
        warm.append(ingest_args(inp.dir / "warm-up.jsonl", "out-warm-up.parquet", "--format", "tokens", "--hash", h))
    if inp.chat is not None:
        chat = ("--format", "openai", "--tokenizer", inp.tok_dir.name)
        commands["chat"] = ingest_args(inp.chat, "out-chat.parquet", *chat)
        warm.append(ingest_args(inp.dir / "warm-up-chat.jsonl", "out-warm-up.parquet", *chat))
    print("warm-up runs ...", flush=True)
    for a in warm:
        child(a, inp.dir)(Timed())
    print(f"end to end, {runs} alternated rounds ...", flush=True)
    jobs = {name: child(a, inp.dir) for name, a in commands.items()}
    jobs["imports"] = lambda t: t.seconds.append(run_measured(IMPORTS).seconds)
    timed = alternate(jobs, runs)
    for name, t in timed.items():
        show_runs(name, t)
    return commands, timed


@dataclass
class HashingAlone:
    """``hash_prompts`` in process, one core: over the whole log (``timed``, the ids in
    each ``result``), its profile (``split``), and against the reference on the first
    prompts (``reference`` and ``subset`` timings, ``equal`` ids)."""

    timed: dict[str, Timed]
    split: dict[str, dict]
    reference: dict[str, Timed]
    subset: dict[str, Timed]
    equal: dict[str, bool]


def hashing_alone(inp: Inputs, runs: int) -> HashingAlone:
    from kvtrace.ingest.vllm_hash import HashSpec, hash_prompts

    log, small = inp.log, inp.small
    hash_prompts(small.tokens, small.starts, HashSpec("sha256"))  # the JIT (or its on-disk cache)

    def hash_all(h: str) -> Callable[[], np.ndarray]:
        return lambda: hash_prompts(log.tokens, log.starts, HashSpec(h, 0, BLOCK_TOKENS))[0]

    print(f"hashing alone, one core, {runs} alternated rounds ...", flush=True)
    timed = alternate({h: in_process(hash_all(h), pinned=True) for h in HASHES}, runs)
    for h, t in timed.items():
        show_runs(f"hash_prompts {h}", t)
    split = {h: profile_split(hash_all(h)) for h in HASHES}
    # the reference's prompts are Python lists beforehand, as vLLM holds them
    prompts = [small.tokens[int(a):int(b)].tolist() for a, b in zip(small.starts[:-1], small.starts[1:])]
    reference, subset, equal = {}, {}, {}
    for h in HASHES:
        got = alternate({"reference": in_process(lambda h=h: reference_ids(prompts, h), pinned=True),
                         "hash_prompts": in_process(lambda h=h: hash_prompts(small.tokens, small.starts,
                                                                             HashSpec(h))[0], pinned=True)}, runs)
        for name, t in got.items():
            show_runs(f"{name} {h}, first {small.n_requests:,} prompts", t)
        reference[h], subset[h] = got["reference"], got["hash_prompts"]
        fast = subset[h].result
        equal[h] = bool(np.array_equal(reference[h].result, fast)
                        and np.array_equal(fast, timed[h].result[:fast.shape[0]]))
    return HashingAlone(timed, split, reference, subset, equal)


@dataclass
class ChatApart:
    """Rendering, tokenization (2 cores, 1 core) and hashing of the chat log, apart."""

    requests: int
    lens: np.ndarray  # prompt tokens of each request
    timed: dict[str, Timed]
    same_tokens: bool  # the 1-core and 2-core tokenizations agree

    @property
    def n_tokens(self) -> int:
        return int(self.lens.sum())


def chat_apart(inp: Inputs, runs: int) -> ChatApart:
    from kvtrace.ingest.chat_template import load_chat_tokenizer
    from kvtrace.ingest.vllm_hash import HashSpec, hash_prompts

    tok = load_chat_tokenizer(inp.tok_dir)
    with open(inp.chat, encoding="utf-8") as fh:
        bodies = [json.loads(line)["body"] for line in fh]

    def render() -> list[str]:
        return [tok.render(b["messages"]) for b in bodies]

    texts = render()
    tok.encode(texts[:100], False)  # tokenizers' thread pool starts here, with both cores
    encoded = tok.encode(texts, False)
    lens = np.array([len(x) for x in encoded], dtype=np.int64)
    starts = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    tokens = np.fromiter((t for x in encoded for t in x), dtype=np.int64, count=int(starts[-1]))
    print(f"chat log apart, {runs} alternated rounds ...", flush=True)
    timed = alternate({
        "render": in_process(render),
        "encode, 2 cores": in_process(lambda: tok.encode(texts, False)),
        "encode, 1 core": in_process(lambda: tok.encode(texts, False), pinned=True, serial_tokenizers=True),
        "hash": in_process(lambda: hash_prompts(tokens, starts, HashSpec("sha256"))[0], pinned=True),
    }, runs)
    for name, t in timed.items():
        show_runs(f"chat {name}", t)
    same = timed["encode, 1 core"].result == encoded == timed["encode, 2 cores"].result
    return ChatApart(len(bodies), lens, timed, same)


def output_matches(path: Path, n_tokens: int, ids: np.ndarray | None, requests: int | None = None) -> bool:
    """The command's canonical Parquet holds ``n_tokens`` prompt tokens (and ``requests``
    requests, and exactly the block ids ``ids`` in request order, when given)."""
    import polars as pl

    out = pl.read_parquet(path, columns=["request_id", "input_tokens", "block_ids"]).sort("request_id")
    ok = int(out["input_tokens"].sum()) == n_tokens and (requests is None or out.height == requests)
    return ok and (ids is None or np.array_equal(out["block_ids"].explode().to_numpy(), ids))


def run(args, d: Path, reproduce: str) -> int:
    runs = args.runs
    load_before = os.getloadavg()
    print(f"work directory: {d}", flush=True)
    inp = prepare_inputs(args, d)
    commands, e2e = end_to_end(inp, runs)
    alone = hashing_alone(inp, runs)
    log, small, n_tok = inp.log, inp.small, inp.log.n_tokens
    same_out = {name: output_matches(d / a[-1], n_tok, alone.timed[name.split()[1]].result)
                for name, a in commands.items() if name != "chat"}
    profiles = {src.suffix[1:]: profile_ingest(src, "sha256", d / "out-profiled.parquet")
                for src in (inp.jsonl, inp.parquet)}
    chat = chat_apart(inp, runs) if inp.chat is not None else None
    chat_ok = chat is None or (chat.same_tokens and output_matches(d / commands["chat"][-1], chat.n_tokens, None,
                                                                   chat.requests))

    tab = Table(f"request-log ingestion: hashing and tokenization ({BLOCK_TOKENS} tokens/block)", reproduce)
    ids = alone.timed["sha256"].result
    n_blocks, distinct = int(ids.shape[0]), int(np.unique(ids).shape[0])
    lens = np.diff(log.starts)
    shown = {name: "kvtrace " + shlex.join(a) for name, a in commands.items()}
    tab.add("token log", f"{log.n_requests:,} requests, {n_tok:,} prompt tokens (mean {lens.mean():,.0f}, "
            f"{lens.min():,}-{lens.max():,}), {n_blocks:,} blocks, {distinct:,} distinct "
            f"({1 - distinct / n_blocks:.0%} repeats); JSONL {fmt_size(inp.jsonl.stat().st_size)}, Parquet "
            f"{fmt_size(inp.parquet.stat().st_size)}; " + (f"{inp.gen_s:.1f} s to generate and write" if inp.written else
                                                  "files reused"), "-")
    for h in HASHES:
        for fmt in ("jsonl", "parquet"):
            name = f"{fmt} {h}"
            tab.rate(f"kvtrace ingest, end to end, {'JSONL' if fmt == 'jsonl' else 'Parquet'}, --hash {h}", n_tok,
                     e2e[name], "prompt tokens/s", shown[name])
    tab.add("of which interpreter start + imports", f"{e2e['imports'].best:.2f} / {e2e['imports'].median:.2f}",
            f"s, best / median of {runs}", shlex.join(["python", *IMPORTS[1:]]))
    for fmt, sh in profiles.items():
        tab.add(f"  where kvtrace ingest's time goes, {'JSONL' if fmt == 'jsonl' else 'Parquet'}, sha256 (in process, "
                f"one cProfile run, {sh['total_s']:.1f} s)",
                " / ".join(f"{sh[part]:.0%}" for part, _ in INGEST_PARTS) + f" / {sh['other']:.0%}",
                "hashing / reading + parsing / token-list checks / prepare_requests / Parquet write / "
                "distinct-block count / other")
    for h in HASHES:
        t, sp = alone.timed[h], alone.split[h]
        tab.rate(f"hashing alone (hash_prompts, in process, one core), {h}", n_tok, t, "prompt tokens/s")
        tab.add(f"  CPU time / wall time of those runs, {h}", f"{max(t.cpu_ratio):.2f}",
                "largest of the runs (1.0 = one core busy)")
        tab.add(f"  where the time goes, {h} (one cProfile run, {sp['total_s']:.2f} s)",
                f"{sp['chain']:.0%} / {sp['serialise']:.0%} / {sp['digests']:.0%}",
                "SHA-256 chain loop / serialisation + index arithmetic / ids from digests")
    for h in HASHES:
        tab.rate(f"pure-Python reference (hashlib + {'pickle' if h == 'sha256' else 'cbor2'} per block), {h}, "
                 f"first {small.n_requests:,} prompts", small.n_tokens, alone.reference[h], "prompt tokens/s")
        tab.add(f"  hash_prompts / reference speed, {h} (block ids equal: {'yes' if alone.equal[h] else 'NO'})",
                f"{alone.reference[h].best / alone.subset[h].best:,.1f}x", "faster, best against best")
    if chat is not None:
        cl, n_chat = chat.lens, chat.n_tokens
        tab.add("chat log", f"{chat.requests:,} requests, {n_chat:,} prompt tokens (mean {cl.mean():,.0f}, "
                f"{cl.min():,}-{cl.max():,}); JSONL {fmt_size(inp.chat.stat().st_size)}; byte-level BPE, 8,192 "
                f"tokens; " + (f"{inp.chat_gen_s:.1f} s to train and generate" if inp.chat_written else "files reused"), "-")
        tab.rate("kvtrace ingest, end to end, OpenAI chat log", chat.requests, e2e["chat"], "requests/s",
                 shown["chat"], scale=1)
        tab.rate("kvtrace ingest, end to end, OpenAI chat log", n_chat, e2e["chat"], "prompt tokens/s",
                 shown["chat"])
        tab.rate("chat template rendering alone (ChatTokenizer.render, in process)", chat.requests,
                 chat.timed["render"], "requests/s", scale=1)
        tab.rate("tokenization alone (ChatTokenizer.encode, in process), 2 cores", n_chat,
                 chat.timed["encode, 2 cores"], "prompt tokens/s")
        tab.rate("tokenization alone (ChatTokenizer.encode, in process), one core", n_chat,
                 chat.timed["encode, 1 core"], "prompt tokens/s")
        tab.rate("hashing alone, the chat log's tokens (one core), sha256", n_chat, chat.timed["hash"],
                 "prompt tokens/s")

    rss = max(t.peak_rss_bytes for name, t in e2e.items() if name not in ("imports", "chat"))
    tab.note(f"Figures are best / median of {runs} runs, the runs of all commands alternated. End to end is the "
             f"wall time of the child process, interpreter start included; peak RSS of the token-log ingests up "
             f"to {fmt_size(rss)}" + (f", of the chat-log ingest {fmt_size(e2e['chat'].peak_rss_bytes)}"
                                      if chat is not None else "") + ".")
    tab.note(f"The commands run in the benchmark's directory on the files it wrote ({d}; `--keep DIR` keeps "
             "them); each was run once untimed on a small log first (JIT cache, page cache).")
    tab.note(f"Load average (1, 5, 15 min) at the start: {', '.join(f'{x:.1f}' for x in load_before)}; at the "
             f"end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} (2 CPUs: above 0 means other work shared them).")
    tab.note("Hashing alone: the tokens are in memory as int64 (as the reader holds a chunk); the calling thread "
             "is pinned to one CPU; the CPU/wall ratio is the whole process's.")
    if chat is not None:
        tab.note("Chat log apart: rendering and tokenization of all requests at once, JSON already parsed; "
                 "`TOKENIZERS_PARALLELISM=false` for the one-core tokenization. The command tokenizes in batches "
                 "of 2,048 requests on both cores.")
    for h in HASHES:
        rate = n_tok / alone.timed[h].best
        tab.checks.append((f"hashing alone, {h}: {rate / 1e6:.2f} M prompt tokens/s on one core (target >= "
                           f"{HASH_TARGET / 1e6:g} M)", rate >= HASH_TARGET))
        tab.checks.append((f"block ids of hash_prompts equal the pure-Python reference, {h} ({small.n_requests:,} "
                           "prompts)", alone.equal[h]))
    for name, ok in same_out.items():
        tab.checks.append((f"kvtrace ingest output ({name}): prompt tokens and block ids equal the in-process "
                           "hash_prompts'", ok))
    if chat is not None:
        tab.checks.append(("kvtrace ingest output (chat): requests and prompt tokens equal the in-process "
                           "render + encode; 1-core and 2-core tokens equal", chat_ok))
    tab.print()
    # a missed speed target is reported, not an error (noisy machines); wrong ids are
    return 0 if all(alone.equal.values()) and all(same_out.values()) and chat_ok else 1


if __name__ == "__main__":
    sys.exit(main())
