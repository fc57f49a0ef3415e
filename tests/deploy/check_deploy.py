#!/usr/bin/env python3
"""Checks deploy/: every YAML parses, and the manifests agree with each other, with the
Dockerfile and with core/params.def on what matters to a running job.

  check_deploy.py REPO_ROOT [BINDIR]

With BINDIR (the build's bin/), every flag the manifests pass to a kolo program must appear in
that program's --help.

Per kustomization (rendered with `kubectl kustomize` when kubectl is there; the base is also
checked from its plain files, so the check runs without kubectl):
  - the token Secret is mounted as a file in the rendezvous and the workers, passed to the
    server with --token-file and to the workers with KOLO_TOKEN_FILE; no token in an env value;
  - the rendezvous Service port = the --listen port = the containerPort = the port in the
    workers' --rendezvous URL, whose host is the Service; probes and Prometheus annotations
    point at /healthz and /metrics on that port;
  - the workers are an Indexed Job with parallelism = completions, restartPolicy Never, a pod
    failure policy ignoring DisruptionTarget, a grace period for a spot leave, KOLO_HOSTNAME
    from the Downward API, and pods x -np consistent with the server's --min-np/--max-np;
  - elastic: processes beyond --max-np are spares, whole pods of them;
  - a JobSet (deploy/kubernetes/jobset) is checked as the Deployment and Job it replaces, and
    is what tests/deploy/make_jobset.py writes from the spot variant;
  - with KOLO_PREEMPTION=k8s (the spot overlay): the workers' own service account, its token
    mounted (and no other pod's), a Role that may get pods and nothing more bound to it, the
    pod's name and namespace from the Downward API, and one PodDisruptionBudget over the
    workers with maxUnavailable 1;
  - every KOLO_* / HOROVOD_* variable exists in core/params.def; every $(VAR) is defined;
  - one image everywhere, tagged with the project version; pods non-root, read-only root
    filesystem, no privilege escalation, no service links;
  - Services and NetworkPolicies select the pods they are meant for;
  - with KOLO_METRICS_LISTEN=[HOST]:PORT on the workers: a container port per local rank
    (PORT .. PORT + np - 1), the scrape annotations on PORT, the workers' NetworkPolicy opens
    those ports to a namespace, and PodMonitors scrape ports that exist.
The docs name the metrics that exist: the rendezvous server's (docs/kubernetes.md) and the
workers' (docs/metrics.md, against core/metrics.c).
And the Dockerfile: multi-stage on Debian 12, builds with scripts/setup.sh, numeric non-root
USER, exec-form CMD/ENTRYPOINT, apt hygiene, ships every binary the manifests run.

Exit 0 on success, 1 on a failed check, 77 (skip) when no python3 with PyYAML exists.
"""
import os
import re
import shutil
import subprocess
import sys

try:
    import yaml
except ImportError:
    # The pyenv python3 on some machines lacks Debian's python3-yaml; /usr/bin/python3 has it.
    alt = "/usr/bin/python3"
    if os.path.exists(alt) and os.path.realpath(sys.executable) != os.path.realpath(alt) \
            and not os.environ.get("KOLO_CHECK_DEPLOY_REEXEC"):
        os.environ["KOLO_CHECK_DEPLOY_REEXEC"] = "1"
        os.execv(alt, [alt] + sys.argv)
    print("SKIP: PyYAML is not installed (Debian: apt-get install python3-yaml)")
    sys.exit(77)

FAILS = []
NOTES = []


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
    return cond


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def params_names(root):
    names = set()
    with open(os.path.join(root, "core", "params.def"), encoding="utf-8") as f:
        text = f.read()
    for m in re.finditer(r'KOLO_PARAM\(\s*\w+\s*,\s*"([A-Z0-9_]+)"\s*,\s*\w+\s*,\s*"[^"]*"\s*,'
                         r'\s*"([A-Z0-9_]*)"', text):
        names.add(m.group(1))
        if m.group(2):
            names.add(m.group(2))
    return names


def params_aliases(root):
    with open(os.path.join(root, "core", "params.def"), encoding="utf-8") as f:
        text = f.read()
    return {(m.group(2), m.group(1)) for m in re.finditer(
        r'KOLO_PARAM\(\s*\w+\s*,\s*"([A-Z0-9_]+)"\s*,\s*\w+\s*,\s*"[^"]*"\s*,\s*"([A-Z0-9_]+)"', text)}


