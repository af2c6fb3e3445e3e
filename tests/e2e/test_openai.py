"""The OpenAI-compatible HTTP API (`--http-listen`) end to end on `pdserve serve` with the trained
demo model: completions and chat completions, JSON and Server-Sent Events, equal to what the gRPC
API returns for the same greedy request; the SSE framing byte by byte (Python's urllib); OpenAI-
shaped errors with the right status; API keys; the in-flight bound; a client that disconnects
(mid-stream, or before a whole response) frees its KV blocks; clients that trickle bytes are cut off
at the request deadline while others are served; 100 streams at once.

Run: /usr/bin/python3 tests/e2e/test_openai.py --pdserve build/pdserve
"""

import argparse
import http.client
import json
import re
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
import scripted_model  # noqa: E402

cluster.stubs_dir()
import grpc  # noqa: E402
from pdserve.v1 import generation_pb2 as pb, generation_pb2_grpc as pbg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "pdserve-demo")
TEMPLATE = os.path.join(ROOT, "tests", "chat", "inst_template.jinja")
PDSERVE = None
WORKDIR = None


def serve(*extra, env=None):
    return cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                     "--kv-memory-gib", "0.1", "--http-listen", "127.0.0.1:0",
                                     "--chat-template", TEMPLATE, "--metrics-listen", "127.0.0.1:0", *extra],
                           env=env)


