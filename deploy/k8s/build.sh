#!/usr/bin/env bash
# Build the Kubernetes binaries NVKE's hosted control planes run -- kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl per supported minor, one etcd, and KWOK
# (the kubelet simulator that keeps simulated hosts' Nodes alive) -- from
# the Go module proxy, unmodified, into a cache folder outside the repo. One builder and one Go
# build cache for every Kubernetes binary NVKE uses (deploy/capi-testbed/build.sh calls this too).
#
# Usage: deploy/k8s/build.sh [TARGET...]      TARGET = etcd (etcd, etcdctl) | kwok | v1.36 | v1.37 (default: all)
#          builds what is missing, prints one line per target: "<target> <folder>" on stdout
#        deploy/k8s/build.sh --dir TARGET     prints the target's folder, builds nothing
#        deploy/k8s/build.sh --list           prints the targets, one a line
# A target's folder is ~/.cache/nvke/k8s/<target>-<hash>/bin/; the hash covers the target's
# go.mod, go.sum and this script's recipe version, so a pin change builds a new set. The kwok
# target's folder also holds stages.yaml: KWOK's Stages, copied from its module's stage files.
# Progress: one line per binary on stderr ("building X (2/9): 3m10s elapsed, ~4m left") every
# 20 s, and the same line in ~/.cache/nvke/k8s/progress (read by NVKE's control-plane manager to
# tell a waiting cluster what it waits for). Per-binary durations go to build-times.tsv and are
# the next build's estimate.
# Env: NVKE_K8S_BIN_ROOT overrides ~/.cache/nvke/k8s; GOFLAGS passes through to go build.
#        deploy/k8s/build.sh --module DIR --out BIN name=package...
#          the same builder for another module of pins (deploy/capi-testbed/build.sh): builds
#          each missing name from package into BIN; a package under k8s.io/kubernetes gets
#          the version stamp
# Exit: 0 built (or nothing to do), 2 bad usage, 3 no Go toolchain, other = go build's status.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="${NVKE_K8S_BIN_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/nvke/k8s}"
recipe=1 # bump when the way binaries are built (ldflags, flags) changes
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

targets_all() { (cd "$here" && ls -d v1.* etcd kwok 2>/dev/null | sort -V); }

target_dir() { # target -> folder
  local t="$1" h
  [[ -f "$here/$t/go.mod" ]] || { echo "k8s-bins: unknown target '$t' (one of: $(targets_all | xargs))" >&2; exit 2; }
  h="$( (cat "$here/$t/go.mod" "$here/$t/go.sum"; echo "recipe=$recipe") | sha256sum | cut -c1-12)"
  echo "$root/$t-$h"
}

target_bins() { # target -> "name package" lines, in build order
  if [[ $1 == etcd ]]; then printf '%s\n' "etcd go.etcd.io/etcd/server/v3" "etcdctl go.etcd.io/etcd/etcdctl/v3"; return; fi
  if [[ $1 == kwok ]]; then echo "kwok sigs.k8s.io/kwok/cmd/kwok"; return; fi
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    echo "$c k8s.io/kubernetes/cmd/$c"
  done
}

# KWOK's Stages (node-initialize, node-heartbeat-with-lease, pod-ready/complete/delete), taken
# unmodified from the stage files of the module the binary was built from: <folder>/stages.yaml
kwok_stages=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)
target_files() { # target folder -> write the target's files besides binaries when missing
  [[ $1 == kwok && ! -s $2/stages.yaml ]] || return 0
  local src f
  src="$(cd "$here/kwok" && GOFLAGS=-mod=mod go mod download -json sigs.k8s.io/kwok | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  mkdir -p "$2"
  for f in "${kwok_stages[@]}"; do echo "---"; cat "$src/kustomize/stage/$f"; done >"$2/stages.yaml.tmp"
  mv "$2/stages.yaml.tmp" "$2/stages.yaml"
}

