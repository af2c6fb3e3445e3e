"""Starting pdserve's tiers as real processes on loopback, for the end-to-end tests.

Each process prints one "ready" line with its addresses; the helpers parse it. Python stubs are
generated from proto/ with Debian's protoc and grpc_python_plugin into a temporary directory.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_DIR = os.path.join(ROOT, "proto")
_STUBS = None


def stubs_dir():
    """Generates the Python stubs once per test process; returns their directory (on sys.path)."""
    global _STUBS
    if _STUBS is None:
        out = tempfile.mkdtemp(prefix="pdserve_stubs_")
        subprocess.run(["protoc", f"-I{PROTO_DIR}", f"--python_out={out}", f"--grpc_out={out}",
                        "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin",
                        "pdserve/v1/generation.proto", "pdserve/internal/v1/worker.proto"],
                       check=True, cwd=PROTO_DIR)
        sys.path.insert(0, out)
        _STUBS = out
        _track_channels()
    return _STUBS


# The tests' open gRPC channels (target, channel), so that a stopping server is not held up by
# one left open. gRPC's graceful shutdown sends GOAWAY and a PING on every open connection and
# waits for the PING's answer; a Python channel with no call in flight reads nothing, so it never
# answers, and the server waits 5 s (measured: a router's SIGTERM exit took 5.0 s with one idle
# test channel open, 8 ms with it closed or watching its connectivity). Clients that keep reading
# their connections (C++, Go, Envoy, a Python channel with a connectivity callback) answer at
# once. Held strongly: a stub keeps the channel's core alive after the Python object is gone, and
# the object's __del__ would cancel the watch.
_OPEN_CHANNELS = {}


def _track_channels():
    import grpc
    import grpc._channel
    if getattr(grpc, "_pdserve_tracked", False):
        return

    def tracked(make):
        def wrapper(target, *args, **kwargs):
            channel = make(target, *args, **kwargs)
            _OPEN_CHANNELS[id(channel)] = (target, channel)
            return channel
        return wrapper

    close = grpc._channel.Channel._close

    def untracked_close(channel):
        _OPEN_CHANNELS.pop(id(channel), None)
        close(channel)

    grpc.insecure_channel = tracked(grpc.insecure_channel)
    grpc.secure_channel = tracked(grpc.secure_channel)
    grpc._channel.Channel._close = untracked_close
    grpc._pdserve_tracked = True


def _channels_to(addresses):
    """The open test channels whose target is one of `addresses` (host:port, matched by port)."""
    ports = {a.rsplit(":", 1)[-1] for a in addresses}
    return [key for key, (target, _) in _OPEN_CHANNELS.items() if target.rsplit(":", 1)[-1] in ports]


def _answer_stop(keys):
    """Has these channels watch their connectivity, which makes gRPC read their connections."""
    for key in keys:
        _OPEN_CHANNELS[key][1].subscribe(_ignore_state, try_to_connect=False)


def _ignore_state(_state):
    pass


# Channels to stopped servers: their watch is cancelled (its thread ends) and they stay
# referenced, since a watched channel deallocated under its thread makes the thread raise.
_RETIRED_CHANNELS = []


def _retire(keys):
    for key in keys:
        entry = _OPEN_CHANNELS.pop(key, None)
        if entry is not None:  # Not closed by the test meanwhile (closing cancels the watch).
            entry[1].unsubscribe(_ignore_state)
            _RETIRED_CHANNELS.append(entry[1])


class Process:
    """A pdserve subcommand; `addresses` holds what its ready line announced."""

    def __init__(self, pdserve, args, env=None, timeout=60):
        full_env = dict(os.environ)
        full_env.setdefault("PDSERVE_LOG_LEVEL", "warning")
        if env:
            full_env.update(env)
        self.args = args
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([pdserve] + args, stdout=subprocess.PIPE, stderr=self.log,
                                     env=full_env, text=True)
        deadline = time.time() + timeout
        line = ""
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if "ready:" in line or self.proc.poll() is not None:
                break
        if "ready:" not in line:
            self.log.seek(0)
            raise RuntimeError(f"pdserve {' '.join(args)} did not start: {self.log.read().decode()[-2000:]}")
        self.addresses = dict(re.findall(r"(\w+)=(\S+)", line))

    @property
    def grpc(self):
        return self.addresses["grpc"]

    def stop(self, timeout=30):
        """SIGTERM; returns the exit code."""
        channels = _channels_to(self.addresses.values())
        _answer_stop(channels)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc.stdout.close()
        _retire(channels)
        return code

    def stderr(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def __del__(self):
        self.log.close()


class Cluster:
    """n prefill workers, m decode workers and a router."""

    def __init__(self, pdserve, model, prefill=2, decode=2, transport="tcp", decode_args=(),
                 prefill_args=(), prefill_env=None, engine_args=("--threads", "1", "--kv-memory-gib", "0.05"),
                 router_args=(), env=None, decode_env=()):
        """`decode_env[i]`: more environment for decode worker i only (a fault on one worker)."""
        self.prefill = [Process(pdserve, ["prefill", "--listen", "127.0.0.1:0", "--model", model,
                                          "--transport", transport, *engine_args, *prefill_args],
                                env={**(env or {}), **(prefill_env or {})}) for _ in range(prefill)]
        self.decode = [Process(pdserve, ["decode", "--listen", "127.0.0.1:0", "--model", model,
                                         "--transport", transport, "--local-prefill-tokens", "4",
                                         *engine_args, *decode_args],
                               env={**(env or {}), **(decode_env[i] if i < len(decode_env) else {})})
                       for i in range(decode)]
        self.router = Process(pdserve, ["router", "--listen", "127.0.0.1:0", "--model", model,
                                        "--prefill", ",".join(p.grpc for p in self.prefill),
                                        "--decode", ",".join(d.grpc for d in self.decode),
                                        "--local-prefill-tokens", "4", *router_args], env=env)

    @property
    def workers(self):
        return self.prefill + self.decode

    def stop(self):
        codes = [self.router.stop()]
        codes += [p.stop() for p in self.decode + self.prefill]
        return codes


# Helpers the end-to-end tests share.

def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(certs, *args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=certs)


def make_ca(certs, name):
    """A self-signed CA `name`.pem / `name`.key in the directory `certs` (made by the openssl command)."""
    _openssl(certs, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}")


def make_leaf(certs, name, ca, names="IP:127.0.0.1,DNS:localhost"):
    """A certificate for `names` (127.0.0.1/localhost), good as server and as client, signed by `ca`."""
    with open(os.path.join(certs, f"{name}.ext"), "w") as f:
        f.write(f"subjectAltName={names}\nextendedKeyUsage=serverAuth,clientAuth\n"
                "basicConstraints=CA:FALSE\n")
    _openssl(certs, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
    _openssl(certs, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")


class RedisServer:
    """A redis-server (Debian's) on 127.0.0.1, in memory only: the shared KV store's tests and
    benches. `password`: its requirepass; `extra`: more server flags (maxmemory, ...)."""

    def __init__(self, password="", port=None, extra=(), tls_certs=None, tls_auth_clients=False, tls_leaf="node"):
        """`tls_certs`: a directory with ca.pem and the leaf `tls_leaf`.pem/.key (make_ca,
        make_leaf): the server then speaks TLS only, on `port`, requiring client certificates when
        `tls_auth_clients`."""
        self.port = port or free_port()
        self.password = password
        self.tls_certs = tls_certs
        auth = ["--requirepass", password] if password else []
        listen = ["--port", str(self.port)]
        if tls_certs:
            listen = ["--port", "0", "--tls-port", str(self.port),
                      "--tls-cert-file", os.path.join(tls_certs, f"{tls_leaf}.pem"),
                      "--tls-key-file", os.path.join(tls_certs, f"{tls_leaf}.key"),
                      "--tls-ca-cert-file", os.path.join(tls_certs, "ca.pem"),
                      "--tls-auth-clients", "yes" if tls_auth_clients else "no"]
        self.proc = subprocess.Popen(["redis-server", *listen, "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", *auth, *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while self.cli("PING") != "PONG":
            if time.time() > deadline:
                raise AssertionError("redis-server did not start")
            time.sleep(0.05)

    @property
    def url(self):
        return f"{'rediss' if self.tls_certs else 'redis'}://127.0.0.1:{self.port}"

    def cli(self, *command):
        auth = ["--no-auth-warning", "-a", self.password] if self.password else []
        if self.tls_certs:
            auth += ["--tls", "--cacert", os.path.join(self.tls_certs, "ca.pem"),
                     "--cert", os.path.join(self.tls_certs, "node.pem"),
                     "--key", os.path.join(self.tls_certs, "node.key")]
        r = subprocess.run(["redis-cli", "-p", str(self.port), *auth, *command],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wide_model(pdserve, workdir):
    """An 8-layer, 512-wide random model (made once per workdir): prefill slow enough to queue
    behind and decode steps slow enough for requests to overlap a stalled transfer."""
    model = os.path.join(workdir, "wide")
    if not os.path.exists(model):
        subprocess.run([pdserve, "make-model", model, "--arch", "llama", "--layers", "8", "--hidden", "512",
                        "--heads", "8", "--kv-heads", "2", "--vocab", "512", "--seed", "5"],
                       check=True, capture_output=True)
    return model


def prompts(n, seed, lo, hi):
    """n random token-id prompts of lo..hi-1 tokens (ids 3..499)."""
    import random
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def worker_info(address, prefill):
    """GetWorkerInfo of a prefill or decode worker."""
    import grpc
    from pdserve.internal.v1 import worker_pb2, worker_pb2_grpc
    with grpc.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.PrefillWorkerStub(channel) if prefill else worker_pb2_grpc.DecodeWorkerStub(channel)
        return stub.GetWorkerInfo(worker_pb2.GetWorkerInfoRequest(), timeout=10)


def streams_with_a_killed_worker(test, run_stream, n, victim, started_streams, started_tokens):
    """Runs streams 0..n-1 at once (run_stream(i, on_token) returns stream i's result, calling
    on_token(tokens so far) as it goes) and SIGKILLs `victim`, a decode worker, once
    `started_streams` of them have `started_tokens` tokens and the victim runs streams of its own
    (the first that started may all be another worker's while the victim's wait for their KV
    pages). Returns the results and how many streams the victim ran when it was killed."""
    import concurrent.futures
    import threading
    started = threading.Event()
    progress = [0] * n

    def run(i):
        def on_token(count):
            progress[i] = count
            if sum(1 for k in progress if k >= started_tokens) >= started_streams:
                started.set()
        return run_stream(i, on_token)

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(run, i) for i in range(n)]
        test.assertTrue(started.wait(60))
        deadline = time.time() + 30
        running = worker_info(victim.grpc, False).running
        while running == 0 and time.time() < deadline:
            time.sleep(0.01)
            running = worker_info(victim.grpc, False).running
        if running == 0:
            # Seen once in CI (2026-12-07, test_kv_tiers): say what the victim was doing.
            info = worker_info(victim.grpc, False)
            print(f"streams_with_a_killed_worker: the victim ran nothing for 30 s: waiting {info.waiting}, "
                  f"used blocks {info.used_blocks}, remote prefills {info.remote_prefills}, local "
                  f"{info.local_prefills}, progress {progress}; its log:\n{victim.stderr()[-3000:]}",
                  file=sys.stderr, flush=True)
        victim.proc.kill()  # SIGKILL: no drain, no goodbye.
        return [f.result(timeout=300) for f in futures], running


def wait_idle(test, workers, timeout=20):
    """Waits until every (process, is_prefill) worker holds no block and runs nothing; returns their infos."""
    deadline = time.time() + timeout
    while True:
        infos = [worker_info(p.grpc, prefill) for p, prefill in workers]
        if all(i.used_blocks == 0 and i.running == 0 and i.waiting == 0 for i in infos):
            for i in infos:
                test.assertEqual(i.free_blocks + i.cached_blocks, i.total_blocks)
            return infos
        if time.time() > deadline:
            test.fail(f"blocks still in use: {[(i.role, i.used_blocks, i.running, i.waiting) for i in infos]}")
        time.sleep(0.05)


LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metric(text, name, **labels):
    """Sum of the series `name` (with these label values) in a Prometheus exposition. A name
    whose family the text does not declare (# TYPE) is an error, not 0: a renamed metric must not
    pass every "== 0" check. So is a label name that none of the family's series carries. A
    declared family with no series of these label values sums to 0."""
    family = name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and f"# TYPE {name[:-len(suffix)]} histogram\n" in text:
            family = name[:-len(suffix)]
    if not re.search(rf"^# TYPE {re.escape(family)} \w+$", text, re.M):
        raise AssertionError(f"no metric family {family!r} in the exposition")
    total, keys = 0.0, set()
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        series, value = line.rsplit(" ", 1)
        have = dict(LABEL.findall(series[len(name):]))
        keys |= set(have)
        if all(have.get(k) == str(v) for k, v in labels.items()):
            total += float(value)
    unknown = set(labels) - keys
    if unknown and keys:
        raise AssertionError(f"{name} has no label {sorted(unknown)}; its series carry {sorted(keys)}")
    return total


def metric(process, name, **labels):
    """parse_metric on a process's /metrics."""
    import urllib.request
    with urllib.request.urlopen(f"http://{process.addresses['metrics']}/metrics", timeout=10) as r:
        return parse_metric(r.read().decode(), name, **labels)
