"""The Helm chart (deploy/k8s/pdserve) as a cluster would meet it, without a cluster.

- Real Helm 4 lints and renders every values file; every rendered object validates against the
  Kubernetes and Prometheus Operator schemas (npm kubernetes-models); values.schema.json refuses
  bad values with its message.
- The rendered objects agree with each other: discovery names and Services, Service and container
  ports, probes and the health port, the ServiceMonitor and --metrics-listen, NetworkPolicies and
  the pods they mean, GPUs, grace periods, the alert rules and dashboard and their files.
- The pods' commands are real: the containers of values-cpu.yaml are started as pdserve processes
  with their rendered command, args and environment (only cluster addresses become loopback ones
  and the image's model path the repository's copy), and requests go through the router.
- The Dockerfiles build with scripts/build.sh and install the libraries the binary links.

Tools: scripts/k8s_tools_setup.sh (Helm, kubectl and the schema packages into .cache/).
Run: /usr/bin/python3 tests/k8s/test_chart.py --pdserve build/pdserve
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import cluster  # noqa: E402

CHART = os.path.join(ROOT, "deploy", "k8s", "pdserve")
VALUES_FILES = [None, "values-cpu.yaml", "values-gpu-nccl.yaml", "values-gpu-rdma.yaml"]
GPU_FILES = {"values-gpu-nccl.yaml", "values-gpu-rdma.yaml"}
RELEASE = "pd"
NAMESPACE = "serving"
# What the GPU values files use that this binary does not have yet: each names the issue that
# builds it. When it lands the test fails until the entry is removed.
# (--device exists since issue 13's kernels and runner; the tiers refuse cuda until a
# device-memory KV transport, cuda_ipc or nccl, exists.)
PENDING_FLAGS = {}
PENDING_TRANSPORTS = {}
# Read by every command from the environment without being a flag (common/base/log.cc).
PROCESS_ENV = {"PDSERVE_LOG_LEVEL"}
# Where deploy/docker/Dockerfile puts the demo model in the image.
IMAGE_MODEL_DIR = "/opt/pdserve/models/pdserve-demo"

PDSERVE = None
TOOLS = None
HELM = None


def helm(*args):
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)


def render(values=None, sets=()):
    args = ["template", RELEASE, CHART, "--namespace", NAMESPACE]
    if values:
        args += ["-f", os.path.join(CHART, values)]
    for s in sets:
        args += ["--set", s]
    return helm(*args)


_RENDERED = {}


def objects(values=None):
    """The rendered objects of a values file (parsed once)."""
    if values not in _RENDERED:
        out = render(values)
        if out.returncode != 0:
            raise AssertionError(f"helm template {values}: {out.stderr}")
        _RENDERED[values] = [d for d in yaml.safe_load_all(out.stdout) if d]
    return _RENDERED[values]


def find(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


def one(docs, kind, name):
    found = find(docs, kind, name)
    assert len(found) == 1, f"{kind} {name}: {len(found)} objects"
    return found[0]


def tier_name(tier):
    return f"{RELEASE}-pdserve-{tier}"


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(deployment):
    return deployment["spec"]["template"]["metadata"]["labels"]


def container(deployment):
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, deployment["metadata"]["name"]
    return containers[0]


def flag_values(c):
    """--flag=value pairs of a container's args (a flag without '=' maps to None)."""
    out = {}
    for a in c["args"][1:]:
        assert a.startswith("--"), f"argument {a!r} is not a --flag"
        name, _, value = a.partition("=")
        out[name] = value if _ else None
    return out


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def container_port(c, ref):
    """A Service targetPort (name or number) resolved against a container's ports."""
    for p in c.get("ports", []):
        if p["name"] == ref or p["containerPort"] == ref:
            return p["containerPort"]
    raise AssertionError(f"container {c['name']} has no port {ref!r}")


_HELP = {}


