#!/usr/bin/python3
"""Streams a generation from a pdserve router (or `pdserve serve`) with Python gRPC.

    sudo apt-get install python3-grpcio python3-protobuf protobuf-compiler-grpc
    /usr/bin/python3 examples/python/generate.py --server localhost:8000 --prompt "Hello"

The stubs are generated from proto/ on first use (Debian's protoc and grpc_python_plugin) into
~/.cache/pdserve/python-stubs. Debian's grpc modules import under /usr/bin/python3 only.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, "..", "..", "proto")


def load_stubs():
    out = os.environ.get("PDSERVE_PYTHON_STUBS", os.path.expanduser("~/.cache/pdserve/python-stubs"))
    if not os.path.exists(os.path.join(out, "pdserve", "v1", "generation_pb2_grpc.py")):
        os.makedirs(out, exist_ok=True)
        subprocess.run(["protoc", f"-I{PROTO_DIR}", f"--python_out={out}", f"--grpc_out={out}",
                        "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin",
                        "pdserve/v1/generation.proto"], check=True)
    sys.path.insert(0, out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default="localhost:8000")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = parser.parse_args()

    load_stubs()
    import grpc
    from pdserve.v1 import generation_pb2 as pb
    from pdserve.v1 import generation_pb2_grpc as pb_grpc

    stub = pb_grpc.GenerationStub(grpc.insecure_channel(args.server))
    sampling = pb.SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    if args.seed is not None:
        sampling.seed = args.seed
    request = pb.GenerateRequest(text=args.prompt, sampling=sampling)
    result = {"token_ids": [], "text": "", "finish_reason": ""}
    for response in stub.Generate(request, timeout=300):
        result["token_ids"] += list(response.token_ids)
        result["text"] += response.text
        if not args.json:
            print(response.text, end="", flush=True)
        if response.finish_reason:
            result["finish_reason"] = response.finish_reason
            result["usage"] = {"prompt_tokens": response.usage.prompt_tokens,
                               "completion_tokens": response.usage.completion_tokens}
    print(json.dumps(result) if args.json else "")


if __name__ == "__main__":
    main()
