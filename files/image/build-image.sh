#!/bin/sh
# Build thorfleet's derived vLLM image from a base pinned by digest:
#   sh build-image.sh --base REF@sha256:... --tag TAG --think-prefill 1|0 [--label k=v]...
# 1. plan in a throwaway container of the base (plain `docker run`, text only: chatfix.py reads
#    the code's shape and imports neither vLLM nor torch, which fail without the nvidia runtime);
# 2. docker build this folder's Dockerfile to a temporary tag (text patching + py_compile only);
# 3. self-check the built image in `docker run --runtime nvidia`: import the patched code, render
#    chat requests, probe the API key (chatfix.py check);
# 4. only then tag it TAG. On any failure the temporary tag is removed and the image previously
#    tagged TAG is left as it was; the message names what was found and what was expected.
# Needs: docker with the nvidia runtime, and the base already pulled.
set -eu

ctx=$(cd "$(dirname "$0")" && pwd)
base="" tag="" think_prefill=1
die() { echo "build-image: $*" >&2; exit 2; }
# Options are consumed from the front; each --label is moved to the back, so that afterwards
# "$@" holds exactly the --label k=v pairs, spaces and all.
left=$#
while [ "$left" -gt 0 ]; do
    [ "$left" -ge 2 ] || die "missing value after $1"
    case "$1" in
        --base) base=$2 ;;
        --tag) tag=$2 ;;
        --think-prefill) think_prefill=$2 ;;
        --label) set -- "$@" --label "$2" ;;
        *) die "unknown argument: $1" ;;
    esac
    shift 2
    left=$((left - 2))
done
[ -n "$base" ] && [ -n "$tag" ] || die "usage: build-image.sh --base REF --tag TAG [--think-prefill 1|0] [--label k=v]..."
case "$think_prefill" in 0|1) ;; *) die "--think-prefill must be 1 or 0, not $think_prefill" ;; esac

echo "==> planning patches against $base"
docker image inspect "$base" >/dev/null 2>&1 || die "base image $base is not pulled"
# The base's own python3 (first on its PATH) finds the packages; the context is mounted read-only.
if ! plan=$(docker run --rm --network none --entrypoint python3 -v "$ctx:/ctx:ro" "$base" \
        /ctx/chatfix.py plan --think-prefill "$think_prefill"); then
    echo "build-image: the patches do not fit $base; $tag left as it was" >&2
    exit 1
fi
plan=$(printf '%s\n' "$plan" | tail -n 1)
echo "==> plan: $plan"

# A tag of its own for this build: removing it never touches TAG, even when the build reuses
# the very image TAG names (then only this extra name goes).
candidate="thorfleet-candidate:$(printf '%s' "$tag" | cksum | cut -d' ' -f1)-$$"
drop() { docker image rm "$candidate" >/dev/null 2>&1 || true; }
trap drop EXIT
trap 'exit 130' INT TERM

echo "==> building $candidate"
if ! docker build --pull=false --build-arg "BASE=$base" --build-arg "THINK_PREFILL=$think_prefill" \
        --build-arg "PLAN=$plan" --label "thorfleet.patches=$plan" "$@" -t "$candidate" "$ctx"; then
    echo "build-image: docker build failed; $tag left as it was" >&2
    exit 1
fi

echo "==> self-check of $candidate under the nvidia runtime"
if ! docker run --rm --runtime nvidia --network none --entrypoint python3 "$candidate" \
        /opt/thorfleet/image/chatfix.py check --think-prefill "$think_prefill"; then
    echo "build-image: the built image failed its self-check; $tag left as it was" >&2
    exit 1
fi

docker tag "$candidate" "$tag"
echo "==> built $tag ($(docker image inspect --format '{{.Id}}' "$tag")) with $plan"
