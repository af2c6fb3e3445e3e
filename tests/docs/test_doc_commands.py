"""The guide's commands, run: every shell block of README.md and docs/**/*.md under a
`<!-- doctest -->` line is executed the way a reader would paste it, from the repository's root,
so a renamed flag or a command that stopped working fails CI instead of misleading a reader.

Marks (an HTML comment on the line before a fenced block, invisible on the rendered page):
  <!-- doctest -->          run the block (bash -euo pipefail); it starts what it needs itself
  <!-- doctest: serve -->   run it while a `pdserve serve` of the demo model is up, at the
                            addresses README's tour uses (127.0.0.1:8000 gRPC, :8080 HTTP,
                            :9400 metrics), with the chat template run.sh gives the demo model
  <!-- doctest: output -->  this block is the output the command block before it prints: each
                            of its non-empty lines must appear in that command's stdout

Addresses in a block are the reader's: the runner maps the serve's three onto the ports it took,
and any other 127.0.0.1:PORT onto a free port (the same one throughout the block), and
`build/pdserve` onto --pdserve. Processes a block leaves in the background are stopped after it.
Beside the commands: every page of docs/guide is linked from README, and every relative link of
README, docs/, bench/RESULTS.md and its notes, RELIABILITY.md and the chart's README reaches an existing file and, into a Markdown file, an existing
heading, and every repository path those pages name in backticks exists.

  /usr/bin/python3 tests/docs/test_doc_commands.py --pdserve build/pdserve
"""

import argparse
import dataclasses
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PDSERVE = None
MARK = re.compile(r"^<!--\s*doctest(?::\s*([\w, ]*))?\s*-->\s*$")
SERVE_PORTS = {"8000": "grpc", "8080": "http", "9400": "metrics"}
BLOCK_TIMEOUT = 240


@dataclasses.dataclass
class Block:
    page: str
    line: int
    code: str
    serve: bool
    output: str = None  # What the command must print (its lines, in its stdout).


def pages():
    found = [os.path.join(ROOT, "README.md")]
    found += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return found


def parse(path, text=None):
    """The marked blocks of one Markdown page, with their expected outputs attached."""
    if text is None:
        with open(path) as f:
            text = f.read()
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if not m:
            i += 1
            continue
        options = {o.strip() for o in (m.group(1) or "").split(",") if o.strip()}
        unknown = options - {"serve", "output"}
        if unknown:
            raise ValueError(f"{path}:{i + 1}: unknown doctest option(s) {sorted(unknown)}")
        start = i + 1
        if start >= len(lines) or not lines[start].startswith("```"):
            raise ValueError(f"{path}:{i + 1}: a doctest mark must stand right above a fenced block")
        end = start + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{start + 1}: the block never closes")
        body = "\n".join(lines[start + 1:end]) + "\n"
        if "output" in options:
            if not blocks or blocks[-1].output is not None:
                raise ValueError(f"{path}:{i + 1}: an output block follows no command block")
            blocks[-1].output = body
        else:
            if lines[start].strip() not in ("```sh", "```bash", "```shell"):
                raise ValueError(f"{path}:{start + 1}: a doctest command block is ```sh")
            blocks.append(Block(os.path.relpath(path, ROOT), start + 1, body, "serve" in options))
        i = end + 1
    return blocks


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def localize(code, serve_addresses):
    """The block with the reader's addresses and binary replaced by this run's."""
    taken = {}

    def address(m):
        port = m.group(2)
        if serve_addresses and port in SERVE_PORTS:
            return serve_addresses[SERVE_PORTS[port]]
        if port not in taken:
            taken[port] = f"127.0.0.1:{free_port()}"
        return taken[port]

    code = re.sub(r"\b(127\.0\.0\.1|localhost):(\d{4,5})\b", address, code)
    return re.sub(r"(?<![\w/.])build/pdserve\b", PDSERVE, code)


def run(block, serve_addresses):
    """Runs one block; returns None or what went wrong."""
    code = localize(block.code, serve_addresses)
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        # What it left in the background (servers it started) goes with it.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(0.5)
    if timed_out:
        out, err = proc.communicate()
        return f"did not finish within {BLOCK_TIMEOUT} s\nstdout:\n{out[-2000:]}\nstderr:\n{err[-2000:]}"
    where = f"{block.page}:{block.line}"
    if proc.returncode != 0:
        return f"{where}: exit {proc.returncode}\n{code}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    if block.output is not None:
        missing = [line for line in block.output.split("\n") if line.strip() and line.strip() not in out]
        if missing:
            return f"{where}: the page shows output the command did not print: {missing}\nstdout:\n{out[-3000:]}"
    return None


