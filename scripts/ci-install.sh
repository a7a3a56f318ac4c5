#!/usr/bin/env bash
# Install checks (docs/operations.md, "Install"): `cargo install --path
# server` works and its binary names its commit; the .deb built by cargo-deb
# installs the binary, the systemd unit (which `systemd-analyze verify`
# accepts), /etc/ringkv/ringkv.toml, the `ringkv` user and /var/lib/ringkv;
# the installed server starts as that user on the installed config, and
# `ringkv-server verify` finds its data directory clean.
#
# Needs root (dpkg -i, useradd). Leaves the machine as it found it: the
# package is purged at the end, and the user and data directory are removed
# if this script created them.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

CARGO_DEB_VERSION=3.8.0   # builds on the stable toolchain
step() { printf '\n--- %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }
fail() { echo "ci-install: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || fail "run as root (dpkg -i and useradd)"
apt_ready=0
need() { # need COMMAND PACKAGE
  command -v "$1" >/dev/null 2>&1 && return 0
  if [[ $apt_ready -eq 0 ]]; then apt-get update -qq; apt_ready=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
need systemd-analyze systemd
need dpkg-deb dpkg
need readelf binutils   # cargo-deb strips with it too

work=$(mktemp -d)
had_user=0; getent passwd ringkv >/dev/null && had_user=1
had_dir=0; [[ -e /var/lib/ringkv ]] && had_dir=1
server_pid=""
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null || true
  dpkg --purge ringkv >/dev/null 2>&1 || true
  [[ $had_dir -eq 0 ]] && rm -rf /var/lib/ringkv
  if [[ $had_user -eq 0 ]] && getent passwd ringkv >/dev/null; then
    userdel ringkv >/dev/null 2>&1 || true
    getent group ringkv >/dev/null && groupdel ringkv >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

step "cargo install --path server"
# The same target directory as cargo deb below, so the release build is shared.
cargo install --locked --path server --root "$work/root" --bin ringkv-server \
  --target-dir "${CARGO_TARGET_DIR:-target}"
version=$("$work/root/bin/ringkv-server" --version)
echo "$version"
[[ $version == *"(commit $commit)"* ]] || fail "--version says '$version', expected commit $commit"

step "cargo-deb $CARGO_DEB_VERSION"
if ! cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
  cargo install cargo-deb --locked --version "$CARGO_DEB_VERSION"
fi

step "build the .deb (the client first: the package ships it too)"
cargo build --release --locked -p ringkv-client --target-dir "${CARGO_TARGET_DIR:-target}"
cargo deb -p ringkv-server --dbgsym --output "$work/deb/"
deb=$(ls "$work"/deb/ringkv_*.deb)
ls "$work"/deb/ringkv-dbgsym_*.ddeb >/dev/null || fail "no -dbgsym package beside the .deb"
dpkg-deb --info "$deb"
dpkg-deb --contents "$deb"

step "dpkg -i"
dpkg -i "$deb"
for f in /usr/bin/ringkv-server /usr/bin/ringkv /lib/systemd/system/ringkv.service \
         /etc/ringkv/ringkv.toml /usr/share/doc/ringkv/operations.md \
         /usr/share/doc/ringkv/security.md /usr/share/doc/ringkv/LICENSE \
         /usr/share/doc/ringkv/ringkv.toml; do
  [[ -f $f ]] || fail "$f is missing after dpkg -i"
done
# Shipped stripped: the line tables went to the -dbgsym package.
for b in /usr/bin/ringkv-server /usr/bin/ringkv; do
  if readelf -S "$b" | grep -q '\.debug_line'; then fail "$b ships with debug sections"; fi
done
ls -l /usr/bin/ringkv-server /usr/bin/ringkv
ringkv --version
getent passwd ringkv >/dev/null || fail "no ringkv user after dpkg -i"
[[ $(stat -c %U:%G /var/lib/ringkv) == ringkv:ringkv ]] || fail "/var/lib/ringkv is not owned by ringkv"
[[ $(stat -c %G /etc/ringkv/ringkv.toml) == ringkv ]] || fail "/etc/ringkv/ringkv.toml is not readable by the ringkv group"
installed=$(ringkv-server --version)
echo "$installed"
[[ $installed == *"(commit $commit)"* ]] || fail "installed --version says '$installed'"
ringkv-server --check-config /etc/ringkv/ringkv.toml

step "systemd-analyze verify the unit"
systemd-analyze verify /lib/systemd/system/ringkv.service
grep -q '^Type=notify$' /lib/systemd/system/ringkv.service || fail "the unit is not Type=notify"

step "the installed server runs as ringkv on the installed config; verify finds its data clean"
# A free port instead of the config's 7379; the rest as the unit runs it.
setpriv --reuid=ringkv --regid=ringkv --init-groups --no-new-privs \
  ringkv-server --config /etc/ringkv/ringkv.toml --listen 127.0.0.1:0 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 1 300); do
  grep -q "ringkv-server ready" "$work/server.log" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log"; fail "the server exited"; }
  sleep 0.1
done
grep -q "ringkv-server ready" "$work/server.log" || { cat "$work/server.log"; fail "the server never became ready"; }
# The installed client reaches the installed server (docs/operations.md's
# backup procedure uses it).
addr=$(grep -o 'ringkv-server ready addr=[0-9.:]*' "$work/server.log" | head -1 | cut -d= -f2)
[[ $(ringkv --server "$addr" put pkg-check 1) == OK ]] || fail "the installed client could not put"
[[ $(ringkv --server "$addr" get pkg-check) == 1 ]] || fail "the installed client could not get"
kill -TERM "$server_pid"
wait "$server_pid" || { cat "$work/server.log"; fail "the server did not stop cleanly"; }
server_pid=""
[[ -f /var/lib/ringkv/MANIFEST ]] || fail "no MANIFEST in /var/lib/ringkv"
setpriv --reuid=ringkv --regid=ringkv --init-groups \
  ringkv-server verify --config /etc/ringkv/ringkv.toml --data-dir /var/lib/ringkv

echo
echo "ci-install: passed"
