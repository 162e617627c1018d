#!/usr/bin/env python3
"""Schema checks of the deployment files that no Docker engine or cluster runs here.

  deploy_check.py compose SCHEMA.json docker-compose.yml
      the compose file against the Compose Specification's JSON schema (compose-go's);
  deploy_check.py crds CRD_DIR RENDERED.yaml
      every custom resource of a rendered chart (ServiceMonitor, PrometheusRule) against the
      openAPIV3Schema of its CRD from the Prometheus Operator's release;
  deploy_check.py chart-copies RENDERED.yaml N
      the rendered PrometheusRule's groups and the dashboard ConfigMap's JSON are exactly
      deploy/prometheus/outbox-relay-rules.yml and deploy/grafana/outbox-relay.json, and N of
      them were rendered;
  deploy_check.py relay-config RENDERED.yaml OUT.toml
      writes the relay.toml of the chart's ConfigMap to OUT.toml (scripts/deploy-check.sh then
      runs `outbox-relay config check` on it).
  deploy_check.py statefulset RENDERED.yaml pvc|emptydir OUT.txt
      the relay runs as one StatefulSet whose pods each get their own MySQL server_id: the
      container's environment is expanded as the kubelet does (fieldRefs of the pod's name and
      ordinal label, then `$(VAR)` references) for every ordinal below spec.replicas, and the
      resulting OUTBOX_RELAY_MYSQL__SERVER_ID values must be distinct whole numbers within
      MySQL's 1..4294967295, none equal to another pod's id + 1 (`replay`'s default reader);
      the checkpoint directory must be on the volume claim template `state` (pvc) or on an
      emptyDir (emptydir). Writes "POD SERVER_ID" lines to OUT.txt (deploy-check.sh then has
      the relay read each id).

Exits 1 with every problem found, naming the file, the object and the path in it.
"""

import json
import pathlib
import sys

import jsonschema
import yaml


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def errors_of(schema, instance, default=jsonschema.Draft202012Validator):
    validator = jsonschema.validators.validator_for(schema, default=default)(schema)
    return sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))


def report(what, errors):
    for e in errors:
        path = "/".join(str(p) for p in e.absolute_path) or "(top)"
        print(f"{what}: {path}: {e.message}", file=sys.stderr)
    return len(errors)


def check_compose(schema_path, compose_path):
    schema = json.loads(pathlib.Path(schema_path).read_text(encoding="utf-8"))
    (compose,) = load_all(compose_path)
    # The spec's "$schema" is draft-07 without the trailing "#" that jsonschema matches on.
    failed = report(compose_path, errors_of(schema, compose, jsonschema.Draft7Validator))
    if not failed:
        print(f"{compose_path}: valid ({len(compose['services'])} services)")
    return failed


def crd_schema(crd_dir, api_version, kind):
    """The openAPIV3Schema of `kind` at `api_version`, from its CRD file in crd_dir (the operator's
    release names them <group>_<plural>.yaml), or None."""
    group, version = api_version.split("/")
    path = pathlib.Path(crd_dir) / f"{group}_{kind.lower()}s.yaml"
    if not path.exists():
        return None
    for crd in load_all(path):
        if crd.get("kind") != "CustomResourceDefinition" or crd["spec"]["names"]["kind"] != kind:
            continue
        for served in crd["spec"]["versions"]:
            if served["name"] == version:
                return served["schema"]["openAPIV3Schema"]
    return None


def check_crds(crd_dir, rendered_path):
    failed = checked = 0
    for doc in load_all(rendered_path):
        key = (doc.get("apiVersion"), doc.get("kind"))
        if "." not in key[0].split("/")[0]:
            continue  # a built-in kind: kubernetes-validate checks those
        schema = crd_schema(crd_dir, *key)
        if schema is None:
            print(f"{rendered_path}: no CRD for {key} in {crd_dir}", file=sys.stderr)
            failed += 1
            continue
        name = f"{rendered_path}: {key[1]}/{doc['metadata']['name']}"
        failed += report(name, errors_of(schema, doc))
        checked += 1
    if not failed:
        print(f"{rendered_path}: {checked} custom resource(s) valid against their CRDs")
    return failed


