"""Reference fixtures from Hugging Face transformers + torch, on the CPU.

For each case: a tiny random model of one family, saved by `save_pretrained`
(config.json in transformers 5's layout and model.safetensors as written), the
same config in transformers 4's layout (config.v4.json: `rope_theta` and
`rope_scaling` at the top, `torch_dtype`), and reference.safetensors: the
input ids, the labels, the logits, the loss and every parameter's gradient
(`grad.` + the parameter's name in the model), in f32, computed by
`model(input_ids, labels=labels)` in eval mode (no dropout) and `loss.backward()`.

Run through scripts/hf-fixtures.sh, which pins the versions. The outputs are
committed under crates/models/tests/fixtures/hf/; `cargo test` reads them without Python.
"""

import json
import shutil
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "crates/models/tests/fixtures/hf")

DECODER = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=64)

CASES = {
    # grouped-query attention, Llama 3's scaling at theta 5e5, a tied head, a padding id in the data
    "llama3-tied": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(
        DECODER, num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=0,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=16))),
    # an untied head, linear scaling, every bias
    "llama-untied-linear": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(
        DECODER, num_key_value_heads=4, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0))),
    # one kv head, a window longer than the sequence, theta 1e6
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(
        DECODER, num_key_value_heads=1, sliding_window=4096, head_dim=8,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # q/k/v biases, a tied head, YaRN
    "qwen2-yarn": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(
        DECODER, num_key_value_heads=2, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                             original_max_position_embeddings=16))),
    # q/k norms, a head_dim that is not hidden / heads, dynamic NTK
    "qwen3-dynamic": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(
        DECODER, num_key_value_heads=2, head_dim=12, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="dynamic", rope_theta=1000000.0, factor=2.0))),
    "gpt2-tied": (transformers.GPT2Config, transformers.GPT2LMHeadModel, dict(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "gpt2-untied": (transformers.GPT2Config, transformers.GPT2LMHeadModel, dict(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, tie_word_embeddings=False)),
    "bert-mlm": (transformers.BertConfig, transformers.BertForMaskedLM, dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, pad_token_id=0)),
    "bert-mlm-untied": (transformers.BertConfig, transformers.BertForMaskedLM, dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, pad_token_id=0, tie_word_embeddings=False)),
    "bert-classifier": (transformers.BertConfig, transformers.BertForSequenceClassification, dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, pad_token_id=0, num_labels=3)),
    # norms after attention and the MLP, q/k norms over the whole projection, grouped-query attention
    "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM, dict(
        DECODER, num_key_value_heads=2, tie_word_embeddings=False, pad_token_id=0,
        rope_parameters=dict(rope_type="default", rope_theta=500000.0))),
    # a sliding window shorter than the sequence on every layer
    "mistral-window": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(
        DECODER, num_key_value_heads=2, sliding_window=4, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # a window on the layers layer_types names (the second), not the others
    "qwen2-window": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(
        DECODER, num_key_value_heads=2, tie_word_embeddings=True, use_sliding_window=True, sliding_window=3,
        max_window_layers=1, layer_types=["full_attention", "sliding_attention"],
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # embeddings times sqrt(hidden), norms of 1 + weight before and after attention and the MLP, GeGLU,
    # a head_dim of its own, its query scalar, both soft caps low enough to bite, a window of 4 on
    # every other layer (the first), the head tied
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM, dict(
        DECODER, num_key_value_heads=2, head_dim=12, query_pre_attn_scalar=10, sliding_window=4,
        attn_logit_softcapping=1.5, final_logit_softcapping=2.0, tie_word_embeddings=True, pad_token_id=0,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Gemma 2's decoder without soft caps, q/k norms of 1 + weight on each head, a sliding layer then
    # a full one, each with its own rotary base (the full one's scaled)
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, dict(
        DECODER, num_key_value_heads=2, head_dim=12, query_pre_attn_scalar=10, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True, pad_token_id=0,
        rope_parameters={"full_attention": dict(rope_type="linear", factor=2.0, rope_theta=1000000.0),
                         "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})),
    # q/k/v and gate/up each one projection, three quarters of each head rotating (Phi-4 mini's share),
    # LongRoPE past 8 positions (the 9 tokens take the long factors), every layer within a window of 5
    "phi3-longrope": (transformers.Phi3Config, transformers.Phi3ForCausalLM, dict(
        DECODER, num_key_value_heads=2, sliding_window=5, tie_word_embeddings=False, pad_token_id=0,
        original_max_position_embeddings=8,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                             short_factor=[1.0, 1.5, 2.0], long_factor=[2.0, 4.0, 9.0]))),
    # the same within its original positions: the short factors, every dimension rotating
    "phi3-short": (transformers.Phi3Config, transformers.Phi3ForCausalLM, dict(
        DECODER, num_key_value_heads=4, tie_word_embeddings=False, pad_token_id=0,
        original_max_position_embeddings=16,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                             short_factor=[1.0, 1.2, 1.5, 3.0], long_factor=[2.0, 3.0, 5.0, 8.0]))),
    # a mixture of 4 SwiGLU experts in every layer, each token to its top 2, renormalized
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM, dict(
        DECODER, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # q/k norms, 6 experts of their own width, 3 a token renormalized, the first of 3 layers dense
    "qwen3-moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, dict(
        DECODER, num_hidden_layers=3, num_key_value_heads=2, num_experts=6, num_experts_per_tok=3,
        moe_intermediate_size=16, norm_topk_prob=True, mlp_only_layers=[0], tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # every other layer sparse (the second), the chosen probabilities as they are (not renormalized)
    "qwen3-moe-step": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, dict(
        DECODER, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
        norm_topk_prob=False, decoder_sparse_step=2, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # q/k/v biases, 6 experts, 2 a token, and a shared expert of its own width behind a sigmoid gate
    "qwen2-moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM, dict(
        DECODER, num_key_value_heads=2, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=40, norm_topk_prob=False, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # the routers' load-balancing loss added at a weight that shows (output_router_logits)
    "mixtral-aux": (transformers.MixtralConfig, transformers.MixtralForCausalLM, dict(
        DECODER, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
        output_router_logits=True, router_aux_loss_coef=0.5,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # the same over the sparse layers alone (the first of 3 dense)
    "qwen3-moe-aux": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, dict(
        DECODER, num_hidden_layers=3, num_key_value_heads=2, num_experts=6, num_experts_per_tok=3,
        moe_intermediate_size=16, norm_topk_prob=True, mlp_only_layers=[0], tie_word_embeddings=False,
        output_router_logits=True, router_aux_loss_coef=0.3,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
}


def checkpoint_gradients(model, name: str, grad: torch.Tensor) -> dict:
    """A gradient under the checkpoint's names: transformers 5 keeps a mixture's
    experts as one 3D parameter each for gate-up and down, and saves them per
    expert (Mixtral's `block_sparse_moe.experts.N.w1/w3/w2`, Qwen's
    `mlp.experts.N.gate_proj/up_proj/down_proj`); the rest as it is."""
    mixtral = model.config.model_type == "mixtral"
    module = "block_sparse_moe" if mixtral else "mlp"
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    if name.endswith("mlp.experts.gate_up_proj"):
        stem = name[: -len("mlp.experts.gate_up_proj")] + f"{module}.experts"
        half = grad.shape[1] // 2
        out = {}
        for e in range(grad.shape[0]):
            out[f"{stem}.{e}.{gate}.weight"] = grad[e, :half]
            out[f"{stem}.{e}.{up}.weight"] = grad[e, half:]
        return out
    if name.endswith("mlp.experts.down_proj"):
        stem = name[: -len("mlp.experts.down_proj")] + f"{module}.experts"
        return {f"{stem}.{e}.{down}.weight": grad[e] for e in range(grad.shape[0])}
    if mixtral and name.endswith("mlp.gate.weight"):
        return {name.replace("mlp.gate.weight", "block_sparse_moe.gate.weight"): grad}
    return {name: grad}


def v4_layout(config: dict) -> dict:
    """The same config as transformers 4 wrote it: `rope_theta` and
    `rope_scaling` at the top level, `torch_dtype` for `dtype`."""
    config = dict(config)
    rope = config.pop("rope_parameters", None)
    if rope is not None and "full_attention" in rope:
        # Gemma 3: the full layers' base and scaling at the top, the sliding layers' base beside
        full, local = dict(rope["full_attention"]), rope["sliding_attention"]
        config["rope_theta"] = full.pop("rope_theta")
        config["rope_local_base_freq"] = local["rope_theta"]
        config["rope_scaling"] = None if full.get("rope_type", "default") == "default" else full
    elif rope is not None:
        rope = dict(rope)
        config["rope_theta"] = rope.pop("rope_theta", 10000.0)
        config["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    if "dtype" in config:
        config["torch_dtype"] = config.pop("dtype")
    config["transformers_version"] = "4.57.1"
    return config


def main():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1234)
    for name, (config_class, model_class, settings) in CASES.items():
        config = config_class(**settings)
        model = model_class(config).float()
        with torch.no_grad():
            # every tensor away from its initial constant, so that a norm or bias read wrong shows
            for parameter in model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
        model.eval()
        folder = OUT / name
        if folder.exists():
            shutil.rmtree(folder)
        model.save_pretrained(folder)
        (folder / "generation_config.json").unlink(missing_ok=True)  # generation only
        saved = json.loads((folder / "config.json").read_text())
        (folder / "config.v4.json").write_text(json.dumps(v4_layout(saved), indent=2) + "\n")

        ids = torch.randint(0, config.vocab_size, (2, 9), generator=generator)
        ids[0, 3] = 0  # the padding id (where a config has one): no gradient for its embedding row
        if isinstance(model, transformers.BertForMaskedLM):
            labels = torch.full_like(ids, -100)
            for row, col in [(0, 1), (0, 4), (1, 0), (1, 5), (1, 8)]:
                labels[row, col] = ids[row, col]
                ids[row, col] = 3  # the mask token
        elif isinstance(model, transformers.BertForSequenceClassification):
            labels = torch.tensor([2, 0])
        else:
            labels = ids.clone()
            labels[1, 6] = -100  # an ignored position
        output = model(input_ids=ids, labels=labels)
        output.loss.backward()
        tensors = {
            "input_ids": ids.contiguous(),
            "labels": labels.contiguous(),
            "logits": output.logits.detach().float().contiguous(),
            "loss": output.loss.detach().float().reshape(1),
        }
        for parameter_name, parameter in model.named_parameters():
            if parameter.grad is not None:
                for saved, grad in checkpoint_gradients(model, parameter_name, parameter.grad).items():
                    tensors[f"grad.{saved}"] = grad.float().contiguous()
        tensors["num_parameters"] = torch.tensor([model.num_parameters()], dtype=torch.int64)
        save_file(tensors, folder / "reference.safetensors",
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__})
        print(f"{name}: {model.num_parameters()} parameters, loss {output.loss.item():.6f}")


if __name__ == "__main__":
    main()
