"""Random LoRA adapters in Hugging Face PEFT's layout, written with numpy (not by pdserve): the
fixture of the LoRA parity and end-to-end tests."""

import json
import os

import numpy as np

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_lora(path, model_dir, rank=8, alpha=16, rslora=False, targets=ALL_TARGETS, dtype="F32", seed=0,
               b_std=0.1):
    """A random adapter for the model at model_dir: adapter_config.json and
    adapter_model.safetensors in PEFT's layout and names."""
    rng = np.random.default_rng(seed)
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    hidden, intermediate, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    layers = c["num_hidden_layers"]
    shapes = {"q_proj": (heads * head_dim, hidden),
              "k_proj": (kv_heads * head_dim, hidden),
              "v_proj": (kv_heads * head_dim, hidden),
              "o_proj": (hidden, heads * head_dim),
              "gate_proj": (intermediate, hidden),
              "up_proj": (intermediate, hidden),
              "down_proj": (hidden, intermediate)}
    tensors = {}
    for layer in range(layers):
        for t in targets:
            out, inp = shapes[t]
            block = "self_attn" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            p = f"base_model.model.model.layers.{layer}.{block}.{t}."
            tensors[p + "lora_A.weight"] = rng.normal(0, 1 / np.sqrt(inp), (rank, inp))
            tensors[p + "lora_B.weight"] = rng.normal(0, b_std, (out, rank))
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        if dtype == "F32":
            raw = a.astype("<f4").tobytes()
        else:  # BF16: round to nearest even from f32
            bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
            raw = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    os.makedirs(path, exist_ok=True)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(path, "adapter_model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "use_rslora": rslora,
                   "target_modules": targets, "bias": "none", "base_model_name_or_path": "random",
                   "task_type": "CAUSAL_LM"}, f)