def post(process, path, body, headers=None, raw=False):
    """(status, parsed JSON or raw bytes, headers)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{process.addresses['http']}{path}", data=data,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            payload = r.read()
            return r.status, (payload if raw else json.loads(payload)), dict(r.headers)
    except urllib.error.HTTPError as e:
        payload = e.read()
        return e.code, (json.loads(payload) if payload else None), dict(e.headers)


def grpc_greedy(process, max_tokens, text=None, ids=None, add_special_tokens=None, logprobs=0):
    stub = pbg.GenerationStub(grpc.insecure_channel(process.grpc))
    sp = pb.SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=logprobs)
    req = pb.GenerateRequest(sampling=sp)
    if text is not None:
        req.text = text
    else:
        req.token_ids.ids.extend(ids)
    if add_special_tokens is not None:
        req.add_special_tokens = add_special_tokens
    out = {"text": "", "ids": [], "logprobs": [], "finish": "", "usage": None}
    for r in stub.Generate(req, timeout=120):
        out["text"] += r.text
        out["ids"] += list(r.token_ids)
        out["logprobs"] += list(r.logprobs)
        if r.finish_reason:
            out["finish"], out["usage"] = r.finish_reason, r.usage
    return out


def grpc_sample(process, max_tokens, text, seed, temperature=1.0):
    stub = pbg.GenerationStub(grpc.insecure_channel(process.grpc))
    req = pb.GenerateRequest(text=text, sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                                                   seed=seed))
    return "".join(r.text for r in stub.Generate(req, timeout=120))


def grpc_generate(process, text, add_special_tokens=None, **sampling):
    """ids, text, logprobs, top (token id, logprob) lists and finish reason of one gRPC Generate
    with these SamplingParams fields."""
    stub = pbg.GenerationStub(grpc.insecure_channel(process.grpc))
    req = pb.GenerateRequest(text=text, sampling=pb.SamplingParams(**sampling))
    if add_special_tokens is not None:
        req.add_special_tokens = add_special_tokens
    out = {"ids": [], "text": "", "logprobs": [], "top": [], "finish": ""}
    for r in stub.Generate(req, timeout=120):
        out["ids"] += list(r.token_ids)
        out["text"] += r.text
        out["logprobs"] += [float(x) for x in r.logprobs]
        out["top"] += [[(t.token_id, float(t.logprob)) for t in tl.top] for tl in r.top_logprobs]
        if r.finish_reason:
            out["finish"] = r.finish_reason
    return out


def render_chat(messages):
    cases = os.path.join(WORKDIR, "chat.jsonl")
    with open(cases, "w") as f:
        f.write(json.dumps({"messages": messages, "add_generation_prompt": True}) + "\n")
    out = subprocess.run([PDSERVE, "chat-template", "--model", MODEL, "--chat-template", TEMPLATE,
                          "--input-jsonl", cases], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["text"]


def sse_events(raw):
    """Splits an SSE body into its data payloads, checking the framing byte by byte."""
    text = raw.decode("utf-8")
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")
    assert events[-1] == "", "the body ends with a blank line"
    out = []
    for e in events[:-1]:
        assert e.startswith("data: ") and "\n" not in e, repr(e)
        out.append(e[len("data: "):])
    assert out[-1] == "[DONE]" and "[DONE]" not in out[:-1]
    return [json.loads(e) for e in out[:-1]]


PROMPTS = ["And God said", "In the beginning", "Blessed are the", "And it came to pass"]


class OpenAiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = serve("--tool-call-parser", "hermes")

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def test_models_health_tokenize(self):
        with urllib.request.urlopen(f"http://{self.s.addresses['http']}/v1/models", timeout=10) as r:
            models = json.loads(r.read())
        self.assertEqual([m["id"] for m in models["data"]], ["pdserve-demo"])
        self.assertEqual(models["data"][0]["max_model_len"], 2048)
        with urllib.request.urlopen(f"http://{self.s.addresses['http']}/health", timeout=10) as r:
            self.assertEqual(r.status, 200)
        want = subprocess.run([PDSERVE, "tokenize", "--tokenizer", MODEL, "--text", "And God said",
                               "--add-special-tokens"], capture_output=True, text=True, check=True).stdout.split()
        status, tok, _ = post(self.s, "/tokenize", {"prompt": "And God said"})
        self.assertEqual((status, tok["tokens"], tok["count"]), (200, [int(t) for t in want], len(want)))
        status, detok, _ = post(self.s, "/detokenize", {"tokens": tok["tokens"][1:]})
        self.assertEqual((status, detok["prompt"]), (200, "And God said"))

    def test_completions_equal_grpc(self):
        for prompt in PROMPTS:
            want = grpc_greedy(self.s, 12, text=prompt)
            status, got, _ = post(self.s, "/v1/completions", {"model": "pdserve-demo", "prompt": prompt,
                                                              "max_tokens": 12, "temperature": 0})
            self.assertEqual(status, 200, got)
            self.assertEqual(got["object"], "text_completion")
            self.assertEqual(got["choices"][0]["text"], want["text"])
            self.assertEqual(got["choices"][0]["finish_reason"], "length")
            u = got["usage"]
            self.assertEqual((u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]),
                             (want["usage"].prompt_tokens, 12, want["usage"].prompt_tokens + 12))
            self.assertIn("cached_tokens", u["prompt_tokens_details"])
        # Token ids and a list of prompts (one choice each), logprobs=N as in the gRPC API.
        ids = [4091, 296, 387, 400]
        want = grpc_greedy(self.s, 5, ids=ids, logprobs=2)
        status, got, _ = post(self.s, "/v1/completions", {"prompt": ids, "max_tokens": 5, "temperature": 0,
                                                          "logprobs": 2})
        self.assertEqual(got["choices"][0]["text"], want["text"])
        self.assertEqual(got["choices"][0]["logprobs"]["token_logprobs"], [float(x) for x in want["logprobs"]])
        self.assertEqual([len(t) for t in got["choices"][0]["logprobs"]["top_logprobs"]], [2] * 5)
        status, got, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[:2], "max_tokens": 4, "temperature": 0})
        self.assertEqual([c["index"] for c in got["choices"]], [0, 1])
        self.assertEqual(got["choices"][1]["text"], grpc_greedy(self.s, 4, text=PROMPTS[1])["text"])
        self.assertEqual(got["usage"]["completion_tokens"], 8)
        # A chunked request body (Python's http.client framing it) gets the same answer.
        host, port = self.s.addresses["http"].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0}).encode()
        conn.request("POST", "/v1/completions", body=iter([body[:7], body[7:]]),
                     headers={"Content-Type": "application/json"}, encode_chunked=True)
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        self.assertEqual(json.loads(r.read())["choices"][0]["text"], grpc_greedy(self.s, 12, text=PROMPTS[0])["text"])
        conn.close()

    def test_chat_completions_equal_grpc_on_the_rendered_template(self):
        messages = [{"role": "system", "content": "Answer as the scripture does."},
                    {"role": "user", "content": "Who made the heaven and the earth?"}]
        want = grpc_greedy(self.s, 10, text=render_chat(messages), add_special_tokens=False)
        status, got, _ = post(self.s, "/v1/chat/completions", {"model": "pdserve-demo", "messages": messages,
                                                               "max_completion_tokens": 10, "temperature": 0})
        self.assertEqual(status, 200, got)
        self.assertEqual(got["object"], "chat.completion")
        self.assertEqual(got["choices"][0]["message"], {"role": "assistant", "content": want["text"], "refusal": None})
        self.assertEqual(got["usage"]["prompt_tokens"], want["usage"].prompt_tokens)
        self.assertEqual(got["usage"]["completion_tokens"], 10)
        # Streaming: a role chunk, one chunk per token batch, the usage chunk, [DONE].
        status, raw, headers = post(self.s, "/v1/chat/completions",
                                    {"messages": messages, "max_tokens": 10, "temperature": 0, "stream": True,
                                     "stream_options": {"include_usage": True}}, raw=True)
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith("text/event-stream"))
        events = sse_events(raw)
        self.assertEqual(events[0]["choices"][0]["delta"], {"role": "assistant", "content": ""})
        self.assertEqual("".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1]), want["text"])
        self.assertEqual(events[-2]["choices"][0]["finish_reason"], "length")
        self.assertTrue(all(e["usage"] is None for e in events[:-1]))
        self.assertEqual(events[-1]["choices"], [])
        self.assertEqual(events[-1]["usage"]["completion_tokens"], 10)
        self.assertEqual(len({e["id"] for e in events}), 1)
        self.assertTrue(all(e["object"] == "chat.completion.chunk" for e in events))

    def test_streamed_completion_equals_the_whole(self):
        status, whole, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 20,
                                                            "temperature": 0, "stop": [" Lord"]})
        status, raw, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0,
                                                          "stop": [" Lord"], "stream": True}, raw=True)
        events = sse_events(raw)
        self.assertEqual("".join(e["choices"][0]["text"] for e in events), whole["choices"][0]["text"])
        self.assertEqual(events[-1]["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"])
        self.assertTrue(all("usage" not in e for e in events))  # Only with include_usage.
        # Two prompts streamed: their choices' events interleaved by index, each the gRPC text.
        status, raw, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[2:4], "max_tokens": 5, "temperature": 0,
                                                          "stream": True, "stream_options": {"include_usage": True}},
                              raw=True)
        events = sse_events(raw)
        for i in (0, 1):
            self.assertEqual("".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"][0]["index"] == i),
                             grpc_greedy(self.s, 5, text=PROMPTS[2 + i])["text"])
        self.assertEqual(events[-1]["usage"]["completion_tokens"], 10)

    def test_n_choices(self):
        # Greedy: n identical choices; the prompt's tokens counted once, as vLLM counts them.
        status, got, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0,
                                                          "n": 3})
        self.assertEqual(status, 200, got)
        want = grpc_greedy(self.s, 6, text=PROMPTS[0])
        self.assertEqual([c["index"] for c in got["choices"]], [0, 1, 2])
        self.assertEqual([c["text"] for c in got["choices"]], [want["text"]] * 3)
        self.assertEqual(got["usage"]["prompt_tokens"], want["usage"].prompt_tokens)
        self.assertEqual(got["usage"]["completion_tokens"], 3 * want["usage"].completion_tokens)
        # Sampled with a seed: choice i * n + j is prompt i's request with seed + j over gRPC.
        body = {"prompt": PROMPTS[1:3], "max_tokens": 8, "temperature": 1.0, "seed": 11, "n": 2}
        status, got, _ = post(self.s, "/v1/completions", body)
        self.assertEqual(status, 200, got)
        texts = [c["text"] for c in got["choices"]]
        self.assertEqual(texts, [grpc_sample(self.s, 8, PROMPTS[1 + i], 11 + j) for i in (0, 1) for j in (0, 1)])
        self.assertNotEqual(texts[0], texts[1])  # Else a seed mix-up would not show.
        status, raw, _ = post(self.s, "/v1/completions", {**body, "stream": True}, raw=True)
        events = sse_events(raw)
        self.assertEqual(["".join(e["choices"][0]["text"] for e in events if e["choices"][0]["index"] == k)
                          for k in range(4)], texts)
        # Chat, streamed: every choice opens with the assistant's role, then the same greedy text.
        chat = {"messages": [{"role": "user", "content": "Who made the earth?"}], "max_tokens": 5, "temperature": 0}
        status, one, _ = post(self.s, "/v1/chat/completions", chat)
        status, raw, _ = post(self.s, "/v1/chat/completions", {**chat, "n": 2, "stream": True}, raw=True)
        events = sse_events(raw)
        self.assertEqual([e["choices"][0]["index"] for e in events if e["choices"][0]["delta"].get("role")], [0, 1])
        for k in (0, 1):
            self.assertEqual("".join(e["choices"][0]["delta"].get("content", "") for e in events
                                     if e["choices"][0]["index"] == k), one["choices"][0]["message"]["content"])

    def test_request_id_header(self):
        # The client's X-Request-Id is the request's id (as vLLM takes it), echoed back.
        status, got, headers = post(self.s, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 2},
                                    {"X-Request-Id": "trace-42"})
        self.assertEqual((status, got["id"], headers["X-Request-Id"]), (200, "cmpl-trace-42", "trace-42"))
        status, raw, headers = post(self.s, "/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": "Who?"}], "max_tokens": 3, "n": 2,
                                     "stream": True}, {"X-Request-Id": "trace-43"}, raw=True)
        self.assertEqual(headers["X-Request-Id"], "trace-43")
        self.assertEqual({e["id"] for e in sse_events(raw)}, {"chatcmpl-trace-43"})
        # Without one: the router's own id, echoed too.
        status, got, headers = post(self.s, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 2})
        self.assertEqual("cmpl-" + headers["X-Request-Id"], got["id"])
        # A refusal names the field and still echoes the id.
        status, got, headers = post(self.s, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 2},
                                    {"X-Request-Id": "x" * 300})
        self.assertEqual((status, got["error"]["param"], headers["X-Request-Id"]), (400, "request_id", "x" * 300))

    def test_tools_with_a_parser(self):
        # The demo model writes no <tool_call> blocks: with tools (which this template ignores, so
        # the prompt is the same) the answer is the plain one, content and finish reason, no calls.
        chat = {"messages": [{"role": "user", "content": "Who made the earth?"}], "max_tokens": 6, "temperature": 0}
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        _, plain, _ = post(self.s, "/v1/chat/completions", chat)
        for choice in (None, "auto", "none"):
            body = {**chat, "tools": tools, **({"tool_choice": choice} if choice else {})}
            status, got, _ = post(self.s, "/v1/chat/completions", body)
            self.assertEqual(status, 200, got)
            self.assertEqual(got["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"])
            self.assertNotIn("tool_calls", got["choices"][0]["message"])
            self.assertEqual(got["choices"][0]["finish_reason"], "length")
            status, raw, _ = post(self.s, "/v1/chat/completions", {**body, "stream": True}, raw=True)
            events = sse_events(raw)
            self.assertEqual("".join(e["choices"][0]["delta"].get("content", "") for e in events),
                             plain["choices"][0]["message"]["content"])
            self.assertEqual(events[-1]["choices"][0]["finish_reason"], "length")
        # Forcing a call is served (constrained to a call: tests/e2e/test_structured_outputs.py);
        # a choice nobody has is refused.
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            status, got, _ = post(self.s, "/v1/chat/completions", {**chat, "tools": tools, "tool_choice": choice,
                                                                   "max_tokens": 40})
            self.assertEqual(status, 200, got)
            self.assertIn(got["choices"][0]["finish_reason"], ("tool_calls", "length"), got)
        for choice in ("sometimes", 3, {"type": "function", "function": {"name": "nope"}}):
            status, got, _ = post(self.s, "/v1/chat/completions", {**chat, "tools": tools, "tool_choice": choice})
            self.assertEqual((status, got["error"]["param"]), (400, "tool_choice"), got)

    def test_chat_without_max_tokens_runs_to_the_end_of_the_context(self):
        body = {"messages": [{"role": "user", "content": "Who made the earth?"}], "temperature": 0,
                "ignore_eos": True}
        status, got, _ = post(self.s, "/v1/chat/completions", body)
        self.assertEqual(status, 200, got)
        usage = got["usage"]
        self.assertEqual(usage["completion_tokens"], 2048 - usage["prompt_tokens"])  # Not 16.
        self.assertEqual(got["choices"][0]["finish_reason"], "length")
        # Completions keep OpenAI's legacy default of 16.
        status, got, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[0], "ignore_eos": True})
        self.assertEqual((status, got["usage"]["completion_tokens"]), (200, 16))

    def test_models_retrieve_and_openai_error_shapes(self):
        with urllib.request.urlopen(f"http://{self.s.addresses['http']}/v1/models/pdserve-demo", timeout=10) as r:
            card = json.loads(r.read())
        self.assertEqual((card["id"], card["object"], card["max_model_len"]), ("pdserve-demo", "model", 2048))
        for path in ("/v1/models/other", "/v1/nothing"):
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://{self.s.addresses['http']}{path}", timeout=10)
            err = json.loads(e.exception.read())["error"]
            self.assertEqual((e.exception.code, err["type"]), (404, "invalid_request_error"), path)
        status, got, _ = post(self.s, "/v1/completions", {"model": "other", "prompt": "a"})
        self.assertEqual((status, got["error"]["type"], got["error"]["code"]),
                         (404, "invalid_request_error", "model_not_found"))
        # Fields OpenAI's reference has: system_fingerprint, and the chat message's refusal.
        status, got, headers = post(self.s, "/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        self.assertEqual(status, 200, got)
        self.assertRegex(got["system_fingerprint"], r"^fp_[0-9a-f]{10}$")
        self.assertIn("refusal", got["choices"][0]["message"])
        self.assertIsNone(got["choices"][0]["message"]["refusal"])
        # A kept-alive connection says how long it stays open idle (urllib's own close it).
        host, port = self.s.addresses["http"].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/v1/models")
        r = conn.getresponse()
        r.read()
        self.assertEqual(r.getheader("Keep-Alive"), "timeout=75")
        conn.close()
        status, raw, _ = post(self.s, "/v1/completions", {"prompt": "a", "max_tokens": 2, "stream": True}, raw=True)
        self.assertTrue(all(e["system_fingerprint"] == got["system_fingerprint"] for e in sse_events(raw)))

    def test_completions_top_logprobs_by_rank_with_the_sampled_token(self):
        def text(i):
            return post(self.s, "/detokenize", {"tokens": [i]})[1]["prompt"]

        stub = pbg.GenerationStub(grpc.insecure_channel(self.s.grpc))
        for n, temperature in ((3, 0), (1, 2.0)):
            sp = pb.SamplingParams(max_tokens=12, temperature=temperature, seed=7, logprobs=n)
            want_ids, want_lps, want_top = [], [], []
            for r in stub.Generate(pb.GenerateRequest(text=PROMPTS[1], sampling=sp), timeout=120):
                want_ids += list(r.token_ids)
                want_lps += list(r.logprobs)
                want_top += [[(t.token_id, t.logprob) for t in tl.top] for tl in r.top_logprobs]
            status, got, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 12, "seed": 7,
                                                              "temperature": temperature, "logprobs": n})
            self.assertEqual(status, 200, got)
            tops = got["choices"][0]["logprobs"]["top_logprobs"]
            extra = 0
            for i, top in enumerate(tops):
                want = []
                for tid, lp in want_top[i]:  # Rank order, as the gRPC API gives them.
                    if text(tid) not in [k for k, _ in want]:
                        want.append((text(tid), lp))
                sampled = text(want_ids[i])
                if sampled not in [k for k, _ in want]:
                    want.append((sampled, want_lps[i]))  # OpenAI: up to N+1 entries.
                    extra += 1
                self.assertEqual([k for k in top], [k for k, _ in want], i)
                for k, lp in want:
                    self.assertAlmostEqual(top[k], lp, places=4)
            if temperature > 0:
                self.assertGreater(extra, 0, "no sampled token outside the top 1: the case is untested")

    def test_sampling_fields_act_as_in_the_grpc_api(self):
        # Each field, over HTTP and over gRPC with the same seed: the same tokens (text and each
        # token's logprob), and not the tokens without the field (it acts, on both paths alike).
        base = {"temperature": 1.0, "seed": 7, "max_tokens": 24}

        def http(fields):
            status, got, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[0], "logprobs": 0, **fields})
            self.assertEqual(status, 200, got)
            c = got["choices"][0]
            return c["text"], c["logprobs"]["token_logprobs"], c["finish_reason"]

        plain = http(base)
        self.assertEqual(plain[0], grpc_generate(self.s, PROMPTS[0], **base)["text"])
        texts = {}
        for fields in ({"top_p": 0.6}, {"top_k": 3}, {"min_p": 0.15}, {"presence_penalty": 1.5},
                       {"frequency_penalty": 1.5}, {"repetition_penalty": 1.8}, {"seed": 8},
                       {"temperature": 0.5}):
            name = next(iter(fields))
            got = http({**base, **fields})
            want = grpc_generate(self.s, PROMPTS[0], **{**base, **fields})
            self.assertEqual(got, (want["text"], want["logprobs"], want["finish"]), name)
            self.assertNotEqual(got[0], plain[0], f"{name} changed nothing: the case does not test it")
            texts[name] = got[0]
        # Presence and frequency penalties must differ on this text, or a swap would go unseen.
        self.assertNotEqual(texts["presence_penalty"], texts["frequency_penalty"])
        # stop_token_ids: the third sampled token ends the output there, as over gRPC.
        ids = grpc_generate(self.s, PROMPTS[0], **base)["ids"]
        stop = {"stop_token_ids": [ids[2]]}
        got = http({**base, **stop})
        want = grpc_generate(self.s, PROMPTS[0], **base, **stop)
        self.assertEqual(got, (want["text"], want["logprobs"], "stop"))
        self.assertEqual(len(got[1]), 3)

    def test_logprobs_of_both_apis_equal_grpc(self):
        def text(i):
            return post(self.s, "/detokenize", {"tokens": [i]})[1]["prompt"]

        messages = [{"role": "user", "content": "Who made the heaven and the earth?"}]
        prompt = render_chat(messages)
        for temperature in (0, 1.5):
            want = grpc_generate(self.s, prompt, add_special_tokens=False, max_tokens=10,
                                 temperature=temperature, seed=11, logprobs=3)
            body = {"messages": messages, "max_tokens": 10, "temperature": temperature, "seed": 11,
                    "logprobs": True, "top_logprobs": 3}
            status, got, _ = post(self.s, "/v1/chat/completions", body)
            self.assertEqual(status, 200, got)
            content = got["choices"][0]["logprobs"]["content"]
            self.assertEqual(len(content), len(want["ids"]))
            for i, c in enumerate(content):
                t = text(want["ids"][i])
                self.assertEqual((c["token"], c["logprob"], c["bytes"]), (t, want["logprobs"][i], list(t.encode())), i)
                self.assertEqual([(a["token"], a["logprob"], a["bytes"]) for a in c["top_logprobs"]],
                                 [(text(tid), lp, list(text(tid).encode())) for tid, lp in want["top"][i]], i)
            self.assertEqual("".join(c["token"] for c in content), got["choices"][0]["message"]["content"])
            # Streamed: the chunks' logprobs concatenate to the whole response's.
            status, raw, _ = post(self.s, "/v1/chat/completions", {**body, "stream": True}, raw=True)
            streamed = [c for e in sse_events(raw) for ch in e["choices"] if ch.get("logprobs")
                        for c in ch["logprobs"]["content"]]
            self.assertEqual(streamed, content)
        # Completions: tokens, token_logprobs, top_logprobs (by rank, then the sampled token) and
        # text_offset, for the same request over gRPC.
        want = grpc_generate(self.s, PROMPTS[2], max_tokens=10, temperature=1.5, seed=3, logprobs=2)
        status, got, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[2], "max_tokens": 10,
                                                          "temperature": 1.5, "seed": 3, "logprobs": 2})
        lp = got["choices"][0]["logprobs"]
        tokens = [text(i) for i in want["ids"]]
        self.assertEqual(lp["tokens"], tokens)
        self.assertEqual(lp["token_logprobs"], want["logprobs"])
        self.assertEqual(lp["text_offset"], [len("".join(tokens[:i]).encode()) for i in range(len(tokens))])
        self.assertEqual("".join(tokens), got["choices"][0]["text"])
        for i, top in enumerate(lp["top_logprobs"]):
            expect = {}
            for tid, v in want["top"][i]:
                expect.setdefault(text(tid), v)
            expect.setdefault(tokens[i], want["logprobs"][i])
            self.assertEqual(list(top.items()), list(expect.items()), i)

    def test_stop_string_kept_and_token_strings(self):
        whole = grpc_greedy(self.s, 12, text=PROMPTS[0])["text"]
        stop = whole[4:7]
        cut = whole.index(stop)
        for include, want in ((False, whole[:cut]), (True, whole[:cut + len(stop)])):
            status, got, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0,
                                                              "stop": [stop], "include_stop_str_in_output": include})
            self.assertEqual((status, got["choices"][0]["text"], got["choices"][0]["finish_reason"]),
                             (200, want, "stop"), include)
        with open(os.path.join(MODEL, "tokenizer.json")) as f:
            vocab = {i: t for t, i in json.load(f)["model"]["vocab"].items()}
        status, got, _ = post(self.s, "/tokenize", {"prompt": "And God said", "return_token_strs": True})
        self.assertEqual(status, 200, got)
        self.assertEqual(got["token_strs"][1:], [vocab[i] for i in got["tokens"][1:]])

    def test_integers_are_range_checked_and_unsupported_fields_refused(self):
        for body, param in (({"prompt": [4294967396], "max_tokens": 1}, "prompt"),
                            ({"prompt": "a", "stop_token_ids": [4294967296]}, "stop_token_ids"),
                            ({"prompt": "a", "top_k": 18446744073709551615}, "top_k"),
                            ({"prompt": "a", "response_format": {"type": "json_schema"}},
                             "response_format.json_schema.schema"),
                            ({"prompt": "a", "response_format": 5}, "response_format"),
                            ({"prompt": "a", "guided_json": {"type": "integer", "minimum": 1}}, "guided_json"),
                            ({"prompt": "a", "guided_regex": "(a"}, "guided_regex")):
            status, got, _ = post(self.s, "/v1/completions", body)
            self.assertEqual((status, got["error"]["param"]), (400, param), body)
        for body, param in (({"messages": [{"role": "user", "content": "Hi"}], "echo": True}, "echo"),
                            ({"messages": [{"role": "user", "content": "Hi"}], "chat_template": "x"}, "chat_template"),
                            ({"messages": [{"role": "user", "content": "Hi"}], "tools": [1]}, "tools[0]"),
                            ({"messages": [{"role": "user", "content": "Hi"}],
                              "tools": [{"type": "function"}]}, "tools[0].function")):
            status, got, _ = post(self.s, "/v1/chat/completions", body)
            self.assertEqual((status, got["error"]["param"]), (400, param), body)
        status, got, _ = post(self.s, "/detokenize", {"tokens": [4294967396]})
        self.assertEqual((status, got["error"]["param"]), (400, "tokens"))
        # A prompt that cannot fit the context is refused without tokenizing 10 MB of it.
        stub = pbg.GenerationStub(grpc.insecure_channel(self.s.grpc))
        with self.assertRaises(grpc.RpcError) as e:
            list(stub.Generate(pb.GenerateRequest(text="In the beginning " * 600000), timeout=60))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("bytes is more tokens than the context length", e.exception.details())

    def test_continue_final_message(self):
        messages = [{"role": "user", "content": "Who made the earth?"},
                    {"role": "assistant", "content": "And God"}]
        status, tok, _ = post(self.s, "/tokenize", {"messages": messages, "continue_final_message": True})
        self.assertEqual(status, 200, tok)
        _, text, _ = post(self.s, "/detokenize", {"tokens": tok["tokens"]})
        self.assertTrue(text["prompt"].endswith("And God"), text)
        want = grpc_greedy(self.s, 6, ids=tok["tokens"])
        status, got, _ = post(self.s, "/v1/chat/completions", {"messages": messages, "continue_final_message": True,
                                                               "max_tokens": 6, "temperature": 0})
        self.assertEqual((status, got["choices"][0]["message"]["content"]), (200, want["text"]), got)

    def test_bad_requests_get_openai_errors(self):
        cases = [
            (b"{not json", 400, None),
            (b"[1, 2]", 400, None),
            ({"prompt": "a", "max_tokens": "3"}, 400, "max_tokens"),
            ({"prompt": "a", "temperature": "hot"}, 400, "temperature"),
            ({"prompt": "a", "temperature": 9}, 400, "temperature"),
            ({"prompt": 5}, 400, "prompt"),
            ({"prompt": "a", "n": 0}, 400, "n"),
            ({"prompt": "a", "n": 129}, 400, "n"),
            ({"prompt": ["a", "b"], "n": 65}, 400, "n"),
            ({"prompt": "a", "n": 2, "best_of": 3}, 400, "best_of"),
            ({"prompt": "a", "suffix": "z"}, 400, "suffix"),
            ({"prompt": "a", "logit_bias": {"5": 10}}, 400, "logit_bias"),
            ({"prompt": "a", "stop": [1]}, 400, "stop"),
            ({"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options"),
            ({"prompt": "a", "max_tokens": 100000}, 400, "max_tokens"),
            ({"prompt": [1, 99999]}, 400, "prompt.token_ids"),
            ({"model": "gpt-4", "prompt": "a"}, 404, "model"),
        ]
        for body, status, param in cases:
            got_status, got, _ = post(self.s, "/v1/completions", body)
            self.assertEqual(got_status, status, (body, got))
            self.assertEqual(set(got["error"]), {"message", "type", "param", "code"}, got)
            self.assertEqual(got["error"]["param"], param, (body, got))
        _, got, _ = post(self.s, "/v1/completions", {"model": "gpt-4", "prompt": "a"})
        self.assertEqual(got["error"]["code"], "model_not_found")
        for body, param in (({}, "messages"), ({"messages": []}, "messages"), ({"messages": [{"content": "x"}]},
                                                                             "messages[0].role"),
                            ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
                            ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
                             "messages")):
            got_status, got, _ = post(self.s, "/v1/chat/completions", body)
            self.assertEqual((got_status, got["error"]["param"]), (400, param), got)
        self.assertIn("alternate", got["error"]["message"])  # The template's raise_exception.
        deep = b'{"prompt": "a", "tools": ' + b"[" * 200000 + b"]" * 200000 + b"}"
        for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
            got_status, got, _ = post(self.s, path, deep)
            self.assertEqual(got_status, 400, path)
            self.assertIn("deeper than 64", got["error"]["message"])
        got_status, got, _ = post(self.s, "/v1/nothing", {})
        self.assertEqual(got_status, 404)
        # Nothing leaked, the server still answers.
        self.assertEqual(post(self.s, "/v1/completions", {"prompt": "a", "max_tokens": 2})[0], 200)

    def test_bench_drives_the_http_api(self):
        got = {}
        for endpoint in ("grpc", "openai-completions", "openai-chat"):
            out = subprocess.run([PDSERVE, "bench", "--server", self.s.grpc, "--http-server", self.s.addresses["http"],
                                  "--endpoint", endpoint, "--num-prompts", "4", "--input-len", "32",
                                  "--output-len", "6", "--format", "json", "--seed", "11"],
                                 capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            r = got[endpoint] = json.loads(out.stdout)[0]
            self.assertEqual((r["ok"], r["failed"], r["completion_tokens"]), (4, 0, 24), r)
            self.assertGreater(r["ttft_mean_ms"], 0)
        # The same token-id prompts over HTTP; chat wraps them in the template (more tokens).
        self.assertEqual(got["openai-completions"]["prompt_tokens"], got["grpc"]["prompt_tokens"])
        self.assertGreater(got["openai-chat"]["prompt_tokens"], got["grpc"]["prompt_tokens"])
        bad = subprocess.run([PDSERVE, "bench", "--server", self.s.grpc, "--endpoint", "openai-chat"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--http-server", bad.stderr)

    def test_client_that_disconnects_mid_stream_frees_its_blocks(self):
        host, port = self.s.addresses["http"].rsplit(":", 1)
        body = json.dumps({"prompt": PROMPTS[1], "max_tokens": 1500, "ignore_eos": True, "stream": True})
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        r.fp.readline()  # The first event is on its way: the request holds blocks.
        # The first token comes from the prefill worker, possibly before the decode worker has
        # its pages and runs the request: wait for that (it ran at once in most runs, not all).
        deadline = time.time() + 10
        while (cluster.metric(self.s, "pdserve_num_requests_running", role="decode") == 0 and
               time.time() < deadline):
            time.sleep(0.01)
        self.assertGreater(cluster.metric(self.s, "pdserve_num_requests_running", role="decode"), 0)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        deadline = time.time() + 30
        while time.time() < deadline:
            if (cluster.metric(self.s, "pdserve_kv_cache_usage_perc", role="decode") == 0 and
                    cluster.metric(self.s, "pdserve_num_requests_running", role="decode") == 0):
                break
            time.sleep(0.2)
        self.assertEqual(cluster.metric(self.s, "pdserve_kv_cache_usage_perc", role="decode"), 0)
        self.assertEqual(cluster.metric(self.s, "pdserve_kv_cache_usage_perc", role="prefill"), 0)
        self.assertEqual(cluster.metric(self.s, "pdserve_request_success_total", role="decode",
                                        finished_reason="abort"), 1)


class HostileClientTest(unittest.TestCase):
    """What the thread-per-connection server fell to: slow and many clients, and clients that leave."""

    @classmethod
    def setUpClass(cls):
        cls.s = serve("--http-request-timeout-seconds", "5")
        cls.host, port = cls.s.addresses["http"].rsplit(":", 1)
        cls.port = int(port)

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def raw_post(self, body):
        data = json.dumps(body).encode()
        sock = socket.create_connection((self.host, self.port), timeout=60)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        return sock

    def wait_metric(self, name, value, **labels):
        deadline = time.time() + 60
        while time.time() < deadline and cluster.metric(self.s, name, **labels) != value:
            time.sleep(0.1)
        self.assertEqual(cluster.metric(self.s, name, **labels), value, (name, labels))

    def assert_all_freed(self, aborts):
        self.wait_metric("pdserve_num_requests_running", 0, role="router")
        self.wait_metric("pdserve_kv_cache_usage_perc", 0, role="decode")
        self.wait_metric("pdserve_kv_cache_usage_perc", 0, role="prefill")
        self.wait_metric("pdserve_num_requests_running", 0, role="decode")
        # Counted where the client's request ends (some never reached the decode worker).
        self.assertEqual(cluster.metric(self.s, "pdserve_request_success_total", role="router",
                                        finished_reason="abort"), aborts)

    def test_trickling_clients_do_not_hold_the_api(self):
        # 200 clients sending a header line now and then (the old server had 64 threads).
        slow = [socket.create_connection((self.host, self.port), timeout=10) for _ in range(200)]
        start = time.time()
        for s in slow:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n")
        status, got, _ = post(self.s, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})
        self.assertEqual(status, 200)
        self.assertEqual(got["choices"][0]["text"], grpc_greedy(self.s, 4, text=PROMPTS[0])["text"])
        self.assertLess(time.time() - start, 4.5)  # Served while all 200 still hold their connections.
        for s in slow:
            s.sendall(b"X-Slow: 1\r\n")
        for s in slow:  # Cut off at the request deadline (5 s), each told why.
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
            self.assertTrue(answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:100])
            self.assertIn(b"did not arrive within 5000 ms", answer)
            s.close()
        self.assertEqual(cluster.metric(self.s, "pdserve_http_responses_total", code="408"), 200)
        self.wait_metric("pdserve_http_connections", 0, role="router")

    def test_more_streams_than_the_old_thread_pool(self):
        aborts = cluster.metric(self.s, "pdserve_request_success_total", role="router", finished_reason="abort")
        body = {"prompt": PROMPTS[1], "max_tokens": 1500, "ignore_eos": True, "stream": True}
        streams = [self.raw_post(body) for _ in range(100)]
        # All 100 reach the router at once (none waits for an HTTP thread; the decode worker runs
        # 64 at a time, --max-num-seqs), then leave: each request is aborted and its blocks freed.
        self.wait_metric("pdserve_num_requests_running", 100, role="router")
        for s in streams:
            s.close()
        self.assert_all_freed(aborts + 100)

    def test_client_that_leaves_an_n_stream_cancels_every_choice(self):
        aborts = cluster.metric(self.s, "pdserve_request_success_total", role="router", finished_reason="abort")
        sock = self.raw_post({"prompt": PROMPTS[1], "max_tokens": 1500, "ignore_eos": True, "stream": True,
                              "n": 4, "temperature": 1.0})
        self.wait_metric("pdserve_num_requests_running", 4, role="router")
        sock.close()
        self.assert_all_freed(aborts + 4)

    def test_client_that_leaves_before_a_whole_response_frees_its_blocks(self):
        aborts = cluster.metric(self.s, "pdserve_request_success_total", role="router", finished_reason="abort")
        sock = self.raw_post({"prompt": PROMPTS[1], "max_tokens": 1500, "ignore_eos": True})
        self.wait_metric("pdserve_num_requests_running", 1, role="router")
        sock.close()  # The answer would come only after 1,500 tokens: nobody would read it.
        self.assert_all_freed(aborts + 1)


class ToolArgumentsTest(unittest.TestCase):
    """Without --tool-call-parser; a template that reads an earlier call's arguments."""

    def test_arguments_reach_the_template_as_an_object_and_auto_needs_a_parser(self):
        template = os.path.join(WORKDIR, "tools.jinja")
        with open(template, "w") as f:
            f.write("{% for m in messages %}{{ m.role }}: {{ m.content }}{% for c in m.tool_calls or [] %}"
                    "[{{ c.function.name }}({{ c.function.arguments.city }})]{% endfor %}\n{% endfor %}")
        s = cluster.Process(PDSERVE, ["serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                                      "--kv-memory-gib", "0.05", "--http-listen", "127.0.0.1:0",
                                      "--chat-template", template])
        try:
            messages = [{"role": "user", "content": "Weather?"},
                        {"role": "assistant", "content": None,
                         "tool_calls": [{"id": "call_1", "type": "function",
                                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
            status, got, _ = post(s, "/tokenize", {"messages": messages})
            self.assertEqual(status, 200, got)
            _, text, _ = post(s, "/detokenize", {"tokens": got["tokens"]})
            # (The newline after a block tag is dropped: Hugging Face renders with trim_blocks.)
            self.assertEqual(text["prompt"], "user: Weather?assistant: [get_weather(Paris)]tool: 21 C")
            tools = [{"type": "function", "function": {"name": "get_weather"}}]
            status, got, _ = post(s, "/v1/chat/completions", {"messages": messages[:1], "tools": tools,
                                                               "tool_choice": "auto", "max_tokens": 2})
            self.assertEqual((status, got["error"]["param"]), (400, "tool_choice"), got)
            self.assertIn("--tool-call-parser", got["error"]["message"])
            # tool_choice absent means "auto" with tools (OpenAI, vLLM): refused the same way, not
            # served as text on one spelling and refused on the other.
            status, got, _ = post(s, "/v1/chat/completions", {"messages": messages[:1], "tools": tools, "max_tokens": 2})
            self.assertEqual((status, got["error"]["param"]), (400, "tool_choice"), got)
            status, got, _ = post(s, "/v1/chat/completions", {"messages": messages[:1], "tools": tools,
                                                               "tool_choice": "none", "max_tokens": 2})
            self.assertEqual(status, 200, got)  # "none": the tools reach the template, the output stays text.
        finally:
            self.assertEqual(s.stop(), 0)


class ScriptedToolCallTest(unittest.TestCase):
    """Tool calls as clients see them, field by field, from a model whose greedy output is a
    script (scripted_model.py: real weights, real engine): some content, then two hermes calls."""
    CONTENT = "Let me check."
    PIECES = [CONTENT, "<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Paris", "days": 2}}',
              "\n</tool_call>", "\n<tool_call>\n", '{"name": "get_time", "arguments": ', '{"zone": "CET"}}',
              "</tool_call>"]
    CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"zone": "CET"})]
    TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("get_weather", "get_time")]

    @classmethod
    def setUpClass(cls):
        model = os.path.join(WORKDIR, "scripted")
        template = scripted_model.make_scripted_model(PDSERVE, model, "<|assistant|>", cls.PIECES)
        cls.s = cluster.Process(PDSERVE, ["serve", "--model", model, "--listen", "127.0.0.1:0", "--threads", "1",
                                          "--kv-memory-gib", "0.05", "--http-listen", "127.0.0.1:0",
                                          "--chat-template", template, "--tool-call-parser", "hermes"])
        cls.chat = {"messages": [{"role": "user", "content": "Weather and time in Paris?"}],
                    "tools": cls.TOOLS, "temperature": 0, "max_tokens": 20}

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def check_calls(self, calls, want):
        self.assertEqual(len(calls), len(want))
        for call, (name, args) in zip(calls, want):
            self.assertRegex(call["id"], r"^call_[0-9a-f]{24}$")
            self.assertEqual(call["type"], "function")
            self.assertEqual(call["function"]["name"], name)
            self.assertIsInstance(call["function"]["arguments"], str)  # JSON text, not an object.
            self.assertEqual(json.loads(call["function"]["arguments"]), args)
        self.assertEqual(len({c["id"] for c in calls}), len(calls))

    def test_whole_response(self):
        status, got, _ = post(self.s, "/v1/chat/completions", self.chat)
        self.assertEqual(status, 200, got)
        choice = got["choices"][0]
        self.assertEqual(choice["finish_reason"], "tool_calls")
        self.assertEqual(choice["message"]["role"], "assistant")
        self.assertEqual(choice["message"]["content"], self.CONTENT)
        self.check_calls(choice["message"]["tool_calls"], self.CALLS)
        self.assertEqual(got["usage"]["completion_tokens"], len(self.PIECES) + 1)  # And EOS.
        # parallel_tool_calls false: the first call only.
        status, got, _ = post(self.s, "/v1/chat/completions", {**self.chat, "parallel_tool_calls": False})
        self.assertEqual(got["choices"][0]["finish_reason"], "tool_calls")
        self.check_calls(got["choices"][0]["message"]["tool_calls"], self.CALLS[:1])
        # Without a parser's tools the same tokens are plain content, finishing with "stop".
        status, got, _ = post(self.s, "/v1/chat/completions", {**self.chat, "tool_choice": "none"})
        self.assertEqual((got["choices"][0]["finish_reason"], got["choices"][0]["message"]["content"]),
                         ("stop", "".join(self.PIECES)))
        self.assertNotIn("tool_calls", got["choices"][0]["message"])

    def test_streamed_response(self):
        status, raw, _ = post(self.s, "/v1/chat/completions", {**self.chat, "stream": True}, raw=True)
        self.assertEqual(status, 200)
        events = sse_events(raw)
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        self.assertEqual(deltas[0], {"role": "assistant", "content": ""})
        self.assertEqual("".join(d.get("content") or "" for d in deltas), self.CONTENT)
        calls = {}  # By index: id, type and name from the first fragment; arguments concatenated.
        for d in deltas:
            for frag in d.get("tool_calls", []):
                self.assertIsInstance(frag["index"], int)
                call = calls.setdefault(frag["index"], {"id": frag.get("id"), "type": frag.get("type"),
                                                        "function": {"name": frag["function"].get("name"),
                                                                     "arguments": ""}})
                call["function"]["arguments"] += frag["function"].get("arguments", "")
        self.assertEqual(sorted(calls), [0, 1])
        self.check_calls([calls[0], calls[1]], self.CALLS)
        finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
        self.assertEqual(finishes[-1], "tool_calls")
        self.assertTrue(all(f is None for f in finishes[:-1]), finishes)


