#!/usr/bin/env python3
"""Writes deploy/kubernetes/jobset/jobset.yaml from the spot variant, so that the
JobSet variant is never a second copy to keep in step by hand:

  make_jobset.py REPO_ROOT           write it
  make_jobset.py REPO_ROOT --check   exit 1 when the file differs from what it would write

`kubectl kustomize deploy/kubernetes/spot` renders the spot variant; its
Deployment kolo-rendezvous becomes the replicated job "rendezvous" (one Job of one
pod at a time, restarted on failure: the same "never two servers" as the
Deployment's Recreate), its Job kolo-train the replicated job "workers", and the
JobSet's own headless Service (the JobSet's name) replaces the workers'. The JobSet
succeeds when the workers do, and then removes the server. Every other object
(the token Secret, the rendezvous Service, the network policies, the service
account and its Role, the disruption budget) is kept as it is."""
import os
import shutil
import subprocess
import sys

import yaml

HEADER = """\
# The spot variant as one JobSet (jobset.x-k8s.io/v1alpha2; the JobSet controller must be
# installed): the rendezvous server and the workers are two replicated jobs of one object that
# succeeds when the workers do and then removes the server, for queues such as Kueue that admit
# a JobSet as a whole. Generated from deploy/kubernetes/spot by tests/deploy/make_jobset.py:
# do not edit by hand; edit the spot variant (or base) and run the script.
#   kubectl apply -k deploy/kubernetes/jobset
"""


def rendered(root):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        sys.exit("make_jobset.py: kubectl is needed to render deploy/kubernetes/spot")
    out = subprocess.run([kubectl, "kustomize", os.path.join(root, "deploy/kubernetes/spot")],
                         capture_output=True, text=True, check=True, timeout=60)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def replicated(name, job_spec):
    return {"name": name, "replicas": 1, "template": {"spec": job_spec}}


def jobset(objs):
    dep = next(o for o in objs if o["kind"] == "Deployment")
    job = next(o for o in objs if o["kind"] == "Job")
    server = dict(dep["spec"]["template"])
    server["spec"] = dict(server["spec"], restartPolicy="OnFailure")
    # The server restarts in place on failure (its state is soft); the
    # JobSet's failure policy acts when it gives up.
    rdzv = {"parallelism": 1, "completions": 1, "backoffLimit": 100, "template": server}
    workers = dict(job["spec"])
    wt = dict(workers["template"])
    wt["spec"] = {k: v for k, v in wt["spec"].items() if k != "subdomain"}
    workers["template"] = wt
    labels = {k: v for k, v in job["metadata"].get("labels", {}).items()
              if k != "app.kubernetes.io/component"}
    meta = {"name": job["metadata"]["name"], "labels": labels}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta,
            "spec": {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                     "successPolicy": {"operator": "All", "targetReplicatedJobs": ["workers"]},
                     "failurePolicy": {"maxRestarts": 3},
                     "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
                     "replicatedJobs": [replicated("rendezvous", rdzv),
                                        replicated("workers", workers)]}}


def text(root):
    objs = rendered(root)
    kept = [o for o in objs if o["kind"] not in ("Deployment", "Job")
            and not (o["kind"] == "Service" and o["spec"].get("clusterIP") == "None")]
    docs = [jobset(objs)] + kept
    return HEADER + "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=False)
                                 for d in docs)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    path = os.path.join(root, "deploy/kubernetes/jobset/jobset.yaml")
    want = text(root)
    if "--check" in sys.argv[2:]:
        have = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        if have != want:
            print("FAIL: %s is not what tests/deploy/make_jobset.py writes from the spot "
                  "variant: run it" % path)
            return 1
        print("%s: up to date" % path)
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(want)
    print("wrote " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
