#!/bin/sh
# Build thorfleet's derived vLLM image from a base pinned by digest:
#   sh build-image.sh --base REF@sha256:... --tag TAG --think-prefill 1|0 [--label k=v]...
# 1. plan in a throwaway container of the base: versions found, code shapes, what to apply/skip;
# 2. docker build this folder's Dockerfile with the base as build-arg, labelled with the plan.
# Exits non-zero, naming what it found and what it expected, when a patch no longer fits; the
# image previously tagged TAG is then left as it was. Needs: docker, and the base already pulled.
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

echo "==> planning chat patches against $base"
docker image inspect "$base" >/dev/null 2>&1 || die "base image $base is not pulled"
# The base's own python3 (first on its PATH) finds the packages; the context is mounted read-only.
if ! plan=$(docker run --rm --network none --entrypoint python3 -v "$ctx:/ctx:ro" "$base" \
        /ctx/chatfix.py plan --think-prefill "$think_prefill"); then
    echo "build-image: the patches do not fit $base; $tag left as it was" >&2
    exit 1
fi
plan=$(printf '%s\n' "$plan" | tail -n 1)
echo "==> plan: $plan"

echo "==> building $tag"
if ! docker build --pull=false --build-arg "BASE=$base" --build-arg "THINK_PREFILL=$think_prefill" \
        --build-arg "PLAN=$plan" --label "thorfleet.patches=$plan" "$@" -t "$tag" "$ctx"; then
    echo "build-image: docker build failed; $tag left as it was" >&2
    exit 1
fi
echo "==> built $tag ($(docker image inspect --format '{{.Id}}' "$tag")) with $plan"
