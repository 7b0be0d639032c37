# The fresh-machine check's steps (sourced by fresh_machine.sh).

step_name="" step_start=$SECONDS
step() {
  [[ -n "$step_name" ]] && echo "phase $step_name: $((SECONDS - step_start)) s"
  step_name=$1 step_start=$SECONDS
}

# fail WHAT [LOG]: the log's tail and what its failed tests said, then one last line naming the
# step and what is missing.
fail() {
  [[ -n "${2:-}" ]] && { tail -n 40 "$2"; failures "$2"; }
  echo "fresh machine: FAILED in step '$step_name' after $((SECONDS - step_start)) s: $1"
  exit 1
}

# The missing piece a log names, in the words of the tool that found it missing.
diagnose() {
  local log=$1 found
  found=$(grep -o -m1 -E "Could NOT find [A-Za-z0-9_]+|Could not find a package configuration \
file provided by \"[^\"]+\"|Unable to locate package [^ ]+|[^ :]+: command not found|\
No module named '[^']+'|fatal error: [^:]+: No such file|EBADENGINE.*|npm ERR! code [A-Z_]+" \
    "$log" || true)
  [[ -z "$found" ]] && found=$(sed -n '/The following tests FAILED/,$p' "$log" |
    grep -o -E '[0-9]+ - [^ ]+' | tr '\n' ' ' || true)
  [[ -z "$found" ]] && found="see the log above"
  echo "$found"
}

# What failed tests said about their failure (pytest's and GoogleTest's lines, the sanitizers'
# reports, a hung test's stacks and its servers' last lines: tests/server/conftest.py), which
# ctest printed where each test ran, far above the log's tail.
failures() {
  local said
  said=$(grep -E -m 80 '^(FAILED |E  )|\[  FAILED  \]|: Failure$|^(WARNING|ERROR): [A-Za-z]+Sanitizer|^SUMMARY: |^Timeout \(| ran past [0-9]+ s|^  File |^--- the end of the log|^fpa-serve: ' \
    "$1" || true)
  [[ -n "$said" ]] && printf 'what the failed tests said:\n%s\n' "$said"
  return 0
}

debian_sources() {  # this machine's apt source files that are Debian's own
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*; do
    [[ -f "$f" ]] && grep -q -E '^[^#]*(URIs:|deb) .*/debian(-security)?/?( |$)' "$f" && echo "$f"
  done
  return 0
}