def check_docs(root):
    """The user docs name what exists: Horovod aliases as in params.def, metric names as the
    rendezvous server exports them."""
    doc = os.path.join(root, "docs", "horovod-migration.md")
    if os.path.exists(doc):
        with open(doc, encoding="utf-8") as f:
            rows = set(re.findall(r"^\| `(HOROVOD_[A-Z0-9_]+)` \| `(KOLO_[A-Z0-9_]+)` \|", f.read(),
                                  re.M))
        want = params_aliases(root)
        check(rows == want, "docs/horovod-migration.md alias table differs from core/params.def: "
              "missing %s, extra %s" % (sorted(want - rows), sorted(rows - want)))
    doc = os.path.join(root, "docs", "kubernetes.md")
    srv = os.path.join(root, "rendezvous", "server_metrics.c")
    if os.path.exists(doc) and os.path.exists(srv):
        with open(doc, encoding="utf-8") as f:
            documented = set(re.findall(r"`(kolo_rdzv_[a-z_]+)`", f.read()))
        with open(srv, encoding="utf-8") as f:
            exported = set(re.findall(r"# TYPE (kolo_rdzv_[a-z_]+) ", f.read()))
        check(documented == exported,
              "docs/kubernetes.md metrics differ from rendezvous/server_metrics.c: "
              "undocumented %s, not exported %s"
              % (sorted(exported - documented), sorted(documented - exported)))
    # The worker's families: core/metrics.c, and the flight recorder's arrival lags.
    doc = os.path.join(root, "docs", "metrics.md")
    srcs = [os.path.join(root, "core", n) for n in ("metrics.c", "flight.c")]
    if os.path.exists(doc) and all(os.path.exists(s) for s in srcs):
        with open(doc, encoding="utf-8") as f:
            documented = set(re.findall(r"^\| `(kolo_[a-z0-9_]+)` \|", f.read(), re.M))
        exported = set()
        for src in srcs:
            with open(src, encoding="utf-8") as f:
                exported |= set(re.findall(r'"(kolo_[a-z0-9_]+)"', f.read()))
        check(documented == exported,
              "docs/metrics.md differs from core/metrics.c and core/flight.c: undocumented %s, "
              "not exported %s" % (sorted(exported - documented), sorted(documented - exported)))


