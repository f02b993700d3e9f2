#!/usr/bin/env bash
# The fresh-machine check: does a new user's first command work? Builds a throw-away Debian root
# with debootstrap (--variant=minbase, the suite and mirror of this machine's own apt sources),
# copies a clean clone of HEAD into it and runs, as root inside a chroot, exactly what the README's
# Quick start says: `make train ARGS="--set train.max_steps=20"`, then a test target (default
# `test-smoke`; `--full` runs the whole `make test`). Nothing the developer's machine has installed
# can leak in: the root starts as minbase plus the two tools a user needs to get the tree and type
# the command (git's work is done outside, so only `make`).
#
# It prints what each phase installed (Debian packages, the virtualenv's pins) and how long each
# phase took, and exits non-zero when any phase fails. Not part of `make test` (minutes to tens of
# minutes); run it before resolving anything that touches set-up, dependencies or CMake.
#
# Cached between runs, outside the tree (MOECORE_FRESH_CACHE, default /var/cache/moecore-fresh):
# the pristine minbase root as a tarball (rebuilt when the sources change or with --rebuild-base),
# and the downloaded .deb files and pip wheels (download caches only: every package is still
# installed from nothing in every run).
#
# --cuda bind-mounts this machine's CUDA toolkit (/usr/local/cuda, read-only) into the root, as the
# CI machine has one there: the build then compiles and links the CUDA backend (MOECORE_CUDA=AUTO)
# as it does in CI. Without it the root has no toolkit, as a new user's machine usually has not.
#
# Usage: scripts/fresh_machine_check.sh [--full] [--cuda] [--keep] [--rebuild-base] [--target T]
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"

TARGET=test-smoke
CUDA=0
KEEP=0
REBUILD_BASE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --full) TARGET=test ;;
    --cuda) CUDA=1 ;;
    --target) TARGET="$2"; shift ;;
    --keep) KEEP=1 ;;
    --rebuild-base) REBUILD_BASE=1 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "fresh_machine_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

