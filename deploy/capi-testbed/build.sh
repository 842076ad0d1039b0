#!/usr/bin/env bash
# Build the Cluster API testbed binaries (kube-apiserver, etcd, the Cluster API controllers and
# CAPD, whose in-memory backend simulates machines) into a cache folder outside the repo, once.
# The folder name carries a hash of go.mod/go.sum/build.sh, so a pin change builds a new set.
# Usage: deploy/capi-testbed/build.sh            -> prints the folder path on stdout
# Env:   NVKE_CAPI_BIN_DIR  overrides the folder;  GOFLAGS/GOMAXPROCS pass through to go build.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
hash="$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)"
dir="${NVKE_CAPI_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nvke/capi-$hash}"
bins=(etcd kube-apiserver capi-manager kubeadm-bootstrap-manager kubeadm-control-plane-manager capd-manager)
pkgs=(go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kube-apiserver sigs.k8s.io/cluster-api
      sigs.k8s.io/cluster-api/bootstrap/kubeadm sigs.k8s.io/cluster-api/controlplane/kubeadm
      sigs.k8s.io/cluster-api/test/infrastructure/docker)
missing=0
for b in "${bins[@]}"; do [[ -x "$dir/bin/$b" ]] || missing=1; done
[[ -f "$dir/crds/.done" ]] || missing=1
if [[ $missing == 0 ]]; then echo "$dir"; exit 0; fi
command -v go >/dev/null || { echo "capi-bins: the Go toolchain is not installed" >&2; exit 3; }
mkdir -p "$dir/bin" "$dir/crds"
cd "$here"
start=$(date +%s)
export GOFLAGS="${GOFLAGS:-} -trimpath -mod=mod"
# one builder (flags, version stamp, progress, lock) and one Go build cache for every
# Kubernetes binary NVKE builds: deploy/k8s/build.sh
pairs=(); for i in "${!bins[@]}"; do pairs+=("${bins[$i]}=${pkgs[$i]}"); done
"$here/../k8s/build.sh" --module "$here" --out "$dir/bin" "${pairs[@]}" >/dev/null
# CRDs and webhook configurations from the same module versions the controllers were built from.
capi="$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)"
capt="$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api/test)"
rm -rf "$dir/crds"/*; mkdir -p "$dir/crds/core" "$dir/crds/bootstrap" "$dir/crds/controlplane" "$dir/crds/infrastructure"
cp "$capi"/config/crd/bases/*.yaml "$dir/crds/core/"
cp "$capi"/bootstrap/kubeadm/config/crd/bases/*.yaml "$dir/crds/bootstrap/"
cp "$capi"/controlplane/kubeadm/config/crd/bases/*.yaml "$dir/crds/controlplane/"
cp "$capt"/infrastructure/docker/config/crd/bases/*.yaml "$dir/crds/infrastructure/"
for c in core:"$capi"/config bootstrap:"$capi"/bootstrap/kubeadm/config controlplane:"$capi"/controlplane/kubeadm/config infrastructure:"$capt"/infrastructure/docker/config; do
  [[ -f "${c#*:}/webhook/manifests.yaml" ]] && cp "${c#*:}/webhook/manifests.yaml" "$dir/crds/${c%%:*}/webhooks.yaml.txt"
done
chmod -R u+w "$dir/crds"
echo "$(( $(date +%s) - start ))" > "$dir/build-seconds"
touch "$dir/crds/.done"
echo "capi-bins: built in $(( $(date +%s) - start )) s into $dir" >&2
echo "$dir"
