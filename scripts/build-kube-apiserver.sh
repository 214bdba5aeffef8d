#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager and kube-scheduler from Debian
# bookworm's `kubernetes` source package (1.20.2) with Debian's golang-go, for
# the end-to-end tests against a real control plane (tests/e2e).
#
# The binaries are cached outside the clone, keyed by the source version and a
# hash of the fixes applied to it, so a machine that built them once skips the
# build (cold: about 10 minutes on 2 cores, one `go build` for the three).
# Prints the bin directory last.
#
# Needs: golang-go, dpkg-dev (dpkg-source), apt with a bookworm deb-src line
# (only to fetch the source the first time). Missing pieces fail with a
# message saying what to install; nothing is skipped.
#
# Env: PSCALER_KUBE_CACHE  cache root (default /var/cache/predictive-scaler)
# --print-bin-dir: only print where the binaries are (or would be); build nothing.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
fixes="$here/kube-apiserver/go119_fixes.py"

DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"   # bookworm's kubernetes source
K8S_VERSION="1.20.2"
BUILD_REV="2"   # bump when the build flags or the binaries below change

cache_root="${PSCALER_KUBE_CACHE:-/var/cache/predictive-scaler}"
key="$( (cat "$fixes"; echo "rev=$BUILD_REV"; echo "deb=$DEB_VERSION") | sha256sum | cut -c1-12)"
dest="$cache_root/kubernetes-$K8S_VERSION-$key"
bin="$dest/bin"

if [ "${1:-}" = "--print-bin-dir" ]; then
  echo "$bin"
  exit 0
fi
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler)
built() { local b; for b in "${BINARIES[@]}"; do [ -x "$bin/$b" ] || return 1; done; }
if built; then
  echo "kubernetes $K8S_VERSION (${BINARIES[*]}) already built (cache hit)" >&2
  echo "$bin"
  exit 0
fi

die() { echo "build-kube-apiserver: $*" >&2; exit 1; }
command -v go >/dev/null || die "go not found: apt-get install golang-go"
command -v dpkg-source >/dev/null || die "dpkg-source not found: apt-get install dpkg-dev"
command -v python3 >/dev/null || die "python3 not found"

start=$(date +%s)
src_dir="$cache_root/src"
mkdir -p "$src_dir"
dsc="$src_dir/kubernetes_${DEB_VERSION}.dsc"
fetch_source() {
  (cd "$src_dir" && apt-get source --download-only "kubernetes=$DEB_VERSION" "$@")
}
if [ ! -f "$dsc" ]; then
  command -v apt-get >/dev/null || die "apt-get not found: the source comes from Debian bookworm's archive"
  if ! fetch_source >/dev/null 2>&1; then
    # No deb-src line in the system's apt sources: use a private one (the system's config is untouched).
    echo "no bookworm deb-src line configured; fetching the source with a private apt source list" >&2
    priv="$src_dir/apt"
    mkdir -p "$priv/lists/partial" "$priv/archives/partial"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    signed=""; [ -f "$keyring" ] && signed="[signed-by=$keyring] "
    archive=$(bash "$(dirname "${BASH_SOURCE[0]}")/debian-archive-uri.sh") || die "no Debian archive configured for apt"
    printf 'deb-src %s%s bookworm main\n' "$signed" "$archive" > "$priv/sources.list"
    opts=(-o "Dir::Etc::SourceList=$priv/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
          -o "Dir::State::Lists=$priv/lists" -o "Dir::Cache::Archives=$priv/archives"
          -o "APT::Sandbox::User=root")
    apt-get "${opts[@]}" update -qq >&2 \
      || die "apt-get update with a bookworm deb-src line failed; add one to /etc/apt/sources.list.d
  (Types: deb-src, URIs: <your Debian archive>, Suites: bookworm, Components: main) and run apt-get update"
    fetch_source "${opts[@]}" >&2 || die "apt-get source kubernetes=$DEB_VERSION failed (see above)"
  fi
fi
[ -f "$dsc" ] || die "the kubernetes source package was not downloaded to $src_dir"

work="$dest/build"
rm -rf "$work"
mkdir -p "$work/gopath/src/k8s.io"
tree="$work/gopath/src/k8s.io/kubernetes"
echo "unpacking kubernetes $DEB_VERSION" >&2
dpkg-source --no-check -x "$dsc" "$tree" >/dev/null

echo "applying the Go 1.19 fixes" >&2
python3 "$fixes" "$tree"

export GOPATH="$work/gopath" GO111MODULE=off CGO_ENABLED=0
export GOCACHE="$work/gocache" GOFLAGS=""
cd "$tree"

# The tarball lacks pkg/generated/openapi/zz_generated.openapi.go; generate it
# with the tree's own openapi-gen from every package that asks for it.
echo "generating pkg/generated/openapi with the tree's openapi-gen" >&2
go build -o "$work/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
inputs="$(
  { find pkg cmd plugin -name '*.go' -not -path '*/testdata/*' -print0
    find -L vendor/k8s.io -name '*.go' -not -path 'vendor/k8s.io/code-generator/*' \
      -not -path 'vendor/k8s.io/sample-apiserver/*' -not -path '*/testdata/*' -print0
  } | xargs -0 grep -l '^// *+k8s:openapi-gen=' | xargs -n1 dirname | LC_ALL=C sort -u \
    | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -
)"
"$work/openapi-gen" --logtostderr -v 0 -i "$inputs" \
  -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
  -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
  -r "$work/openapi-violations.report" 2>"$work/openapi-gen.log" \
  || { tail -20 "$work/openapi-gen.log" >&2; die "openapi-gen failed"; }
[ -s pkg/generated/openapi/zz_generated.openapi.go ] || die "openapi-gen wrote nothing"

# The version the binaries report (--version, the API server's /version, the
# User-Agent of their clients) is set at link time, in both packages that hold
# it, as Kubernetes' own hack/lib/version.sh does; unset, it is v0.0.0-master.
# The commit is upstream's v1.20.2 tag, the tree Debian's source is.
ldflags="-s -w"
for vpkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version \
            k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $vpkg.gitVersion=v$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=20"
  ldflags="$ldflags -X $vpkg.gitCommit=faecb196815e248d3ecfb03c680a4507229c2a56"
  ldflags="$ldflags -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
done
echo "building ${BINARIES[*]} ($(go version))" >&2
mkdir -p "$work/out"
go build -ldflags "$ldflags" -o "$work/out/" "${BINARIES[@]/#/./cmd/}"

for b in "${BINARIES[@]}"; do
  reported="$("$work/out/$b" --version)"
  echo "$b: $reported" >&2
  [ "$reported" = "Kubernetes v$K8S_VERSION" ] || die "$b reports '$reported', not v$K8S_VERSION"
done
mkdir -p "$bin"
mv "${BINARIES[@]/#/$work/out/}" "$bin/"
rm -rf "$work"   # the source tree and Go cache (about 1.5 GB) are not needed any more
echo "built in $(( $(date +%s) - start )) s" >&2
echo "$bin"