class DemoServe:
    """`pdserve serve` of the demo model as README's tour runs it (scripts/run.sh's flags)."""

    def __init__(self):
        self.ready = tempfile.TemporaryFile(mode="w+")
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [PDSERVE, "serve", "--model", "models/pdserve-demo", "--kv-memory-gib", "0.25", "--threads", "1",
             "--chat-template", "tests/chat/inst_template.jinja", "--lora-modules", "psalms=models/pdserve-demo-lora",
             "--listen", "127.0.0.1:0",
             "--http-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if "ready:" not in line:
            self.log.seek(0)
            raise RuntimeError(f"the demo serve did not start: {self.log.read().decode()[-2000:]}")
        self.addresses = dict(re.findall(r"(\w+)=(\S+)", line))

    def stop(self):
        self.proc.terminate()
        return self.proc.wait(timeout=60)


def anchors(path):
    """The anchors GitHub gives a Markdown page's headings."""
    out, fence = set(), False
    with open(path) as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            m = None if fence else re.match(r"^#{1,6} (.*)$", line.rstrip("\n"))
            if m:
                slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
                n = 1
                base = slug
                while slug in out:
                    slug = f"{base}-{n}"
                    n += 1
                out.add(slug)
    return out


class DocCommandsTest(unittest.TestCase):

    def test_the_marked_commands_of_every_page_run(self):
        blocks = [b for p in pages() for b in parse(p)]
        self.assertGreaterEqual(len(blocks), 10, "fewer marked blocks than README's tour alone has")
        failures = []
        serve = DemoServe() if any(b.serve for b in blocks) else None
        try:
            for b in blocks:
                problem = run(b, serve.addresses if b.serve else None)
                if problem:
                    failures.append(problem)
        finally:
            if serve is not None:
                self.assertEqual(serve.stop(), 0, "the demo serve did not stop cleanly")
        self.assertEqual(failures, [], "\n\n".join(failures))

    def test_a_renamed_flag_fails_its_page(self):
        """The runner itself: a block whose flag does not exist (as after a rename), and a block
        whose shown output differs from what the command prints, each fail; the same blocks as
        documented pass."""
        page = ("<!-- doctest -->\n```sh\nbuild/pdserve kv-calc --model models/pdserve-demo --seq-len 100 "
                "--batch 2 --{flag}\n```\n<!-- doctest: output -->\n```\n{shown}\n```\n")
        good, = parse("scratch.md", page.format(flag="format text", shown="bytes per token:   2048 (2.0 KiB)"))
        self.assertIsNone(run(good, None))
        renamed, = parse("scratch.md", page.format(flag="output-format text", shown="bytes per token:   2048 (2.0 KiB)"))
        problem = run(renamed, None)
        self.assertIsNotNone(problem)
        self.assertIn("output-format", problem)
        wrong, = parse("scratch.md", page.format(flag="format text", shown="no such line"))
        self.assertIn("did not print", run(wrong, None))
        with self.assertRaisesRegex(ValueError, "unknown doctest option"):
            parse("scratch.md", "<!-- doctest: serve, sometimes -->\n```sh\ntrue\n```\n")

    def test_every_guide_page_is_linked_from_readme(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            readme = f.read()
        guide = sorted(glob.glob(os.path.join(ROOT, "docs", "guide", "*.md")))
        self.assertGreaterEqual(len(guide), 10)
        for page in guide:
            self.assertIn(f"](docs/guide/{os.path.basename(page)}", readme, f"{page} is not linked from README")

    def test_every_relative_link_resolves(self):
        sources = pages() + glob.glob(os.path.join(ROOT, "bench", "*.md"))
        sources += glob.glob(os.path.join(ROOT, "bench", "notes", "*.md"))
        sources += [os.path.join(ROOT, "RELIABILITY.md"), os.path.join(ROOT, "deploy", "k8s", "pdserve", "README.md")]
        broken, checked = [], 0
        for src in sources:
            with open(src) as f:
                text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
            for target in re.findall(r"\]\(([^)\s]+)\)", text):
                if re.match(r"^[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                full = os.path.normpath(os.path.join(os.path.dirname(src), path)) if path else src
                checked += 1
                if not os.path.exists(full):
                    broken.append(f"{os.path.relpath(src, ROOT)}: {target} (no such file)")
                elif anchor and full.endswith(".md") and anchor not in anchors(full):
                    broken.append(f"{os.path.relpath(src, ROOT)}: {target} (no such heading)")
        self.assertGreater(checked, 50)
        self.assertEqual(broken, [])

    def test_every_repository_path_named_exists(self):
        """A path of this repository in backticks (`tests/docs/test_doc_commands.py`) names a
        file or directory that exists (README named this file by a name it never had). The lab
        notes under bench/notes are history and may name what has since moved."""
        tops = {d for d in os.listdir(ROOT) if not d.startswith((".", "build"))}
        sources = pages() + glob.glob(os.path.join(ROOT, "bench", "*.md"))
        sources += [os.path.join(ROOT, "RELIABILITY.md"), os.path.join(ROOT, "deploy", "k8s", "pdserve", "README.md")]
        path = re.compile(r"`([\w.-]+(?:/[\w.-]+)+/?)`")
        missing, checked = [], 0
        for src in sources:
            with open(src) as f:
                text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
            for named in path.findall(text):
                if named.split("/")[0] not in tops:
                    continue  # build/..., /usr/..., a URL path: not this repository's files
                checked += 1
                if not os.path.exists(os.path.join(ROOT, named)):
                    missing.append(f"{os.path.relpath(src, ROOT)}: `{named}`")
        self.assertGreater(checked, 50)
        self.assertEqual(missing, [])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
