"""Writes the fuzzers' seed corpora into fuzz/corpus/<target>/ (committed; rerun to refresh).

Run: /usr/bin/python3 fuzz/make_corpus.py --pdserve build/pdserve
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
import cluster  # noqa: E402

cluster.stubs_dir()
from pdserve.v1 import generation_pb2 as pb  # noqa: E402


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs += raw
        offset += len(raw)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + blobs


def write_device_transport_corpus(frame):
    """The device transports' control stream: HELLO (layout, identity, handle; offset = the
    sender's pool size), page references (+ source offset), END, a refused reference, ABORT."""
    hello = frame(1, 0, 65536, b"kv_dtype=bf16\0host-shm:0\0handle")
    def ref(tag, dst, n, src):
        return frame(16, tag, dst, b"")[:-8] + struct.pack("<Q", n) + struct.pack("<Q", src)
    stream = hello + ref(1, 0, 1024, 0) + ref(1, 1024, 1024, 4096) + \
        frame(3, 1, 0, struct.pack("<QQQ", 2, 2048, 0)) + ref(2, 100, 64, 0) + frame(4, 2, 0, b"")
    write("device_transport_fuzz", "stream.bin", stream)
    write("device_transport_fuzz", "bad_source.bin", hello + ref(2, 8192, 512, 65536 - 100))


def write_grammar_corpus():
    """Constraint grammars (the syntax of common/structured/grammar_parser.h), each optionally
    followed by a NUL and bytes for the matcher; good ones and ones that must be refused."""
    seeds = {
        "json.gbnf": b'root ::= value\nvalue ::= object | array | string | number | "true" | "false" | "null"\n'
                     b'object ::= "{" ( string ":" value ( "," string ":" value )* )? "}"\n'
                     b'array ::= "[" ( value ( "," value )* )? "]"\n'
                     b'string ::= "\\"" ( [^"\\\\\\x00-\\x1F] | "\\\\" ["\\\\/bfnrt] )* "\\""\n'
                     b'number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )?\n\x00{"a":[1,2.5,"x\\n"]}',
        "repeat.gbnf": b'root ::= "a"{2,4} "b"{3} ("c" | [d-f])+ "g"? ([^a-z\\u00e9] | .)* # comment\n'
                       b'\x00aabbbcdx\xc3\xa9',
        "classes.gbnf": b"root ::= [a-zA-Z\\u03b1-\\u03c9\\U00010000-\\U0001FFFF]{1,3} 'q'\x00\xce\xb1\xf0\x90\x80\x80q",
        "nullable_star.gbnf": b'root ::= ("a"? "b"?)* x\nx ::= "c" | ""\x00abbac',
        "left_recursive.gbnf": b'root ::= root "x" | "y"',
        # Nested nullable repetitions: took minutes a byte before the parser folded them.
        "nested_quantifiers.gbnf": b'root ::= ("a"+++*+++++++++++++++ "b")+ ("c"*)?+\x00aaabbbc',
        "bad.gbnf": b'root ::= ( "a" | [z-a] ',
    }
    for name, data in seeds.items():
        write("grammar_fuzz", name, data)


def write_constraint_corpus():
    """Constraints as requests give them: a kind byte (0 JSON schema, 1 regex, 2 choices split at
    \x01), the text, then a NUL and bytes for the matcher."""
    seeds = {
        "schema.json": b'\x00{"type":"object","properties":{"a":{"type":"string","maxLength":3},'
                       b'"b":{"type":"array","items":{"enum":[1,"x",null]},"minItems":1}},"required":["a"]}'
                       b'\x00{"a":"xy","b":[1]}',
        "recursive.json": b'\x00{"$defs":{"n":{"properties":{"k":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}\x00{"k":{}}',
        "pattern.json": b'\x00{"type":"string","pattern":"^[A-Z]{2}\\d+$"}\x00"AB12"',
        "anyof.json": b'\x00{"anyOf":[{"type":"integer"},{"type":["string","null"],"format":"date"}]}\x00null',
        "bad.json": b'\x00{"type":"integer","minimum":1}',
        "ip.regex": b'\x01(\\d{1,3}\\.){3}\\d{1,3}\x00192.168.0.1',
        "classes.regex": b'\x01[^a-z\\s]+(?:x|y)*?\\u00e9.\x00AB\xc3\xa9q',
        "bad.regex": b'\x01(a)\\1',
        "choices": b'\x02yes\x01no\x01maybe \xc3\xa9\x00no',
    }
    for name, data in seeds.items():
        write("constraint_fuzz", name, data)


