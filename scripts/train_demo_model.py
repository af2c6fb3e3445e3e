#!/usr/bin/python3
"""Trains pdserve's demo model: a small Llama-architecture model on the King James Bible.

Run once by hand, never in CI (about 50 minutes on 2 cores); the result is committed under
models/pdserve-demo/. Installs nothing itself: `scripts/setup.sh --train` adds Debian's
python3-torch (1.13) and the KJV text to what building needs.

    scripts/setup.sh --train
    scripts/build.sh
    /usr/bin/python3 scripts/train_demo_model.py --pdserve build/pdserve --out models/pdserve-demo --steps 1500

Steps: corpus from `bible` (verse references stripped, one verse a line, one chapter a document);
every 40th chapter held out; a byte-level BPE tokenizer trained on the training chapters by
pdserve's own trainer (`pdserve train-tokenizer`); token ids from `pdserve tokenize`; a Llama
model (RMSNorm, RoPE, GQA, SwiGLU, tied embeddings) trained by AdamW with a fixed seed on random
windows of the training stream; bf16 safetensors, config.json, generation_config.json; the
held-out perplexity of the bf16 weights; the loss curve as TSV and PNG (gnuplot); SHA256SUMS.
"""

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

HELD_OUT_EVERY = 40  # chapter i (0-based) is held out when i % 40 == 39
SPECIAL_TOKENS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def read_chapters():
    """[(book chapter label, text)] in canonical order; text is the verses, one a line."""
    out = subprocess.run(["bible", "-f", "Ge1:1-Re22:21"], check=True, capture_output=True,
                         text=True).stdout
    chapters, labels = [], []
    verse_re = re.compile(r"^(\w+?)(\d+):(\d+) (.*)$")
    for line in out.splitlines():
        m = verse_re.match(line)
        if not m:
            if line.strip():
                raise SystemExit(f"unexpected line from bible: {line!r}")
            continue
        label = f"{m.group(1)}{m.group(2)}"
        if not labels or labels[-1] != label:
            labels.append(label)
            chapters.append([])
        chapters[-1].append(m.group(4).strip())
    return [(label, "\n".join(verses) + "\n") for label, verses in zip(labels, chapters)]


def tokenize(pdserve, tokenizer_dir, texts):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
        path = f.name
    out = subprocess.run([pdserve, "tokenize", "--tokenizer", tokenizer_dir, "--input-jsonl", path],
                         check=True, capture_output=True, text=True).stdout
    os.unlink(path)
    ids = [json.loads(line)["token_ids"] for line in out.splitlines()]
    assert len(ids) == len(texts)
    return ids


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        h, hd = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.input_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.q_proj = torch.nn.Linear(h, self.nh * hd, bias=False)
        self.k_proj = torch.nn.Linear(h, self.nkv * hd, bias=False)
        self.v_proj = torch.nn.Linear(h, self.nkv * hd, bias=False)
        self.o_proj = torch.nn.Linear(self.nh * hd, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.gate_proj = torch.nn.Linear(h, c["intermediate_size"], bias=False)
        self.up_proj = torch.nn.Linear(h, c["intermediate_size"], bias=False)
        self.down_proj = torch.nn.Linear(c["intermediate_size"], h, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.nh // self.nkv
        k = k.repeat_interleave(group, dim=1)  # query head i uses kv head i // group
        v = v.repeat_interleave(group, dim=1)
        # Written out: torch 1.13 has no scaled_dot_product_attention.
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, self.nh * self.hd))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = torch.nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        hd = c["head_dim"]
        self.register_buffer("inv_freq", 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)),
                             persistent=False)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # GPT-2's scaling of the projections that write into the residual stream.
                scale = 1.0 / math.sqrt(2 * c["num_hidden_layers"]) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
                torch.nn.init.normal_(p, std=std * scale)

    def forward(self, ids):
        t = ids.shape[1]
        freqs = torch.outer(torch.arange(t, dtype=torch.float32), self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        mask = torch.full((t, t), float("-inf")).triu(1)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x) @ self.embed_tokens.weight.T  # tied embeddings


def hf_state_dict(model):
    """Hugging Face names (LlamaForCausalLM, tied: no lm_head.weight)."""
    out = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = layer.input_layernorm.weight
        out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{n}.weight"] = getattr(layer, n).weight
        for n in ("gate_proj", "up_proj", "down_proj"):
            out[p + f"mlp.{n}.weight"] = getattr(layer, n).weight
    return {k: v.detach() for k, v in out.items()}