[ "$(id -u)" -eq 0 ] || { echo "fresh_machine_check: needs root (debootstrap, chroot, mount)" >&2; exit 2; }
CACHE="${MOECORE_FRESH_CACHE:-/var/cache/moecore-fresh}"
case "$CACHE" in "$REPO"|"$REPO"/*) echo "fresh_machine_check: the cache must be outside the tree" >&2; exit 2 ;; esac
mkdir -p "$CACHE/apt-archives/partial" "$CACHE/pip"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }
declare -a PHASES=()
record() { PHASES+=("$(printf '%-34s %6s s  %s' "$1" "$2" "$3")"); }

# The suite and mirror of this machine's own apt sources: deb822 (.sources) or one-line format.
apt_source() {
  local f suite="" uri=""
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk '/^URIs:/ { print $2; exit }' "$f")
    suite=$(awk '/^Suites:/ { print $2; exit }' "$f")
    [ -n "$uri" ] && [ -n "$suite" ] && { echo "$suite $uri"; return; }
  done
  if [ -f /etc/apt/sources.list ]; then
    awk '$1 == "deb" && $2 !~ /^\[/ { print $3, $2; exit } $1 == "deb" && $2 ~ /^\[/ { print $4, $3; exit }' \
      /etc/apt/sources.list
  fi
}
read -r SUITE MIRROR < <(apt_source) || true
[ -n "${SUITE:-}" ] && [ -n "${MIRROR:-}" ] ||
  { echo "fresh_machine_check: cannot read the suite and mirror from /etc/apt/sources*" >&2; exit 2; }
echo "fresh_machine_check: Debian $SUITE from $MIRROR, clean clone of $(git rev-parse --short HEAD), target $TARGET"

command -v debootstrap > /dev/null || {
  echo "fresh_machine_check: installing debootstrap (host tool)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap > /dev/null
}

# 1. The pristine base root, cached as a tarball keyed by suite and mirror.
BASE="$CACHE/base-$SUITE-minbase-$(echo "$MIRROR" | md5sum | cut -c1-8).tar"
if [ "$REBUILD_BASE" -eq 1 ] || [ ! -f "$BASE" ]; then
  t0=$(now)
  staging=$(mktemp -d "$CACHE/debootstrap.XXXXXX")
  echo "fresh_machine_check: debootstrap --variant=minbase $SUITE (cached afterwards as $BASE)"
  debootstrap --variant=minbase "$SUITE" "$staging" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 ||
    { echo "fresh_machine_check: debootstrap failed, see $CACHE/debootstrap.log" >&2; rm -rf "$staging"; exit 1; }
  tar -C "$staging" -cf "$BASE.tmp" . && mv "$BASE.tmp" "$BASE"
  rm -rf "$staging"
  record "debootstrap (cached next time)" "$(elapsed "$t0" "$(now)")" "$BASE"
fi

# 2. A throw-away root from the tarball, with this machine's apt sources and the download caches.
ROOT=$(mktemp -d /var/tmp/moecore-fresh-root.XXXXXX)
MOUNTS=()
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTS[$i]}" 2> /dev/null || true; done
  # And what the tests mounted inside the root themselves (`ip netns` bind-mounts /run/netns),
  # deepest first, or rm -rf --one-file-system stops at them and the check fails after passing.
  awk -v root="$ROOT/" 'index($2, root) == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r mnt; do umount -l "$mnt" 2> /dev/null || true; done
  if [ "$KEEP" -eq 1 ]; then echo "fresh_machine_check: root kept at $ROOT"; else rm -rf --one-file-system "$ROOT"; fi
}
trap cleanup EXIT
bind() { mkdir -p "$2"; mount --bind "$1" "$2"; MOUNTS+=("$2"); }

t0=$(now)
tar -C "$ROOT" -xf "$BASE"
# The machine's network settings, which are not dependencies: name resolution, the CA bundle (a
# workplace's egress proxy may sign with its own CA, which only the host's bundle holds; minbase has
# no ca-certificates, and pip verifies against the file pip.conf names) and pip's own configuration.
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$ROOT/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/"
fi
# Local CAs also go where Debian keeps them: installing ca-certificates (a dependency pulled in by
# the set-up) regenerates the bundle from /usr/share and /usr/local/share/ca-certificates.
if compgen -G "/usr/local/share/ca-certificates/*" > /dev/null; then
  mkdir -p "$ROOT/usr/local/share/ca-certificates"
  cp -r /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/"
fi
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$ROOT/etc/pip.conf"
rm -f "$ROOT/etc/apt/sources.list"
mkdir -p "$ROOT/etc/apt/sources.list.d"
cp /etc/apt/sources.list.d/*.sources "$ROOT/etc/apt/sources.list.d/" 2> /dev/null || true
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$ROOT/etc/apt/sources.list"
# Keep downloaded .debs in the bind-mounted cache (minbase's docker-clean hook may not exist; be explicit).
echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' > "$ROOT/etc/apt/apt.conf.d/10keep-downloads"
mount -t proc proc "$ROOT/proc"; MOUNTS+=("$ROOT/proc")
bind /dev "$ROOT/dev"
bind /dev/pts "$ROOT/dev/pts"
mount -t sysfs sysfs "$ROOT/sys"; MOUNTS+=("$ROOT/sys")
mount -t tmpfs tmpfs "$ROOT/dev/shm" 2> /dev/null && MOUNTS+=("$ROOT/dev/shm") || true
bind "$CACHE/apt-archives" "$ROOT/var/cache/apt/archives"
bind "$CACHE/pip" "$ROOT/root/.cache/pip"
if [ "$CUDA" -eq 1 ]; then
  [ -x /usr/local/cuda/bin/nvcc ] || { echo "fresh_machine_check: --cuda, but no /usr/local/cuda/bin/nvcc here" >&2; exit 2; }
  bind "$(readlink -f /usr/local/cuda)" "$ROOT/usr/local/cuda"
  mount -o remount,bind,ro "$ROOT/usr/local/cuda"
fi
git clone -q --no-local "$REPO" "$ROOT/root/moecore"
git -C "$ROOT/root/moecore" checkout -q "$(git rev-parse HEAD)"
rm -rf "$ROOT/root/moecore/.git"   # a user's tree, not the developer's: nothing but what is committed
record "fresh root + clean clone" "$(elapsed "$t0" "$(now)")" "$ROOT"

in_root() { chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 TERM=dumb ${PROXY_ENV[@]+"${PROXY_ENV[@]}"} bash -c "$1"; }
# Proxy settings pass through (network, not dependencies); nothing else of the caller's environment.
PROXY_ENV=()
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY PIP_INDEX_URL PIP_CERT; do
  [ -n "${!v:-}" ] && PROXY_ENV+=("$v=${!v}")
done
LOG="$CACHE/last-run.log"
: > "$LOG"
dpkg_list() { in_root "dpkg-query -W -f='\${Package}\n' | sort"; }

# 3. The user's prerequisite: make (git already ran outside; everything else is the commands' own job).
t0=$(now)
dpkg_list > "$CACHE/packages.minbase"
in_root "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make" >> "$LOG" 2>&1 ||
  { echo "fresh_machine_check: could not install make in the fresh root (see $LOG)" >&2; exit 1; }
dpkg_list > "$CACHE/packages.prereq"
record "prerequisite: make" "$(elapsed "$t0" "$(now)")" ""

# 4. `make train` exactly as the README says, each output line stamped with its time, so the
#    phases (Debian packages, build, corpus, training) can be read off the log afterwards.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }
run_phase() {  # name, command inside the root
  local name="$1" cmd="$2" t rc
  echo "fresh_machine_check: $name: $cmd"
  t=$(now)
  set +e
  in_root "cd /root/moecore && $cmd" 2>&1 | stamp | tee -a "$LOG" > "$CACHE/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  PHASE_START=$t
  PHASE_END=$(now)
  if [ "$rc" -ne 0 ]; then
    echo "fresh_machine_check: FAILED: '$cmd' exited $rc in the fresh root; its last lines:" >&2
    tail -n 25 "$CACHE/$name.log" | cut -d' ' -f2- >&2
    exit 1
  fi
}
# The time of the first log line matching a pattern (or the fallback).
first_at() { awk -v p="$2" -v d="$3" '$0 ~ p { print $1; found = 1; exit } END { if (!found) print d }' "$1"; }

run_phase train 'make train ARGS="--set train.max_steps=20"'
T=$CACHE/train.log
t_build=$(first_at "$T" '(-- |\[[0-9]+/[0-9]+\] )' "$PHASE_START")
t_corpus=$(first_at "$T" 'moecore tokenizer train' "$PHASE_END")
t_train=$(first_at "$T" 'build/bin/moecore train ' "$PHASE_END")
record "make train: Debian packages" "$(elapsed "$PHASE_START" "$t_build")" ""
record "make train: build (release CLI)" "$(elapsed "$t_build" "$t_corpus")" ""
record "make train: corpus + tokenizer" "$(elapsed "$t_corpus" "$t_train")" ""
record "make train: 20 training steps" "$(elapsed "$t_train" "$PHASE_END")" ""
grep -q 'val_loss' "$T" || { echo "fresh_machine_check: make train printed no validation loss" >&2; exit 1; }
dpkg_list > "$CACHE/packages.train"

run_phase test "make $TARGET"
T=$CACHE/test.log
t_venv=$(first_at "$T" 'setup: creating the reference virtualenv' "$PHASE_START")
t_venv_end=$(awk -v s="$t_venv" '$1 > s && $0 !~ /setup:/ { print $1; exit }' "$T")
record "make $TARGET (all)" "$(elapsed "$PHASE_START" "$PHASE_END")" ""
[ -n "$t_venv_end" ] && record "  of which the virtualenv" "$(elapsed "$t_venv" "$t_venv_end")" ""
grep -Eq '([0-9]+ passed|tests passed)' "$T" || { echo "fresh_machine_check: make $TARGET reported no passing tests" >&2; exit 1; }

echo
echo "== Debian packages installed by 'make train' (beyond minbase + make):"
comm -13 "$CACHE/packages.prereq" "$CACHE/packages.train" | tr '\n' ' ' | fold -s -w 100; echo
echo "   ($(comm -13 "$CACHE/packages.prereq" "$CACHE/packages.train" | wc -l) packages; requested: $(grep -oP 'installing Debian packages: \K.*' "$CACHE/train.log" | head -1))"
echo "== Debian packages installed by 'make $TARGET' beyond those: $(comm -13 "$CACHE/packages.train" <(dpkg_list) | tr '\n' ' ')"
echo "== Python virtualenv (/opt/moecore/venv):"
in_root "/opt/moecore/venv/bin/pip freeze 2> /dev/null" | tr '\n' ' ' | fold -s -w 100; echo
echo "== Results: $(grep -E '[0-9]+ passed|tests passed' "$CACHE/test.log" | cut -d' ' -f2- | tr '\n' ';')"
echo "== Time per phase ($(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')):"
printf '   %s\n' "${PHASES[@]}"
echo "fresh_machine_check: PASSED (logs in $CACHE/{train,test}.log)"