def gguf_file(metadata, tensors):
    """A GGUF v3 file: metadata {key: (type id, packed value)}, tensors [(name, type, dims, raw)]."""
    def string(s):
        return struct.pack("<Q", len(s)) + s.encode()
    out = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(metadata))
    for key, (vtype, packed) in metadata.items():
        out += string(key) + struct.pack("<I", vtype) + packed
    offset, blobs = 0, b""
    for name, ttype, dims, raw in tensors:
        out += string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
        padded = raw + b"\0" * (-len(raw) % 32)
        blobs += padded
        offset += len(padded)
    return out + b"\0" * (-len(out) % 32) + blobs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp()
    for arch in ("llama", "qwen3", "mistral"):
        model = os.path.join(tmp, arch)
        subprocess.run([args.pdserve, "make-model", model, "--arch", arch, "--layers", "1", "--hidden", "32",
                        "--heads", "2", "--kv-heads", "1", "--vocab", "300"], check=True, capture_output=True)
        with open(os.path.join(model, "config.json")) as f:
            write("model_config_fuzz", f"{arch}.json", f.read())
    with open(os.path.join(tmp, "llama", "tokenizer.json")) as f:
        write("tokenizer_json_fuzz", "trained_bpe.json", f.read())
    write("tokenizer_json_fuzz", "tiny_bpe.json", json.dumps({
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
        "pre_tokenizer": {"type": "Whitespace"}, "decoder": {"type": "BPEDecoder"}}))
    write("safetensors_fuzz", "two_tensors.safetensors", safetensors({
        "w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), "b": ("BF16", [2], b"\x80\x3f\x00\x40")}))
    write("safetensors_fuzz", "empty.safetensors", safetensors({}))
    tokens = struct.pack("<IQ", 8, 2) + struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 2) + b"bc"
    write("gguf_fuzz", "llama.gguf", gguf_file(
        {"general.architecture": (8, struct.pack("<Q", 5) + b"llama"),
         "llama.block_count": (4, struct.pack("<I", 1)),
         "tokenizer.ggml.tokens": (9, tokens)},
        [("token_embd.weight", 8, [32, 2], bytes(range(68))),  # Q8_0
         ("output_norm.weight", 0, [4], struct.pack("<4f", 1, 2, 3, 4)),
         ("blk.0.ffn_down.weight", 12, [256, 1], bytes(144)),  # Q4_K
         ("blk.0.ffn_up.weight", 14, [256, 1], bytes(210)),  # Q6_K
         ("blk.0.attn_q.weight", 13, [256, 1], bytes(176)),  # Q5_K
         ("blk.0.attn_k.weight", 6, [32, 1], bytes(range(22)))]))  # Q5_0
    write("gguf_fuzz", "empty.gguf", gguf_file({}, []))

    def strings(items):  # A GGUF array of strings.
        return struct.pack("<IQ", 8, len(items)) + b"".join(struct.pack("<Q", len(x.encode())) + x.encode()
                                                             for x in items)

    def text(s):
        return (8, struct.pack("<Q", len(s.encode())) + s.encode())
    pieces = ["<unk>", "<s>", "</s>", "<0xE4>", "<0xB8>", "<0xAD>", "\u2581", "h", "i", "\u2581h", "\u2581hi"]
    write("gguf_fuzz", "sentencepiece_vocab.gguf", gguf_file(
        {"tokenizer.ggml.model": text("llama"),
         "tokenizer.ggml.tokens": (9, strings(pieces)),
         "tokenizer.ggml.scores": (9, struct.pack("<IQ", 6, len(pieces)) +
                                   struct.pack(f"<{len(pieces)}f", 0, 0, 0, 0, 0, 0, -9, -9, -9, -1, -2)),
         "tokenizer.ggml.token_type": (9, struct.pack("<IQ", 5, len(pieces)) +
                                       struct.pack(f"<{len(pieces)}i", 2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1))}, []))
    write("gguf_fuzz", "byte_level_vocab.gguf", gguf_file(
        {"tokenizer.ggml.model": text("gpt2"), "tokenizer.ggml.pre": text("llama-bpe"),
         "tokenizer.ggml.tokens": (9, strings(["h", "i", "hi", "<s>"])),
         "tokenizer.ggml.merges": (9, strings(["h i"])),
         "tokenizer.ggml.token_type": (9, struct.pack("<IQ", 5, 4) + struct.pack("<4i", 1, 1, 1, 3)),
         "tokenizer.ggml.bos_token_id": (4, struct.pack("<I", 3))}, []))
    for i, text in enumerate(["Hello, world!", "def f(x):\n    return x ** 2  # ok", "Ünïcödé — 漢字 🙂🙃",
                              "   spaces\t\ttabs\n\nnewlines", "<|begin_of_text|>special", "1234567890 3.14159"]):
        write("tokenizer_encode_fuzz", f"text{i}.txt", text)
    # A KV stream: HELLO, two pages for transfer 1, its END; a page outside transfer 2's ranges.
    def frame(kind, tag, offset, payload):
        return struct.pack("<IIQQQ", 0x564b4450, kind, tag, offset, len(payload)) + payload
    page = bytes(range(256)) * 2
    stream = frame(1, 0, 0, b"layout") + frame(2, 1, 0, page) + frame(2, 1, 512, page) + \
        frame(3, 1, 0, struct.pack("<QQQ", 2, 1024, 0)) + frame(2, 2, 1024, page) + frame(4, 2, 0, b"")
    # The first byte says whether the connection starts with its HELLO (bit 0).
    write("frame_reader_fuzz", "stream.bin", b"\x01" + stream)
    write("frame_reader_fuzz", "pages_only.bin", b"\x00" + frame(2, 2, 2048, page) + frame(2, 2, 3072, page))
    write_device_transport_corpus(frame)
    write_grammar_corpus()
    write_constraint_corpus()
    reqs = [
        pb.GenerateRequest(text="Hello there", sampling=pb.SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9,
                                                                         stop=["\n", "END"], logprobs=2)),
        pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2, 3, 300]), request_id="r-1",
                           sampling=pb.SamplingParams(max_tokens=4, seed=3, top_k=5, stop_token_ids=[7])),
        pb.GenerateRequest(text="x", add_special_tokens=False, timeout_ms=100,
                           sampling=pb.SamplingParams(repetition_penalty=1.1, frequency_penalty=0.5,
                                                      presence_penalty=-0.5, min_p=0.1, ignore_eos=True)),
    ]
    for i, r in enumerate(reqs):
        write("request_validator_fuzz", f"request{i}.pb", r.SerializeToString())
    # Chat templates: the test fixtures (our own) and small pieces of the constructs they use.
    for name in ("inst_template.jinja", "features_template.jinja"):
        with open(os.path.join(HERE, "..", "tests", "chat", name)) as f:
            write("chat_template_fuzz", name, f.read())
    pieces = ["{% for m in messages %}{{ m.role | upper }}{% if loop.last %}!{% endif %}{% endfor %}",
              "{%- set ns = namespace(a=1) -%}{% set ns.a = ns.a * 2 %}{{ ns.a ~ (tools | tojson) }}",
              "{{ messages[::-1][0].content.split('</think>')[-1].lstrip('\\n') if messages else '' }}",
              "{% macro f(x, y=2) %}{{ x + y }}{% endmacro %}{{ f(1) }}{{ raise_exception('no') }}"]
    for i, p in enumerate(pieces):
        write("chat_template_fuzz", f"piece{i}.jinja", p)
    # OpenAI API bodies.
    bodies = [{"model": "m", "prompt": "Hello", "max_tokens": 8, "temperature": 0.5, "stop": ["\n", "x"]},
              {"prompt": [[1, 2, 3], "text"], "logprobs": 2, "stream": True, "stream_options": {"include_usage": True}},
              {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                            {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}],
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
               "logprobs": True, "top_logprobs": 3, "max_completion_tokens": 4, "seed": 7, "n": 1},
              {"messages": [{"role": "user", "content": "x"}], "top_p": 0.9, "top_k": 5, "min_p": 0.1,
               "presence_penalty": 1, "frequency_penalty": -1, "repetition_penalty": 1.1, "chat_template_kwargs": {"a": 1}},
              {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {
                  "name": "p", "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x+$"}}}}}},
              {"prompt": "x", "guided_regex": "[a-z]{2,4}", "structured_outputs": None, "guided_choice": None},
              {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", "parallel_tool_calls": False,
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                          "properties": {"q": {"enum": [1, 2]}}, "required": ["q"]}}}]}]
    for i, b in enumerate(bodies):
        write("openai_request_fuzz", f"body{i}.json", json.dumps(b))
    # HTTP/1.1 request heads (and what follows them).
    heads = [b"GET /v1/models HTTP/1.1\r\nHost: localhost:8080\r\nUser-Agent: curl/7.88\r\nAccept: */*\r\n\r\n",
             b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
             b"Content-Length: 17\r\nExpect: 100-continue\r\nConnection: keep-alive, Upgrade\r\n\r\n{\"prompt\": \"a\"}",
             b"GET /metrics HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
             b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
             b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;a=b\r\nabc\r\n1A\r\n"
             b"abcdefghijklmnopqrstuvwxyz\r\n0\r\nTrailer: x\r\n\r\nGET / HTTP/1.1\r\n",
             b"HEAD /health HTTP/1.1\r\nhost:\tb \r\nX-Empty:\r\nauthorization: Bearer k\r\n\r\n"]
    for i, h in enumerate(heads):
        write("http_request_fuzz", f"head{i}.http", h)


if __name__ == "__main__":
    main()
