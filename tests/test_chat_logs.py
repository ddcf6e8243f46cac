"""OpenAI request logs (format ``openai``) -> chat template -> token ids -> canonical table.

The tokenizer is trained here with ``tokenizers`` (nothing is downloaded); the expected
renderings are written by hand from transformers' rules (trim_blocks, lstrip_blocks,
its ``tojson``, special tokens as template variables, add_special_tokens=False).
"""

from __future__ import annotations

import gzip
import json
import socket
from datetime import datetime

import numpy as np
import numpy.testing as npt
import pytest
from test_tokens_vllm import vllm_twin

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers  # noqa: E402

from kvtrace.errors import KvtraceError  # noqa: E402
from kvtrace.ingest.chat import ChatFields, load_chat_trace, read_chat_log  # noqa: E402
from kvtrace.ingest.chat_template import load_chat_tokenizer  # noqa: E402
from kvtrace.ingest.vllm_hash import HashSpec  # noqa: E402

SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]

# Block tags on their own, indented lines: the output is only the expected one with
# trim_blocks and lstrip_blocks (as transformers sets them).
TEMPLATE = """{{- bos_token }}
{% if tools %}
<|system|>
tools: {{ tools | tojson }}</s>
{% endif %}
{% for m in messages %}
    {% if m['role'] == 'forbidden' %}
        {{ raise_exception('role forbidden is not allowed') }}
    {% elif m['role'] == 'tool' %}
<|tool|>{{ m['tool_call_id'] }}: {{ m['content'] }}</s>
    {% else %}
<|{{ m['role'] }}|>
        {% if m['content'] is string %}
{{ m['content'] }}
        {% elif m['content'] %}
            {% for p in m['content'] %}
{{ p['text'] }}
            {% endfor %}
        {% endif %}
        {% for c in m['tool_calls'] or [] %}
call {{ c['function']['name'] }} {{ c['function']['arguments'] }}
        {% endfor %}
</s>
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|assistant|>
{% endif %}
"""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "température < 40°"}}]
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": [{"type": "text", "text": "What is the weather"},
                                 {"type": "text", "text": "in Paris today?"}]},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny and warm"},
]
EXPECTED = (
    "<s>\n"
    "<|system|>\ntools: [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
    "\"description\": \"température < 40°\"}}]</s>\n"
    "<|system|>\nYou are a helpful assistant.\n</s>\n"
    "<|user|>\nWhat is the weather\nin Paris today?\n</s>\n"
    "<|assistant|>\ncall get_weather {\"city\": \"Paris\"}\n</s>\n"
    "<|tool|>call_1: sunny and warm</s>\n"
    "<|assistant|>\n"
)

WORDS = ("you are a helpful assistant what is the weather in paris today call get weather city sunny and warm "
         "tools function name description hello world how can i help tell me about caching blocks prefix "
         "tokens request model tea coffee rain snow cold hot london tokyo berlin yes no maybe thanks").split()