make_bare_root() {  # ROOT DEB_CACHE LOG
  local root=$1 debs=$2 log=$3 sources
  mapfile -t sources < <(debian_sources)
  ((${#sources[@]})) || fail "a Debian apt source on this machine (/etc/apt/sources.list*)"
  mmdebstrap --variant=minbase \
    --setup-hook="mkdir -p \"\$1\"/var/cache/apt/archives" \
    --setup-hook="sync-in $debs /var/cache/apt/archives" \
    --customize-hook="sync-out /var/cache/apt/archives $debs" \
    bookworm "$root" "${sources[@]}" >"$log" 2>&1 || fail "mmdebstrap: $(tail -n 1 "$log")" "$log"
}

save_root_tarball() { tar -C "$1" -cf "$2" .; }

# DNS, /etc/hosts and the CA certificates this machine uses (also where apt's ca-certificates
# rebuilds the bundle later); the CA and proxy variables are passed by in_root.
give_network_settings() {
  local root=$1
  cp /etc/resolv.conf /etc/hosts "$root/etc/"
  mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$root/usr/local/share/ca-certificates/host-ca.crt"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
}

mount_root() {  # ROOT CACHE
  local root=$1 cache=$2
  # The root a mount point of its own, as on a real machine: buildah's layer apply (in the
  # deploy.image test) remounts / and fails inside a plain chroot directory.
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
  mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
  mount -t tmpfs tmpfs "$root/tmp"
  mount --bind "$cache/debs" "$root/var/cache/apt/archives"
  mkdir -p "$root/root/.cache/ccache"
  mount --bind "$cache/ccache" "$root/root/.cache/ccache"
}

mounts_under() {  # DIR: DIR itself and every mount point below it
  findmnt -rn -o TARGET | awk -v d="$1" '$0 == d || index($0, d "/") == 1'
}

cleanup_root() {
  local root=$1 m
  [[ -d "$root" ]] || return 0
  for m in $(mounts_under "$root" | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  if [[ -n "$(mounts_under "$root")" ]]; then
    echo "fresh machine: mounts left under $root; not removing it" >&2
    return 1
  fi
}

# in_root CMD...: CMD in the clone inside the root, with an empty environment but for the
# paths, CI, this machine's CA and proxy variables, and the test lengths (FPA_*_SECONDS).
in_root() {
  local root=$1; shift
  local env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
             LANG=C.UTF-8 CI=${CI:-} DEBIAN_FRONTEND=noninteractive) name
  for name in $(compgen -e); do
    [[ "$name" =~ (_proxy|_PROXY|CA_BUNDLE|CA_CERTS|CERT_FILE|CERT_DIR|CAINFO|_CERT)$ ||
       "$name" =~ ^FPA_(FUZZ|SOAK)_SECONDS$ ]] &&
      env+=("$name=${!name}")
  done
  chroot "$root" /usr/bin/env -i "${env[@]}" /bin/bash -c 'cd /root/fpa-serve && exec "$@"' \
    in_root "$@"
}

# The README's serve command in the root, on free loopback ports, until a completion answers
# over HTTP and gRPC (asked with this machine's Python and the clone's client).
serve_and_ask() {
  local root=$1 log=$2 pid ports deadline=$((SECONDS + 2400))
  in_root "$root" scripts/serve --address 127.0.0.1:0 --http-address 127.0.0.1:0 \
    --metrics-address 127.0.0.1:0 >"$log" 2>&1 &
  pid=$!
  until ports=$(grep -o -E 'listening on .*' "$log" 2>/dev/null); do
    kill -0 "$pid" 2>/dev/null || fail "$(diagnose "$log")" "$log"
    ((SECONDS < deadline)) || { stop_server "$pid"; fail "no listening line in 40 min" "$log"; }
    sleep 5
  done
  read -r grpc http < <(echo "$ports" | sed -E 's/.*:([0-9]+) \(gRPC\).*:([0-9]+) \(http\).*/\1 \2/')
  echo "serving after $((SECONDS - step_start)) s: gRPC $grpc, HTTP $http"
  /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/ask_server.py" "$grpc" "$http" \
    "$root/root/fpa-serve/client" || { stop_server "$pid"; fail "a completion over HTTP and gRPC" "$log"; }
  stop_server "$pid" || fail "fpa-serve's exit status after SIGTERM" "$log"
}

# SIGTERM to what runs under in_root's background subshell PID (chroot, env, bash and
# scripts/serve all exec, so that is fpa-serve itself), then its exit status.
stop_server() {
  pkill -TERM -P "$1" || kill -TERM "$1"
  wait "$1"
}

# deploy/Dockerfile's cpu target with the saved bare root as DEBIAN_IMAGE and
# DEBIAN_SLIM_IMAGE, then tests/deploy/test_image.py's image tests on the result.
build_and_run_image() {  # ROOT WORK CACHE LOG REPO
  local root=$1 work=$2 cache=$3 log=$4 repo=$5 store=$work/buildah base=localhost/fresh-debian:12 ctr
  local buildah=(buildah --root "$store/storage" --runroot "$store/run" --storage-driver vfs)
  ctr=$("${buildah[@]}" from scratch)
  tar -C "$("${buildah[@]}" mount "$ctr")" -xf "$work/root.tar"
  "${buildah[@]}" commit -q "$ctr" "$base" >/dev/null
  "${buildah[@]}" rm "$ctr" >/dev/null
  # TMPDIR: where buildah keeps the Dockerfile's cache mounts (ccache's objects) between runs.
  mkdir -p "$cache/buildah-tmp"
  TMPDIR=$cache/buildah-tmp \
    "${buildah[@]}" build --isolation chroot --format docker --target cpu \
    --build-arg DEBIAN_IMAGE=$base --build-arg DEBIAN_SLIM_IMAGE=$base \
    --volume "$cache/debs:/var/cache/apt/archives" --tag localhost/fpa-serve:fresh-cpu \
    -f "$root/root/fpa-serve/deploy/Dockerfile" "$root/root/fpa-serve" >"$log" 2>&1 ||
    fail "the image build: $(diagnose "$log")" "$log"
  echo "image built after $((SECONDS - step_start)) s"
  FPA_IMAGE_STORE=$store FPA_IMAGE=localhost/fpa-serve:fresh-cpu \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider -k "image_config or healthcheck" \
    "$repo/tests/deploy/test_image.py" >>"$log" 2>&1 ||
    fail "the built image's HEALTHCHECK run" "$log"
  tail -n 1 "$log"
}
