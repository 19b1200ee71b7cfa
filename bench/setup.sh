#!/usr/bin/env bash
# Installs the benchmark peers and load tools from Debian/Ubuntu packages:
#   nginx-light (or nginx), haproxy, caddy, apache2, apache2-utils (ab), wrk, nghttp2-client
#   (h2load), varnish (cache-cost).
# Idempotent: packages already installed are left alone, and apt-get update runs only when
# something is missing. A package the distribution does not have is skipped with a note;
# the script never fails because of one missing peer (weir-bench skips that peer too).
# Then: cargo run -p weir-bench --release -- proxy-1core --quick
set -u

if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
else
  echo "setup.sh: not root and no sudo: cannot install packages" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup.sh: no apt-get: install nginx, haproxy, caddy, apache2, ab and wrk by hand" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive

summary() {
  for tool in nginx haproxy caddy apache2 ab wrk taskset h2load varnishd; do
    if command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ]; then
      echo "setup.sh: ok      $tool"
    else
      echo "setup.sh: missing $tool (weir-bench skips what needs it)"
    fi
  done
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
available() { [ -n "$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}' | grep -v '(none)')" ]; }

# Each entry: alternatives, first available wins ("nginx-light|nginx").
wanted=("nginx-light|nginx" haproxy caddy apache2 apache2-utils wrk nghttp2-client varnish)

missing=()
for alts in "${wanted[@]}"; do
  have=""
  for p in ${alts//|/ }; do installed "$p" && have="$p" && break; done
  [ -z "$have" ] && missing+=("$alts")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all peers and tools already installed"
  summary
  exit 0
fi

echo "setup.sh: apt-get update"
"${SUDO[@]}" apt-get update -qq || echo "setup.sh: note: apt-get update failed; using the existing package lists"

to_install=()
for alts in "${missing[@]}"; do
  pick=""
  for p in ${alts//|/ }; do available "$p" && pick="$p" && break; done
  if [ -n "$pick" ]; then
    to_install+=("$pick")
  else
    echo "setup.sh: note: no package for ${alts//|/ or } here: skipped (weir-bench will skip it)"
  fi
done

if [ ${#to_install[@]} -gt 0 ]; then
  echo "setup.sh: installing ${to_install[*]}"
  if ! "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${to_install[@]}" >/dev/null; then
    # One bad package must not take the others down: retry one by one.
    for p in "${to_install[@]}"; do
      "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "$p" >/dev/null \
        || echo "setup.sh: note: installing $p failed: skipped"
    done
  fi
fi

# The benchmark starts its own instances on loopback ports; a packaged service that the
# install may have started on port 80 is not used and stays idle.
summary
exit 0