def _train(tmp_path, template=TEMPLATE, config_extra=None, name="tok"):
    """A small BPE tokenizer (BOS added by its post-processor) and its config, in a dir."""
    rng = np.random.default_rng(0)
    corpus = [" ".join(rng.choice(WORDS, 12)) + " Paris ? ." for _ in range(300)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL,
                                                        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    d = tmp_path / name
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    config = {"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>", "unk_token": "<unk>",
              "chat_template": template, **(config_extra or {})}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d, tok


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _ids(log):
    return log.requests["block_ids"].to_list()


# -- (1) rendering, (2) token ids -----------------------------------------------------

def test_render_matches_hand_written_string(tmp_path):
    d, _ = _train(tmp_path)
    tok = load_chat_tokenizer(d)
    assert tok.render(CONVERSATION, tools=TOOLS) == EXPECTED
    # without tools the tools header goes; add_generation_prompt=False drops the last header
    tools_header = EXPECTED[len("<s>\n"):EXPECTED.index("<|system|>\nYou")]
    assert tools_header.startswith("<|system|>\ntools: [") and tools_header.endswith("</s>\n")
    assert tok.render(CONVERSATION, add_generation_prompt=False) == \
        EXPECTED.replace(tools_header, "").removesuffix("<|assistant|>\n")


def test_token_ids_are_the_tokenizers_encoding(tmp_path):
    d, tok = _train(tmp_path)
    body = {"model": "m", "messages": CONVERSATION, "tools": TOOLS}
    log = read_chat_log(_jsonl(tmp_path / "chat.jsonl", [body]), d, spec=HashSpec(block_tokens=4))
    want = tok.encode(EXPECTED, add_special_tokens=False).ids
    assert want[0] == 1 and want.count(1) == 1  # the template's <s>, not a second one from the post-processor
    exp, _ = vllm_twin([want], block=4)
    assert log.requests["input_tokens"].to_list() == [len(want)]
    npt.assert_array_equal(log.requests["block_ids"].explode().to_numpy(), exp)
    assert log.meta.source_format == "openai" and log.meta.block_tokens == 4


def test_completions_prompts_get_the_post_processors_special_tokens(tmp_path):
    d, tok = _train(tmp_path)
    body = {"model": "m", "prompt": ["hello world", [5, 6, 7, 8, 9]], "max_tokens": 7}
    log = read_chat_log(_jsonl(tmp_path / "c.jsonl", [body, {"prompt": "hello world", "add_special_tokens": False}]),
                        d, spec=HashSpec(block_tokens=4))
    prompts = [tok.encode("hello world").ids, [5, 6, 7, 8, 9], tok.encode("hello world", add_special_tokens=False).ids]
    assert prompts[0][0] == 1 and prompts[2][0] != 1
    exp, starts = vllm_twin(prompts, block=4)
    npt.assert_array_equal(log.requests["block_ids"].explode().to_numpy(), exp)
    assert log.requests["output_tokens"].to_list() == [7, 7, 0]
    assert log.locate(1) == {"path": str(tmp_path / "c.jsonl"), "line": 1}
    assert log.locate(2)["line"] == 2


# -- (3) prefix sharing -----------------------------------------------------------------

def test_turns_of_one_conversation_share_prefix_blocks(tmp_path):
    d, _ = _train(tmp_path)
    turn1 = CONVERSATION[:2]
    turn2 = turn1 + [{"role": "assistant", "content": "It is sunny and warm in Paris today."},
                     {"role": "user", "content": "And in London?"}]
    turn3 = turn2 + [{"role": "assistant", "content": "Cold rain."}, {"role": "user", "content": "Thanks"}]
    rows = [{"timestamp": 1_700_000_000 + i, "body": {"model": "m", "messages": m, "user": "alice"}}
            for i, m in enumerate((turn1, turn2, turn3))]
    log = read_chat_log(_jsonl(tmp_path / "conv.jsonl", rows), d, spec=HashSpec(block_tokens=4))
    ids = _ids(log)
    n = log.requests["input_tokens"].to_list()
    assert n[0] < n[1] < n[2]
    for a, b in ((0, 1), (1, 2)):
        full = n[a] // 4
        assert full >= 3
        assert ids[b][:full] == ids[a][:full]  # the earlier turn's full blocks, same ids
    assert ids[1][n[0] // 4 + 1] != ids[0][-1]
    assert log.requests["session_id"].to_list() == [0, 0, 0] and log.requests["tenant"].to_list() == ["m"] * 3
    trace, _ = load_chat_trace(tmp_path / "conv.jsonl", d, spec=HashSpec(block_tokens=4))
    assert trace.requests["timestamp"].to_list() == [0.0, 1.0, 2.0]


# -- (4) forms ------------------------------------------------------------------------

def _bodies():
    return [
        {"model": "m", "messages": CONVERSATION, "tools": TOOLS, "max_completion_tokens": 30},
        {"model": "m", "messages": CONVERSATION[:2], "max_tokens": 10, "cache_salt": "s1"},
        {"model": "m", "prompt": "tell me about caching", "max_tokens": 5},
    ]


def test_batch_wrapped_and_bare_forms_give_the_same_blocks(tmp_path):
    d, _ = _train(tmp_path)
    bodies = _bodies()
    bare = read_chat_log(_jsonl(tmp_path / "bare.jsonl", bodies), d)
    urls = ["/v1/chat/completions", "/v1/chat/completions", "/v1/completions"]
    batch = read_chat_log(_jsonl(tmp_path / "batch.jsonl", [
        {"custom_id": f"req-{i}", "method": "POST", "url": u, "body": b} for i, (u, b) in enumerate(zip(urls, bodies))
    ]), d)
    wrapped = read_chat_log(_jsonl(tmp_path / "wrapped.jsonl", [
        {"timestamp": "2024-05-01T12:00:00Z", "body": bodies[0], "session_id": "a"},
        {"timestamp": "2024-05-01T12:00:01.5Z", "body": bodies[1], "session_id": "a"},
        {"timestamp": "2024-05-01T12:00:03Z", "body": bodies[2], "session_id": "b"},
    ]), d)
    p = tmp_path / "gateway.jsonl.gz"
    p.write_bytes(gzip.compress("".join(json.dumps({"created": 1714564800 + i, "request": b}) + "\n"
                                        for i, b in enumerate(bodies)).encode()))
    gateway = read_chat_log(p, d)
    for log in (batch, wrapped, gateway, read_chat_log(tmp_path / "bare.jsonl", d, chunk_rows=1)):
        assert _ids(log) == _ids(bare)
        assert log.requests["output_tokens"].to_list() == [30, 10, 5]
    assert bare.requests["block_ids"].list.len().min() > 0
    assert _ids(bare)[1][0] != read_chat_log(_jsonl(tmp_path / "nosalt.jsonl", [
        {k: v for k, v in bodies[1].items() if k != "cache_salt"}]), d).requests["block_ids"][0][0]
    for log in (bare, batch):
        assert log.requests["timestamp"].to_list() == [0.0, 1.0, 2.0]
        assert "no timestamps" in log.time_note and "1 s apart" in log.time_note
    assert batch.requests["request_id"].to_list() == [0, 1, 2]
    assert wrapped.requests["timestamp"].to_list() == [1714564800.0, 1714564801.5, 1714564803.0]
    assert wrapped.time_unit == "iso" and gateway.time_unit == "s"
    assert wrapped.requests["session_id"].to_list() == [0, 0, 1]
    assert any("max_completion_tokens / max_tokens" in w for w in bare.warnings)


def test_measured_output_counts_win_and_options(tmp_path):
    d, _ = _train(tmp_path)
    rows = [
        {"ts": 1.0, "body": {"model": "base", "messages": CONVERSATION[:2], "max_tokens": 99},
         "usage": {"completion_tokens": 12}},
        {"ts": 2.0, "body": {"model": "adapter-a", "messages": CONVERSATION[:2], "max_tokens": 99},
         "output_tokens": 3},
        {"ts": 3.0, "body": {"model": "adapter-a", "messages": CONVERSATION[:2]}},
    ]
    log = read_chat_log(_jsonl(tmp_path / "m.jsonl", rows), d,
                        fields=ChatFields(lora_from_model=True, base_models=("base",), tenant=None))
    assert log.requests["output_tokens"].to_list() == [12, 3, 0]
    assert log.requests["tenant"].to_list() == [None] * 3
    ids = _ids(log)
    assert ids[1] == ids[2] and ids[0][0] != ids[1][0]  # the LoRA name is hashed into every block
    assert any("no count and no cap" in w for w in log.warnings)


# -- templates: named, override, generation tag, clock ----------------------------------

def test_named_templates_pick_tool_use_with_tools(tmp_path):
    named = [{"name": "default", "template": "{{ bos_token }}D{{ messages[0]['content'] }}"},
             {"name": "tool_use", "template": "{{ bos_token }}T{{ tools | length }}{{ messages[0]['content'] }}"}]
    d, _ = _train(tmp_path, template=named)
    tok = load_chat_tokenizer(d)
    msgs = [{"role": "user", "content": "hello"}]
    assert tok.render(msgs) == "<s>Dhello"
    assert tok.render(msgs, tools=TOOLS) == "<s>T1hello"
    override = tmp_path / "over.jinja"
    override.write_text("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                        "{% generation %}[{{ m['content'] }}]{% endgeneration %}{% endfor %}"
                        "{{ strftime_now('%Y') }}")
    tok2 = load_chat_tokenizer(d, override, clock=datetime(2031, 1, 2))
    assert tok2.render(msgs + msgs, tools=TOOLS) == "[hello]2031"
    log = read_chat_log(_jsonl(tmp_path / "o.jsonl", [{"messages": msgs}]), d, chat_template=override)
    assert any("strftime_now" in w for w in log.warnings)


def test_chat_template_jinja_file_and_continue_final_message(tmp_path):
    d, _ = _train(tmp_path, template=None)
    (d / "chat_template.jinja").write_text("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>"
                                          "{% endfor %}")
    tok = load_chat_tokenizer(d)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Paris is"}]
    assert tok.render(msgs) == "<|user|>hi</s><|assistant|>Paris is</s>"
    assert tok.render(msgs, add_generation_prompt=False, continue_final_message=True) == \
        "<|user|>hi</s><|assistant|>Paris is"


# -- (5) bad input: one line naming file, line and field -----------------------------------

BAD = [
    ("no body", {"timestamp": 1, "payload": {"x": 1}}, "messages", "expected a chat-completions body"),
    ("no role", {"messages": [{"content": "hi"}]}, "messages[0].role", "expected a role"),
    ("template raises", {"messages": [{"role": "forbidden", "content": "x"}]}, "messages",
     "role forbidden is not allowed"),
    ("image part", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}, "messages[0].content[0].type",
     "images are not supported"),
    ("bad prompt", {"prompt": {"text": "x"}}, "prompt", "expected a string"),
    ("bad batch url", {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}, "url",
     "Batch API url"),
    ("bad time", {"timestamp": "yesterday at noon", "body": {"messages": [{"role": "user", "content": "hi"}]}},
     "timestamp", "ISO-8601"),
    ("bad max_tokens", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}, "max_tokens",
     "non-negative integer"),
]


