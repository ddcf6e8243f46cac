"""Model and GPU descriptions: KV bytes per token, prefill FLOPs, config loading.

Golden values are computed here from the models' published Hugging Face config.json
fields, written out below, never read back from kvtrace.model.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.errors import KvtraceError, UsageError
from kvtrace.model import (
    DEFAULT_MODEL,
    DTYPES,
    GPUS,
    MODELS,
    GpuSpec,
    ModelSpec,
    gpus_table,
    load_hf_config,
    models_table,
    position_token_sum,
    resolve_gpu,
    resolve_model,
)

# Fields copied from each model's published config.json (the ones that matter here).
PUBLISHED_CONFIGS = {
    "Llama-3.1-8B": {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "Llama-3.1-70B": {
        "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
        "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
        "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "Llama-3.1-405B": {
        "model_type": "llama", "hidden_size": 16384, "intermediate_size": 53248,
        "num_attention_heads": 128, "num_hidden_layers": 126, "num_key_value_heads": 8,
        "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "Qwen2.5-7B": {
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
        "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "vocab_size": 152064, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "Qwen2.5-72B": {
        "model_type": "qwen2", "hidden_size": 8192, "intermediate_size": 29568,
        "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
        "vocab_size": 152064, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "Qwen3-32B": {
        "model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600, "head_dim": 128,
        "num_attention_heads": 64, "num_hidden_layers": 64, "num_key_value_heads": 8,
        "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "Qwen3-235B-A22B": {
        "model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288, "head_dim": 128,
        "num_attention_heads": 64, "num_hidden_layers": 94, "num_key_value_heads": 4,
        "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8,
        "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "Mistral-7B": {
        "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "sliding_window": 4096,
        "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "DeepSeek-V3": {
        "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
        "num_attention_heads": 128, "num_hidden_layers": 61, "num_key_value_heads": 128,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128,
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "num_nextn_predict_layers": 1,
        "vocab_size": 129280, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
}

# Parameter counts from the model cards / reports (not in config.json).
PUBLISHED_ACTIVE_PARAMS = {
    "Llama-3.1-8B": 8.03e9, "Llama-3.1-70B": 70.6e9, "Llama-3.1-405B": 405.9e9,
    "Qwen2.5-7B": 7.62e9, "Qwen2.5-72B": 72.7e9, "Qwen3-32B": 32.8e9,
    "Qwen3-235B-A22B": 22e9, "Mistral-7B": 7.24e9, "DeepSeek-V3": 37e9,
}


def kv_bytes_from_config(cfg: dict, dtype_bytes: int = 2) -> int:
    """Independent DESIGN §1 formula over raw config.json fields."""
    layers = cfg["num_hidden_layers"]
    if "kv_lora_rank" in cfg:
        return layers * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * dtype_bytes
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return layers * cfg["num_key_value_heads"] * head_dim * dtype_bytes * 2


def attention_coefficient_from_config(cfg: dict) -> int:
    """4 x layers x q_heads x (q·k head dim), from raw config fields."""
    if "kv_lora_rank" in cfg:
        head_dim = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    else:
        head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return 4 * cfg["num_hidden_layers"] * cfg["num_attention_heads"] * head_dim


def write_config(tmp_path, cfg: dict, name: str = "model"):
    directory = tmp_path / name
    directory.mkdir()
    path = directory / "config.json"
    path.write_text(json.dumps(cfg))
    return path


# ------------------------------------------------------------------ KV bytes per token


def test_design_example_llama_31_70b_fp16():
    # DESIGN §1: 80 x 8 x 128 x 2 x 2.
    assert resolve_model("Llama-3.1-70B", dtype="fp16").kv_bytes_per_token == 327_680
    assert MODELS["Llama-3.1-70B"].kv_bytes_per_token == 327_680


def test_deepseek_v3_mla_bytes_per_token():
    # 61 layers x (512 latent + 64 rope) x 2 bytes.
    spec = MODELS["DeepSeek-V3"]
    assert spec.attention == "mla"
    assert spec.kv_bytes_per_token == 70_272


def test_every_preset_has_a_published_config_here():
    assert set(MODELS) == set(PUBLISHED_CONFIGS)
    assert DEFAULT_MODEL in MODELS


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_preset_matches_published_config(name):
    cfg = PUBLISHED_CONFIGS[name]
    spec = MODELS[name]
    assert spec.kv_bytes_per_token == kv_bytes_from_config(cfg)
    assert spec.layers == cfg["num_hidden_layers"]
    assert spec.q_heads == cfg["num_attention_heads"]
    assert spec.flops_coefficients()[1] == attention_coefficient_from_config(cfg)
    assert spec.active_params == PUBLISHED_ACTIVE_PARAMS[name]


def test_bytes_per_block():
    spec = MODELS["Qwen2.5-7B"]  # 28 x 4 x 128 x 2 x 2 = 57,344 B/token
    assert spec.bytes_per_block(16) == 16 * 57_344
    np.testing.assert_array_equal(spec.bytes_per_block(np.array([1, 16, 7])),
                                  np.array([57_344, 16 * 57_344, 7 * 57_344]))


# ------------------------------------------------------------------ dtypes and overrides


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("fp32", 655_360), ("bf16", 327_680), ("bfloat16", 327_680), ("fp8", 163_840),
     ("int8", 163_840), ("fp4", 81_920)],
)
def test_dtype_override(dtype, expected):
    # 80 x 8 x 128 x 2 (K and V) = 163,840 elements per token.
    spec = resolve_model("Llama-3.1-70B", dtype=dtype)
    assert spec.kv_bytes_per_token == expected
    assert isinstance(spec.kv_bytes_per_token, int)


def test_fp4_is_exact_for_mla():
    # 61 x 576 elements x 1/2 byte = 17,568 bytes exactly.
    assert resolve_model("DeepSeek-V3", dtype="fp4").kv_bytes_per_token == 17_568
    assert DTYPES["fp4"] == Fraction(1, 2)


def test_fractional_bytes_per_token_is_refused_unless_overridden():
    args = dict(name="odd", attention="mla", layers=1, q_heads=1, kv_heads=1, head_dim=64,
                kv_lora_rank=3, rope_dim=0, active_params=1e6)
    with pytest.raises(KvtraceError) as err:
        ModelSpec(**args, dtype_bytes=Fraction(1, 2))  # 1.5 bytes per token
    assert err.value.field == "dtype"
    spec = ModelSpec(**args, dtype_bytes=Fraction(1, 2), kv_bytes_per_token_override=2)
    assert spec.kv_bytes_per_token == 2


def test_kv_bytes_per_token_override_wins_over_dtype():
    spec = resolve_model("Llama-3.1-8B", dtype="fp8", kv_bytes_per_token=100_000)
    assert spec.kv_bytes_per_token == 100_000
    assert spec.bytes_per_block(512) == 51_200_000
    # FLOPs do not depend on the cache format.
    assert spec.flops_coefficients() == MODELS["Llama-3.1-8B"].flops_coefficients()


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_bad_kv_bytes_per_token_override(bad):
    with pytest.raises(UsageError) as err:
        resolve_model("Llama-3.1-8B", kv_bytes_per_token=bad)
    assert err.value.field == "kv_bytes_per_token"


def test_unknown_dtype():
    with pytest.raises(UsageError) as err:
        resolve_model("Llama-3.1-8B", dtype="fp6")
    assert err.value.field == "dtype"
    assert "fp8" in str(err.value)


# ------------------------------------------------------------------ resolve_model


def test_default_model():
    assert resolve_model().name == "Llama-3.1-70B"
    assert resolve_model(None).kv_bytes_per_token == 327_680


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("llama-3.1-70b", "Llama-3.1-70B"),
        ("Llama-3.1-70B", "Llama-3.1-70B"),
        ("meta-llama/Llama-3.1-70B-Instruct", "Llama-3.1-70B"),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "Llama-3.1-70B"),
        ("llama3.1:8b", "Llama-3.1-8B"),
        ("Qwen/Qwen2.5-72B-Instruct", "Qwen2.5-72B"),
        ("qwen3-235b-a22b", "Qwen3-235B-A22B"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "Mistral-7B"),
        ("deepseek-ai/DeepSeek-V3", "DeepSeek-V3"),
        ("DeepSeek-R1", "DeepSeek-V3"),
    ],
)
def test_aliases_are_case_insensitive(alias, canonical):
    assert resolve_model(alias).name == canonical
    assert MODELS[alias].name == canonical
    assert alias in MODELS


def test_unknown_model_lists_close_matches():
    with pytest.raises(UsageError) as err:
        resolve_model("llama-3.1-7b")
    assert err.value.field == "model"
    message = str(err.value)
    assert "Llama-3.1-70B" in message and "Llama-3.1-8B" in message
    assert "gpt" not in MODELS


def test_unknown_model_without_close_match_lists_presets():
    with pytest.raises(UsageError) as err:
        resolve_model("completely-different")
    assert "DeepSeek-V3" in str(err.value)


def test_missing_config_path(tmp_path):
    missing = tmp_path / "nope" / "config.json"
    with pytest.raises(KvtraceError) as err:
        resolve_model(str(missing))
    assert err.value.path == str(missing)


def test_resolve_model_from_directory_and_file(tmp_path):
    path = write_config(tmp_path, PUBLISHED_CONFIGS["Llama-3.1-70B"], name="my-llama")
    by_dir = resolve_model(str(path.parent))
    by_file = resolve_model(path, dtype="fp8")
    assert by_dir.name == "my-llama"
    assert by_dir.kv_bytes_per_token == 327_680
    assert by_file.kv_bytes_per_token == 163_840


# ------------------------------------------------------------------ load_hf_config


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_load_hf_config_matches_preset(tmp_path, name):
    path = write_config(tmp_path, PUBLISHED_CONFIGS[name])
    loaded = load_hf_config(path)
    preset = MODELS[name]
    assert loaded.attention == preset.attention
    assert loaded.kv_bytes_per_token == preset.kv_bytes_per_token
    assert loaded.flops_coefficients()[1] == preset.flops_coefficients()[1]
    # The active-parameter estimate is within 2 % of the published count.
    assert loaded.active_params == pytest.approx(PUBLISHED_ACTIVE_PARAMS[name], rel=0.02)


def test_llama_gqa_config_directory(tmp_path):
    path = write_config(tmp_path, PUBLISHED_CONFIGS["Llama-3.1-70B"])
    spec = load_hf_config(path.parent)
    assert (spec.layers, spec.q_heads, spec.kv_heads, spec.head_dim) == (80, 64, 8, 128)
    assert spec.kv_bytes_per_token == 327_680


def test_deepseek_mla_config(tmp_path):
    path = write_config(tmp_path, PUBLISHED_CONFIGS["DeepSeek-V3"])
    spec = load_hf_config(path)
    assert spec.attention == "mla"
    assert (spec.kv_lora_rank, spec.rope_dim, spec.head_dim) == (512, 64, 192)
    assert spec.kv_bytes_per_token == 70_272


def test_explicit_head_dim_beats_hidden_over_heads(tmp_path):
    # Qwen3-32B: 5120 / 64 = 80, but its config says head_dim 128.
    path = write_config(tmp_path, PUBLISHED_CONFIGS["Qwen3-32B"])
    assert load_hf_config(path).kv_bytes_per_token == 64 * 8 * 128 * 2 * 2


def test_kv_heads_default_to_attention_heads(tmp_path):
    cfg = {"hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 4,
           "intermediate_size": 4096, "vocab_size": 1000}
    spec = load_hf_config(write_config(tmp_path, cfg))
    assert spec.kv_heads == 16
    assert spec.kv_bytes_per_token == 4 * 16 * 64 * 2 * 2


def test_torch_dtype_sets_bytes(tmp_path):
    cfg = {**PUBLISHED_CONFIGS["Llama-3.1-8B"], "torch_dtype": "float32"}
    assert load_hf_config(write_config(tmp_path, cfg)).kv_bytes_per_token == 32 * 8 * 128 * 4 * 2


def test_unknown_torch_dtype(tmp_path):
    cfg = {**PUBLISHED_CONFIGS["Llama-3.1-8B"], "torch_dtype": "complex64"}
    with pytest.raises(KvtraceError) as err:
        load_hf_config(write_config(tmp_path, cfg))
    assert err.value.field == "torch_dtype"


def test_multimodal_text_config(tmp_path):
    cfg = {"model_type": "llava", "vision_config": {"hidden_size": 1024},
           "text_config": PUBLISHED_CONFIGS["Mistral-7B"]}
    assert load_hf_config(write_config(tmp_path, cfg)).kv_bytes_per_token == 131_072


@pytest.mark.parametrize(
    ("base", "field"),
    [
        ("Llama-3.1-70B", "num_hidden_layers"),
        ("Llama-3.1-70B", "num_attention_heads"),
        ("Llama-3.1-70B", "hidden_size"),  # needed when head_dim is absent
        ("DeepSeek-V3", "qk_rope_head_dim"),
        ("DeepSeek-V3", "qk_nope_head_dim"),
    ],
)
def test_missing_required_field_is_named(tmp_path, base, field):
    cfg = {k: v for k, v in PUBLISHED_CONFIGS[base].items() if k != field}
    path = write_config(tmp_path, cfg)
    with pytest.raises(KvtraceError) as err:
        load_hf_config(path)
    assert err.value.field == field
    assert err.value.path == str(path)
    assert field in str(err.value)


def test_active_params_override_skips_the_estimate(tmp_path):
    cfg = {k: v for k, v in PUBLISHED_CONFIGS["Llama-3.1-70B"].items() if k != "vocab_size"}
    path = write_config(tmp_path, cfg)
    with pytest.raises(KvtraceError) as err:
        load_hf_config(path)
    assert err.value.field == "vocab_size"
    spec = load_hf_config(path, active_params=70.6e9, name="L70")
    assert spec.name == "L70"
    assert spec.flops_coefficients()[0] == 2 * 70.6e9


def test_wrong_type_field_is_named(tmp_path):
    cfg = {**PUBLISHED_CONFIGS["Llama-3.1-8B"], "num_key_value_heads": "eight"}
    with pytest.raises(KvtraceError) as err:
        load_hf_config(write_config(tmp_path, cfg))
    assert err.value.field == "num_key_value_heads"


def test_missing_file_and_directory_without_config(tmp_path):
    with pytest.raises(KvtraceError) as err:
        load_hf_config(tmp_path / "absent.json")
    assert err.value.path == str(tmp_path / "absent.json")
    with pytest.raises(KvtraceError) as err:
        load_hf_config(tmp_path)
    assert err.value.path == str(tmp_path / "config.json")


def test_bad_json_reports_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "num_hidden_layers": 32,\n  "num_attention_heads": \n}\n')
    with pytest.raises(KvtraceError) as err:
        load_hf_config(path)
    assert err.value.path == str(path)
    assert err.value.line == 4
    assert "JSON" in str(err.value)


def test_json_that_is_not_an_object(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(KvtraceError):
        load_hf_config(path)


# ------------------------------------------------------------------ prefill FLOPs


def test_flops_coefficients_llama_70b():
    a, b = MODELS["Llama-3.1-70B"].flops_coefficients()
    assert a == 2 * 70.6e9
    assert b == 4 * 80 * 64 * 128  # 2,621,440 FLOPs per token per earlier token


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(PUBLISHED_CONFIGS)),
    n=st.integers(min_value=0, max_value=3000),
    start=st.integers(min_value=0, max_value=200_000),
)
def test_prefill_flops_equals_brute_force_sum(name, n, start):
    spec = MODELS[name]
    cfg = PUBLISHED_CONFIGS[name]
    a = 2 * PUBLISHED_ACTIVE_PARAMS[name]
    b = attention_coefficient_from_config(cfg)
    brute = math.fsum(a + b * p for p in range(start, start + n))
    assert spec.prefill_flops(n, start) == pytest.approx(brute, rel=1e-12, abs=0.0)


@settings(max_examples=100, deadline=None)
@given(n1=st.integers(0, 5000), n2=st.integers(0, 5000), start=st.integers(0, 100_000))
def test_prefill_flops_splits_into_blocks(n1, n2, start):
    # The kernels' decomposition: a request is the sum of its blocks.
    spec = MODELS["DeepSeek-V3"]
    whole = spec.prefill_flops(n1 + n2, start)
    parts = spec.prefill_flops(n1, start) + spec.prefill_flops(n2, start + n1)
    assert whole == pytest.approx(parts, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(k=st.integers(0, 2000), s=st.integers(0, 10**6))
def test_position_token_sum_brute_force(k, s):
    assert position_token_sum(k, s) == sum(range(s, s + k))


def test_prefill_flops_vectorised():
    spec = MODELS["Llama-3.1-8B"]
    n = np.array([512, 512, 100, 0])
    s = np.array([0, 512, 1024, 7])
    got = spec.prefill_flops(n, s)
    assert got.dtype == np.float64
    expected = [spec.prefill_flops(int(k), int(p)) for k, p in zip(n, s)]
    np.testing.assert_allclose(got, expected, rtol=1e-15)
    # Whole 1124-token prompt = its three blocks.
    assert got.sum() == pytest.approx(spec.prefill_flops(1124), rel=1e-14)


def test_prefill_flops_rejects_negative():
    with pytest.raises(ValueError):
        MODELS["Llama-3.1-8B"].prefill_flops(-1)


# ------------------------------------------------------------------ GPUs


def test_gpu_presets():
    assert GPUS["h100"].peak_flops == 989e12
    assert GPUS["H200"].peak_flops == 989e12
    assert GPUS["b200"].peak_flops == 2.25e15
    assert resolve_gpu().name == "H100"


def test_gpu_seconds_and_dollars():
    gpu = resolve_gpu("H100", mfu=0.4, dollars_per_hour=3.0)
    flops = 1e18
    seconds = 1e18 / (989e12 * 0.4)  # 2527.8 s
    assert gpu.gpu_seconds(flops) == pytest.approx(seconds, rel=1e-15)
    assert gpu.dollars(flops) == pytest.approx(seconds * 3.0 / 3600, rel=1e-15)
    np.testing.assert_allclose(gpu.gpu_seconds(np.array([0.0, flops])), [0.0, seconds])


def test_resolve_gpu_overrides_and_errors():
    assert resolve_gpu("b200", peak_flops=4.5e15).peak_flops == 4.5e15
    with pytest.raises(UsageError) as err:
        resolve_gpu("H100", mfu=40)
    assert err.value.field == "mfu"
    with pytest.raises(UsageError) as err:
        resolve_gpu("H10")
    assert "H100" in str(err.value)


def test_from_throughput_reproduces_the_measurement():
    model = MODELS["Llama-3.1-70B"]
    gpu = GpuSpec.from_throughput(2000.0, model, prompt_tokens=4096, gpu="H100")
    # A 4096-token prompt at 2000 tokens/s takes 2.048 s of GPU time.
    assert gpu.gpu_seconds(model.prefill_flops(4096)) == pytest.approx(4096 / 2000.0, rel=1e-12)
    # Position dependence survives: the second half of the prompt costs more.
    assert model.prefill_flops(2048, 2048) > model.prefill_flops(2048, 0)
    with pytest.raises(UsageError):
        GpuSpec.from_throughput(1e6, model, prompt_tokens=4096, gpu="H100")


# ------------------------------------------------------------------ tables


def test_models_table():
    df = models_table(block_tokens=16)
    assert df.columns == ["name", "attention", "layers", "q_heads", "kv_heads", "head_dim",
                          "dtype", "kv_bytes_per_token", "bytes_per_block", "active_params"]
    assert df.height == len(PUBLISHED_CONFIGS)
    row = df.filter(df["name"] == "Llama-3.1-70B").row(0, named=True)
    assert row["kv_bytes_per_token"] == 327_680
    assert row["bytes_per_block"] == 16 * 327_680
    assert df.filter(df["name"] == "DeepSeek-V3")["attention"].item() == "mla"
    with pytest.raises(UsageError):
        models_table(block_tokens=0)


def test_gpus_table():
    df = gpus_table()
    assert df.columns == ["name", "peak_flops", "mfu", "effective_flops", "dollars_per_hour"]
    row = df.filter(df["name"] == "H100").row(0, named=True)
    assert row["effective_flops"] == pytest.approx(row["peak_flops"] * row["mfu"])
