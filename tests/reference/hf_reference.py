"""An independent float64 implementation of the Hugging Face decoder forward pass.

Written from the transformers modeling code of Llama, Mistral, Qwen2 and Qwen3 (not from
pdserve's C++), in numpy, without a KV cache: every call recomputes the whole sequence. It is
the yardstick for tests/reference/test_parity.py.
"""

import json
import math
import os
import struct

import numpy as np


def _read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin:base + end]
        shape = info["shape"]
        dtype = info["dtype"]
        if dtype == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        tensors[name] = arr.astype(np.float64).reshape(shape)
    return tensors


def load_lora(adapter_dir):
    """A PEFT LoRA adapter as {base weight name: (A, B, scale)}: the projection's output becomes
    W x + scale * B (A x) (peft.tuners.lora.Linear.forward, dropout off)."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        c = json.load(f)
    r = c["r"]
    alpha = c.get("lora_alpha", 8)
    scale = alpha / math.sqrt(r) if c.get("use_rslora") else alpha / r
    tensors = _read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    out = {}
    for name, a in tensors.items():
        if not name.endswith(".lora_A.weight"):
            continue
        module = name[:-len(".lora_A.weight")]
        b = tensors[module + ".lora_B.weight"]
        assert module.startswith("base_model.model."), name
        out[module[len("base_model.model."):] + ".weight"] = (a, b, scale)
    return out


def load_weights(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(_read_safetensors(os.path.join(model_dir, shard)))
        return tensors
    return _read_safetensors(os.path.join(model_dir, "model.safetensors"))


class Config:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.arch = c["architectures"][0]
        self.hidden = c["hidden_size"]
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads") or self.heads
        default_hd = 128 if self.arch == "Qwen3ForCausalLM" else self.hidden // self.heads
        self.head_dim = c.get("head_dim") or default_hd
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.theta = c.get("rope_theta", 10000.0)
        self.rope_scaling = c.get("rope_scaling")
        self.tie = c.get("tie_word_embeddings", False)
        self.qkv_bias = self.arch == "Qwen2ForCausalLM" or (
            self.arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and c.get("attention_bias", False))
        self.o_bias = self.arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and c.get("attention_bias", False)
        self.mlp_bias = self.arch == "LlamaForCausalLM" and c.get("mlp_bias", False)
        self.qk_norm = self.arch == "Qwen3ForCausalLM"
        self.window = None
        if self.arch == "MistralForCausalLM":
            self.window = c["sliding_window"] if "sliding_window" in c else 4096


def inv_frequencies(cfg):
    d = cfg.head_dim
    inv = 1.0 / (cfg.theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = cfg.rope_scaling
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv / rs["factor"]
    if kind == "llama3":
        factor = rs["factor"]
        low = rs["low_freq_factor"]
        high = rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wavelen = old / low
        high_wavelen = old / high
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled)
    if kind in (None, "default"):
        return inv
    raise ValueError(f"rope type {kind}")


def rms_norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def bf16_round(a):
    """Round float64 values to bfloat16 (through float32, nearest even), as a bf16 KV pool does."""
    f = np.asarray(a, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def kv_quantize(a, levels):
    """Symmetric quantization of each row (last axis) as an int8/int4 KV pool stores it: the row's
    f32 values, scale = max|x| / levels, codes rounded half to even; returns codes x scale."""
    f = np.asarray(a, dtype=np.float32).astype(np.float64)
    amax = np.max(np.abs(f), axis=-1, keepdims=True)
    safe = np.where(amax > 0, amax, 1.0)
    codes = np.clip(np.round(f * (levels / safe)), -levels, levels)
    scale = (amax / levels).astype(np.float32).astype(np.float64)
    return codes * scale


KV_ROUNDING = {"f32": lambda a: a, "bf16": bf16_round,
               "int8": lambda a: kv_quantize(a, 127), "int4": lambda a: kv_quantize(a, 7)}


def perplexity(cfg, w, stream, window, act_blocks=None, lora=None):
    """exp of the mean negative log-likelihood of `stream`, read in windows of `window` tokens (each
    window's first token predicts nothing), through forward() (act_blocks and lora as there)."""
    total, count = 0.0, 0
    for start in range(0, len(stream) - 1, window):
        chunk = stream[start:start + window]
        if len(chunk) < 2:
            break
        logits = forward(cfg, w, chunk[:-1], act_blocks=act_blocks, lora=lora)
        logits = logits - logits.max(axis=-1, keepdims=True)
        logz = np.log(np.exp(logits).sum(axis=-1))
        total -= float(np.sum(logits[np.arange(len(chunk) - 1), chunk[1:]] - logz))
        count += len(chunk) - 1
    return math.exp(total / count), count


def quantize_activations(x, block, site=None, ties=None, flips=()):
    """x as pdserve's integer kernels for quantized weights read it (kernels/cpu/linear_quant.h,
    QuantizeActivations), in float32 as they compute it: per block of `block` elements
    d = max|x| / 127 and codes rint(clip(x * (127 / max|x|), -127, 127)) (ties to even); returns
    d * codes in float64.

    The engine's activations differ from these float64 ones in their last bits, so a code within a
    hair of a rounding boundary may round the other way there. `ties` (a list) collects such codes
    as (site, flat index), site naming this call; a code listed in `flips` rounds the other way."""
    x32 = np.asarray(x, dtype=np.float32)
    blocks = x32.reshape(*x32.shape[:-1], x32.shape[-1] // block, block)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    scaled = np.clip(blocks * inv, np.float32(-127), np.float32(127))
    codes = np.rint(scaled).reshape(-1)
    if ties is not None:
        frac = (np.asarray(x, dtype=np.float64).reshape(blocks.shape) * inv).reshape(-1)
        near = np.nonzero(np.abs(frac - np.floor(frac) - 0.5) < TIE_WINDOW)[0]
        ties.extend((site, int(i)) for i in near)
    for s, i in flips:
        if s == site:
            v = scaled.reshape(-1)[i]
            codes[i] = np.floor(v) if codes[i] > v else np.ceil(v)
    d = amax / np.float32(127)
    return (codes.reshape(blocks.shape).astype(np.float64) * d.astype(np.float64)).reshape(x32.shape)


# A code is a tie candidate when its float64 value lies this close (in code units) to a rounding
# boundary: the engine's float32 activations differ from the reference's by ~1e-6 relative, at
# most ~1e-4 of a code unit at |code| = 127.
TIE_WINDOW = 5e-4


def forward(cfg, w, tokens, kv="f32", compute_bf16=False, act_blocks=None, ties=None, flips=(),
            lora=None):
    """Logits [len(tokens), vocab] in float64. kv: the KV pool dtype whose rounding K and V get
    (f32: none). compute_bf16: every linear layer's input and weights rounded to bf16 first
    (pdserve --compute-dtype bf16; the products and sums stay exact here), and attention's too:
    q, K and V rounded to bf16, and the softmax's unnormalised exp(s - max) rounded to bf16 before
    it weights V (its sum, which divides, is not). act_blocks: {weight name: block} for quantized
    weights, whose input is quantized as the engine's integer kernels quantize it (ties and flips
    as quantize_activations has them; a site is the number of the quantization in the pass, so
    sites order as the layers do). lora: load_lora's adapter, its terms from the layer's input (in
    f32 by pdserve, or with compute_bf16 from bf16 roundings as its bf16 path makes them)."""
    act_blocks = act_blocks or {}
    sites = iter(range(1 << 30))

    def quantize(x, name):
        return quantize_activations(x, act_blocks[name], next(sites), ties, flips)

    def lin(x, name):
        delta = 0.0
        if lora and name in lora:
            a, b, scale = lora[name]
            if compute_bf16:
                # pdserve's bf16 path: the rounded input, A and scale * B (scaled in f32) in bf16,
                # and A x rounded to bf16 before the expand.
                t = bf16_round(bf16_round(x) @ bf16_round(a).T)
                delta = t @ bf16_round((b * scale).astype(np.float32)).T
            else:
                delta = scale * ((x @ a.T) @ b.T)
        if name in act_blocks:
            x = quantize(x, name)
        if compute_bf16:
            return bf16_round(x) @ bf16_round(w[name]).T + delta
        return x @ w[name].T + delta

    tokens = np.asarray(tokens)
    t = len(tokens)
    nh, nkv, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
    x = w["model.embed_tokens.weight"][tokens]
    pos = np.arange(t, dtype=np.float64)
    freqs = np.outer(pos, inv_frequencies(cfg))
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    causal = np.tril(np.ones((t, t), dtype=bool))
    if cfg.window is not None:
        # Mistral: query at p sees keys j with p - j < window.
        causal &= ~np.tril(np.ones((t, t), dtype=bool), k=-cfg.window)
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.eps)
        q = lin(h, p + "self_attn.q_proj.weight")
        k = lin(h, p + "self_attn.k_proj.weight")
        v = lin(h, p + "self_attn.v_proj.weight")
        if cfg.qkv_bias:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q = q.reshape(t, nh, hd)
        k = k.reshape(t, nkv, hd)
        v = v.reshape(t, nkv, hd)
        if cfg.qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = KV_ROUNDING[kv](k)
        v = KV_ROUNDING[kv](v)
        if compute_bf16:
            q = bf16_round(q)
            if kv in ("f32", "bf16"):  # Quantized pools' codes are exact in bf16.
                k = bf16_round(k)
                v = bf16_round(v)
        group = nh // nkv
        k = np.repeat(k, group, axis=1)  # transformers' repeat_kv: head h uses kv head h // group
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        scores = np.where(causal[None], scores, -np.inf)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        total = probs.sum(axis=-1, keepdims=True)
        if compute_bf16:
            probs = bf16_round(probs)
        probs /= total
        attn = np.einsum("hts,shd->thd", probs, v).reshape(t, nh * hd)
        o = lin(attn, p + "self_attn.o_proj.weight")
        if cfg.o_bias:
            o = o + w[p + "self_attn.o_proj.bias"]
        x = x + o
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.eps)
        gate = lin(h, p + "mlp.gate_proj.weight")
        up = lin(h, p + "mlp.up_proj.weight")
        if cfg.mlp_bias:
            gate = gate + w[p + "mlp.gate_proj.bias"]
            up = up + w[p + "mlp.up_proj.bias"]
        act = gate / (1.0 + np.exp(-gate)) * up
        down = lin(act, p + "mlp.down_proj.weight")
        if cfg.mlp_bias:
            down = down + w[p + "mlp.down_proj.bias"]
        x = x + down
    x = rms_norm(x, w["model.norm.weight"], cfg.eps)
    head_name = "model.embed_tokens.weight" if cfg.tie and "lm_head.weight" not in w else "lm_head.weight"
    if "lm_head.weight" in act_blocks:
        x = quantize(x, "lm_head.weight")
    head = w[head_name]
    return bf16_round(x) @ bf16_round(head).T if compute_bf16 else x @ head.T
