"""HF config.json -> ModelConfig, including refusals."""

import json

import pytest

from specpilot.errors import CheckpointError
from specpilot.models.config import ModelConfig

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": False,
    "max_position_embeddings": 40960, "eos_token_id": 151645, "bos_token_id": 151643,
}


def test_qwen3_8b_fields():
    c = ModelConfig.from_hf_dict(QWEN3)
    assert (c.family, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == ("qwen3", 36, 32, 8, 128)
    assert c.qk_norm and c.rope_theta == 1e6 and c.eos_token_ids == (151645,)
    assert 8.1e9 < c.num_params < 8.3e9  # Qwen3-8B has 8.19B parameters


def test_transformers5_rope_parameters_spelling():
    d = dict(QWEN3)
    d.pop("rope_theta")
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    assert ModelConfig.from_hf_dict(d).rope_theta == 5e5


def test_llama3_rope_scaling_and_eos_list():
    d = {
        "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 5e5,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        "eos_token_id": [128001, 128009],
    }
    c = ModelConfig.from_hf_dict(d)
    assert c.family == "llama" and not c.qk_norm and c.head_dim == 128
    assert c.rope_scaling.factor == 8.0 and c.eos_token_ids == (128001, 128009)


@pytest.mark.parametrize("change,message", [
    ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"}, "unsupported architecture 'MixtralForCausalLM'"),
    ({"num_key_value_heads": 5}, "not a multiple"),
    ({"attention_bias": True}, "biases"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "rope scaling type 'yarn'"),
])
def test_refusals(change, message):
    with pytest.raises(CheckpointError, match=message):
        ModelConfig.from_hf_dict({**QWEN3, **change})


def test_missing_field_and_bad_json(tmp_path):
    d = dict(QWEN3)
    d.pop("hidden_size")
    with pytest.raises(CheckpointError, match="missing field 'hidden_size'"):
        ModelConfig.from_hf_dict(d)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        ModelConfig.from_dir(tmp_path)
    with pytest.raises(CheckpointError, match="no config.json"):
        ModelConfig.from_dir(tmp_path / "nowhere")


def test_round_trip_through_hf_dict():
    c = ModelConfig.from_hf_dict(QWEN3)
    assert ModelConfig.from_hf_dict(json.loads(json.dumps(c.to_hf_dict()))) == c
