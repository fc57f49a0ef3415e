#!/usr/bin/env python3
"""Validates every object of deploy/kubernetes against the Kubernetes OpenAPI
schema (kubernetes-validate, from PyPI), strictly: an unknown field, a wrong
type or a missing required field fails.

  validate_schema.py REPO_ROOT [VERSION ...]

Each kustomization under deploy/kubernetes is rendered with `kubectl
kustomize` (without kubectl only the base's plain files are checked, and the
overlays are reported as unchecked). VERSIONs (default 1.29.0 and 1.33.0: the
oldest release the manifests support, with elastic Indexed Jobs and pod
failure policies, and a recent one) are the API versions to validate against.
Exit 0 when every object is valid, 1 when one is not, 77 (skip) without
kubernetes-validate or PyYAML."""
import os
import shutil
import subprocess
import sys

try:
    import kubernetes_validate
    import yaml
except ImportError as e:
    print("SKIP: %s (scripts/setup.sh installs kubernetes-validate into .venv)" % e)
    sys.exit(77)

VERSIONS = ["1.29.0", "1.33.0"]
# Custom resources have no schema in the Kubernetes API: check_deploy.py checks
# the fields kolo relies on (the Prometheus Operator's PodMonitor). A JobSet's
# replicated jobs are Jobs, validated as such; its own fields are the
# v1alpha2 API's.
CUSTOM = ("monitoring.coreos.com/",)
JOBSET_SPEC = {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy",
               "suspend", "coordinator", "managedBy", "ttlSecondsAfterFinished",
               "volumeClaimPolicies"}
JOBSET_RJOB = {"name", "groupName", "template", "replicas", "dependsOn"}


def as_validated(o):
    """The objects to validate for o: a JobSet's replicated jobs as Jobs
    (after checking the JobSet's own field names), anything else as itself."""
    if o.get("apiVersion") != "jobset.x-k8s.io/v1alpha2":
        return [o], []
    errors = ["unknown JobSet field spec.%s" % k for k in o.get("spec", {}) if k not in JOBSET_SPEC]
    jobs = []
    for r in o.get("spec", {}).get("replicatedJobs", []):
        errors += ["unknown field %s in replicated job %s" % (k, r.get("name"))
                   for k in r if k not in JOBSET_RJOB]
        jobs.append({"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {"name": "%s-%s" % (o["metadata"]["name"], r.get("name"))},
                     "spec": r.get("template", {}).get("spec", {})})
    return jobs, errors


def kustomizations(root):
    base = os.path.join(root, "deploy", "kubernetes")
    for d in sorted(os.listdir(base)):
        if os.path.exists(os.path.join(base, d, "kustomization.yaml")):
            yield os.path.join(base, d)


def objects(path, kubectl):
    """The rendered objects of a kustomization; None when it cannot be rendered."""
    if kubectl:
        out = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True,
                             timeout=60)
        if out.returncode != 0:
            raise RuntimeError("kubectl kustomize %s: %s" % (path, out.stderr.strip()))
        return [d for d in yaml.safe_load_all(out.stdout) if d]
    if os.path.basename(path) != "base":
        return None
    docs = []
    with open(os.path.join(path, "kustomization.yaml"), encoding="utf-8") as f:
        resources = yaml.safe_load(f).get("resources", [])
    for r in resources:
        with open(os.path.join(path, r), encoding="utf-8") as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def validator_is_strict(version):
    """A Job with an unknown field and a string count must be refused."""
    bad = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"},
           "spec": {"completions": "four", "template": {"spec": {
               "restartPolicy": "Never", "containers": [{"name": "a", "image": "b",
                                                         "unknownField": 1}]}}}}
    try:
        kubernetes_validate.validate(bad, version, strict=True)
    except kubernetes_validate.ValidationError:
        return True
    return False


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    versions = sys.argv[2:] or VERSIONS
    for v in versions:
        if not validator_is_strict(v):
            print("FAIL: kubernetes-validate accepted a broken Job for %s" % v)
            return 1
    kubectl = shutil.which("kubectl")
    failed = checked = 0
    for path in kustomizations(root):
        rel = os.path.relpath(path, root)
        objs = objects(path, kubectl)
        if objs is None:
            print("%s: not rendered (no kubectl): unchecked" % rel)
            continue
        custom = sorted({o["kind"] for o in objs if o.get("apiVersion", "").startswith(CUSTOM)})
        objs = [o for o in objs if not o.get("apiVersion", "").startswith(CUSTOM)]
        plain, errors = [], []
        for o in objs:
            got, errs = as_validated(o)
            plain += got
            errors += ["%s: %s" % (rel, e) for e in errs]
        for e in errors:
            print("FAIL: " + e)
        failed += len(errors)
        for v in versions:
            for o in plain:
                what = "%s: %s %s (Kubernetes %s)" % (rel, o.get("kind"),
                                                     o.get("metadata", {}).get("name"), v)
                checked += 1
                try:
                    kubernetes_validate.validate(o, v, strict=True)
                except kubernetes_validate.ValidationError as e:
                    failed += 1
                    print("FAIL: %s: %s at %s" % (what, e.message,
                                                  "/".join(map(str, e.path)) or "the top"))
                except (kubernetes_validate.SchemaNotFoundError,
                        kubernetes_validate.InvalidSchemaError) as e:
                    failed += 1
                    print("FAIL: %s: no schema (%s)" % (what, e))
        print("%s: %d objects against %s%s" % (rel, len(objs), ", ".join(versions),
                                             "; custom resources not checked here: " +
                                             ", ".join(custom) if custom else ""))
    print("%d validations, %d failed" % (checked, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