def check_chart_copies(rendered_path, expected):
    rules = load_all("deploy/prometheus/outbox-relay-rules.yml")[0]
    dashboard = json.loads(pathlib.Path("deploy/grafana/outbox-relay.json").read_text("utf-8"))
    failed = compared = 0
    for doc in load_all(rendered_path):
        name = f"{rendered_path}: {doc['kind']}/{doc['metadata']['name']}"
        data = doc.get("data") or {}
        if doc["kind"] == "PrometheusRule":
            compared += 1
            if doc["spec"] != rules:
                print(f"{name}: differs from deploy/prometheus/outbox-relay-rules.yml",
                      file=sys.stderr)
                failed += 1
        elif doc["kind"] == "ConfigMap" and "outbox-relay.json" in data:
            compared += 1
            if json.loads(data["outbox-relay.json"]) != dashboard:
                print(f"{name}: differs from deploy/grafana/outbox-relay.json", file=sys.stderr)
                failed += 1
    if compared != int(expected):
        print(f"{rendered_path}: {compared} copies of the rules or the dashboard, expected "
              f"{expected}", file=sys.stderr)
        failed += 1
    if not failed:
        print(f"{rendered_path}: {compared} copies of the rules or the dashboard, all identical")
    return failed


def extract_relay_config(rendered_path, out_path):
    maps = [
        d for d in load_all(rendered_path)
        if d.get("kind") == "ConfigMap" and "relay.toml" in d.get("data", {})
    ]
    if len(maps) != 1:
        print(f"{rendered_path}: expected one ConfigMap with relay.toml, found {len(maps)}",
              file=sys.stderr)
        return 1
    pathlib.Path(out_path).write_text(maps[0]["data"]["relay.toml"], encoding="utf-8")
    return 0


STATE_DIR = "/var/lib/outbox-relay"
SERVER_ID_ENV = "OUTBOX_RELAY_MYSQL__SERVER_ID"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
MAX_SERVER_ID = 2**32 - 1


def expand_env(env, pod_name, ordinal):
    """The container's environment as the kubelet makes it for the pod `pod_name` of ordinal
    `ordinal`: values, the fieldRefs a StatefulSet's pod can resolve, and `$(VAR)` references to
    variables defined earlier (`$$` escapes; an undefined reference stays as written). Variables
    from Secrets and ConfigMaps are "<secret>": the chart never derives anything from them."""
    fields = {
        "metadata.name": pod_name,
        f"metadata.labels['{POD_INDEX_LABEL}']": str(ordinal),
    }
    resolved = {}
    for var in env:
        if "value" in var:
            raw, out, i = var["value"], "", 0
            while i < len(raw):
                if raw.startswith("$$", i):
                    out, i = out + "$", i + 2
                elif raw.startswith("$(", i) and ")" in raw[i:]:
                    end = raw.index(")", i)
                    name = raw[i + 2:end]
                    out += resolved.get(name, raw[i:end + 1])
                    i = end + 1
                else:
                    out, i = out + raw[i], i + 1
            resolved[var["name"]] = out
        elif "fieldRef" in (var.get("valueFrom") or {}):
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            if path not in fields:
                raise ValueError(f"env {var['name']}: fieldRef {path} is not one this check knows")
            resolved[var["name"]] = fields[path]
        else:
            resolved[var["name"]] = "<secret>"
    return resolved


