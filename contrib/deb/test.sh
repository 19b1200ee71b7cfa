#!/usr/bin/env bash
# Builds the Debian package (build.sh), installs it on this machine with dpkg -i, and checks
# it: `weir --version`, `weir check` on the installed /etc/weir/weir.toml, the man page,
# the completions and the unit where they belong, `systemd-analyze verify` on the unit
# (when systemd-analyze is there), and lintian with no error. Run as root on a Debian or
# Ubuntu machine you may install packages on; it removes the package again at the end
# (KEEP=1 keeps it). Not part of .ci/run: the release build (fat LTO) takes minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."

deb=$(contrib/deb/build.sh)
echo "package: $deb"
command -v lintian >/dev/null || apt-get install -y -qq lintian >/dev/null

fail() { echo "FAIL: $*" >&2; exit 1; }

dpkg -i "$deb"
[ "${KEEP:-0}" = 1 ] || trap 'dpkg --purge weir >/dev/null' EXIT

version=$(weir --version)
[ "$version" = "weir $(dpkg-deb -f "$deb" Version | cut -d- -f1)" ] || fail "weir --version said: $version"
weir check -c /etc/weir/weir.toml || fail "weir check of the installed config"
getent passwd weir >/dev/null || fail "no weir user"
[ "$(stat -c %G /etc/weir)" = weir ] || fail "/etc/weir is not the weir group's"
[ "$(stat -c '%a %U %G %s' /etc/weir/admin.token)" = "640 root weir 64" ] \
    || fail "/etc/weir/admin.token: $(stat -c '%a %U %G %s' /etc/weir/admin.token)"
for f in /usr/share/man/man1/weir.1.gz /usr/share/bash-completion/completions/weir \
         /usr/share/zsh/vendor-completions/_weir /usr/share/fish/vendor_completions.d/weir.fish \
         /usr/share/weir/weir.schema.json /etc/logrotate.d/weir /lib/systemd/system/weir.service; do
    [ -s "$f" ] || fail "$f is missing or empty"
done
zcat /usr/share/man/man1/weir.1.gz | grep -q '^\.SH COMMANDS' || fail "man page without its commands"
if command -v systemd-analyze >/dev/null; then
    # Only the unit's own problems: a missing man-db is not one.
    out=$(systemd-analyze verify /lib/systemd/system/weir.service 2>&1 | grep -v "man weir(1)" || true)
    [ -z "$out" ] || fail "systemd-analyze verify: $out"
fi
if command -v logrotate >/dev/null; then
    logrotate --debug /etc/logrotate.d/weir >/dev/null 2>&1 || fail "logrotate rejects /etc/logrotate.d/weir"
fi

# lintian: errors fail the test; warnings and notes are printed.
lintian --no-tag-display-limit "$deb" | tee /tmp/weir-lintian.txt || true
if grep -q '^E:' /tmp/weir-lintian.txt; then
    fail "lintian reported errors"
fi
echo "OK: $deb installs, runs and passes lintian without errors"
