"""What the LoRA end-to-end tests share: a request through a router's gRPC API with an adapter, and
the same request on a local `pdserve generate` with the adapter's files (the reference; itself
checked against the float64 reference in tests/reference/test_parity.py)."""

import json
import subprocess

import cluster

cluster.stubs_dir()
import grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg  # noqa: E402

SMALL = ["--threads", "1", "--kv-memory-gib", "0.05"]


def local(pdserve, model, ids, modules="", adapter="", max_tokens=12):
    """`modules`: --lora-modules (NAME=PATH,...); `adapter`: the one the request names."""
    extra = ["--lora-modules", modules, "--lora-name", adapter] if adapter else []
    out = subprocess.run([pdserve, "generate", "--model", model, "--prompt-ids", ",".join(map(str, ids)),
                          "--max-tokens", str(max_tokens), "--temperature", "0", "--ignore-eos",
                          "--logprobs", "1", "--format", "json", *SMALL, *extra], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(out.stderr)
    return json.loads(out.stdout)


def generate(address, ids, adapter="", max_tokens=12, metadata=()):
    """Greedy, EOS ignored: token_ids, logprobs, text and the prompt tokens reused (cached)."""
    stub = pbg.GenerationStub(grpc.insecure_channel(address))
    sp = pb.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=1, lora_name=adapter)
    out = {"token_ids": [], "logprobs": [], "text": "", "cached": 0}
    for r in stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=sp), timeout=120,
                           metadata=metadata):
        out["token_ids"] += list(r.token_ids)
        out["logprobs"] += [float(x) for x in r.logprobs]
        out["text"] += r.text
        if r.finish_reason:
            out["cached"] = r.usage.cached_tokens
    return out