def known_flags(tier):
    """The flags and PDSERVE_* variables `pdserve <tier> --help` lists."""
    if tier not in _HELP:
        out = subprocess.run([PDSERVE, tier, "--help"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
        _HELP[tier] = (set(re.findall(r"^\s+(--[a-z0-9-]+)", text, re.M)),
                       set(re.findall(r"\[\$(PDSERVE_[A-Z0-9_]+)\]", text)), text)
    return _HELP[tier]


def validate_with_schemas(test, docs):
    """validate_objects.mjs on `docs`: one {kind, name, error} per object (error None if valid)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(docs, f)
        f.flush()
        with open(os.path.join(HERE, "validate_objects.mjs")) as script:
            out = subprocess.run(["node", "--input-type=module", "-", f.name], stdin=script,
                                 capture_output=True, text=True, cwd=TOOLS, timeout=120)
    test.assertEqual(out.returncode, 0, out.stdout + out.stderr)
    results = [json.loads(line) for line in out.stdout.splitlines()]
    test.assertEqual(len(results), len(docs), out.stdout)
    return results


class HelmChecks(unittest.TestCase):
    def test_lint_strict_every_values_file(self):
        for values in VALUES_FILES:
            args = ["lint", "--strict", CHART] + (["-f", os.path.join(CHART, values)] if values else [])
            out = helm(*args)
            self.assertEqual(out.returncode, 0, f"{values}: {out.stdout}{out.stderr}")
            self.assertIn("0 chart(s) failed", out.stdout)

    def test_every_rendered_object_validates_against_the_schemas(self):
        expected_kinds = {"ConfigMap", "Deployment", "Service", "ServiceAccount", "NetworkPolicy",
                          "PodDisruptionBudget"}
        for values in VALUES_FILES + ["autoscaling", "planner", "keda"]:
            docs = objects(values) if values not in ("autoscaling", "planner", "keda") else (
                self.autoscaled() if values == "autoscaling" else self.planned() if values == "planner"
                else self.keda())
            kinds = {d["kind"] for d in docs}
            self.assertTrue(expected_kinds <= kinds, f"{values}: {kinds}")
            if values == "keda":
                self.assertEqual(len(find(docs, "ScaledObject")), 2)
            results = validate_with_schemas(self, docs)
            for r in results:
                self.assertIsNone(r["error"], f"{values}: {r}")
        # The validator can fail: a wrong type in a rendered object is caught.
        broken = json.loads(json.dumps(objects("values-cpu.yaml")))
        dep = find(broken, "Deployment")[0]
        container(dep)["ports"][0]["containerPort"] = "eight thousand"
        (result,) = validate_with_schemas(self, [dep])
        self.assertIn("containerPort must be integer", result["error"])
        # A misspelt field name is refused too (the schemas alone would let it through), at any
        # depth and in any kind.
        for kind, edit, field in (
                ("Deployment", lambda d: container(d)["readinessProbe"].update(periodSecond=5),
                 "spec.template.spec.containers[0].readinessProbe.periodSecond"),
                ("Deployment", lambda d: d["spec"]["template"]["spec"].update(terminationGracePeriod=5),
                 "spec.template.spec.terminationGracePeriod"),
                ("Service", lambda d: d["spec"]["ports"][0].update(targetport=1), "spec.ports[0].targetport"),
                ("PodDisruptionBudget", lambda d: d["spec"].update(maxUnavailble=1), "spec.maxUnavailble"),
                ("NetworkPolicy", lambda d: d["spec"]["ingress"][0].update(form=[]), "spec.ingress[0].form")):
            doc = json.loads(json.dumps(find(objects("values-cpu.yaml"), kind)[0]))
            edit(doc)
            (result,) = validate_with_schemas(self, [doc])
            self.assertEqual(result["error"], f"unknown field {field}", kind)
        # Inside the custom resources' inline types too (KEDA's, the Prometheus Operator's), but not
        # among the free keys of a map (a trigger's metadata).
        scaled = find(self.keda(), "ScaledObject")[0]
        monitor = find(self.keda(), "ServiceMonitor")[0]
        for doc, edit, field in (
                (scaled, lambda d: d["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
                 ["scaleDown"].update(stabilizationWindowSecond=1),
                 "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilizationWindowSecond"),
                (scaled, lambda d: d["spec"]["triggers"][0].update(metricTyp="Value"), "spec.triggers[0].metricTyp"),
                (monitor, lambda d: d["spec"]["endpoints"][0].update(intervall="5s"), "spec.endpoints[0].intervall")):
            doc = json.loads(json.dumps(doc))
            edit(doc)
            (result,) = validate_with_schemas(self, [doc])
            self.assertEqual(result["error"], f"unknown field {field}", doc["kind"])
        doc = json.loads(json.dumps(scaled))
        doc["spec"]["triggers"][0]["metadata"]["anyKey"] = "x"
        (result,) = validate_with_schemas(self, [doc])
        self.assertIsNone(result["error"])

    def autoscaled(self):
        out = render("values-cpu.yaml", ["prefill.autoscaling.enabled=true",
                                         "decode.autoscaling.enabled=true", "tls.enabled=true",
                                         "tls.secretName=pdserve-tls", "tls.mutual=true",
                                         "apiKeys.enabled=true", "apiKeys.secretName=pdserve-keys",
                                         "model.source=download", "model.download.image=amazon/aws-cli",
                                         "model.download.command={aws,s3,sync,s3://b/m,/models/m}",
                                         "model.path=/models/m"])
        self.assertEqual(out.returncode, 0, out.stderr)
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    PROFILE = '{"format": "pdserve-profile-v1", "step_cost": {"a_seconds": 0.01}}'

    def planned(self, extra=(), sets=("prefill.autoscaling.enabled=true", "prefill.autoscaling.source=planner",
                                      "decode.autoscaling.enabled=true", "decode.autoscaling.source=planner")):
        # The profile comes in a values file, as a user gives it (--set would split its commas).
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump({"planner": {"enabled": True, "profile": self.PROFILE}}, f)
            f.flush()
            args = ["template", RELEASE, CHART, "--namespace", NAMESPACE, "-f",
                    os.path.join(CHART, "values-cpu.yaml"), "-f", f.name]
            for s in [*sets, *extra]:
                args += ["--set", s]
            out = helm(*args)
        self.assertEqual(out.returncode, 0, out.stderr)
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    def test_planner_autoscaling_follows_the_routers_desired_workers(self):
        docs = self.planned(["planner.sloTtftMs=1500", "planner.scaleDownDelaySeconds=120"])
        router = one(docs, "Deployment", tier_name("router"))
        args = container(router)["args"]
        self.assertIn("--planner-profile=/etc/pdserve/planner/profile.json", args)
        self.assertIn("--planner-slo-ttft-ms=1500", args)
        self.assertIn("--planner-scale-down-delay-seconds=120", args)
        values = get_values("values-cpu.yaml")
        self.assertIn(f"--planner-kv-memory-gib={values['engine']['kvMemoryGib']}", args)
        # The profile reaches the file the flag names: a ConfigMap mounted at its directory.
        mount = [m for m in container(router)["volumeMounts"] if m["mountPath"] == "/etc/pdserve/planner"]
        self.assertEqual(len(mount), 1)
        volume = [v for v in router["spec"]["template"]["spec"]["volumes"] if v["name"] == mount[0]["name"]]
        cm = one(docs, "ConfigMap", volume[0]["configMap"]["name"])
        self.assertEqual(json.loads(cm["data"]["profile.json"]), json.loads(self.PROFILE))
        self.assertIn("checksum/planner", router["spec"]["template"]["metadata"]["annotations"])
        # Each tier's HPA reads the router's metric for its own tier; replicas = the metric's value.
        for tier in ("prefill", "decode"):
            hpa = one(docs, "HorizontalPodAutoscaler", tier_name(tier))
            (m,) = hpa["spec"]["metrics"]
            self.assertEqual(m["type"], "External")
            self.assertEqual(m["external"]["metric"]["name"], "pdserve_planner_desired_workers")
            self.assertEqual(m["external"]["metric"]["selector"]["matchLabels"], {"tier": tier})
            self.assertEqual(m["external"]["target"], {"type": "AverageValue", "averageValue": "1"})
            self.assertEqual(hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"], 0)
        # The binary knows every flag the chart passes (run, not just rendered: --help lists them).
        help_text = subprocess.run([PDSERVE, "router", "--help"], capture_output=True, text=True).stdout
        for a in args:
            if a.startswith("--planner-"):
                self.assertIn(a.split("=")[0], help_text)
        # Misconfigurations fail the render with a message.
        no_profile = render("values-cpu.yaml", ["planner.enabled=true"])
        self.assertNotEqual(no_profile.returncode, 0)
        self.assertIn("planner.profile", no_profile.stderr)
        orphan = render("values-cpu.yaml", ["decode.autoscaling.enabled=true", "decode.autoscaling.source=planner"])
        self.assertNotEqual(orphan.returncode, 0)
        self.assertIn("needs planner.enabled", orphan.stderr)
        bad = render("values-cpu.yaml", ["decode.autoscaling.source=keda"])
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("source", bad.stderr)

    PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"

    def keda(self, extra=()):
        """Both tiers on KEDA: prefill on the planner's metric, decode on its pods' KV usage."""
        return self.planned(extra, sets=(
            "prefill.autoscaling.enabled=true", "prefill.autoscaling.source=planner",
            "prefill.autoscaling.scaler=keda", "decode.autoscaling.enabled=true",
            "decode.autoscaling.scaler=keda", f"keda.prometheusAddress={self.PROMETHEUS}",
            "metrics.serviceMonitor.enabled=true"))

    def test_keda_scaled_objects_query_what_the_hpas_read(self):
        docs = self.keda(["planner.scaleDownDelaySeconds=120"])
        self.assertEqual(find(docs, "HorizontalPodAutoscaler"), [])  # KEDA's operator makes them.
        values = get_values("values-cpu.yaml")
        queries = {}
        for tier in ("prefill", "decode"):
            so = one(docs, "ScaledObject", tier_name(tier))
            dep = one(docs, "Deployment", tier_name(tier))
            self.assertEqual(so["spec"]["scaleTargetRef"],
                             {"apiVersion": "apps/v1", "kind": "Deployment", "name": dep["metadata"]["name"]})
            self.assertNotIn("replicas", dep["spec"])  # The scaler owns the count.
            auto = values[tier]["autoscaling"]
            self.assertEqual((so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]),
                             (auto["minReplicas"], auto["maxReplicas"]))
            (trigger,) = so["spec"]["triggers"]
            self.assertEqual((trigger["type"], trigger["metricType"]), ("prometheus", "AverageValue"))
            self.assertEqual(trigger["metadata"]["serverAddress"], self.PROMETHEUS)
            queries[tier] = trigger["metadata"]["query"]
            window = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
            # The planner waits itself; a per-pod metric settles for 300 s as the HPA does.
            self.assertEqual(window["stabilizationWindowSeconds"], 0 if tier == "prefill" else 300)
        prefill = one(docs, "ScaledObject", tier_name("prefill"))["spec"]["triggers"][0]["metadata"]
        decode = one(docs, "ScaledObject", tier_name("decode"))["spec"]["triggers"][0]["metadata"]
        self.assertEqual(prefill["threshold"], "1")  # replicas = the planner's number
        # 800m in the HPA's quantity is KEDA's 0.8 (KEDA parses a plain number).
        self.assertEqual(values["decode"]["autoscaling"]["targetAverageValue"], "800m")
        self.assertEqual(decode["threshold"], "0.8")
        # Prometheus' own engine evaluates both queries over series as the ServiceMonitor labels
        # them: the planner's number for this namespace and tier, and the sum of this Deployment's
        # pods' KV usage (not the prefill pods', not another release's or namespace's).
        dep = tier_name("decode")
        series = [
            ('pdserve_planner_desired_workers{namespace="%s",tier="prefill"}' % NAMESPACE, 3),
            ('pdserve_planner_desired_workers{namespace="%s",tier="decode"}' % NAMESPACE, 5),
            ('pdserve_planner_desired_workers{namespace="other",tier="prefill"}', 9),
            ('pdserve_kv_cache_usage_perc{namespace="%s",pod="%s-7d9f8b6c5d-x2k4p"}' % (NAMESPACE, dep), 0.5),
            ('pdserve_kv_cache_usage_perc{namespace="%s",pod="%s-7d9f8b6c5d-q9w8e"}' % (NAMESPACE, dep), 0.75),
            ('pdserve_kv_cache_usage_perc{namespace="%s",pod="%s-6c5d4b3a2f-z1y2x"}' % (NAMESPACE, tier_name("prefill")), 0.9),
            ('pdserve_kv_cache_usage_perc{namespace="%s",pod="%s-extra-5b4c3d2e1f-a1b2c"}' % (NAMESPACE, dep), 0.9),
            ('pdserve_kv_cache_usage_perc{namespace="other",pod="%s-7d9f8b6c5d-x2k4p"}' % dep, 0.9),
        ]
        test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
            "interval": "1m",
            "input_series": [{"series": s, "values": f"{v}x5"} for s, v in series],
            "promql_expr_test": [
                {"expr": queries["prefill"], "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": 3}]},
                {"expr": queries["decode"], "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": 1.25}]},
            ]}]}
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "rules.yaml"), "w") as f:
                yaml.safe_dump({"groups": []}, f)
            with open(os.path.join(d, "test.yaml"), "w") as f:
                yaml.safe_dump(test, f)
            out = subprocess.run(["promtool", "test", "rules", "test.yaml"], cwd=d, capture_output=True,
                                 text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        # Misconfigurations fail the render with a message naming the value.
        no_address = render("values-cpu.yaml", ["decode.autoscaling.enabled=true", "decode.autoscaling.scaler=keda"])
        self.assertNotEqual(no_address.returncode, 0)
        self.assertIn("needs keda.prometheusAddress", no_address.stderr)
        quantity = render("values-cpu.yaml", ["decode.autoscaling.enabled=true", "decode.autoscaling.scaler=keda",
                                              "keda.prometheusAddress=http://p:9090",
                                              "decode.autoscaling.targetAverageValue=1Ki"])
        self.assertNotEqual(quantity.returncode, 0)
        self.assertIn("decode.autoscaling.targetAverageValue=1Ki", quantity.stderr)
        bad = render("values-cpu.yaml", ["decode.autoscaling.scaler=vpa"])
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("scaler", bad.stderr)

    def test_schema_refuses_bad_values_with_its_message(self):
        cases = [
            (None, ["prefill.replicas=-1"], "at '/prefill/replicas': minimum: got -1, want 0"),
            (None, ["engine.transport=rdma"], "at '/engine/transport'"),
            (None, ["engine.kvDtype=fp8"], "at '/engine/kvDtype'"),
            (None, ["engine.computeDtype=fp16"], "at '/engine/computeDtype'"),
            ("values-gpu-nccl.yaml", ["decode.gpus=0"], "at '/decode/gpus': minimum: got 0, want 1"),
            ("values-gpu-rdma.yaml", ["prefill.gpus=0"], "at '/prefill/gpus': minimum: got 0, want 1"),
            (None, ["engine.transport=nccl"], "at '/engine/device'"),
            (None, ["model.source=pvc"], "at '/model/pvc/claimName'"),
            (None, ["router.replica=2"], "additional properties 'replica' not allowed"),
            (None, ["ports.decode=70000"], "at '/ports/decode': maximum"),
            (None, ["tls.enabled=true"], "at '/tls/secretName'"),
            (None, ["extraEnv[0].value=x"], "at '/extraEnv/0': missing property 'name'"),
            (None, ["decode.speculative.method=eagle"], "at '/decode/speculative/method'"),
            (None, ["decode.speculative.numTokens=17"], "at '/decode/speculative/numTokens': maximum"),
        ]
        for values, sets, message in cases:
            out = render(values, sets)
            self.assertNotEqual(out.returncode, 0, f"{values} {sets} rendered")
            self.assertIn("values don't meet the specifications of the schema", out.stderr, sets)
            self.assertIn(message, out.stderr, sets)
            # helm install says the same before touching a cluster.
            args = ["install", "--dry-run=client", RELEASE, CHART] + sum((["--set", s] for s in sets), [])
            if values:
                args += ["-f", os.path.join(CHART, values)]
            out = helm(*args)
            self.assertNotEqual(out.returncode, 0, sets)
            self.assertIn(message, out.stderr, sets)


class Consistency(unittest.TestCase):
    def each(self):
        """(values file, rendered objects) for each values file; messages name the file."""
        return [(values, objects(values)) for values in VALUES_FILES]

    def test_router_discovers_the_headless_services(self):
        for values, docs in self.each():
            router = container(one(docs, "Deployment", tier_name("router")))
            flags = flag_values(router)
            for tier in ("prefill", "decode"):
                svc = one(docs, "Service", tier_name(tier))
                self.assertEqual(svc["spec"]["clusterIP"], "None", "headless: DNS lists the pod IPs")
                grpc_port = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"][0]
                self.assertEqual(
                    flags[f"--{tier}"],
                    f"dns:///{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{grpc_port['port']}")
                dep = one(docs, "Deployment", tier_name(tier))
                self.assertTrue(selects(svc["spec"]["selector"], pod_labels(dep)))
                worker_flags = flag_values(container(dep))
                self.assertEqual(port_of(worker_flags["--listen"]),
                                 container_port(container(dep), grpc_port["targetPort"]))
            self.assertEqual(flags["--local-prefill-tokens"],
                             flag_values(container(one(docs, "Deployment", tier_name("decode"))))["--local-prefill-tokens"])

    def test_service_ports_reach_container_ports_and_listen_flags(self):
        listen_flag = {"grpc": "--listen", "metrics": "--metrics-listen", "kv-transport": "--transport-listen",
                       "http": "--http-listen"}
        for values, docs in self.each():
            for svc in find(docs, "Service"):
                deps = [d for d in find(docs, "Deployment") if selects(svc["spec"]["selector"], pod_labels(d))]
                self.assertEqual(len(deps), 1, svc["metadata"]["name"])
                c = container(deps[0])
                flags = flag_values(c)
                for p in svc["spec"]["ports"]:
                    target = container_port(c, p["targetPort"])
                    self.assertEqual(port_of(flags[listen_flag[p["name"]]]), target, (svc["metadata"]["name"], p))
                    self.assertEqual(p["port"], target)
                    self.assertTrue(flags[listen_flag[p["name"]]].startswith("0.0.0.0:"))
            decode = container(one(docs, "Deployment", tier_name("decode")))
            self.assertEqual(flag_values(decode)["--transport-advertise"], "$(POD_IP)")
            pod_ip = [e for e in decode["env"] if e["name"] == "POD_IP"][0]
            self.assertEqual(pod_ip["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")

    def test_probes_use_the_grpc_health_port(self):
        for values, docs in self.each():
            for dep in find(docs, "Deployment"):
                c = container(dep)
                grpc_port = container_port(c, "grpc")
                self.assertEqual(port_of(flag_values(c)["--listen"]), grpc_port)
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    self.assertEqual(c[probe]["grpc"]["port"], grpc_port, (dep["metadata"]["name"], probe))
        # With TLS on the port kubelet's gRPC probe cannot connect: a TCP connect instead.
        out = render(None, ["tls.enabled=true", "tls.secretName=s"])
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        for dep in find(docs, "Deployment"):
            c = container(dep)
            self.assertEqual(c["readinessProbe"], {"tcpSocket": {"port": container_port(c, "grpc")},
                                                   "periodSeconds": 5, "failureThreshold": 2})
            self.assertIn("--tls-cert=/etc/pdserve/tls/tls.crt", c["args"])

    def test_servicemonitor_scrapes_where_metrics_listen(self):
        for values, docs in self.each():
            monitors = find(docs, "ServiceMonitor")
            if values is None:
                self.assertEqual(monitors, [], "off by default (needs the operator's CRDs)")
                continue
            self.assertEqual(len(monitors), 1)
            sm = monitors[0]
            selected = [s for s in find(docs, "Service") if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
            self.assertEqual(sorted(s["metadata"]["name"] for s in selected),
                             sorted(tier_name(t) for t in ("router", "prefill", "decode")))
            self.assertEqual(sm["spec"]["namespaceSelector"]["matchNames"], [NAMESPACE])
            (endpoint,) = sm["spec"]["endpoints"]
            self.assertEqual(endpoint["path"], "/metrics")
            for svc in selected:
                port = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]][0]
                dep = [d for d in find(docs, "Deployment") if selects(svc["spec"]["selector"], pod_labels(d))][0]
                c = container(dep)
                self.assertEqual(container_port(c, port["targetPort"]), port_of(flag_values(c)["--metrics-listen"]))

    def test_gpu_values_request_gpus_and_devices(self):
        for values, docs in self.each():
            for tier in ("prefill", "decode"):
                limits = container(one(docs, "Deployment", tier_name(tier)))["resources"].get("limits", {})
                if values in GPU_FILES:
                    self.assertGreaterEqual(limits.get("nvidia.com/gpu", 0), 1, (values, tier))
                else:
                    self.assertNotIn("nvidia.com/gpu", limits)
            router = container(one(docs, "Deployment", tier_name("router")))
            self.assertNotIn("nvidia.com/gpu", router["resources"].get("limits", {}))
        rdma = objects("values-gpu-rdma.yaml")
        for tier in ("prefill", "decode"):
            dep = one(rdma, "Deployment", tier_name(tier))
            self.assertEqual(container(dep)["resources"]["limits"]["rdma/rdma_shared_device_a"], 1)
            self.assertEqual(container(dep)["securityContext"]["capabilities"]["add"], ["IPC_LOCK"])
            shm = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "shm"][0]
            self.assertEqual(shm["emptyDir"]["medium"], "Memory")
        nccl = one(objects("values-gpu-nccl.yaml"), "Deployment", tier_name("decode"))
        self.assertTrue(nccl["spec"]["template"]["spec"]["hostIPC"])

    def test_network_policies_select_the_pods_they_mean(self):
        for values, docs in self.each():
            deps = {t: one(docs, "Deployment", tier_name(t)) for t in ("router", "prefill", "decode")}

            def tiers(selector):
                return sorted(t for t, d in deps.items() if selects(selector["matchLabels"], pod_labels(d)))

            def allowed(policy, port):
                """The tiers allowed to reach `port` ("any" when a rule has no `from`)."""
                out = set()
                for rule in policy["spec"]["ingress"]:
                    if "ports" in rule and port not in [p["port"] for p in rule["ports"]]:
                        continue
                    if "from" not in rule:
                        return {"any"}
                    for peer in rule["from"]:
                        out.update(tiers(peer["podSelector"]))
                return out

            for tier, dep in deps.items():
                pol = one(docs, "NetworkPolicy", tier_name(tier))
                self.assertEqual(tiers(pol["spec"]["podSelector"]), [tier])
                self.assertEqual(pol["spec"]["policyTypes"], ["Ingress"])
                c = container(dep)
                self.assertEqual(allowed(pol, container_port(c, "metrics")), {"any"})
            p = {t: container(d) for t, d in deps.items()}
            self.assertEqual(allowed(one(docs, "NetworkPolicy", tier_name("router")), container_port(p["router"], "grpc")), {"any"})
            self.assertEqual(allowed(one(docs, "NetworkPolicy", tier_name("router")), container_port(p["router"], "http")), {"any"})
            # tcp: only the router. NCCL and UCX open ports of their own, so with them the prefill
            # pods may reach every port of the decode pods (and the reverse).
            tcp = one(docs, "ConfigMap", f"{RELEASE}-pdserve-config")["data"]["PDSERVE_TRANSPORT"] == "tcp"
            self.assertEqual(allowed(one(docs, "NetworkPolicy", tier_name("decode")), container_port(p["decode"], "grpc")),
                             {"router"} if tcp else {"router", "prefill"}, values)
            # A decode worker calls PrefillWorker/Prefill itself (it owns the destination blocks).
            self.assertEqual(allowed(one(docs, "NetworkPolicy", tier_name("prefill")), container_port(p["prefill"], "grpc")),
                             {"router", "decode"})
            self.assertEqual(allowed(one(docs, "NetworkPolicy", tier_name("decode")), container_port(p["decode"], "kv-transport")),
                             {"prefill"})
            # A port no rule names is closed (the router's metrics port number is the same on
            # every pod, so pick one that is not); with NCCL or UCX, which open ports of their own,
            # the two worker tiers reach each other on every port, both ways.
            self.assertEqual(allowed(one(docs, "NetworkPolicy", tier_name("router")), 1), set(), values)
            self.assertEqual(allowed(one(docs, "NetworkPolicy", tier_name("prefill")), 1),
                             set() if tcp else {"decode"}, values)
            self.assertEqual(allowed(one(docs, "NetworkPolicy", tier_name("decode")), 1),
                             set() if tcp else {"prefill"}, values)

    def test_pdbs_and_hpas_name_the_rendered_deployments(self):
        autoscaled = render("values-cpu.yaml", ["prefill.autoscaling.enabled=true", "decode.autoscaling.enabled=true"])
        self.assertEqual(autoscaled.returncode, 0, autoscaled.stderr)
        cases = self.each() + [("autoscaling", [d for d in yaml.safe_load_all(autoscaled.stdout) if d])]
        for values, docs in cases:
            deps = find(docs, "Deployment")
            pdbs = find(docs, "PodDisruptionBudget")
            self.assertEqual(len(pdbs), 3, values)
            for pdb in pdbs:
                chosen = [d["metadata"]["name"] for d in deps if selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(d))]
                self.assertEqual(chosen, [pdb["metadata"]["name"]], (values, pdb["metadata"]["name"]))
            hpas = find(docs, "HorizontalPodAutoscaler")
            self.assertEqual(len(hpas), 2 if values == "autoscaling" else 0, values)
            for hpa in hpas:
                ref = hpa["spec"]["scaleTargetRef"]
                self.assertEqual((ref["apiVersion"], ref["kind"]), ("apps/v1", "Deployment"))
                self.assertEqual(ref["name"], hpa["metadata"]["name"])
                self.assertIn(ref["name"], [d["metadata"]["name"] for d in deps])
                self.assertIn(ref["name"], (tier_name("prefill"), tier_name("decode")))
                # An autoscaled Deployment leaves its replica count to the HPA.
                self.assertNotIn("replicas", one(docs, "Deployment", ref["name"])["spec"])

    def test_download_init_container_fills_the_volume_the_server_reads(self):
        out = render("values-cpu.yaml", ["model.source=download", "model.download.image=amazon/aws-cli",
                                         "model.download.command={aws,s3,sync,s3://b/m,/models/m}",
                                         "model.path=/models/m"])
        self.assertEqual(out.returncode, 0, out.stderr)
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        for dep in find(docs, "Deployment"):
            spec = dep["spec"]["template"]["spec"]
            (init,) = spec["initContainers"]
            self.assertEqual((init["name"], init["image"]), ("fetch-model", "amazon/aws-cli"))
            self.assertEqual(init["command"], ["aws", "s3", "sync", "s3://b/m", "/models/m"])
            volumes = {v["name"]: v for v in spec["volumes"]}
            mounts = {m["name"]: m for m in init["volumeMounts"]}
            self.assertEqual(sorted(mounts), ["model", "tmp"])
            for name in mounts:
                self.assertIn(name, volumes, dep["metadata"]["name"])  # Every mount has its volume.
            self.assertIn("emptyDir", volumes["model"])
            self.assertFalse(mounts["model"].get("readOnly"), "the download writes the model volume")
            # The server reads that volume at the same place, read-only, and the model path is in it.
            served = [m for m in container(dep)["volumeMounts"] if m["name"] == "model"]
            self.assertEqual([(m["mountPath"], m.get("readOnly")) for m in served],
                             [(mounts["model"]["mountPath"], True)])
            self.assertTrue("/models/m".startswith(mounts["model"]["mountPath"] + "/"))
            env = {e["name"]: e for e in container(dep)["env"]}
            model = env["PDSERVE_MODEL"]["valueFrom"]["configMapKeyRef"]
            self.assertEqual(one(docs, "ConfigMap", model["name"])["data"][model["key"]], "/models/m")

    def test_alert_rules_and_dashboard_are_the_files_under_deploy(self):
        with open(os.path.join(ROOT, "deploy/k8s/prometheus/pdserve-alerts.yaml"), "rb") as f:
            alerts = f.read()
        with open(os.path.join(ROOT, "deploy/k8s/grafana/pdserve-dashboard.json"), "rb") as f:
            dashboard = f.read()
        # The chart's files/ are links to them: one source of truth.
        with open(os.path.join(CHART, "files/pdserve-alerts.yaml"), "rb") as f:
            self.assertEqual(f.read(), alerts)
        with open(os.path.join(CHART, "files/pdserve-dashboard.json"), "rb") as f:
            self.assertEqual(f.read(), dashboard)
        docs = objects("values-cpu.yaml")
        (rule,) = find(docs, "PrometheusRule")
        self.assertEqual(rule["spec"], yaml.safe_load(alerts))
        # Byte-equal: the rendered spec is the file's text indented by two spaces.
        out = render("values-cpu.yaml").stdout
        body = out.split("kind: PrometheusRule", 1)[1].split("\nspec:\n", 1)[1].split("\n---", 1)[0]
        dedented = "\n".join(line[2:] for line in body.split("\n")).rstrip("\n")
        self.assertEqual(dedented, alerts.decode().rstrip("\n"))
        cm = one(docs, "ConfigMap", f"{RELEASE}-pdserve-dashboard")
        self.assertEqual(cm["data"]["pdserve-dashboard.json"].encode(), dashboard)
        self.assertEqual(cm["metadata"]["labels"]["grafana_dashboard"], "1")

    def test_grace_periods_security_and_model_mounts(self):
        for values, docs in self.each():
            for dep in find(docs, "Deployment"):
                spec = dep["spec"]["template"]["spec"]
                c = container(dep)
                flags = flag_values(c)
                tier = c["args"][0]
                # Every tier, the router too: --drain-seconds, then 15 s to write what is queued.
                self.assertEqual(spec["terminationGracePeriodSeconds"], int(flags["--drain-seconds"]) + 15, tier)
                self.assertTrue(spec["securityContext"]["runAsNonRoot"])
                self.assertFalse(spec["automountServiceAccountToken"])
                self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
                self.assertFalse(c["securityContext"]["allowPrivilegeEscalation"])
                self.assertEqual(c["securityContext"]["capabilities"]["drop"], ["ALL"])
                for m in c["volumeMounts"]:
                    if m["name"] in ("model", "tls", "api-keys"):
                        self.assertTrue(m.get("readOnly"), (values, m))
                env = {e["name"]: e for e in c["env"]}
                model = env["PDSERVE_MODEL"]["valueFrom"]["configMapKeyRef"]
                cm = one(docs, "ConfigMap", model["name"])
                model_dir = cm["data"][model["key"]]
                mounts = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "model"]
                if model_dir == IMAGE_MODEL_DIR:
                    self.assertEqual(mounts, [])
                else:
                    self.assertEqual(len(mounts), 1)
                    self.assertTrue(model_dir.startswith(mounts[0] + "/"), (model_dir, mounts))

    def test_compute_dtype_reaches_the_workers_only(self):
        out = render(None, ["engine.computeDtype=f32"])
        self.assertEqual(out.returncode, 0, out.stderr)
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        self.assertEqual(one(docs, "ConfigMap", f"{RELEASE}-pdserve-config")["data"]["PDSERVE_COMPUTE_DTYPE"],
                         "f32")
        for tier in ("router", "prefill", "decode"):
            names = [e["name"] for e in container(one(docs, "Deployment", tier_name(tier)))["env"]]
            self.assertEqual("PDSERVE_COMPUTE_DTYPE" in names, tier != "router", tier)

    def test_speculative_decoding_reaches_the_decode_workers_only(self):
        out = render(None, ["decode.speculative.method=suffix", "decode.speculative.numTokens=3"])
        self.assertEqual(out.returncode, 0, out.stderr)
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        flags = {tier: flag_values(container(one(docs, "Deployment", tier_name(tier))))
                 for tier in ("router", "prefill", "decode")}
        self.assertEqual((flags["decode"]["--speculative"], flags["decode"]["--num-speculative-tokens"]),
                         ("suffix", "3"))
        self.assertTrue(flags["decode"].keys() <= known_flags("decode")[0])
        for tier in ("router", "prefill"):
            self.assertNotIn("--speculative", flags[tier], tier)
        # Off by default: no flag at all.
        docs = [d for d in yaml.safe_load_all(render(None, []).stdout) if d]
        self.assertNotIn("--speculative", flag_values(container(one(docs, "Deployment", tier_name("decode")))))

    def test_kv_events_reach_both_worker_tiers_with_their_ports(self):
        out = render(None, ["kvEvents.enabled=true", "kvEvents.topic=kv@pods", "ports.kvEvents=6557"])
        self.assertEqual(out.returncode, 0, out.stderr)
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        for tier in ("prefill", "decode"):
            c = container(one(docs, "Deployment", tier_name(tier)))
            flags = flag_values(c)
            self.assertEqual((flags["--kv-events-publisher"], flags["--kv-events-endpoint"],
                              flags["--kv-events-replay-endpoint"], flags["--kv-events-topic"]),
                             ("zmq", "tcp://*:6557", "tcp://*:5558", "kv@pods"), tier)
            self.assertTrue(flags.keys() <= known_flags(tier)[0])
            self.assertEqual((container_port(c, "kv-events"), container_port(c, "kv-events-rpl")), (6557, 5558))
            svc = one(docs, "Service", tier_name(tier))
            ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
            self.assertEqual((ports["kv-events"], ports["kv-events-rpl"]),
                             ((6557, "kv-events"), (5558, "kv-events-rpl")))
            # Open to every peer by default (networkPolicy.kvEventsFrom empty).
            rules = one(docs, "NetworkPolicy", tier_name(tier))["spec"]["ingress"]
            kv = [r for r in rules if 6557 in [p["port"] for p in r.get("ports", [])]]
            self.assertEqual(len(kv), 1)
            self.assertEqual(sorted(p["port"] for p in kv[0]["ports"]), [5558, 6557])
            self.assertNotIn("from", kv[0])
        self.assertNotIn("--kv-events-publisher", flag_values(container(one(docs, "Deployment", tier_name("router")))))
        # Off by default: no flag, no port.
        docs = [d for d in yaml.safe_load_all(render(None, []).stdout) if d]
        for tier in ("prefill", "decode"):
            c = container(one(docs, "Deployment", tier_name(tier)))
            self.assertNotIn("--kv-events-publisher", flag_values(c))
            self.assertNotIn("kv-events", [p["name"] for p in c["ports"]])
        bad = render(None, ["kvEvents.bufferSteps=0"])
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("at '/kvEvents/bufferSteps'", bad.stderr)

    def test_kv_store_deployed_or_external_reaches_the_workers_only(self):
        out = render(None, ["kvStore.enabled=true", "kvStore.passwordSecret=kv-pw", "kvStore.keySecret=kv-hmac",
                            "kvStore.redis.maxmemoryGib=12"])
        self.assertEqual(out.returncode, 0, out.stderr)
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        for r in validate_with_schemas(self, docs):
            self.assertIsNone(r["error"], r)
        store = one(docs, "Deployment", tier_name("kv-store"))
        redis = container(store)
        args = redis["args"]
        self.assertEqual(args[0], "redis-server")
        opts = dict(zip(args[1::2], args[2::2]))
        self.assertEqual((opts["--maxmemory"], opts["--maxmemory-policy"], opts["--save"], opts["--appendonly"]),
                         ("12gb", "allkeys-lru", "", "no"))
        self.assertEqual(opts["--requirepass"], "$(REDIS_PASSWORD)")
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"]}
        self.assertEqual(env["REDIS_PASSWORD"], {"name": "kv-pw", "key": "password"})
        self.assertEqual(redis["resources"]["limits"]["memory"], f"{12 * 1280}Mi")  # maxmemory + 25%
        svc = one(docs, "Service", tier_name("kv-store"))
        self.assertTrue(selects(svc["spec"]["selector"], pod_labels(store)))
        port = svc["spec"]["ports"][0]
        self.assertEqual(container_port(redis, port["targetPort"]), int(opts["--port"]))
        for tier in ("prefill", "decode"):
            d = one(docs, "Deployment", tier_name(tier))
            c = container(d)
            flags = flag_values(c)
            self.assertTrue(flags.keys() <= known_flags(tier)[0], flags.keys() - known_flags(tier)[0])
            self.assertEqual(flags["--kv-store"], f"redis://{tier_name('kv-store')}:{port['port']}")
            self.assertEqual(flags["--kv-store-timeout-ms"], "1000")
            # Each file flag names a file of a mounted Secret's item.
            volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
            for flag, secret, key in (("--kv-store-password-file", "kv-pw", "password"),
                                      ("--kv-store-key-file", "kv-hmac", "key")):
                path = flags[flag]
                mount = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
                self.assertEqual(len(mount), 1, flag)
                vol = volumes[mount[0]["name"]]["secret"]
                self.assertEqual(vol["secretName"], secret)
                self.assertIn({"key": key, "path": path[len(mount[0]["mountPath"]) + 1:]}, vol["items"])
        router = one(docs, "Deployment", tier_name("router"))
        self.assertNotIn("--kv-store", flag_values(container(router)))
        self.assertNotIn("kv-store-password", str(router["spec"]["template"]["spec"]["volumes"]))
        # Only the workers reach the store.
        rule = one(docs, "NetworkPolicy", tier_name("kv-store"))["spec"]["ingress"]
        self.assertEqual(len(rule), 1)
        peers = [p["podSelector"]["matchLabels"] for p in rule[0]["from"]]
        for tier in ("prefill", "decode", "router"):
            labels = pod_labels(one(docs, "Deployment", tier_name(tier)))
            self.assertEqual(any(selects(p, labels) for p in peers), tier != "router", tier)

        # External servers: no Redis in the release, the workers shard across the list.
        docs = [d for d in yaml.safe_load_all(render(None, [
            "kvStore.enabled=true", "kvStore.mode=external",
            "kvStore.servers={redis-0.cache:6379,redis-1.cache:6380}"]).stdout) if d]
        self.assertEqual(find(docs, "Deployment", tier_name("kv-store")), [])
        flags = flag_values(container(one(docs, "Deployment", tier_name("decode"))))
        self.assertEqual(flags["--kv-store"], "redis://redis-0.cache:6379,redis-1.cache:6380")
        self.assertNotIn("--kv-store-password-file", flags)
        # A Redis Cluster's seeds.
        docs = [d for d in yaml.safe_load_all(render(None, [
            "kvStore.enabled=true", "kvStore.mode=external", "kvStore.cluster=true",
            "kvStore.servers={redis-cluster.cache:6379}"]).stdout) if d]
        flags = flag_values(container(one(docs, "Deployment", tier_name("prefill"))))
        self.assertEqual(flags["--kv-store"], "redis+cluster://redis-cluster.cache:6379")
        # Over TLS, with a client certificate: rediss://, the Secret's files named by the flags.
        docs = [d for d in yaml.safe_load_all(render(None, [
            "kvStore.enabled=true", "kvStore.mode=external", "kvStore.servers={redis-0.cache:6380}",
            "kvStore.tlsSecret=kv-tls", "kvStore.clientCertificate=true"]).stdout) if d]
        decode = one(docs, "Deployment", tier_name("decode"))
        flags = flag_values(container(decode))
        self.assertEqual(flags["--kv-store"], "rediss://redis-0.cache:6380")
        mounts = {m["name"]: m["mountPath"] for m in container(decode)["volumeMounts"]}
        volumes = {v["name"]: v for v in decode["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual(volumes["kv-store-tls"]["secret"]["secretName"], "kv-tls")
        for flag, key in (("--kv-store-tls-ca", "ca.crt"), ("--kv-store-tls-cert", "tls.crt"),
                          ("--kv-store-tls-key", "tls.key")):
            self.assertEqual(flags[flag], mounts["kv-store-tls"] + "/" + key)
        # Off by default.
        docs = [d for d in yaml.safe_load_all(render(None, []).stdout) if d]
        self.assertEqual(find(docs, "Deployment", tier_name("kv-store")), [])
        self.assertNotIn("--kv-store", flag_values(container(one(docs, "Deployment", tier_name("decode")))))
        for sets, message in ((["kvStore.enabled=true", "kvStore.mode=external"], "at '/kvStore/servers'"),
                              (["kvStore.redis.maxmemoryGib=0"], "at '/kvStore/redis/maxmemoryGib'"),
                              (["kvStore.servers={nohostport}"], "at '/kvStore/servers/0'")):
            bad = render(None, sets)
            self.assertNotEqual(bad.returncode, 0, sets)
            self.assertIn(message, bad.stderr, sets)

    def test_tracing_reaches_every_tier_as_opentelemetry_variables(self):
        out = render(None, ["tracing.otlpEndpoint=http://otel:4318/v1/traces", "tracing.sampleRatio=0.25"])
        self.assertEqual(out.returncode, 0, out.stderr)
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        for tier in ("router", "prefill", "decode"):
            env = {e["name"]: e.get("value") for e in container(one(docs, "Deployment", tier_name(tier)))["env"]}
            self.assertEqual((env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"], env["OTEL_TRACES_SAMPLER"],
                              env["OTEL_TRACES_SAMPLER_ARG"], env["OTEL_SERVICE_NAME"]),
                             ("http://otel:4318/v1/traces", "parentbased_traceidratio", "0.25", "pdserve"), tier)
        docs = [d for d in yaml.safe_load_all(render(None, []).stdout) if d]
        for tier in ("router", "prefill", "decode"):
            names = [e["name"] for e in container(one(docs, "Deployment", tier_name(tier)))["env"]]
            self.assertFalse([n for n in names if n.startswith("OTEL_")], tier)
        for bad, where in ((["tracing.sampleRatio=2"], "/tracing/sampleRatio"),
                           (["tracing.otlpEndpoint=otel:4318"], "/tracing/otlpEndpoint")):
            r = render(None, bad)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(f"at '{where}'", r.stderr)

    def test_every_flag_and_variable_is_known_to_the_binary(self):
        for values, docs in self.each():
            for dep in find(docs, "Deployment"):
                c = container(dep)
                self.assertEqual(c["command"], ["pdserve"])
                tier = c["args"][0]
                flags, variables, help_text = known_flags(tier)
                for flag in flag_values(c):
                    if flag in flags:
                        self.assertNotIn(flag, PENDING_FLAGS, f"{flag} exists now: drop it from PENDING_FLAGS")
                        continue
                    self.assertIn(values, GPU_FILES, f"pdserve {tier} has no flag {flag}")
                    self.assertIn(flag, PENDING_FLAGS, f"pdserve {tier} has no flag {flag}")
                if values == "values-gpu-rdma.yaml":
                    self.assertIn({"name": "UCX_TLS", "value": "rc,sm,self"}, c["env"])
                for e in c["env"]:
                    if e["name"].startswith("PDSERVE_"):
                        self.assertTrue(e["name"] in variables or e["name"] in PROCESS_ENV,
                                        f"pdserve {tier} reads no {e['name']}")
                cm = one(docs, "ConfigMap", f"{RELEASE}-pdserve-config")
                transport = cm["data"]["PDSERVE_TRANSPORT"]
                if tier != "router":
                    listed = re.search(r"--transport\s+KV transport: ([^(]*)", help_text).group(1)
                    if transport in re.findall(r"[a-z_]+", listed):
                        self.assertNotIn(transport, PENDING_TRANSPORTS)
                    else:
                        self.assertIn(values, GPU_FILES, transport)
                        self.assertIn(transport, PENDING_TRANSPORTS, transport)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(address, timeout=5):
    """grpc.health.v1.Health/Check for the whole server: 1 SERVING, 2 NOT_SERVING."""
    import grpc
    with grpc.insecure_channel(address) as ch:
        reply = ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=timeout)
    assert reply[:1] == b"\x08", reply
    return reply[1]


def expand(value, env):
    """Kubernetes' $(VAR) expansion of command and args ($$ escapes; unknown names stay)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


class PodCommands(unittest.TestCase):
    """values-cpu.yaml's containers as real processes. What changes: each container port becomes
    a free loopback port (the pods share this host), a cluster address (0.0.0.0:P of a pod,
    dns:///<service>...:P) the loopback address of the port it names, the downward API's pod IP
    127.0.0.1, and the image's model directory the repository's models/pdserve-demo."""

    @classmethod
    def setUpClass(cls):
        docs = objects("values-cpu.yaml")
        cls.docs = docs
        deps = {t: one(docs, "Deployment", tier_name(t)) for t in ("router", "prefill", "decode")}
        loopback = {(t, p["containerPort"]): free_port() for t, d in deps.items() for p in container(d)["ports"]}

        def pod_address(tier, address):
            return f"127.0.0.1:{loopback[(tier, port_of(address))]}"

        def service_address(address):
            m = re.fullmatch(r"dns:///([a-z0-9-]+)\." + NAMESPACE + r"\.svc\.cluster\.local:(\d+)", address)
            assert m, f"not a Service address of this namespace: {address}"
            svc = one(docs, "Service", m.group(1))
            port = [p for p in svc["spec"]["ports"] if p["port"] == int(m.group(2))][0]
            (tier,) = [t for t, d in deps.items() if selects(svc["spec"]["selector"], pod_labels(d))]
            return f"127.0.0.1:{loopback[(tier, container_port(container(deps[tier]), port['targetPort']))]}"

        cls.commands = {}
        for tier, dep in deps.items():
            c = container(dep)
            env = {}
            for e in c.get("env", []):
                if "value" in e:
                    env[e["name"]] = e["value"]
                    continue
                ref = e["valueFrom"]
                if "configMapKeyRef" in ref:
                    cm = one(docs, "ConfigMap", ref["configMapKeyRef"]["name"])
                    env[e["name"]] = cm["data"][ref["configMapKeyRef"]["key"]]
                else:
                    assert ref["fieldRef"]["fieldPath"] == "status.podIP", ref
                    env[e["name"]] = "127.0.0.1"
            if env.get("PDSERVE_MODEL") == IMAGE_MODEL_DIR:
                env["PDSERVE_MODEL"] = os.path.join(ROOT, "models", "pdserve-demo")
            args = []
            for a in [expand(x, env) for x in c["command"] + c["args"]]:
                name, eq, value = a.partition("=")
                if eq and value.startswith("0.0.0.0:"):
                    a = f"{name}={pod_address(tier, value)}"
                elif eq and "svc.cluster.local" in value:
                    a = f"{name}={','.join(service_address(v) for v in value.split(','))}"
                assert "cluster.local" not in a and "0.0.0.0" not in a, a
                args.append(a)
            assert args[0] == "pdserve", args
            cls.commands[tier] = (args[1:], env)
        cls.procs = {}
        try:
            for tier in ("decode", "prefill", "router"):
                args, env = cls.commands[tier]
                cls.procs[tier] = cluster.Process(PDSERVE, args, env=env, timeout=120)
        except Exception:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for p in cls.procs.values():
            p.stop()

    def generate(self, *args):
        out = subprocess.run([PDSERVE, "generate", *args, "--format", "json"], capture_output=True,
                             text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)

    def test_requests_through_the_router_equal_the_local_engine(self):
        router = self.procs["router"].grpc
        env = self.commands["decode"][1]
        # Longer than --local-prefill-tokens: prefilled on the prefill pod, pages over tcp to the
        # decode pod's advertised address.
        prompt = ("And God said, Let there be light: and there was light. And God saw the light, "
                  "that it was good: and God divided the light from the darkness.")
        remote = self.generate("--server", router, "--prompt", prompt, "--max-tokens", "24",
                               "--temperature", "0")
        local = self.generate("--model", env["PDSERVE_MODEL"], "--prompt", prompt, "--max-tokens", "24",
                              "--temperature", "0", "--block-size", env["PDSERVE_BLOCK_SIZE"])
        self.assertEqual(remote["token_ids"], local["token_ids"])
        self.assertEqual(remote["text"], local["text"])
        self.assertEqual(len(remote["token_ids"]), 24)
        self.assertGreater(cluster.metric(self.procs["decode"], "pdserve_kv_transfers_total"), 0)
        self.assertEqual(cluster.metric(self.procs["decode"], "pdserve_kv_transfer_failures_total"), 0)
        # The decode pod advertised its pod IP (--transport-advertise=$(POD_IP)), not its hostname.
        self.assertTrue(self.procs["decode"].addresses["transport"].startswith("tcp://127.0.0.1:"))
        # The router pod's OpenAI HTTP API (router.http.enabled) gives the same greedy text.
        body = json.dumps({"prompt": prompt, "max_tokens": 24, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://{self.procs['router'].addresses['http']}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            completion = json.loads(r.read())
        self.assertEqual(completion["choices"][0]["text"], local["text"])
        self.assertEqual(completion["model"], "pdserve-demo")

    def test_probes_metrics_and_autoscaling_metrics_answer(self):
        for tier, proc in self.procs.items():
            dep = one(self.docs, "Deployment", tier_name(tier))
            self.assertEqual(port_of(proc.grpc), port_of(dict(
                a.split("=", 1) for a in self.commands[tier][0][1:] if "=" in a)["--listen"]))
            self.assertEqual(health(proc.grpc), 1, tier)  # the probes' gRPC health check
            with urllib.request.urlopen(f"http://{proc.addresses['metrics']}/metrics", timeout=10) as r:
                text = r.read().decode()
            self.assertIn(f'role="{tier}"', text)
            spec = get_values("values-cpu.yaml")
            if tier != "router":
                metric = spec[tier]["autoscaling"]["metric"]
                self.assertRegex(text, rf"(?m)^{metric}\{{[^}}]*role=\"{tier}\"", f"HPA metric of {tier}")
            self.assertEqual(container(dep)["name"], tier)

    def test_zz_sigterm_drains_and_turns_health_not_serving(self):
        """Last (zz): stops the decode pod. Its health turns NOT_SERVING at once while a running
        request finishes (the grace period covers --drain-seconds)."""
        router = self.procs["router"].grpc
        decode = self.procs["decode"]
        result = {}

        def long_request():
            result["out"] = subprocess.run(
                [PDSERVE, "generate", "--server", router, "--prompt", "In the beginning",
                 "--max-tokens", "1500", "--ignore-eos", "--temperature", "0", "--format", "json"],
                capture_output=True, text=True, timeout=300)

        t = threading.Thread(target=long_request)
        t.start()
        deadline = time.time() + 60
        while cluster.metric(decode, "pdserve_num_requests_running") < 1:
            self.assertLess(time.time(), deadline, "the request never started")
            time.sleep(0.02)
        decode.proc.send_signal(15)
        deadline = time.time() + 5
        status = 1
        while status != 2 and time.time() < deadline:
            status = health(decode.grpc)
        self.assertEqual(status, 2, "NOT_SERVING during the drain")
        t.join(timeout=300)
        out = result["out"]
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(len(json.loads(out.stdout)["token_ids"]), 1500)
        self.assertEqual(decode.proc.wait(timeout=60), 0)


_VALUES = {}


def get_values(values):
    """The chart's values merged with a values file, as Helm computes them."""
    if values not in _VALUES:
        out = helm("show", "values", CHART)
        base = yaml.safe_load(out.stdout)
        with open(os.path.join(CHART, values)) as f:
            over = yaml.safe_load(f)

        def merge(a, b):
            for k, v in b.items():
                a[k] = merge(a.get(k, {}), v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
            return a
        _VALUES[values] = merge(base, over)
    return _VALUES[values]


class Dockerfiles(unittest.TestCase):
    def read(self, name):
        with open(os.path.join(ROOT, "deploy", "docker", name)) as f:
            return f.read()

    def stages(self, text):
        """{stage name or index: its text}, split at FROM lines (continuations joined)."""
        text = re.sub(r"\\\n\s*", " ", text)
        parts = re.split(r"(?m)^FROM\s+", text)[1:]
        out = {}
        for i, part in enumerate(parts):
            m = re.match(r"\S+(?:\s+AS\s+(\S+))?", part)
            out[m.group(1) or f"#{i}"] = part
        return out, parts[-1]

    # Libraries of the CUDA toolkit under /usr/local/cuda (not Debian's): the NVIDIA apt package
    # that ships each in Dockerfile.cuda's runtime stage. The CPU image builds with
    # PDSERVE_CUDA=OFF, so its binary links none of them.
    CUDA_LIBRARIES = {"libcudart": "cuda-cudart-13-0", "libcublasLt": "libcublas-13-0",
                      "libcublas": "libcublas-13-0", "libnccl": "libnccl2"}

    def linked_packages(self):
        """The packages of the shared libraries the pdserve binary links: (Debian's, CUDA's)."""
        out = subprocess.run(["ldd", PDSERVE], capture_output=True, text=True, check=True).stdout
        packages, cuda, debian = set(), set(), []
        for path in re.findall(r"=> (/\S+)", out):
            real = os.path.realpath(path)
            if real.startswith("/usr/local/cuda"):
                name = os.path.basename(path).split(".so", 1)[0]
                self.assertIn(name, self.CUDA_LIBRARIES, f"which NVIDIA package ships {path}?")
                cuda.add(self.CUDA_LIBRARIES[name])
                continue
            debian.append((path, [path, real, real.replace("/usr/lib/", "/lib/", 1)]))
        # One dpkg -S for every candidate path (each call reads the whole package database):
        # it prints "package[:arch]: path" for each path a package owns.
        q = subprocess.run(["dpkg", "-S", *{c for _, cs in debian for c in cs}], capture_output=True, text=True)
        owner = {}
        for line in q.stdout.splitlines():
            package, owned = line.split(": ", 1)
            owner[owned] = package.split(":", 1)[0]
        for path, candidates in debian:
            found = [owner[c] for c in candidates if c in owner]
            if not found:
                self.fail(f"no Debian package owns {path}")
            packages.add(found[0])
        return packages - {"libc6", "libgcc-s1", "zlib1g"}, cuda  # libc6...: in every Debian image

    def test_build_stage_runs_build_sh_and_runtime_has_every_library(self):
        needed_debian, needed_cuda = self.linked_packages()
        self.assertIn("libgrpc++1.51", needed_debian)
        for name in ("Dockerfile", "Dockerfile.cuda"):
            needed = needed_debian | (needed_cuda if name == "Dockerfile.cuda" else set())
            stages, runtime = self.stages(self.read(name))
            self.assertIn("build", stages, name)
            self.assertRegex(stages["build"], r"(?m)^RUN scripts/build\.sh ", name)
            self.assertIn("COPY --from=build /src/build/pdserve /usr/local/bin/pdserve", runtime)
            installed = set(re.findall(r"[a-z0-9][a-z0-9+.-]+", runtime.split("apt-get install", 1)[1].split("&&", 1)[0]))
            self.assertFalse(needed - installed, f"{name}: runtime stage lacks {sorted(needed - installed)}")
            self.assertIn('ENTRYPOINT ["pdserve"]', runtime)
            uid = get_values("values-cpu.yaml")["podSecurityContext"]["runAsUser"]
            self.assertIn(f"USER {uid}:{uid}", runtime)
        _, runtime = self.stages(self.read("Dockerfile"))
        self.assertIn(f"COPY models/pdserve-demo {IMAGE_MODEL_DIR}", runtime)
        self.assertIn("-DPDSERVE_CUDA=OFF", self.read("Dockerfile"))
        self.assertIn("-DPDSERVE_CUDA=ON", self.read("Dockerfile.cuda"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    PDSERVE = os.path.abspath(args.pdserve)
    TOOLS = subprocess.run([os.path.join(ROOT, "scripts", "k8s_tools_setup.sh")], check=True,
                           capture_output=True, text=True).stdout.strip()
    HELM = os.path.join(TOOLS, "bin", "helm")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
