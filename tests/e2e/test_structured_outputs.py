"""Structured outputs end to end, as real processes: JSON schemas, regexes, choices and grammars on
a random-weight model at temperature 1 (the worst case: it has no idea what JSON is) and on the
trained demo model, through a router, a prefill and two decode workers. Independent oracles check
every output that ends with "stop": python3-jsonschema, Python's re.fullmatch, the choices, and
Python's own parser for an arithmetic grammar. Disaggregated output equals `pdserve generate`
bitwise; a killed decode worker's constrained streams resume elsewhere, still valid and equal to
an uninterrupted run; the official OpenAI Node.js client gets parseable JSON and forced tool
calls, and an OpenAI-shaped 400 for a schema it cannot enforce.

Run: /usr/bin/python3 tests/e2e/test_structured_outputs.py --pdserve build/pdserve
"""

import argparse
import ast
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.stubs_dir()
import grpc  # noqa: E402
from pdserve.internal.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "models", "pdserve-demo")
TEMPLATE = os.path.join(ROOT, "tests", "chat", "inst_template.jinja")
PDSERVE = None
WORKDIR = None
RANDOM = None

SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                              "age": {"type": "integer"}, "ok": {"type": "boolean"}},
             "required": ["name", "age", "ok"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"},
                                                  "email": {"type": ["string", "null"], "maxLength": 6}},
                 "required": ["id"]},
        "score": {"type": "number"}}, "required": ["user", "score"]},
    "recursive": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"enum": [1, 2, "x", None]},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"]}}, "$ref": "#/$defs/node"},
    "enums": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                               "size": {"const": "XL"}}, "required": ["color", "size"]},
    "bounded_array": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    "tuple": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "boolean"}],
              "items": False, "minItems": 2},
    "any_of": {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"k": {"type": "null"}},
                                                                      "required": ["k"]}]},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2,4}$"},
                                                 "when": {"type": "string", "format": "date"}},
                "required": ["code", "when"]},
}
REGEXES = [r"(\d{1,3}\.){3}\d{1,3}", r"[a-z]{2,5}@[a-z]{2,4}\.(com|org)", r"(yes|no|maybe)!?"]
CHOICES = ["alpha", "beta", "gamma delta"]
# An arithmetic grammar whose strings are bounded (parentheses one deep, four terms at most): the
# demo model, a King James Bible one, would nest "(((..." to max_tokens otherwise, and a case that
# never finishes proves nothing. Recursive grammars are the engine tests' (engine_test).
ARITH = """root ::= expr
expr ::= term (("+" | "-") term){0,3}
term ::= num | "(" inner ")"
inner ::= num (("+" | "-") num){0,3}
num ::= [1-9] [0-9]{0,2}
"""