module_dir="" out_dir="" extra=()
if [[ ${1:-} == --module ]]; then
  [[ $# -ge 5 && ${3:-} == --out ]] || { echo "usage: $0 --module DIR --out BIN name=package..." >&2; exit 2; }
  module_dir="$(cd "$2" && pwd)"; out_dir="$4"; shift 4; extra=("$@")
fi
case "${1:-}" in
  --dir) [[ $# == 2 ]] || { echo "usage: $0 --dir TARGET" >&2; exit 2; }; target_dir "$2"; exit 0 ;;
  --list) targets_all; exit 0 ;;
  -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
esac
targets=("$@"); [[ ${#targets[@]} == 0 && -z $module_dir ]] && mapfile -t targets < <(targets_all)
[[ -n $module_dir ]] && targets=()

fmt() { local s=$1; if ((s >= 60)); then echo "$((s / 60))m$((s % 60))s"; else echo "${s}s"; fi; }

# Estimate for a binary: its last recorded build time on this machine, else a cold default
# measured on a 2-core machine.
estimate() { # name -> seconds
  local t
  t="$(awk -F'\t' -v n="$1" '$1==n {t=$3} END {print t}' "$root/build-times.tsv" 2>/dev/null || true)"
  if [[ -n $t ]]; then echo "$t"; return; fi
  case "$1" in
    etcd) echo 240 ;; etcdctl) echo 60 ;; kube-apiserver) echo 900 ;; kube-controller-manager) echo 420 ;;
    kube-scheduler) echo 120 ;; kubectl) echo 240 ;; kwok) echo 180 ;; *) echo 300 ;;
  esac
}

todo=() # "module-dir out-dir name package" of each missing binary
for t in "${targets[@]}"; do
  d="$(target_dir "$t")"
  while read -r name pkg; do [[ -x "$d/bin/$name" ]] || todo+=("$here/$t $d/bin $name $pkg"); done < <(target_bins "$t")
done
for e in "${extra[@]}"; do [[ -x "$out_dir/${e%%=*}" ]] || todo+=("$module_dir $out_dir ${e%%=*} ${e#*=}"); done
if [[ ${#todo[@]} == 0 ]]; then
  for t in "${targets[@]}"; do target_files "$t" "$(target_dir "$t")"; echo "$t $(target_dir "$t")"; done
  exit 0
fi
command -v go >/dev/null || { echo "k8s-bins: the Go toolchain is not installed (https://go.dev/dl/)" >&2; exit 3; }
mkdir -p "$root"
exec 9>"$root/.lock"
flock 9 # one build at a time on this machine: a second caller waits, then finds the binaries built
export GOFLAGS="${GOFLAGS:-} -trimpath -mod=mod -buildvcs=false"
# the Go build cache's state when this build started (recorded with each time): cold = empty
# (under 100 MB: Go creates its folder layout before it holds anything worth the name)
cache_state=warm; (( $(du -sm "$(go env GOCACHE)" 2>/dev/null | cut -f1 || echo 0) >= 100 )) || cache_state=cold
start=$(date +%s); n=0; total=${#todo[@]}
for item in "${todo[@]}"; do
  read -r mod bin name pkg <<<"$item"; n=$((n + 1))
  mkdir -p "$bin"
  [[ -x "$bin/$name" ]] && continue # built by another caller while this one waited on the lock
  ldflags='-s -w'
  if [[ $pkg == k8s.io/kubernetes/* ]]; then
    # what Kubernetes' own build stamps (hack/lib/version.sh): `kubectl version` and clients
    # read these (Cluster API refuses a server without them); unstamped is v0.0.0-master
    k8s="$(cd "$mod" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
    minor="${k8s#v1.}"; minor="${minor%%.*}"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $p.gitVersion=$k8s -X $p.gitMajor=1 -X $p.gitMinor=$minor"
      ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
    done
  else
    k8s="$(cd "$mod" && go list -m -f '{{.Path}} {{.Version}}' all 2>/dev/null | awk -v p="$pkg" 'index(p, $1) == 1 && length($1) > length(best) {best = $1; v = $2} END {print v}')"
  fi
  est="$(estimate "$name")"; b0=$(date +%s)
  line() { echo "building $name $k8s ($n/$total): $(fmt $(($(date +%s) - b0))) elapsed, ~$(fmt $((est > $(date +%s) - b0 ? est - ($(date +%s) - b0) : 0))) left; all: $(fmt $(($(date +%s) - start)))"; }
  echo "k8s-bins: $(line)" >&2; line >"$root/progress"
  (cd "$mod" && nice -n 10 go build -ldflags="$ldflags" -o "$bin/$name.tmp" "$pkg") &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && { echo "k8s-bins: $(line)" >&2; line >"$root/progress"; }
  done
  wait "$pid"
  mv "$bin/$name.tmp" "$bin/$name"
  took=$(($(date +%s) - b0))
  printf '%s\t%s\t%s\t%s\n' "$name" "$cache_state" "$took" "$k8s" >>"$root/build-times.tsv"
  echo "k8s-bins: built $name $k8s in $(fmt $took) (Go cache $cache_state at start)" >&2
done
rm -f "$root/progress"
echo "k8s-bins: built ${#todo[@]} binaries in $(fmt $(($(date +%s) - start)))" >&2
for t in "${targets[@]}"; do target_files "$t" "$(target_dir "$t")"; echo "$t $(target_dir "$t")"; done
