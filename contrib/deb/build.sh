#!/usr/bin/env bash
# Builds the Debian package: the release binary, then the files generated from it (man
# page, shell completions, the config's JSON Schema), then `cargo deb --no-build`.
# Needs cargo-deb (`cargo install cargo-deb`) and protoc (Debian protobuf-compiler, for the
# etcd client's generated gRPC code). Prints the path of the .deb.
set -euo pipefail
cd "$(dirname "$0")/../.."

command -v cargo-deb >/dev/null || { echo "cargo-deb is missing: cargo install cargo-deb" >&2; exit 1; }
cargo build --release --locked -p weir >&2
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
weir="$target/release/weir"
assets="$target/release/deb-assets"
mkdir -p "$assets"
"$weir" man | gzip -9n >"$assets/weir.1.gz"
"$weir" completions bash >"$assets/weir.bash"
"$weir" completions zsh >"$assets/_weir"
"$weir" completions fish >"$assets/weir.fish"
"$weir" schema >"$assets/weir.schema.json"
# --strip: the release profile keeps line tables (debug = 1), which cargo-deb would ship.
cargo deb -p weir --no-build --strip --locked >&2
ls -t "$target"/debian/weir_*.deb | head -n 1