class ScriptedSpecialTokenTest(unittest.TestCase):
    """skip_special_tokens over HTTP as over gRPC, on a model whose output holds a special token."""

    def test_skip_special_tokens(self):
        model = os.path.join(WORKDIR, "scripted-special")
        scripted_model.make_scripted_model(PDSERVE, model, "<|go|>", ["Hello", "<|sep|>", " world"],
                                           special={"<|sep|>"})
        s = cluster.Process(PDSERVE, ["serve", "--model", model, "--listen", "127.0.0.1:0", "--threads", "1",
                                      "--kv-memory-gib", "0.05", "--http-listen", "127.0.0.1:0"])
        try:
            for skip, text in ((True, "Hello world"), (False, "Hello<|sep|> world")):
                want = grpc_generate(s, "say<|go|>", max_tokens=8, temperature=0, skip_special_tokens=skip)
                status, got, _ = post(s, "/v1/completions", {"prompt": "say<|go|>", "max_tokens": 8,
                                                             "temperature": 0, "skip_special_tokens": skip})
                self.assertEqual(status, 200, got)
                self.assertEqual((got["choices"][0]["text"], want["text"]), (text, text), skip)
                self.assertEqual(got["choices"][0]["finish_reason"], "stop")
            # The default is to skip them, as vLLM's. The EOS that ended the output is not text
            # (as in vLLM), unless include_stop_str_in_output asks for it.
            status, got, _ = post(s, "/v1/completions", {"prompt": "say<|go|>", "max_tokens": 8, "temperature": 0})
            self.assertEqual(got["choices"][0]["text"], "Hello world")
            status, got, _ = post(s, "/v1/completions", {"prompt": "say<|go|>", "max_tokens": 8, "temperature": 0,
                                                         "skip_special_tokens": False,
                                                         "include_stop_str_in_output": True})
            self.assertEqual(got["choices"][0]["text"], "Hello<|sep|> world<|end_of_text|>")
        finally:
            self.assertEqual(s.stop(), 0)


