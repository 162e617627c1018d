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


def main(argv):
    commands = {
        "compose": check_compose,
        "crds": check_crds,
        "chart-copies": check_chart_copies,
        "relay-config": extract_relay_config,
    }
    if len(argv) != 4 or argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    return 1 if commands[argv[1]](argv[2], argv[3]) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