def project_version(root):
    with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(kolo\s+VERSION\s+([0-9.]+)", f.read())
    return m.group(1) if m else None


def pod_spec(obj):
    kind = obj.get("kind")
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        t = obj.get("spec", {}).get("template", {})
        return t.get("spec", {}), t.get("metadata", {})
    return None, None


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def arg_value(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def env_map(container):
    return {e["name"]: e for e in container.get("env", [])}


def expand(value, env):
    """Resolves $(VAR) from literal env values (as the kubelet does)."""
    def sub(m):
        e = env.get(m.group(1))
        return e["value"] if e and "value" in e else m.group(0)
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, str(value))


def secret_mount_dir(spec, container, secret_name):
    """The mountPath of a volume of container that projects Secret secret_name."""
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        v = vols.get(m["name"], {})
        if v.get("secret", {}).get("secretName") == secret_name:
            return m["mountPath"].rstrip("/"), m.get("readOnly", False)
    return None, False


def check_security(where, spec, container, reads_pod=False):
    """reads_pod: the pod reads its own status (KOLO_PREEMPTION=k8s), so it
    mounts its service account's token, and nothing else may need one."""
    psc = spec.get("securityContext", {})
    csc = container.get("securityContext", {})
    check(psc.get("runAsNonRoot") or csc.get("runAsNonRoot"), where + ": runAsNonRoot not set")
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    check(uid is not None and uid != 0, where + ": runAsUser must be a non-zero uid")
    check(csc.get("readOnlyRootFilesystem") is True, where + ": readOnlyRootFilesystem not true")
    check(csc.get("allowPrivilegeEscalation") is False,
          where + ": allowPrivilegeEscalation not false")
    check("ALL" in csc.get("capabilities", {}).get("drop", []), where + ": capabilities not dropped")
    check(spec.get("enableServiceLinks") is False,
          where + ": enableServiceLinks must be false (Service env vars would use the KOLO_ prefix)")
    check(spec.get("automountServiceAccountToken") is (True if reads_pod else False),
          where + ": automountServiceAccountToken should be %s"
          % ("true (KOLO_PREEMPTION=k8s reads the pod)" if reads_pod else "false"))


def check_reads_pod(label, by_kind, wspec, wmeta, env):
    """KOLO_PREEMPTION=k8s: a service account of its own, bound to a Role that
    may get pods and no more, the pod's name and namespace from the Downward
    API, an elastic job, and a PodDisruptionBudget over the workers."""
    sa = wspec.get("serviceAccountName")
    if not check(sa and sa != "default", label + ": KOLO_PREEMPTION=k8s needs a service account "
                 "of the workers' own"):
        return
    check(env.get("KOLO_ELASTIC", {}).get("value") in ("1", "true", "yes"),
          label + ": KOLO_PREEMPTION needs an elastic job (KOLO_ELASTIC=1)")
    for var, path in (("KOLO_K8S_POD_NAME", "metadata.name"),
                      ("KOLO_K8S_NAMESPACE", "metadata.namespace")):
        got = env.get(var, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        check(got == path, "%s: %s must come from the Downward API (%s)" % (label, var, path))
    roles = {r["metadata"]["name"]: r for r in by_kind.get("Role", [])}
    bound = [b["roleRef"]["name"] for b in by_kind.get("RoleBinding", [])
             if b["roleRef"].get("kind") == "Role"
             and any(s.get("kind") == "ServiceAccount" and s.get("name") == sa
                     for s in b.get("subjects", []))]
    rules = [r for name in bound for r in roles.get(name, {}).get("rules", [])]
    check(any("pods" in r.get("resources", []) and "get" in r.get("verbs", []) for r in rules),
          label + ": no Role bound to %s may get pods" % sa)
    check(all(set(r.get("verbs", [])) <= {"get"} and set(r.get("resources", [])) <= {"pods"}
              for r in rules), label + ": the workers' Role grants more than get on pods")
    check(any(s["metadata"]["name"] == sa for s in by_kind.get("ServiceAccount", [])),
          label + ": ServiceAccount %s is not defined" % sa)
    pdbs = [d for d in by_kind.get("PodDisruptionBudget", [])
            if selects(d["spec"].get("selector", {}).get("matchLabels"), wmeta.get("labels", {}))]
    check(len(pdbs) == 1 and pdbs[0]["spec"].get("maxUnavailable") == 1,
          label + ": a spot job needs one PodDisruptionBudget over the workers, maxUnavailable 1")


def check_worker_metrics(label, by_kind, wc, wmeta, env, np, rmeta, rports):
    """KOLO_METRICS_LISTEN=[HOST]:PORT (docs/metrics.md): a container port per local rank from
    PORT, the scrape annotation on PORT, the workers' NetworkPolicy opens those ports to a
    namespace, and every PodMonitor scrapes named ports that exist."""
    listen = env.get("KOLO_METRICS_LISTEN", {}).get("value")
    wlabels = wmeta.get("labels", {})
    wnames = {p.get("name") for p in wc.get("ports", [])}
    if listen:
        m = re.fullmatch(r"(\[[^]]*\]|[^:]*):(\d+)", listen)
        if check(m and int(m.group(2)) > 0 and np.isdigit(),
                 label + ": KOLO_METRICS_LISTEN %r is not [HOST]:PORT with PORT > 0" % listen):
            base, n = int(m.group(2)), int(np)
            want = list(range(base, base + n))
            got = sorted(p["containerPort"] for p in wc.get("ports", [])
                         if str(p.get("name", "")).startswith("metrics"))
            check(got == want, "%s: metrics container ports %s, want %s (PORT + local rank, "
                  "-np %d)" % (label, got, want, n))
            ann = wmeta.get("annotations", {})
            if ann.get("prometheus.io/scrape") == "true":
                check(str(ann.get("prometheus.io/port")) == str(base)
                      and ann.get("prometheus.io/path") == "/metrics",
                      label + ": worker scrape annotations must point at /metrics on PORT")
            for np_ in by_kind.get("NetworkPolicy", []):
                if not selects(np_["spec"]["podSelector"].get("matchLabels", {}), wlabels):
                    continue
                opened = [(p.get("port"), p.get("endPort", p.get("port")))
                          for r in np_["spec"].get("ingress", []) for p in r.get("ports", [])
                          if any("namespaceSelector" in f for f in r.get("from", []))]
                check(any(isinstance(lo, int) and lo <= want[0] and want[-1] <= hi
                          for lo, hi in opened),
                      "%s: NetworkPolicy %s does not open the metrics ports %d-%d to a namespace"
                      % (label, np_["metadata"]["name"], want[0], want[-1]))
    for pm in by_kind.get("PodMonitor", []):
        sel = pm["spec"].get("selector", {}).get("matchLabels", {})
        ports = [e.get("port") for e in pm["spec"].get("podMetricsEndpoints", [])]
        if selects(sel, wlabels):
            check(set(ports) == {n for n in wnames if str(n).startswith("metrics")},
                  "%s: PodMonitor %s scrapes %s, not every worker metrics port"
                  % (label, pm["metadata"]["name"], ports))
        elif check(selects(sel, rmeta.get("labels", {})),
                   "%s: PodMonitor %s selects no kolo pod" % (label, pm["metadata"]["name"])):
            check(all(p in rports for p in ports), "%s: PodMonitor %s scrapes ports %s the "
                  "rendezvous does not name" % (label, pm["metadata"]["name"], ports))


def check_set(label, objs, params, version, image_name):
    """The invariants on one rendered set of objects."""
    by_kind = {}
    for o in objs:
        check(isinstance(o, dict) and "apiVersion" in o and "kind" in o
              and o.get("metadata", {}).get("name"),
              "%s: an object lacks apiVersion/kind/metadata.name" % label)
        by_kind.setdefault(o.get("kind"), []).append(o)
    secrets = by_kind.get("Secret", [])
    deps = by_kind.get("Deployment", [])
    jobs = by_kind.get("Job", [])
    svcs = by_kind.get("Service", [])
    if not (check(len(secrets) == 1, "%s: expected one Secret" % label)
            and check(len(deps) == 1, "%s: expected one Deployment" % label)
            and check(len(jobs) == 1, "%s: expected one Job" % label)):
        return
    secret, dep, job = secrets[0], deps[0], jobs[0]
    secret_name = secret["metadata"]["name"]
    secret_keys = set(secret.get("data", {})) | set(secret.get("stringData", {}))

    # --- rendezvous
    rspec, rmeta = pod_spec(dep)
    check(dep["spec"].get("replicas") == 1, label + ": rendezvous replicas must be 1")
    check(dep["spec"].get("strategy", {}).get("type") == "Recreate",
          label + ": rendezvous strategy should be Recreate (never two servers)")
    rc = [c for c in rspec["containers"] if "kolo-rendezvous" in (c.get("command") or [])]
    if not check(len(rc) == 1, label + ": no container runs kolo-rendezvous"):
        return
    rc = rc[0]
    rargs = [str(a) for a in rc.get("args", [])]
    listen = arg_value(rargs, "--listen")
    port = None
    if check(listen and re.fullmatch(r"[^:]*:\d+", listen), label + ": --listen HOST:PORT missing"):
        port = int(listen.rsplit(":", 1)[1])
    tf = arg_value(rargs, "--token-file")
    if check(tf, label + ": kolo-rendezvous has no --token-file"):
        mdir, ro = secret_mount_dir(rspec, rc, secret_name)
        check(mdir == os.path.dirname(tf) and ro,
              label + ": --token-file %s is not in a read-only mount of Secret %s" % (tf, secret_name))
        check(os.path.basename(tf) in secret_keys,
              label + ": Secret %s has no key %s" % (secret_name, os.path.basename(tf)))
    min_np, max_np = arg_value(rargs, "--min-np"), arg_value(rargs, "--max-np")
    cports = {p.get("name"): p["containerPort"] for p in rc.get("ports", [])}
    check(port in cports.values(), label + ": containerPort != --listen port")

    def port_of(p):
        return cports.get(p, None) if isinstance(p, str) else p
    for probe in ("readinessProbe", "livenessProbe"):
        g = rc.get(probe, {}).get("httpGet", {})
        check(g.get("path") == "/healthz" and port_of(g.get("port")) == port,
              "%s: rendezvous %s is not GET /healthz on port %s" % (label, probe, port))
    ann = rmeta.get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/path") == "/metrics"
          and str(ann.get("prometheus.io/port")) == str(port),
          label + ": Prometheus annotations must scrape /metrics on the --listen port")
    check("requests" in rc.get("resources", {}) and "limits" in rc.get("resources", {}),
          label + ": rendezvous needs resource requests and limits")
    check_security(label + ": rendezvous", rspec, rc)
    for e in rc.get("env", []):
        if e["name"].startswith(("KOLO_", "HOROVOD_")):
            check(e["name"] in params, "%s: rendezvous env %s is not in core/params.def"
                  % (label, e["name"]))

    rsvc = [s for s in svcs if selects(s["spec"].get("selector"), rmeta.get("labels", {}))]
    if not check(len(rsvc) == 1, label + ": expected one Service selecting the rendezvous"):
        return
    rsvc = rsvc[0]
    sp = rsvc["spec"]["ports"]
    check(len(sp) == 1 and sp[0]["port"] == port and port_of(sp[0].get("targetPort", sp[0]["port"]))
          == port, label + ": rendezvous Service port/targetPort != --listen port %s" % port)

    # --- workers
    js = job["spec"]
    wspec, wmeta = pod_spec(job)
    check(js.get("completionMode") == "Indexed", label + ": Job is not Indexed")
    check(js.get("parallelism") == js.get("completions"), label + ": parallelism != completions")
    check(wspec.get("restartPolicy") == "Never", label + ": restartPolicy must be Never")
    rules = js.get("podFailurePolicy", {}).get("rules", [])
    check(any(r.get("action") == "Ignore" and any(c.get("type") == "DisruptionTarget"
                                                  for c in r.get("onPodConditions", []))
              for r in rules), label + ": no pod failure rule ignoring DisruptionTarget")
    check(isinstance(js.get("backoffLimit"), int), label + ": Job has no backoffLimit")
    grace = wspec.get("terminationGracePeriodSeconds")
    check(isinstance(grace, int) and 5 <= grace <= 120,
          label + ": worker terminationGracePeriodSeconds should be 5..120 for a spot leave")
    wc = [c for c in wspec["containers"] if "kolorun" in (c.get("command") or [])]
    if not check(len(wc) == 1, label + ": no worker container runs kolorun"):
        return
    wc = wc[0]
    env = env_map(wc)
    wargs = [str(a) for a in wc.get("args", [])]
    for a in wargs + [str(c) for c in wc.get("command", [])]:
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
            check(ref in env, "%s: $(%s) in the worker command is not defined" % (label, ref))
    for name in env:
        if name.startswith(("KOLO_", "HOROVOD_")):
            check(name in params, "%s: worker env %s is not in core/params.def" % (label, name))
    check("KOLO_TOKEN" not in env, label + ": the token must come from a file, not KOLO_TOKEN")
    check("--" in wargs and wargs.index("--") < len(wargs) - 1,
          label + ": kolorun has no `-- program`")
    pre = wargs[:wargs.index("--")] if "--" in wargs else wargs
    url = arg_value(pre, "--rendezvous")
    m = re.fullmatch(r"http://([^:/]+):(\d+)/?", url or "")
    if check(m, label + ": kolorun --rendezvous http://HOST:PORT missing"):
        host = m.group(1).split(".")[0]
        check(host == rsvc["metadata"]["name"],
              label + ": --rendezvous host %s is not the Service %s" % (m.group(1),
                                                                       rsvc["metadata"]["name"]))
        check(int(m.group(2)) == port, label + ": --rendezvous port != Service port")
    check(arg_value(pre, "--job") is not None, label + ": kolorun has no --job")
    gms = arg_value(pre, "--grace-ms")
    check(gms and gms.isdigit() and isinstance(grace, int) and int(gms) < grace * 1000,
          label + ": kolorun --grace-ms must be set below terminationGracePeriodSeconds")
    tfe = env.get("KOLO_TOKEN_FILE", {}).get("value")
    if check(tfe, label + ": workers have no KOLO_TOKEN_FILE"):
        mdir, ro = secret_mount_dir(wspec, wc, secret_name)
        check(mdir == os.path.dirname(tfe) and ro,
              label + ": KOLO_TOKEN_FILE %s is not in a read-only mount of Secret %s"
              % (tfe, secret_name))
        check(os.path.basename(tfe) in secret_keys,
              label + ": Secret has no key %s" % os.path.basename(tfe))
    hn = env.get("KOLO_HOSTNAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    check(hn in ("metadata.name", "spec.nodeName"),
          label + ": KOLO_HOSTNAME must come from the Downward API (metadata.name or spec.nodeName)")
    np = expand(arg_value(pre, "-np") or "", env)
    elastic = env.get("KOLO_ELASTIC", {}).get("value") in ("1", "true", "yes")
    if check(np.isdigit() and min_np and max_np and str(min_np).isdigit()
             and str(max_np).isdigit(), label + ": -np / --min-np / --max-np not numbers"):
        total = int(np) * int(js.get("completions", 0))
        if elastic:
            # Processes beyond --max-np wait as spares: whole pods of them.
            spares = total - int(max_np)
            check(int(min_np) <= total and int(min_np) < int(max_np),
                  "%s: elastic: pods x -np = %d must be at least --min-np %s, below --max-np %s"
                  % (label, total, min_np, max_np))
            check(spares <= 0 or spares % int(np) == 0,
                  "%s: pods x -np = %d exceeds --max-np %s by %d: spares must be whole pods"
                  % (label, total, max_np, spares))
        else:
            check(int(min_np) == total == int(max_np),
                  "%s: pods x -np = %d must equal --min-np %s and --max-np %s"
                  % (label, total, min_np, max_np))
    check_worker_metrics(label, by_kind, wc, wmeta, env, np, rmeta, cports)
    shm = [m for m in wc.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
    vols = {v["name"]: v for v in wspec.get("volumes", [])}
    check(shm and vols.get(shm[0]["name"], {}).get("emptyDir", {}).get("medium") == "Memory",
          label + ": workers need /dev/shm as a memory emptyDir")
    reads_pod = "k8s" in env.get("KOLO_PREEMPTION", {}).get("value", "").split(",")
    check_security(label + ": workers", wspec, wc, reads_pod)
    if reads_pod:
        check_reads_pod(label, by_kind, wspec, wmeta, env)
    if wspec.get("subdomain"):
        hs = [s for s in svcs if s["metadata"]["name"] == wspec["subdomain"]]
        check(len(hs) == 1 and hs[0]["spec"].get("clusterIP") == "None"
              and selects(hs[0]["spec"].get("selector"), wmeta.get("labels", {})),
              label + ": subdomain %s has no headless Service selecting the workers"
              % wspec["subdomain"])

    # --- images: one, tagged with the project's version
    images = {c["image"] for o in objs for c in (pod_spec(o)[0] or {}).get("containers", [])}
    images |= {c["image"] for o in objs for c in (pod_spec(o)[0] or {}).get("initContainers", [])}
    check(len(images) == 1, label + ": containers use different images: %s" % sorted(images))
    for img in images:
        name, _, tag = img.rpartition(":")
        check(tag and tag != "latest" and "/" not in tag, label + ": image %s has no pinned tag" % img)
        if image_name and not kubectl_rendered(label):
            check(name == image_name, label + ": image %s is not the kustomization's %s"
                  % (img, image_name))
        if version:
            check(tag == version, label + ": image tag %s != project version %s" % (tag, version))

    # --- network policies select real pods and open the rendezvous port
    for np_ in by_kind.get("NetworkPolicy", []):
        sel = np_["spec"]["podSelector"].get("matchLabels", {})
        check(selects(sel, rmeta.get("labels", {})) or selects(sel, wmeta.get("labels", {})),
              "%s: NetworkPolicy %s selects no kolo pod" % (label, np_["metadata"]["name"]))
        if selects(sel, rmeta.get("labels", {})):
            ports = [p.get("port") for r in np_["spec"].get("ingress", []) for p in r.get("ports", [])]
            check(port in ports, "%s: NetworkPolicy %s does not open port %s"
                  % (label, np_["metadata"]["name"], port))
            froms = [f.get("podSelector", {}).get("matchLabels", {})
                     for r in np_["spec"].get("ingress", []) for f in r.get("from", [])]
            check(any(selects(f, wmeta.get("labels", {})) for f in froms if f),
                  "%s: NetworkPolicy %s does not admit the workers" % (label,
                                                                      np_["metadata"]["name"]))


def from_jobset(label, objs):
    """A set with a JobSet as check_set knows it: the replicated job
    "rendezvous" as a one-replica Deployment when it runs one pod at a time
    (Recreate's guarantee: never two servers), "workers" as the Job. The
    JobSet's own rules are checked here: it succeeds when the workers do, its
    pods get DNS names, each replicated job is one Job."""
    sets = [o for o in objs if o.get("kind") == "JobSet"]
    if not sets or not check(len(sets) == 1, label + ": more than one JobSet"):
        return objs
    js = sets[0]
    spec = js.get("spec", {})
    rj = {r.get("name"): r for r in spec.get("replicatedJobs", [])}
    if not check(set(rj) == {"rendezvous", "workers"},
                 label + ": the JobSet's replicated jobs must be rendezvous and workers"):
        return objs
    check(all(r.get("replicas") == 1 for r in rj.values()),
          label + ": each replicated job must be one Job (replicas 1)")
    check(spec.get("successPolicy") == {"operator": "All", "targetReplicatedJobs": ["workers"]},
          label + ": the JobSet must succeed when the workers do (successPolicy)")
    check(spec.get("network", {}).get("enableDNSHostnames") is True,
          label + ": the JobSet should give its pods DNS names")
    server = rj["rendezvous"]["template"]["spec"]
    one = server.get("parallelism") == 1 and server.get("completions") == 1
    check(one, label + ": the rendezvous replicated job must run one pod (never two servers)")
    check(server["template"]["spec"].get("restartPolicy") == "OnFailure",
          label + ": the server should restart in place (restartPolicy OnFailure)")
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "kolo-rendezvous"},
           "spec": {"replicas": 1 if one else None,
                    "strategy": {"type": "Recreate"} if one else {},
                    "template": server["template"]}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": js["metadata"],
           "spec": rj["workers"]["template"]["spec"]}
    return [o for o in objs if o is not js] + [dep, job]


