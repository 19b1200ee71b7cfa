#!/usr/bin/env bash
# Instruction budgets: user-space instructions per request of five workloads (HTTP/1.1
# keep-alive proxied to a 615-byte backend, HTTP/1.1 answered by Weir, an h2c stream proxied,
# a keep-alive TLS request proxied, a new TLS connection per request), counted under
# `valgrind --tool=callgrind` and checked against bench/instruction-budgets.toml. Exits
# non-zero when a workload costs more than 2 % over its budget, after printing the functions
# that grew. CI runs it (.ci/run); docs/benchmarks.md ("Instruction budgets") says how it
# counts and how to lower a budget.
#
# Usage: bench/instructions.sh [BUDGET_FILE] [-- weir-bench instructions options]
#   e.g. bench/instructions.sh bench/instruction-budgets.toml -- --update
#        bench/instructions.sh bench/instruction-budgets.toml -- --only http1-proxy
# Needs valgrind (Debian package `valgrind`); installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

BUDGETS=bench/instruction-budgets.toml
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  BUDGETS=$1
  shift
fi
[ "${1:-}" = "--" ] && shift

for tool in valgrind callgrind_annotate; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "instructions.sh: $tool not found: install the Debian package valgrind" >&2
    exit 2
  fi
done

# The budgets are counted on this profile (Cargo.toml: release code generation without fat
# LTO, so that CI builds it in minutes); counts of another build are not comparable.
cargo build --quiet --profile instructions -p weir -p weir-bench
TARGET=${CARGO_TARGET_DIR:-target}/instructions
exec "$TARGET/weir-bench" instructions --weir "$TARGET/weir" --budgets "$BUDGETS" "$@"
