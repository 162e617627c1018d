#!/usr/bin/env bash
# Keeps the quickstart's first build from creeping back (.ci/run runs this; seconds, no build):
# the crates (name and version) `cargo build -p outbox-dev` compiles (normal and build dependencies) stay within
# a budget, and no new crate that compiles C (a `-sys` crate, `ring`) joins the ones below.
# The quickstart built these 380 crates from nothing in 3 min 19 s on 2 cores
# (docs/getting-started.md). Raise the budget only with a measurement of the quickstart.
set -euo pipefail
cd "$(dirname "$0")/.."

CRATE_BUDGET=390
# What compiles C today: aws-lc-sys (rustls' default provider, through reqwest in the RocketMQ
# client's transport), zstd-sys and libz-sys (the client's compression), libmimalloc-sys (the
# relay's allocator), ring (rustls' provider the relay chooses).
KNOWN_C="aws-lc-sys libmimalloc-sys libz-sys linux-raw-sys ring zstd-sys"

crates=$(cargo tree --locked -p outbox-dev -e normal,build --prefix none -f '{p}' |
  sed 's/ (\*)$//; s/ (proc-macro)$//' | awk '{print $1, $2}' | sort -u)
count=$(printf '%s\n' "$crates" | wc -l)
c_crates=$(printf '%s\n' "$crates" | awk '{print $1}' | grep -E -- '-sys$|^ring$' | sort -u | tr '\n' ' ' |
  sed 's/ $//')

status=0
echo "quickstart build: $count crates (budget $CRATE_BUDGET); compiling C: $c_crates"
if [ "$count" -gt "$CRATE_BUDGET" ]; then
  echo "error: outbox-dev now builds $count crates, over the budget of $CRATE_BUDGET: a new dependency (or feature) lengthens a newcomer's first build; trim it, or measure scripts/quickstart.sh from nothing and raise CRATE_BUDGET with the figure in docs/getting-started.md" >&2
  status=1
fi
for crate in $c_crates; do
  case " $KNOWN_C " in
    *" $crate "*) ;;
    *)
      echo "error: $crate joins the quickstart's build and compiles C (slow on 2 cores): find which dependency brings it (cargo tree -p outbox-dev -i $crate) and avoid it, or list it in KNOWN_C with a measurement" >&2
      status=1
      ;;
  esac
done
exit $status