def write_safetensors_bf16(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


@torch.no_grad()
def held_out_perplexity(model, stream, window):
    """exp(mean NLL) over non-overlapping windows of `window` tokens, each read from its start:
    the definition tests/demo_model/test_demo_model.py recomputes with the numpy reference."""
    total, count = 0.0, 0
    for start in range(0, len(stream) - 1, window):
        chunk = torch.tensor(stream[start:start + window])[None]
        if chunk.shape[1] < 2:
            break
        logits = model(chunk)[0, :-1].double()
        total += F.cross_entropy(logits, chunk[0, 1:], reduction="sum").item()
        count += chunk.shape[1] - 1
    return math.exp(total / count), count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdserve", default="build/pdserve")
    ap.add_argument("--out", default="models/pdserve-demo")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=100)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    started = time.time()
    os.makedirs(args.out, exist_ok=True)

    chapters = read_chapters()
    train = [c for i, c in enumerate(chapters) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    held = [c for i, c in enumerate(chapters) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    print(f"corpus: {len(chapters)} chapters, {len(train)} train, {len(held)} held out", flush=True)
    work = tempfile.mkdtemp()
    corpus_path = os.path.join(work, "train.txt")
    with open(corpus_path, "w") as f:
        f.write("".join(text for _, text in train))
    template_path = os.path.join(work, "chat_template.jinja")
    with open(template_path, "w") as f:
        f.write(CHAT_TEMPLATE)
    subprocess.run([args.pdserve, "train-tokenizer", "--corpus", corpus_path, "--vocab", str(args.vocab),
                    "--special-tokens", ",".join(SPECIAL_TOKENS), "--chat-template", template_path,
                    args.out], check=True)
    tok = json.load(open(os.path.join(args.out, "tokenizer.json")))
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    bos, eos, eot = special["<|begin_of_text|>"], special["<|end_of_text|>"], special["<|eot_id|>"]

    def stream_of(chs):
        out = []
        for ids in tokenize(args.pdserve, args.out, [text for _, text in chs]):
            out += [bos] + ids + [eos]
        return out

    train_stream, held_stream = stream_of(train), stream_of(held)
    print(f"tokens: {len(train_stream)} train, {len(held_stream)} held out "
          f"({sum(len(t) for _, t in train) / len(train_stream):.2f} bytes/token)", flush=True)
    with open(os.path.join(args.out, "heldout.txt"), "w") as f:
        f.write("".join(f"{label}\n{text}\n" for label, text in held))
    words = sorted({w for _, text in chapters for w in re.findall(r"[A-Za-z]+", text.lower())})
    with open(os.path.join(args.out, "words.txt"), "w") as f:
        f.write("\n".join(words) + "\n")

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": args.vocab, "hidden_size": args.hidden, "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "head_dim": args.hidden // args.heads,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False,
        "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "bfloat16",
    }
    model = Model(config)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f} M parameters", flush=True)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    data = torch.tensor(train_stream)
    gen = torch.Generator().manual_seed(args.seed)
    curve = []  # (step, tokens seen, train loss, held-out loss or None)
    t0 = time.time()
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch,), generator=gen)
        batch = torch.stack([data[s:s + args.seq_len + 1] for s in starts.tolist()])
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        held_loss = None
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            ppl, _ = held_out_perplexity(model, held_stream[:8192], args.seq_len)
            model.train()
            held_loss = math.log(ppl)
        curve.append((step, step * args.batch * args.seq_len, loss.item(), held_loss))
        if step % 10 == 0 or held_loss is not None:
            rate = step * args.batch * args.seq_len / (time.time() - t0)
            extra = f" held-out {held_loss:.3f}" if held_loss is not None else ""
            print(f"step {step}/{args.steps} loss {loss.item():.3f}{extra} lr {lr:.2e} {rate:.0f} tok/s", flush=True)
    train_seconds = time.time() - t0

    # The shipped weights are bf16: measure the held-out perplexity of exactly those.
    weights = hf_state_dict(model)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model.eval()
    ppl, predicted = held_out_perplexity(model, held_stream, args.seq_len)
    print(f"held-out perplexity (bf16 weights): {ppl:.4f} over {predicted} tokens", flush=True)

    write_safetensors_bf16(os.path.join(args.out, "model.safetensors"), weights)
    json.dump(config, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": bos, "eos_token_id": [eos, eot], "do_sample": True, "temperature": 0.8,
               "top_p": 0.95}, open(os.path.join(args.out, "generation_config.json"), "w"), indent=2)
    with open(os.path.join(args.out, "loss.tsv"), "w") as f:
        f.write("step\ttokens\ttrain_loss\theld_out_loss\n")
        for step, tokens, tl, hl in curve:
            f.write(f"{step}\t{tokens}\t{tl:.5f}\t{'' if hl is None else f'{hl:.5f}'}\n")
    plot = (f"set terminal png size 800,480; set output '{args.out}/loss.png';"
            "set xlabel 'training tokens (millions)'; set ylabel 'cross-entropy (nats/token)';"
            "set title 'pdserve-demo on the KJV'; set grid; set datafile separator '\\t';"
            f"plot '{args.out}/loss.tsv' every ::1 using ($2/1e6):3 with lines title 'train (batch)',"
            f"     '' every ::1 using ($2/1e6):($4 == 0 ? 1/0 : $4) with linespoints title 'held-out (first 8192 tokens)'")
    subprocess.run(["gnuplot", "-e", plot], check=True)
    command = " ".join(["/usr/bin/python3", "scripts/train_demo_model.py"] + sys.argv[1:])
    training = {
        "command": command, "seed": args.seed, "steps": args.steps, "batch": args.batch,
        "seq_len": args.seq_len, "lr": args.lr, "warmup": args.warmup, "parameters": params,
        "train_tokens": len(train_stream), "held_out_tokens": len(held_stream),
        "tokens_seen": args.steps * args.batch * args.seq_len,
        "held_out_every_nth_chapter": HELD_OUT_EVERY, "held_out_window": args.seq_len,
        "held_out_predicted_tokens": predicted, "held_out_perplexity": ppl,
        "final_train_loss": curve[-1][2], "train_seconds": round(train_seconds),
        "torch": torch.__version__,
        "cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip(),
    }
    json.dump(training, open(os.path.join(args.out, "training.json"), "w"), indent=2)
    sums = []
    for name in sorted(os.listdir(args.out)):
        if name in ("SHA256SUMS",) or name.endswith(".md"):
            continue
        digest = hashlib.sha256(open(os.path.join(args.out, name), "rb").read()).hexdigest()
        sums.append(f"{digest}  {name}\n")
    open(os.path.join(args.out, "SHA256SUMS"), "w").write("".join(sums))
    shutil.rmtree(work)
    print(f"done in {time.time() - started:.0f} s: {args.out}", flush=True)


if __name__ == "__main__":
    main()
