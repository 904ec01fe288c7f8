#!/usr/bin/env bash
# Build the gpu-admission container image from the Dockerfile, daemonless, for the image tests
# (tests/e2e/test_image_e2e.py): `buildah bud --isolation chroot` on a base image made by `mmdebstrap` from
# Debian's packages (public container registries are not assumed reachable; Debian's mirror and PyPI are).
#
# Usage: scripts/image/build.sh            # install the tools if missing, build once, then reuse the cache
#        scripts/image/build.sh --force    # rebuild the image (not the base) even when cached
#        scripts/image/build.sh --print    # print the image reference if built for these inputs, else exit 1
#
# Everything lives outside the repository, under ${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/images/:
#   storage/, run/                buildah's image store (its own, not the system one)
#   base-<key>.tar                the mmdebstrap root filesystem; <key> hashes the suite and package list
#   gpu-admission-<key>.env       what was built: IMAGE=localhost/gpu-admission:<key>, SIZE_BYTES, build
#                                 seconds, BUILDAH_ARGS (the store flags to use it); <key> hashes the base
#                                 key and every file of the build context
# The last line on stdout is always the image reference; progress goes to stderr.
#
# Tools: buildah and mmdebstrap (Debian packages). When missing they are installed with apt-get (root, or
# sudo without a password); anything else is a one-line error saying what to install.
set -euo pipefail

cd "$(dirname "$0")/../.."
REPO="$PWD"
SUITE="${IMAGE_BASE_SUITE:-bookworm}"             # bookworm ships Python 3.11, the project's minimum
MIRROR="${IMAGE_BASE_MIRROR:-http://deb.debian.org/debian}"
# What the Dockerfile needs from a Python base: python (-m venv needs ensurepip: python3-venv) and CA roots.
BASE_PACKAGES="python3,python3-venv,python-is-python3,ca-certificates"
CACHE_ROOT="${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}"
IMAGES="$CACHE_ROOT/images"
BUILDAH=(buildah --root "$IMAGES/storage" --runroot "$IMAGES/run" --storage-driver vfs)

LOG_NAME=image/build.sh
source scripts/lib/cache.sh

# The build context is what .dockerignore lets through: hash exactly those files (names and contents).
context_hash() {
    {
        printf '%s\n' "$1"
        git -C "$REPO" ls-files -co --exclude-standard -- Dockerfile .dockerignore requirements.lock pyproject.toml \
            webhook policies certs cluster | grep -v -e '__pycache__' -e '\.py[cod]$' | LC_ALL=C sort \
            | while read -r f; do [[ -f $f ]] && printf '%s %s\n' "$f" "$(sha256sum <"$f" | cut -c1-64)"; done
    } | sha256sum | cut -c1-16
}
base_key() { printf '%s\n' "$SUITE" "$MIRROR" "$BASE_PACKAGES" "v1" | sha256sum | cut -c1-16; }

BASE_KEY="$(base_key)"
BASE_TAR="$IMAGES/base-$BASE_KEY.tar"
BASE_REF="localhost/gpu-admission-base:$BASE_KEY"
KEY="$(context_hash "$BASE_KEY")"
REF="localhost/gpu-admission:$KEY"
STAMP="$IMAGES/gpu-admission-$KEY.env"

cached() { [[ -f "$STAMP" ]] && command -v buildah >/dev/null 2>&1 && "${BUILDAH[@]}" inspect --type image "$REF" >/dev/null 2>&1; }

PRODUCT="$REF"
cache_args 19 "$@"

install_tools() {
    local missing=()
    command -v buildah >/dev/null 2>&1 || missing+=(buildah)
    command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
    ((${#missing[@]} == 0)) && return 0
    command -v apt-get >/dev/null 2>&1 || die "install ${missing[*]} (Debian/Ubuntu packages); no apt-get here"
    local sudo=()
    if [[ $(id -u) != 0 ]]; then
        sudo -n true 2>/dev/null || die "install ${missing[*]}: apt-get needs root (or passwordless sudo)"
        sudo=(sudo -n)
    fi
    log "installing ${missing[*]} with apt-get"
    if ! "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
        "${sudo[@]}" apt-get update -q >&2 || die "apt-get update failed"
        "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
            || die "apt-get install ${missing[*]} failed"
    fi
}

cache_lock "$IMAGES"

start=$(date +%s)
install_tools

# ---- base image: a Debian root filesystem from Debian's packages -------------------------------------------
if ! "${BUILDAH[@]}" inspect --type image "$BASE_REF" >/dev/null 2>&1; then
    if [[ ! -s $BASE_TAR ]]; then
        log "mmdebstrap $SUITE ($BASE_PACKAGES) -> $BASE_TAR"
        mode=root; [[ $(id -u) == 0 ]] || mode=unshare
        partial="${BASE_TAR%.tar}.partial.tar"  # mmdebstrap picks its output format from the extension
        rm -rf "$partial"
        mmdebstrap --quiet --mode="$mode" --variant=minbase --include="$BASE_PACKAGES" \
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            "$SUITE" "$partial" "$MIRROR" >&2 || die "mmdebstrap of $SUITE failed"
        mv "$partial" "$BASE_TAR"
    fi
    log "importing $BASE_TAR as $BASE_REF"
    ctr="$("${BUILDAH[@]}" from scratch)"
    "${BUILDAH[@]}" add "$ctr" "$BASE_TAR" / >&2 || die "buildah add of $BASE_TAR failed"
    "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd python3 "$ctr" >&2
    "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$BASE_REF" >&2 || die "buildah commit of the base failed"
fi

# ---- the image, from the Dockerfile ---------------------------------------------------------------------
# Machines behind a TLS-inspecting proxy trust its CA in their own bundle: the build's RUN steps (pip) see
# that bundle in place of the image's, with a pip.conf pointing at it. Both are mounted for the build only
# and are not in the image. IMAGE_BUILD_CA_BUNDLE="" turns this off.
ca_bundle="${IMAGE_BUILD_CA_BUNDLE-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}"
mounts=()
if [[ -n $ca_bundle ]]; then
    [[ -r $ca_bundle ]] || die "IMAGE_BUILD_CA_BUNDLE $ca_bundle is not a readable file"
    pip_conf="$IMAGES/build-pip.conf"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$pip_conf"
    mounts=(-v "$ca_bundle:/etc/ssl/certs/ca-certificates.crt:ro" -v "$pip_conf:/etc/pip.conf:ro")
fi
log "buildah bud --isolation chroot --build-arg BASE_IMAGE=$BASE_REF -> $REF"
bud_start=$(date +%s)
"${BUILDAH[@]}" bud --isolation chroot --network host --pull-never --build-arg "BASE_IMAGE=$BASE_REF" \
    "${mounts[@]}" -t "$REF" "$REPO" >&2 || die "buildah bud failed (see above)"
# The image's size: its layers, uncompressed, as the manifest in the local store lists them.
size="$("${BUILDAH[@]}" inspect --type image --format '{{.Manifest}}' "$REF" \
    | python3 -c 'import json, sys; print(sum(layer["size"] for layer in json.load(sys.stdin)["layers"]))')" \
    || die "cannot read the size of $REF"
now=$(date +%s)
printf 'IMAGE=%s\nBASE_IMAGE=%s\nSIZE_BYTES=%s\nBUILD_SECONDS=%s\nBUD_SECONDS=%s\nBUILDAH_ARGS="%s"\n' \
    "$REF" "$BASE_REF" "$size" "$((now - start))" "$((now - bud_start))" "${BUILDAH[*]:1}" >"$STAMP"
log "done in $((now - start))s (image $size bytes)"
echo "$REF"
