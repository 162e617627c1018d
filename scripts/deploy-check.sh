#!/usr/bin/env bash
# Checks the deployment files in deploy/: the Prometheus alert rules (`promtool check rules`),
# their unit tests (`promtool test rules`), and that the Grafana dashboard is valid JSON.
# Exits non-zero on the first failure.
#
# promtool comes from Debian's `prometheus` package: the .deb is downloaded with
# `apt-get download` and only usr/bin/promtool is extracted (the daemon is not installed) into
# $OUTBOX_DEVENV_CACHE/promtool (default ~/.cache/outbox-relay/promtool). Cached: a second run
# downloads nothing. PROMTOOL=/path/to/promtool uses another one.
#
# That the dashboard and the rules name only metrics the relay exports is checked by
# `cargo test --test dashboard` (tests/dashboard.rs), not here.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[deploy-check] %s\n' "$*" >&2; }

RULES=deploy/prometheus/outbox-relay-rules.yml
RULE_TESTS=deploy/prometheus/outbox-relay-rules.test.yml
DASHBOARD=deploy/grafana/outbox-relay.json
CACHE="${OUTBOX_DEVENV_CACHE:-$HOME/.cache/outbox-relay}/promtool"

# Puts a working promtool at $CACHE/promtool unless one is there; prints the path.
install_promtool() {
  local bin="$CACHE/promtool"
  if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
    say "promtool: cached at $bin"
    echo "$bin"
    return
  fi
  command -v apt-get >/dev/null || { say "no apt-get: set PROMTOOL=/path/to/promtool"; exit 1; }
  local work
  work="$(mktemp -d "${TMPDIR:-/tmp}/promtool.XXXXXX")"
  say "promtool: downloading Debian's prometheus package (only promtool is kept) into $CACHE"
  # The package lists may be missing or old on a fresh machine.
  if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
    say "apt-get download failed: refreshing the package lists (apt-get update) and retrying"
    apt-get update -qq >/dev/null
    (cd "$work" && apt-get download prometheus >/dev/null)
  fi
  dpkg-deb -x "$work"/prometheus_*.deb "$work/x"
  mkdir -p "$CACHE"
  install -m 0755 "$work/x/usr/bin/promtool" "$bin.tmp"
  mv "$bin.tmp" "$bin"
  rm -rf "$work"
  say "promtool: installed $("$bin" --version 2>&1 | head -n1)"
  echo "$bin"
}

if [ -z "${PROMTOOL:-}" ]; then
  PROMTOOL="$(install_promtool)"
fi

say "promtool check rules $RULES"
"$PROMTOOL" check rules "$RULES"

say "promtool test rules $RULE_TESTS"
"$PROMTOOL" test rules "$RULE_TESTS"

say "dashboard is valid JSON: $DASHBOARD"
python3 -m json.tool "$DASHBOARD" >/dev/null

say "all deployment checks passed"