RENDERED = set()


def kubectl_rendered(label):
    return label in RENDERED


def check_flags(bindir, flags_by_cmd):
    """Every flag a manifest passes appears in the program's --help (when it is built)."""
    for cmd, flags in sorted(flags_by_cmd.items()):
        exe = os.path.join(bindir, cmd) if bindir else None
        if not exe or not os.access(exe, os.X_OK):
            NOTES.append("%s not built: its flags were not checked against --help" % cmd)
            continue
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
        for f in sorted(flags):
            check(re.search(r"(^|[\s,])%s\b" % re.escape(f), text),
                  "%s --help does not know %s, which a manifest passes" % (cmd, f))
        print("%s: flags %s ok" % (cmd, " ".join(sorted(flags))))


def check_dockerfile(root, path, commands):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # Join continuation lines into instructions.
    instrs = []
    cur = ""
    for line in text.splitlines():
        s = line.strip()
        if not s or (s.startswith("#") and not cur):
            continue
        cur += " " + s.rstrip("\\").strip() if cur else s.rstrip("\\").strip()
        if not s.endswith("\\"):
            instrs.append(cur)
            cur = ""
    froms = [i.split()[1] for i in instrs if i.upper().startswith("FROM ")]
    check(len(froms) >= 2, "Dockerfile: not multi-stage")
    for f in froms:
        check(re.fullmatch(r"debian:bookworm(-slim)?(@sha256:[0-9a-f]{64})?", f),
              "Dockerfile: FROM %s is not a pinned Debian 12 (bookworm) image" % f)
    runs = [i for i in instrs if i.upper().startswith("RUN ")]
    check(any("scripts/setup.sh" in r for r in runs), "Dockerfile: does not build with scripts/setup.sh")
    for r in runs:
        if "apt-get install" in r:
            check("--no-install-recommends" in r, "Dockerfile: apt-get install without "
                  "--no-install-recommends: " + r[:60])
            check("rm -rf /var/lib/apt/lists" in r, "Dockerfile: apt lists not removed in: " + r[:60])
    users = [i.split()[1] for i in instrs if i.upper().startswith("USER ")]
    check(users and re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", users[-1]),
          "Dockerfile: the final USER must be a numeric non-root uid")
    for i in instrs:
        if i.upper().startswith(("CMD ", "ENTRYPOINT ")):
            check(i.split(None, 1)[1].startswith("["), "Dockerfile: not exec form: " + i)
    copies = " ".join(r for r in runs if "build/bin/" in r)
    for cmd in sorted(commands):
        # The build stage copies build/bin/kolo* into the image.
        check(cmd.startswith("kolo") and "build/bin/kolo*" in copies,
              "Dockerfile: the image may not contain %s, which a manifest runs" % cmd)
    ign = path + ".dockerignore"
    if check(os.path.exists(ign), "Dockerfile: no %s" % os.path.relpath(ign, root)):
        with open(ign, encoding="utf-8") as f:
            pats = {ln.strip() for ln in f}
        check({"build", "build-*", ".git"} <= pats, "Dockerfile.dockerignore: must exclude "
              ".git, build and build-*")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    deploy = os.path.join(root, "deploy")
    params = params_names(root)
    version = project_version(root)
    check(params, "core/params.def: no parameters parsed")

    yamls, kusts = [], []
    for d, _, files in os.walk(deploy):
        for f in sorted(files):
            if f.endswith((".yaml", ".yml")):
                yamls.append(os.path.join(d, f))
                if f == "kustomization.yaml":
                    kusts.append(d)
    check(yamls, "deploy/: no YAML files")
    parsed = {}
    for p in yamls:
        try:
            parsed[p] = load_all(p)
        except yaml.YAMLError as e:
            check(False, "%s: does not parse: %s" % (os.path.relpath(p, root), e))
    print("parsed %d YAML files under deploy/" % len(parsed))

    commands = set()
    flags_by_cmd = {}
    kubectl = shutil.which("kubectl")
    for k in sorted(kusts):
        rel = os.path.relpath(k, root)
        kdoc = parsed.get(os.path.join(k, "kustomization.yaml"), [{}])[0]
        image_name = None
        for im in kdoc.get("images", []):
            image_name = im.get("newName", im.get("name"))
        # Plain files (a base: every resource is a file here).
        res = kdoc.get("resources", [])
        if res and all(os.path.isfile(os.path.join(k, r)) for r in res):
            objs = []
            for r in res:
                objs += parsed.get(os.path.join(k, r), [])
            n = len(FAILS)
            objs = from_jobset(rel + " (files)", objs)
            check_set(rel + " (files)", objs, params, version, None)
            print("%s (files): %d objects, %s" % (rel, len(objs),
                                                 "ok" if len(FAILS) == n else "FAILED"))
        if kubectl:
            out = subprocess.run([kubectl, "kustomize", k], capture_output=True, text=True,
                                 timeout=60)
            if not check(out.returncode == 0, "%s: kubectl kustomize failed: %s"
                         % (rel, out.stderr.strip())):
                continue
            objs = [d for d in yaml.safe_load_all(out.stdout) if d]
            label = rel + " (kustomize)"
            RENDERED.add(label)
            n = len(FAILS)
            objs = from_jobset(label, objs)
            check_set(label, objs, params, version, image_name)
            for o in objs:
                spec = pod_spec(o)[0] or {}
                for c in spec.get("containers", []):
                    commands.update(c.get("command", [])[:1])
                    args = [str(a) for a in c.get("args", [])]
                    args = args[:args.index("--")] if "--" in args else args
                    if c.get("command"):
                        flags_by_cmd.setdefault(c["command"][0], set()).update(
                            a.split("=")[0] for a in args if a.startswith("-"))
            print("%s (kustomize): %d objects, %s" % (rel, len(objs),
                                                     "ok" if len(FAILS) == n else "FAILED"))
        else:
            NOTES.append("kubectl not found: %s not rendered (overlays unchecked)" % rel)
    for p, docs in parsed.items():
        for d in docs:
            spec = pod_spec(d)[0] if isinstance(d, dict) and "spec" in d else None
            for c in (spec or {}).get("containers", []):
                commands.update(c.get("command", [])[:1])

    dockerfile = os.path.join(deploy, "Dockerfile")
    if check(os.path.exists(dockerfile), "deploy/Dockerfile missing"):
        n = len(FAILS)
        check_dockerfile(root, dockerfile, commands)
        print("deploy/Dockerfile: %s (image runs: %s)" % ("ok" if len(FAILS) == n else "FAILED",
                                                         ", ".join(sorted(commands))))
    if kubectl:
        gen = subprocess.run([sys.executable, os.path.join(root, "tests", "deploy",
                                                           "make_jobset.py"), root, "--check"],
                             capture_output=True, text=True, timeout=120)
        print(gen.stdout.strip())
        check(gen.returncode == 0, "deploy/kubernetes/jobset/jobset.yaml: " +
              (gen.stdout + gen.stderr).strip()[-300:])
    check_flags(sys.argv[2] if len(sys.argv) > 2 else None, flags_by_cmd)
    n = len(FAILS)
    check_docs(root)
    print("docs (aliases, metric names): %s" % ("ok" if len(FAILS) == n else "FAILED"))
    for n_ in NOTES:
        print("note: " + n_)
    for f in FAILS:
        print("FAIL: " + f)
    print("%d failed checks" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