def arith_ok(text):
    """Python's parser as the reference: the text is an expression of + and - over integers."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Constant)):
            return False
        if isinstance(node, ast.Constant) and not isinstance(node.value, int):
            return False
    return True


WHITESPACE = "[ \\n]{0,2}"  # json_schema_ws: the flat schema with whitespace allowed between tokens.


def constraint_of(kind, value):
    if kind == "json_schema":
        return pb.Constraint(json_schema=json.dumps(value))
    if kind == "json_schema_ws":
        return pb.Constraint(json_schema=json.dumps(value), json_whitespace=WHITESPACE)
    if kind == "regex":
        return pb.Constraint(regex=value)
    if kind == "choice":
        return pb.Constraint(choice=pb.Constraint.Choices(choices=value))
    if kind == "grammar":
        return pb.Constraint(grammar=value)
    return pb.Constraint(json_object=True)


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate key in {keys}")
    return dict(pairs)


def check(test, kind, value, text, what):
    if kind in ("json_schema", "json_schema_ws"):
        jsonschema.Draft202012Validator(value, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).validate(
            json.loads(text, object_pairs_hook=no_duplicates))
    elif kind == "json_object":
        test.assertIsInstance(json.loads(text, object_pairs_hook=no_duplicates), dict, what)
    elif kind == "regex":
        test.assertIsNotNone(re.fullmatch(value, text), f"{what}: {text!r}")
    elif kind == "choice":
        test.assertIn(text, value, what)
    else:
        test.assertTrue(arith_ok(text), f"{what}: {text!r}")


def cases():
    out = [("json_schema", s, name) for name, s in SCHEMAS.items()]
    out += [("regex", r, r) for r in REGEXES]
    out += [("choice", CHOICES, "choice"), ("grammar", ARITH, "arith"), ("json_object", None, "json_object"),
            ("json_schema_ws", SCHEMAS["flat"], "flat_ws")]
    return out


def request(prompt_ids, kind, value, seed, max_tokens=96, **extra):
    sp = pb.SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, logprobs=1,
                           constraint=constraint_of(kind, value), **extra)
    return pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt_ids), sampling=sp)


def collect(stub, req, on_token=None):
    out = {"ids": [], "logprobs": [], "text": "", "finish": ""}
    for r in stub.Generate(req, timeout=300):
        out["ids"] += list(r.token_ids)
        out["logprobs"] += [float(x) for x in r.logprobs]
        out["text"] += r.text
        if on_token:
            on_token(len(out["ids"]))
        if r.finish_reason:
            out["finish"] = r.finish_reason
    return out


def local(model, prompt_ids, kind, value, seed, max_tokens=96):
    flag = {"json_schema": ["--json-schema", json.dumps(value)], "regex": ["--regex", value],
            "json_schema_ws": ["--json-schema", json.dumps(value), "--json-whitespace", WHITESPACE],
            "choice": ["--choice", json.dumps(value)], "grammar": ["--grammar", value or ""],
            "json_object": ["--json-object"]}[kind]
    out = subprocess.run([PDSERVE, "generate", "--model", model, "--prompt-ids", ",".join(map(str, prompt_ids)),
                          "--max-tokens", str(max_tokens), "--temperature", "1", "--seed", str(seed),
                          "--logprobs", "1", "--format", "json", "--threads", "1", "--kv-memory-gib", "0.05",
                          *flag], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


class StructuredOutputsTest(unittest.TestCase):
    def run_suite(self, model, seeds, min_stop_share):
        c = cluster.Cluster(PDSERVE, model, prefill=1, decode=2)
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            jobs = []
            for ci, (kind, value, name) in enumerate(cases()):
                for seed in range(seeds):
                    prompt = cluster.prompts(1, 1000 * ci + seed, 6, 30)[0]
                    jobs.append((kind, value, name, seed, prompt))
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                got = list(pool.map(lambda j: collect(stub, request(j[4], j[0], j[1], j[3])), jobs))
            stops = 0
            per_case = {}
            for (kind, value, name, seed, prompt), g in zip(jobs, got):
                what = f"{name} seed {seed}"
                self.assertIn(g["finish"], ("stop", "length"), what)
                if g["finish"] == "stop":
                    stops += 1
                    per_case[name] = per_case.get(name, 0) + 1
                    check(self, kind, value, g["text"], what)
                else:  # Cut by max_tokens, never short of it.
                    self.assertEqual(len(g["ids"]), 96, f"{what}: 'length' before max_tokens")
            self.assertGreaterEqual(stops, min_stop_share * len(jobs), "too few outputs finished to prove much")
            # Every case proves something: none may pass by finishing nothing.
            for kind, value, name in cases():
                self.assertGreaterEqual(per_case.get(name, 0), 1, f"{name}: no output finished")
            # Disaggregated (prefill worker's first token, decode worker's rest) == local, bitwise.
            for (kind, value, name, seed, prompt), g in list(zip(jobs, got))[::seeds]:
                want = local(model, prompt, kind, value, seed)
                self.assertEqual(g["ids"], want["token_ids"], name)
                self.assertEqual(g["logprobs"], [float(x) for x in want["logprobs"]], name)
            cluster.wait_idle(self, [(p, True) for p in c.prefill] + [(d, False) for d in c.decode])
            # Both tiers masked (the prefill worker its first tokens), and the masks were reused.
            for w, prefill in [(c.prefill[0], True), (c.decode[0], False), (c.decode[1], False)]:
                i = cluster.worker_info(w.grpc, prefill)
                self.assertGreater(i.structured_mask_lookups, 0)
                self.assertLessEqual(i.structured_compiled, len(cases()))
            decode = [cluster.worker_info(d.grpc, False) for d in c.decode]
            self.assertGreater(sum(i.structured_mask_lookups for i in decode),
                               sum(i.structured_masks_computed for i in decode))
            return stops, len(jobs)
        finally:
            self.assertEqual(c.stop(), [0, 0, 0, 0])

    def test_random_model_at_temperature_one(self):
        stops, total = self.run_suite(RANDOM, seeds=8, min_stop_share=0.6)
        print(f"random model: {stops}/{total} finished with stop, all valid", file=sys.stderr)

    def test_demo_model(self):
        stops, total = self.run_suite(DEMO, seeds=4, min_stop_share=0.6)
        print(f"demo model: {stops}/{total} finished with stop, all valid", file=sys.stderr)

    def test_killed_decode_worker_resumes_constrained_streams(self):
        # Long constrained outputs (an array of exactly 200 small numbers, 400+ tokens) on 2 decode
        # workers; one is killed mid-stream: every stream resumes on the other with the matcher
        # replayed, ends valid and equal to the fault-free run.
        schema = {"type": "array", "items": {"enum": [1, 22, 333]}, "minItems": 200, "maxItems": 200}
        c = cluster.Cluster(PDSERVE, RANDOM, prefill=1, decode=2)
        victim = c.decode[0]
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            reqs = [request(p, "json_schema", schema, 70 + i, max_tokens=1500)
                    for i, p in enumerate(cluster.prompts(12, 9, 6, 40))]
            with concurrent.futures.ThreadPoolExecutor(12) as pool:
                want = list(pool.map(lambda r: collect(stub, r), reqs))
            for w in want:
                self.assertEqual(w["finish"], "stop")
                jsonschema.validate(json.loads(w["text"]), schema)
            cluster.wait_idle(self, [(p, True) for p in c.prefill] + [(d, False) for d in c.decode])
            got, running = cluster.streams_with_a_killed_worker(
                self, lambda i, on_token: collect(stub, reqs[i], on_token), len(reqs), victim,
                started_streams=6, started_tokens=8)
            self.assertGreater(running, 0)
            for i, (g, w) in enumerate(zip(got, want)):
                self.assertEqual((g["ids"], g["logprobs"], g["text"], g["finish"]),
                                 (w["ids"], w["logprobs"], w["text"], w["finish"]), f"stream {i}")
            admin = worker_pb2_grpc.RouterAdminStub(grpc.insecure_channel(c.router.grpc))
            stats = admin.GetRouterStats(worker_pb2.GetRouterStatsRequest(), timeout=10)
            self.assertGreater(stats.resumes, 0, "no stream was resumed: the test proved nothing")
        finally:
            codes = c.stop()
        self.assertEqual(codes, [0, -9, 0, 0])

    def test_bad_constraints_are_invalid_argument(self):
        c = cluster.Cluster(PDSERVE, RANDOM, prefill=1, decode=1)
        try:
            stub = pbg.GenerationStub(grpc.insecure_channel(c.router.grpc))
            for constraint, message in [
                    (pb.Constraint(json_schema='{"type": "integer", "minimum": 1}'), "keyword 'minimum' is not supported"),
                    (pb.Constraint(json_schema="{"), "not valid JSON"),
                    (pb.Constraint(regex="(a)\\1"), "backreferences"),
                    (pb.Constraint(grammar="root ::= missing"), "grammar"),
                    (pb.Constraint(choice=pb.Constraint.Choices()), "at least one choice"),
                    (pb.Constraint(), "sets none of")]:
                req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7]),
                                         sampling=pb.SamplingParams(max_tokens=4, constraint=constraint))
                with self.assertRaises(grpc.RpcError) as e:
                    collect(stub, req)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("sampling.constraint", e.exception.details())
                self.assertIn(message, e.exception.details())
            cluster.wait_idle(self, [(c.prefill[0], True), (c.decode[0], False)])
        finally:
            self.assertEqual(c.stop(), [0, 0, 0])

    def test_one_request_cannot_end_a_server(self):
        """Schemas and regexes nested or stacked 20k-100k deep, sent as a string (past the HTTP body's
        own nesting bound) to serve's OpenAI API and to a separate router's gRPC API: each is a 400 /
        INVALID_ARGUMENT naming the field, and the servers go on serving (these ended them with
        SIGSEGV before)."""
        deep = "{\"const\": " + "[" * 100000 + "]" * 100000 + "}"
        # Stacked quantifiers within the 64 KiB a pattern may have, and a pattern past it (a 762 KB
        # one took a second to compile: refused before compiling now).
        stacked = ["a" + "*" * 65000, "a" + "?" * 60000, "a" + "{1}" * 21000]
        long = "a1" * 40000
        s = cluster.Process(PDSERVE, ["serve", "--model", DEMO, "--listen", "127.0.0.1:0", "--threads", "1",
                                      "--kv-memory-gib", "0.1", "--http-listen", "127.0.0.1:0"])
        try:
            bodies = [({"guided_json": deep}, "guided_json", "nests deeper than 256")]
            bodies += [({"guided_regex": r}, "guided_regex", "multiple repeat") for r in stacked]
            bodies.append(({"guided_json": json.dumps({"type": "string", "pattern": stacked[0]})}, "guided_json",
                           "multiple repeat"))
            bodies.append(({"guided_regex": long}, "guided_regex", "80000 bytes, over the limit of 65536"))
            bodies.append(({"guided_json": json.dumps({"type": "string", "pattern": long})}, "guided_json",
                           "over the limit of 65536"))
            for extra, param, message in bodies:
                body = json.dumps({"model": "pdserve-demo", "prompt": "In the beginning", "max_tokens": 4, **extra})
                req = urllib.request.Request(f"http://{s.addresses['http']}/v1/completions", data=body.encode(),
                                             headers={"Content-Type": "application/json"})
                with self.assertRaises(urllib.error.HTTPError) as e:
                    urllib.request.urlopen(req, timeout=60)
                self.assertEqual(e.exception.code, 400)
                err = json.loads(e.exception.read())["error"]
                self.assertEqual(err["param"], param)
                self.assertIn(message, err["message"])
                self.assertIsNone(s.proc.poll(), "serve ended")
            stub = pbg.GenerationStub(grpc.insecure_channel(s.grpc))
            for constraint, message in [(pb.Constraint(json_schema=deep), "nests deeper"),
                                        (pb.Constraint(regex=stacked[0]), "multiple repeat")]:
                req = pb.GenerateRequest(text="In the beginning",
                                         sampling=pb.SamplingParams(max_tokens=4, constraint=constraint))
                with self.assertRaises(grpc.RpcError) as e:
                    collect(stub, req)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn(message, e.exception.details())
            ok = collect(stub, pb.GenerateRequest(text="In the beginning", sampling=pb.SamplingParams(max_tokens=4)))
            self.assertEqual(len(ok["ids"]), 4)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_openai_node_client(self):
        client_dir = subprocess.run([os.path.join(ROOT, "scripts", "openai_client_setup.sh")], check=True,
                                    capture_output=True, text=True).stdout.strip()
        script = os.path.join(client_dir, "structured_client.mjs")
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "structured_client.mjs")) as src, \
                open(script, "w") as dst:
            dst.write(src.read())
        s = cluster.Process(PDSERVE, ["serve", "--model", DEMO, "--listen", "127.0.0.1:0", "--threads", "1",
                                      "--kv-memory-gib", "0.1", "--http-listen", "127.0.0.1:0",
                                      "--chat-template", TEMPLATE])
        schema = SCHEMAS["flat"]
        try:
            out = subprocess.run(["node", script, f"http://{s.addresses['http']}/v1", "pdserve-demo",
                                  json.dumps(schema)], capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr[-2000:])
            got = json.loads(out.stdout)
        finally:
            self.assertEqual(s.stop(), 0)
        stops = [r for r in got["schema"] if r["finish_reason"] == "stop"]
        self.assertGreater(len(stops), 0, got["schema"])
        for r in stops:
            jsonschema.validate(json.loads(r["content"]), schema)
        for r in got["json_object"]:
            if r["finish_reason"] == "stop":
                self.assertIsInstance(json.loads(r["content"]), dict)
        tools = {"get_weather": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                                  "unit": {"enum": ["c", "f"]}},
                                 "required": ["city", "unit"]},
                 "get_time": {"type": "object", "properties": {"zone": {"enum": ["utc", "local"]}},
                              "required": ["zone"]}}
        called = 0
        for r in got["required"]:
            if r["finish_reason"] == "length":
                continue
            self.assertEqual(r["finish_reason"], "tool_calls", r)
            self.assertIsNone(r["message"]["content"])
            for call in r["message"]["tool_calls"]:
                called += 1
                jsonschema.validate(json.loads(call["function"]["arguments"]), tools[call["function"]["name"]])
        self.assertGreater(called, 0, got["required"])
        for r in got["named"]:
            if r["finish_reason"] != "tool_calls":
                continue
            self.assertEqual(len(r["calls"]), 1, r)
            self.assertEqual(r["calls"][0]["function"]["name"], "get_time")
            jsonschema.validate(json.loads(r["calls"][0]["function"]["arguments"]), tools["get_time"])
        self.assertTrue(any(r["finish_reason"] == "tool_calls" for r in got["named"]), got["named"])
        bad = got["bad_schema"]
        self.assertEqual((bad["status"], bad["param"], bad["type"]),
                         (400, "response_format.json_schema.schema", "invalid_request_error"))
        self.assertIn("minimum", bad["message"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_structured_")
    RANDOM = os.path.join(WORKDIR, "random")
    subprocess.run([PDSERVE, "make-model", RANDOM, "--arch", "qwen3", "--layers", "2", "--hidden", "64",
                    "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--seed", "3"], check=True,
                   capture_output=True)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
