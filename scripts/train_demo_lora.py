#!/usr/bin/python3
"""Trains pdserve's demo LoRA adapter: rank 8 on every projection of the demo model
(models/pdserve-demo), on the Book of Psalms, saved in Hugging Face PEFT's layout
(adapter_config.json, adapter_model.safetensors) under models/pdserve-demo-lora. Run once by
hand, never in CI (minutes on 2 cores); the result is committed. Needs what
scripts/train_demo_model.py needs (`scripts/setup.sh --train`: Debian's python3-torch, the KJV).
    /usr/bin/python3 scripts/train_demo_lora.py --pdserve build/pdserve --out models/pdserve-demo-lora

The base model stays frozen; each projection's output becomes W x + (alpha / r) B (A x), A
initialised as PEFT does (Kaiming-uniform), B at zero, trained by AdamW with a fixed seed on
random windows of the training psalms. Held out: the psalms the base model never saw either (its
held-out chapters, every 40th of the Bible: Psalms 2, 42, 82 and 122), so their perplexity under
the base model and under the adapter (the same windows, in training.json) says what the adapter
learnt of the Psalms beyond what the base knew; tests/demo_model/test_demo_model.py recomputes
both from the committed files.
"""
import argparse
import json
import math
import os
import random
import struct
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_demo_model as base  # noqa: E402

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraLinear(torch.nn.Module):
    """A frozen nn.Linear plus scale * B (A x), as peft.tuners.lora.Linear (dropout 0)."""

    def __init__(self, linear, r, alpha):
        super().__init__()
        self.base = linear
        self.scale = alpha / r
        self.lora_A = torch.nn.Parameter(torch.empty(r, linear.in_features))
        self.lora_B = torch.nn.Parameter(torch.zeros(linear.out_features, r))
        torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x):
        return self.base(x) + self.scale * ((x @ self.lora_A.T) @ self.lora_B.T)


def load_base(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    model = base.Model(c)
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = torch.frombuffer(bytearray(data[8 + n + b:8 + n + e]), dtype=torch.int16)
        tensors[name] = raw.view(torch.bfloat16).float().reshape(info["shape"])
    state = base.hf_state_dict(model)
    for name, t in state.items():
        t.copy_(tensors[name])
    for p in model.parameters():
        p.requires_grad_(False)
    return model, c


def write_held_out(path):
    """The held-out psalms as heldout.txt: each a label line, its verses, a blank line."""
    with open(path, "w") as f:
        for index, (label, text) in enumerate(base.read_chapters()):
            if label.startswith("Psa") and index % base.HELD_OUT_EVERY == base.HELD_OUT_EVERY - 1:
                f.write(f"{label}\n{text}\n")


def psalm_streams(pdserve, tokenizer_dir):
    """(training psalms' tokens, held-out psalms' tokens, the held-out labels); each psalm's
    verses tokenized without BOS or EOS, psalms concatenated."""
    chapters = base.read_chapters()
    psalms = [(i, label, text) for i, (label, text) in enumerate(chapters) if label.startswith("Psa")]
    assert len(psalms) == 150, len(psalms)
    ids = base.tokenize(pdserve, tokenizer_dir, [text for _, _, text in psalms])
    train, held, labels = [], [], []
    for (index, label, _), chapter in zip(psalms, ids):
        if index % base.HELD_OUT_EVERY == base.HELD_OUT_EVERY - 1:  # Held out from the base too.
            held.extend(chapter)
            labels.append(label)
        else:
            train.extend(chapter)
    return train, held, labels


def write_adapter(out, model, c, r, alpha, model_dir):
    tensors = {}
    for i, layer in enumerate(model.layers):
        for t in TARGETS:
            block = "self_attn" if t in TARGETS[:4] else "mlp"
            p = f"base_model.model.model.layers.{i}.{block}.{t}."
            m = getattr(layer, t)
            tensors[p + "lora_A.weight"] = m.lora_A.detach().float().contiguous()
            tensors[p + "lora_B.weight"] = m.lora_B.detach().float().contiguous()
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        raw = tensors[name].numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(out, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": os.path.basename(model_dir),
              "r": r, "lora_alpha": alpha, "lora_dropout": 0.0, "use_rslora": False, "use_dora": False,
              "bias": "none", "fan_in_fan_out": False, "target_modules": list(TARGETS), "modules_to_save": None}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", default="build/pdserve")
    ap.add_argument("--model", default="models/pdserve-demo")
    ap.add_argument("--out", default="models/pdserve-demo-lora")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    torch.set_num_threads(os.cpu_count())
    model, c = load_base(a.model)
    train, held, held_labels = psalm_streams(a.pdserve, a.model)
    window = a.seq_len
    base_ppl, predicted = base.held_out_perplexity(model, held, window)
    for layer in model.layers:
        for t in TARGETS:
            setattr(layer, t, LoraLinear(getattr(layer, t), a.rank, a.alpha))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps)))
    start = time.time()
    losses = []
    for step in range(a.steps):
        starts = [rng.randrange(0, len(train) - window - 1) for _ in range(a.batch)]
        batch = torch.tensor([train[s:s + window + 1] for s in starts])
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == a.steps - 1:
            ppl, _ = base.held_out_perplexity(model, held, window)
            print(f"step {step} loss {loss.item():.4f} held-out perplexity {ppl:.3f} "
                  f"({time.time() - start:.0f} s)", flush=True)
    lora_ppl, _ = base.held_out_perplexity(model, held, window)
    os.makedirs(a.out, exist_ok=True)
    write_adapter(a.out, model, c, a.rank, a.alpha, a.model)
    write_held_out(os.path.join(a.out, "heldout.txt"))
    record = {
        "command": " ".join(["/usr/bin/python3", "scripts/train_demo_lora.py"] + sys.argv[1:]),
        "seed": a.seed, "steps": a.steps, "batch": a.batch, "seq_len": a.seq_len, "lr": a.lr,
        "rank": a.rank, "lora_alpha": a.alpha, "targets": list(TARGETS),
        "trainable_parameters": sum(p.numel() for p in params),
        "train_tokens": len(train), "held_out_tokens": len(held),
        "held_out_psalms": held_labels, "held_out_window": window,
        "held_out_predicted_tokens": predicted,
        "held_out_perplexity_base": base_ppl, "held_out_perplexity_adapter": lora_ppl,
        "final_train_loss": sum(losses[-20:]) / len(losses[-20:]),
        "train_seconds": round(time.time() - start), "torch": torch.__version__,
    }
    with open(os.path.join(a.out, "training.json"), "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
