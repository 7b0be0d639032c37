#!/usr/bin/env bash
# The fresh-machine check: a bare Debian 12 root (mmdebstrap, minbase, from this machine's
# Debian apt sources) given only this machine's network settings (DNS, CA certificates, the
# CA and proxy variables), a clean clone of HEAD inside it, then
#   serve  the README's serve command, until a completion answers over HTTP and gRPC;
#   test   the README's test command (its own fresh_machine entry excluded: no recursion);
#   image  deploy/Dockerfile's cpu target built by buildah with the bare root as its base
#          images, and the image run as its user until it passes its HEALTHCHECK.
# Each phase prints its time. A failure's last line names the step and the missing piece.
# Cached between runs: the downloaded .deb files and ccache's objects (content-addressed,
# checked against the root's own compiler and headers; the image build's in its cache mount);
# never a root. FPA_FRESH_PHASES
# picks phases (default "serve test image").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$here/fresh_lib.sh"

phases=${FPA_FRESH_PHASES:-serve test image}
cache=${FPA_FRESH_CACHE:-/var/cache/fpa-serve/fresh}
work=$(mktemp -d /var/tmp/fpa-fresh.XXXXXX)
root=$work/root
trap 'cleanup_root "$root"; rm -rf --one-file-system "$work"' EXIT
mkdir -p "$cache/debs" "$cache/ccache"

step "preconditions"
((EUID == 0)) || fail "root (chroot, mounts and buildah's storage need it)"
for tool in mmdebstrap buildah git; do
  command -v "$tool" >/dev/null || fail "$tool (scripts/packages.txt)"
done
[[ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ]] ||
  echo "note: uncommitted changes are not in the clone; the check runs HEAD"

step "bare root"
make_bare_root "$root" "$cache/debs" "$work/log.root"
# The image build starts from the root as it is now, before anything is run in it.
[[ " $phases " == *" image "* ]] && save_root_tarball "$root" "$work/root.tar"
give_network_settings "$root"
git clone -q --no-hardlinks "$repo" "$root/root/fpa-serve"
mount_root "$root" "$cache"

if [[ " $phases " == *" serve "* ]]; then
  step "serve"
  serve_and_ask "$root" "$work/log.serve"
fi
if [[ " $phases " == *" test "* ]]; then
  step "test"
  # The host's run of the same command fuzzes and soaks at full length; here the short runs
  # prove that the fuzzers and the soak build and run on what the project installs.
  FPA_FUZZ_SECONDS=${FPA_FUZZ_SECONDS:-5} FPA_SOAK_SECONDS=${FPA_SOAK_SECONDS:-15} \
    in_root "$root" scripts/test -E '^fresh_machine$' >"$work/log.test" 2>&1 ||
    fail "$(diagnose "$work/log.test")" "$work/log.test"
  tail -n 4 "$work/log.test"
fi
if [[ " $phases " == *" image "* ]]; then
  step "image"
  build_and_run_image "$root" "$work" "$cache" "$work/log.image" "$repo"
fi
step "done"
echo "fresh machine: passed ($phases)"