@pytest.mark.parametrize("case, record, field, text", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_naming_file_line_field(tmp_path, case, record, field, text):
    d, _ = _train(tmp_path)
    good = {"timestamp": "2024-05-01T00:00:00Z", "body": {"messages": [{"role": "user", "content": "hello"}]}}
    if "timestamp" not in record:
        good = good["body"]
    path = _jsonl(tmp_path / "bad.jsonl", [good, good, record])
    with pytest.raises(KvtraceError) as err:
        read_chat_log(path, d)
    msg = str(err.value)
    assert "\n" not in msg and text in msg, msg
    assert f"bad.jsonl:3: field '{field}':" in msg, msg


def test_malformed_json_and_tokenizer_failure(tmp_path):
    d, _ = _train(tmp_path)
    p = tmp_path / "broken.jsonl"
    p.write_text(json.dumps({"prompt": "hello"}) + "\n{not json\n")
    with pytest.raises(KvtraceError, match=r"broken\.jsonl:2: malformed JSON"):
        read_chat_log(p, d)
    # a WordLevel tokenizer whose unknown token is missing from its vocabulary fails on unknown words
    w = tmp_path / "wl"
    w.mkdir()
    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(w / "tokenizer.json"))
    log = _jsonl(tmp_path / "wl.jsonl", [{"prompt": "hello world"}, {"prompt": "hello zebra"}])
    with pytest.raises(KvtraceError) as err:
        read_chat_log(log, w / "tokenizer.json")
    msg = str(err.value)
    assert "\n" not in msg and "wl.jsonl:2: field 'prompt': the tokenizer failed" in msg, msg
    # a chat without any template
    with pytest.raises(KvtraceError, match=r"field 'messages': the tokenizer has no chat template.*--chat-template"):
        read_chat_log(_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}]), w)