class OfficialClientTest(unittest.TestCase):
    """The official `openai` npm client (pinned in scripts/openai_client_setup.sh) against serve."""

    def test_openai_node_client(self):
        client_dir = subprocess.run([os.path.join(ROOT, "scripts", "openai_client_setup.sh")], check=True,
                                    capture_output=True, text=True).stdout.strip()
        script = os.path.join(client_dir, "openai_client.mjs")
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_client.mjs")) as src, \
                open(script, "w") as dst:
            dst.write(src.read())
        s = serve()
        try:
            messages = [{"role": "user", "content": "Who made the heaven and the earth?"}]
            out = subprocess.run(["node", script, f"http://{s.addresses['http']}/v1", "pdserve-demo", PROMPTS[0],
                                  json.dumps(messages)], capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            got = json.loads(out.stdout)
            want = grpc_greedy(s, 12, text=PROMPTS[0])
            self.assertEqual(got["completion"]["text"], want["text"])
            self.assertEqual(got["completion"]["finish_reason"], "length")
            self.assertEqual(got["completion"]["usage"]["prompt_tokens"], want["usage"].prompt_tokens)
            self.assertEqual(got["completion"]["usage"]["completion_tokens"], 12)
            self.assertEqual(got["completion_stream"]["text"], want["text"])
            self.assertGreater(got["completion_stream"]["chunks"], 1)
            chat = grpc_greedy(s, 10, text=render_chat(messages), add_special_tokens=False)
            self.assertEqual((got["chat"]["content"], got["chat"]["role"]), (chat["text"], "assistant"))
            self.assertEqual(got["chat"]["usage"]["prompt_tokens"], chat["usage"].prompt_tokens)
            self.assertEqual(got["chat_stream"]["content"], chat["text"])
            self.assertEqual(got["chat_stream"]["usage"]["completion_tokens"], 10)
            self.assertEqual(got["models"], ["pdserve-demo"])
            self.assertEqual(got["not_found"], {"status": 404, "code": "model_not_found", "param": "model",
                                                "type": "invalid_request_error"})
            self.assertEqual(got["retrieved"]["id"], "pdserve-demo")
            self.assertEqual(got["retrieve_missing"], {"status": 404, "code": "model_not_found"})
            # Chat without max_tokens runs to the end of the context (or EOS), as OpenAI's does:
            # the same as the gRPC API asked for everything the context has left.
            prompt_tokens = chat["usage"].prompt_tokens
            whole = grpc_greedy(s, 2048 - prompt_tokens, text=render_chat(messages), add_special_tokens=False)
            self.assertEqual(got["chat_unbounded"]["content"], whole["text"])
            self.assertEqual(got["chat_unbounded"]["usage"]["completion_tokens"], len(whole["ids"]))
            self.assertEqual(got["bad_request"], {"status": 400, "param": "messages"})
        finally:
            self.assertEqual(s.stop(), 0)


class OpenAiLimitsTest(unittest.TestCase):
    def test_api_keys_size_limit_and_inflight_bound(self):
        s = serve("--max-request-bytes", "2048", "--max-inflight-requests", "1", env={"PDSERVE_API_KEYS": "k1"})
        try:
            body = {"prompt": "a", "max_tokens": 2}
            self.assertEqual(post(s, "/v1/completions", body)[0], 401)
            status, got, _ = post(s, "/v1/completions", body, {"Authorization": "Bearer wrong"})
            self.assertEqual((status, got["error"]["type"]), (401, "authentication_error"))
            key = {"Authorization": "Bearer k1"}
            self.assertEqual(post(s, "/v1/completions", body, key)[0], 200)
            status, got, _ = post(s, "/v1/completions", {"prompt": "x" * 4000}, key)
            self.assertEqual(status, 413)
            self.assertIn("--max-request-bytes", got["error"]["message"])
            # A long stream holds the only slot: the next request is refused with Retry-After.
            host, port = s.addresses["http"].rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            conn.request("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": 1500, "ignore_eos": True,
                                                                "stream": True}),
                         {"Content-Type": "application/json", **key})
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            r.fp.readline()
            status, got, headers = post(s, "/v1/completions", body, key)
            self.assertEqual((status, got["error"]["type"]), (429, "rate_limit_error"), got)
            self.assertEqual(headers["Retry-After"], "1")
            conn.close()
            # More choices than may ever be in flight: a 400 naming the bound, not a 429 to retry forever.
            status, got, headers = post(s, "/v1/completions", {**body, "n": 2}, key)
            self.assertEqual((status, got["error"]["param"]), (400, "n"), got)
            self.assertIn("--max-inflight-requests", got["error"]["message"])
            self.assertNotIn("Retry-After", headers)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_rejected_large_bodies_leave_no_memory_behind(self):
        """A few refused 10 MB bodies (a chat of 300k messages, a 10 MB message, 1.5M stop strings)
        took serve from ~100 MB to 1.2 GB for good; their memory is given back within seconds."""
        s = serve()
        try:
            def rss_mib():
                with open(f"/proc/{s.proc.pid}/status") as f:
                    return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) // 1024
            base = rss_mib()
            bodies = [("/v1/chat/completions", {"model": "pdserve-demo", "max_tokens": 4,
                                                "messages": [{"role": "user", "content": "w"}] * 300000}),
                      ("/v1/chat/completions", {"model": "pdserve-demo", "max_tokens": 4,
                                                "messages": [{"role": "user", "content": "word " * 2000000}]}),
                      ("/v1/completions", {"model": "pdserve-demo", "prompt": "hi", "stop": ["ab"] * 1500000})]
            for path, body in bodies * 2:
                status, got, _ = post(s, path, body)
                self.assertEqual(status, 400, got)
            deadline = time.time() + 10
            while rss_mib() > base + 300 and time.time() < deadline:
                time.sleep(0.5)
            self.assertLess(rss_mib(), base + 300, f"from {base} MiB")
            status, got, _ = post(s, "/v1/completions", {"model": "pdserve-demo", "prompt": "In the", "max_tokens": 3})
            self.assertEqual(status, 200, got)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_api_keys_guard_every_route_but_health(self):
        s = serve(env={"PDSERVE_API_KEYS": "k1"})
        try:
            base = f"http://{s.addresses['http']}"
            for method, path, body in (("POST", "/tokenize", {"prompt": "a"}), ("POST", "/detokenize", {"tokens": [1]}),
                                       ("GET", "/v1/models", None), ("GET", "/v1/models/pdserve-demo", None),
                                       ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 1})):
                data = None if body is None else json.dumps(body).encode()
                for headers, want in (({}, 401), ({"Authorization": "Bearer wrong"}, 401),
                                      ({"Authorization": "Bearer k1"}, 200),
                                      ({"Authorization": "bearer k1"}, 200),  # Schemes are case-insensitive.
                                      ({"Authorization": "BEARER  k1"}, 200)):
                    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
                    try:
                        with urllib.request.urlopen(req, timeout=60) as r:
                            status = r.status
                    except urllib.error.HTTPError as e:
                        status = e.code
                        if status == 401:
                            self.assertEqual(json.loads(e.read())["error"]["type"], "authentication_error")
                    self.assertEqual(status, want, (method, path, headers))
            with urllib.request.urlopen(base + "/health", timeout=10) as r:
                self.assertEqual(r.status, 200)
            # gRPC takes the lower-case scheme too.
            stub = pbg.GenerationStub(grpc.insecure_channel(s.grpc))
            stub.Tokenize(pb.TokenizeRequest(text="a"), metadata=[("authorization", "bearer k1")], timeout=10)
            # The key is checked on the head: a client without one never gets its body read.
            host, port = s.addresses["http"].rsplit(":", 1)
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 10000000\r\n\r\n{")
            head = sock.recv(4096).decode()
            self.assertTrue(head.startswith("HTTP/1.1 401"), head)
            sock.close()
        finally:
            self.assertEqual(s.stop(), 0)

    def test_router_over_separate_tiers(self):
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1,
                            router_args=("--http-listen", "127.0.0.1:0", "--chat-template", TEMPLATE))
        try:
            messages = [{"role": "user", "content": "Who made the heaven and the earth?"}]
            want = grpc_greedy(c.router, 8, text=render_chat(messages), add_special_tokens=False)
            status, got, _ = post(c.router, "/v1/chat/completions", {"messages": messages, "max_tokens": 8,
                                                                     "temperature": 0})
            self.assertEqual((status, got["choices"][0]["message"]["content"]), (200, want["text"]))
            status, raw, _ = post(c.router, "/v1/completions", {"prompt": PROMPTS[2], "max_tokens": 8,
                                                                "temperature": 0, "stream": True}, raw=True)
            self.assertEqual("".join(e["choices"][0]["text"] for e in sse_events(raw)),
                             grpc_greedy(c.router, 8, text=PROMPTS[2])["text"])
        finally:
            self.assertEqual(c.stop(), [0] * 3)

    def test_served_model_name(self):
        s = serve("--served-model-name", "kjv-small")
        try:
            with urllib.request.urlopen(f"http://{s.addresses['http']}/v1/models", timeout=10) as r:
                self.assertEqual([m["id"] for m in json.loads(r.read())["data"]], ["kjv-small"])
            self.assertEqual(post(s, "/v1/completions", {"model": "pdserve-demo", "prompt": "a"})[0], 404)
            status, got, _ = post(s, "/v1/completions", {"model": "kjv-small", "prompt": "a", "max_tokens": 2})
            self.assertEqual((status, got["model"]), (200, "kjv-small"))
            stub = pbg.GenerationStub(grpc.insecure_channel(s.grpc))
            self.assertEqual(stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).name, "kjv-small")
            for role in ("router", "decode"):
                self.assertEqual(cluster.metric(s, "pdserve_request_success_total", role=role, model_name="kjv-small"),
                                 1, role)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_tls(self):
        cert, key = os.path.join(WORKDIR, "cert.pem"), os.path.join(WORKDIR, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True)
        s = serve("--tls-cert", cert, "--tls-key", key, env={"PDSERVE_API_KEYS": "k1"})
        try:
            url = f"https://{s.addresses['http']}/v1/completions"
            body = json.dumps({"prompt": "And God said", "max_tokens": 4, "temperature": 0}).encode()
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json",
                                                                  "Authorization": "Bearer k1"})
            with urllib.request.urlopen(req, timeout=60, context=ssl.create_default_context(cafile=cert)) as r:
                got = json.loads(r.read())
            self.assertEqual(got["usage"]["completion_tokens"], 4)
            # The key is still checked behind TLS; plain HTTP is not served.
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=60, context=ssl.create_default_context(cafile=cert))
            self.assertEqual(e.exception.code, 401)
            with self.assertRaises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
                urllib.request.urlopen(f"http://{s.addresses['http']}/health", timeout=10)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_bad_flags(self):
        bad = subprocess.run([PDSERVE, "serve", "--model", MODEL, "--http-listen", "nohostport"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--http-listen", bad.stderr)
        broken = os.path.join(WORKDIR, "broken.jinja")
        with open(broken, "w") as f:
            f.write("{% for m in messages %}")
        bad = subprocess.run([PDSERVE, "serve", "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", "1",
                              "--kv-memory-gib", "0.05", "--http-listen", "127.0.0.1:0", "--chat-template", broken],
                             capture_output=True, text=True, timeout=60)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("endfor", bad.stderr)
        bad = subprocess.run([PDSERVE, "serve", "--model", MODEL, "--tool-call-parser", "mistral"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--tool-call-parser: 'mistral' is not one of hermes, llama3_json, none", bad.stderr)


class RouterDrainTest(unittest.TestCase):
    """SIGTERM to a router with HTTP responses still on their way: each one is finished, and a
    request arriving meanwhile hears that the server is stopping. The fault hook holds each
    response's last bytes back 1.5 s after its generation ended, so without the HTTP drain the
    router's exit cuts them every time, not by chance."""

    def test_sigterm_finishes_http_responses_in_flight(self):
        c = cluster.Cluster(PDSERVE, MODEL, prefill=1, decode=1,
                            router_args=("--http-listen", "127.0.0.1:0", "--chat-template", TEMPLATE),
                            env={"PDSERVE_FAULT_HTTP_DELAY_END_MS": "1500"})
        try:
            host, port = c.router.addresses["http"].rsplit(":", 1)
            streams, wholes = [], []
            for i in range(4):
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                conn.request("POST", "/v1/completions", json.dumps(
                    {"prompt": PROMPTS[i], "max_tokens": 4, "temperature": 0, "stream": True}),
                    {"Content-Type": "application/json"})
                streams.append(conn)
            for i in range(3):
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                conn.request("POST", "/v1/chat/completions", json.dumps(
                    {"messages": [{"role": "user", "content": PROMPTS[i]}], "max_tokens": 4, "temperature": 0}),
                    {"Content-Type": "application/json"})
                wholes.append(conn)
            # Each stream's generation is over once its finish_reason arrived; its end is held back.
            responses = [conn.getresponse() for conn in streams]
            bodies = []
            for r in responses:
                self.assertEqual(r.status, 200)
                body = b""
                while b"finish_reason\": \"length" not in body and b'"finish_reason":"length' not in body:
                    line = r.fp.readline()
                    self.assertTrue(line, body)
                    body += line
                bodies.append(body)
            c.router.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            # During the drain: health and new requests say so.
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://{host}:{port}/health", timeout=10)
            self.assertEqual(e.exception.code, 503)
            status, got, _ = post(c.router, "/v1/completions", {"prompt": "a", "max_tokens": 2})
            self.assertEqual(status, 503, got)
            self.assertIn("shutting down", got["error"]["message"])
            for r, body in zip(responses, bodies):
                # The rest of the chunked stream, raw, up to the connection's close (a drained
                # connection closes once its response ended): the last event and the last chunk.
                body += r.fp.read()
                self.assertIn(b"data: [DONE]\n\n", body)
                self.assertTrue(body.endswith(b"0\r\n\r\n"), body[-200:])
            for conn in wholes:
                r = conn.getresponse()
                got = json.loads(r.read())
                self.assertEqual((r.status, got.get("usage", {}).get("completion_tokens")), (200, 4), str(got))
            self.assertEqual(c.router.proc.wait(timeout=60), 0)
        finally:
            c.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_openai_")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
