"""A model whose greedy output follows a script, for tests of what clients see when a model emits
a given token sequence (tool calls). Real weights run by the real engine, not a mock of it:

  - `pdserve make-model` writes a one-layer llama and its byte-level tokenizer; each piece of the
    script (and the chat template's last prompt token) becomes an added token of the tokenizer;
  - every projection is zero, so the residual stream is the token's embedding: token a gets the
    one-hot row e_slot(a), and lm_head's row for the token that follows a is 8 * e_slot(a), so the
    logits after a peak (8 * sqrt(hidden) above the rest) at its successor, whatever the position;
  - the script's tokens are distinct, each with one successor, and the last is followed by EOS.

  make_scripted_model(pdserve, dir, "<|assistant|>", ["<tool_call>", ...]) -> chat template path
"""
import json
import os
import struct
import subprocess

import numpy as np

# The chat template: each message as <|role|>content, then prompt_end.
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}PROMPT_END{% endif %}")


def read_safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())


def make_scripted_model(pdserve, out_dir, prompt_end, pieces, special=()):
    """Writes the model into out_dir and its chat template beside it; returns the template's path.
    After a prompt ending in prompt_end, greedy decoding emits pieces in order, then EOS. Pieces
    in `special` are special tokens (skip_special_tokens leaves them out of the text)."""
    subprocess.run([pdserve, "make-model", out_dir, "--arch", "llama", "--layers", "1", "--hidden", "64",
                    "--vocab", "300", "--seed", "1"], check=True, capture_output=True)
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(out_dir, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    base = config["vocab_size"]
    contents = [prompt_end] + list(pieces)
    if len(set(contents)) != len(contents):
        raise ValueError("script pieces must be distinct (each has one successor)")
    ids = {}
    for i, content in enumerate(contents):
        ids[content] = base + i
        tokenizer["added_tokens"].append({"id": base + i, "content": content, "single_word": False,
                                          "lstrip": False, "rstrip": False, "normalized": False,
                                          "special": content in special})
    vocab = base + len(contents)
    config["vocab_size"] = vocab
    hidden = config["hidden_size"]
    seq = [ids[c] for c in contents] + [config["eos_token_id"]]
    if len(seq) - 1 > hidden:
        raise ValueError(f"a script of {len(seq) - 1} steps needs hidden >= that")
    embed = np.zeros((vocab, hidden), np.float32)
    lm_head = np.zeros((vocab, hidden), np.float32)
    for slot, (a, b) in enumerate(zip(seq, seq[1:])):
        embed[a, slot] = 1.0
        lm_head[b, slot] = 8.0
    path = os.path.join(out_dir, "model.safetensors")
    tensors = {}
    for name, meta in read_safetensors_header(path).items():
        if name == "__metadata__":
            continue
        shape = tuple(meta["shape"])
        if name == "model.embed_tokens.weight":
            tensors[name] = embed
        elif name == "lm_head.weight":
            tensors[name] = lm_head
        elif name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, np.float32)
        else:
            tensors[name] = np.zeros(shape, np.float32)
    write_safetensors(path, tensors)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    template = os.path.join(out_dir, "chat_template.jinja")
    with open(template, "w") as f:
        f.write(TEMPLATE.replace("PROMPT_END", prompt_end))
    return template