def check_statefulset(rendered_path, storage, out_path):
    docs = load_all(rendered_path)
    failed = 0

    def problem(message):
        nonlocal failed
        print(f"{rendered_path}: {message}", file=sys.stderr)
        failed += 1

    sets = [d for d in docs if d["kind"] == "StatefulSet"]
    for d in docs:
        if d["kind"] in ("Deployment", "ReplicaSet", "DaemonSet"):
            problem(f"{d['kind']}/{d['metadata']['name']}: the relay's pods must be a "
                    "StatefulSet's (each its own ordinal, server_id and volume)")
    if len(sets) != 1:
        problem(f"expected one StatefulSet, found {len(sets)}")
        return failed
    sts = sets[0]
    name, spec = sts["metadata"]["name"], sts["spec"]
    what = f"StatefulSet/{name}"
    headless = [d for d in docs if d["kind"] == "Service"
                and d["metadata"]["name"] == spec.get("serviceName")
                and d["spec"].get("clusterIP") == "None"]
    if not headless:
        problem(f"{what}: serviceName {spec.get('serviceName')!r} is no headless Service of "
                "the chart")
    pod = spec["template"]["spec"]
    (relay,) = [c for c in pod["containers"] if c["name"] == "relay"]

    # Each pod its own server_id.
    replicas = int(spec.get("replicas", 1))
    ids = {}
    for ordinal in range(replicas):
        pod_name = f"{name}-{ordinal}"
        value = expand_env(relay.get("env", []), pod_name, ordinal).get(SERVER_ID_ENV)
        if value is None:
            problem(f"{what}: the relay container sets no {SERVER_ID_ENV}: every pod would use "
                    "the config file's one server_id")
            return failed
        if not value.isdigit() or not 1 <= int(value) <= MAX_SERVER_ID:
            problem(f"{what}: pod {pod_name} gets {SERVER_ID_ENV}={value!r}: not a server_id "
                    f"(1 to {MAX_SERVER_ID})")
            continue
        ids[pod_name] = int(value)
    by_id = {}
    for pod_name, server_id in ids.items():
        by_id.setdefault(server_id, []).append(pod_name)
    for server_id, pods in by_id.items():
        if len(pods) > 1:
            problem(f"{what}: pods {', '.join(pods)} share server_id {server_id}")
        if server_id + 1 in by_id:
            problem(f"{what}: `replay` on {pods[0]} would read the binlog as server_id "
                    f"{server_id + 1}, the id of {by_id[server_id + 1][0]}")

    # The checkpoint directory: on the claim template `state`, or on an emptyDir.
    mounts = [m["name"] for m in relay.get("volumeMounts", []) if m["mountPath"] == STATE_DIR]
    if mounts != ["state"]:
        problem(f"{what}: {STATE_DIR} is mounted from {mounts}, expected the volume 'state'")
    pod_volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = [c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])]
    if storage == "pvc":
        if "state" not in claims or "state" in pod_volumes:
            problem(f"{what}: the checkpoint volume 'state' is not a PersistentVolumeClaim "
                    f"(claim templates {claims}, pod volume {pod_volumes.get('state')}): the "
                    "checkpoint history that `replay --from-time` reads would die with the pod")
    elif storage == "emptydir":
        if "state" in claims or "emptyDir" not in pod_volumes.get("state", {}):
            problem(f"{what}: with persistence.enabled=false the checkpoint volume must be an "
                    f"emptyDir (claim templates {claims}, pod volume {pod_volumes.get('state')})")
    else:
        problem(f"storage must be pvc or emptydir, not {storage!r}")

    if not failed:
        pathlib.Path(out_path).write_text(
            "".join(f"{p} {i}\n" for p, i in ids.items()), encoding="utf-8")
        listed = ", ".join(f"{p}={i}" for p, i in ids.items())
        print(f"{rendered_path}: {what}: {replicas} pods, distinct server_ids ({listed}); "
              f"checkpoint on {'a PersistentVolumeClaim' if storage == 'pvc' else 'an emptyDir'}")
    return failed


def main(argv):
    commands = {
        "compose": check_compose,
        "crds": check_crds,
        "chart-copies": check_chart_copies,
        "relay-config": extract_relay_config,
        "statefulset": check_statefulset,
    }
    if len(argv) < 2 or argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    command = commands[argv[1]]
    if len(argv) - 2 != command.__code__.co_argcount:
        print(__doc__, file=sys.stderr)
        return 2
    return 1 if command(*argv[2:]) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