def test_template_that_does_not_parse(tmp_path):
    d, _ = _train(tmp_path, template="{% for m in messages %}{{ m['content'] }}")
    with pytest.raises(KvtraceError) as err:
        load_chat_tokenizer(d)
    msg = str(err.value)
    assert "\n" not in msg and "tokenizer_config.json: field 'chat_template': the chat template does not parse" in msg


# -- (6) a missing tokenizer: one line, nothing fetched -------------------------------------

@pytest.mark.parametrize("given", [None, "missing-dir", "meta-llama/Llama-3.1-8B-Instruct", "empty-dir"])
def test_missing_tokenizer_is_one_line_and_fetches_nothing(tmp_path, monkeypatch, given):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(Tokenizer, "from_pretrained", no_network)
    monkeypatch.setattr(Tokenizer, "from_file", no_network)
    if given == "empty-dir":
        (tmp_path / "empty-dir").mkdir()
    tok = None if given is None else (tmp_path / given if given != "meta-llama/Llama-3.1-8B-Instruct" else given)
    log = _jsonl(tmp_path / "x.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(KvtraceError) as err:
        read_chat_log(log, tok)
    msg = str(err.value)
    assert "\n" not in msg
    assert "--tokenizer DIR_OR_tokenizer.json: a local Hugging Face tokenizer; nothing is downloaded" in msg
