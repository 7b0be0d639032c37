"""The container image without a Docker engine (none runs here): the Dockerfile linted and
parsed; its build stages' CMake targets and paths checked against a real build; its runtime
package list checked against the shared libraries the built binaries load; and the runtime
image assembled without a registry: a root filesystem from exactly those Debian packages, the
binaries and the model, made into an image by buildah with the Dockerfile's own image
configuration, in whose filesystem fpa-serve then runs as the image's user with the image's
command line and passes the image's HEALTHCHECK."""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from deploy_env import (BUILD, DEPLOY, REPO, Process, dockerfile_facts, flag_values,
                        fpa_serve_binary, free_port, grpc_port, health_probe_binary,
                        healthcheck_command, http_port, instructions, metrics_port,
                        model_for_tests, scrape, serving_flags, stage, wait_until)

HEALTH_SERVICES = {"", "fpa.v1.FpaService"}  # docs/serving.md
BUILDAH = shutil.which("buildah")
# The Dockerfile instructions that make up an image's configuration rather than its files.
IMAGE_CONFIG = ("ENV", "USER", "EXPOSE", "STOPSIGNAL", "HEALTHCHECK", "ENTRYPOINT", "CMD")
# In every Debian image (debian:12-slim included) before any package is added.
BASE_PACKAGES = {"libc6"}


@pytest.fixture(scope="module")
def facts():
    return dockerfile_facts()


@pytest.fixture(scope="module")
def runtime(facts):
    return stage(facts, "runtime")


def binaries():
    serve, probe = fpa_serve_binary(), health_probe_binary()
    if serve is None or probe is None:
        pytest.skip(f"fpa-serve or fpa-health-probe not built in {BUILD} yet")
    return serve, probe


def entrypoint_and_cmd(runtime):
    (entrypoint,) = instructions(runtime, "ENTRYPOINT")
    (cmd,) = instructions(runtime, "CMD")
    assert entrypoint["json"] and cmd["json"], "ENTRYPOINT and CMD must be exec (JSON) form"
    return entrypoint["json"], cmd["json"]


def apt_packages(stage_facts):
    """Packages that a stage's `apt-get install` names."""
    packages = []
    for run in instructions(stage_facts, "RUN"):
        args = run["args"]
        for i in range(len(args) - 1):
            if args[i:i + 2] == ["apt-get", "install"]:
                for word in args[i + 2:]:
                    if word in ("&&", ";"):
                        break
                    if not word.startswith("-") and word != "\\":
                        packages.append(word)
    return packages


def test_dockerfile_lints_clean(facts):
    assert facts["problems"] == []


def test_final_stages_are_the_runtime_with_each_build(facts):
    assert {s["name"]: s["from"] for s in facts["stages"] if s["name"] in ("cpu", "cuda")} == {
        "cpu": "runtime", "cuda": "runtime"}
    runtime_user = instructions(stage(facts, "runtime"), "USER")[-1]["args"]
    for variant in ("cpu", "cuda"):
        (copy,) = instructions(stage(facts, variant), "COPY")
        assert copy["args"][0] == "/out/" and copy["args"][1] == "/usr/local/bin/"
        # A stage that installs more as root must hand back to the image's user.
        users = instructions(stage(facts, "runtime"), "USER") + instructions(
            stage(facts, variant), "USER")
        assert users[-1]["args"] == runtime_user, variant
    assert stage(facts, "runtime")["from"].startswith("${DEBIAN_SLIM_IMAGE}")


def test_runtime_stage_runs_as_non_root_with_the_contract_ports(runtime):
    (user,) = instructions(runtime, "USER")
    uid, gid = user["args"][0].split(":")
    assert int(uid) >= 1000 and int(gid) >= 1000, "numeric non-root, so runAsNonRoot can verify"
    (expose,) = instructions(runtime, "EXPOSE")
    assert sorted(map(int, expose["args"])) == sorted([grpc_port(), metrics_port(), http_port()])
    (signal_,) = instructions(runtime, "STOPSIGNAL")
    assert signal_["args"] == ["SIGTERM"]  # starts the server's drain
    entrypoint, cmd = entrypoint_and_cmd(runtime)
    assert entrypoint == ["/usr/local/bin/fpa-serve"]
    flags = flag_values(cmd)
    assert set(flags) <= set(serving_flags())
    assert flags["--address"] == serving_flags()["--address"]
    assert flags["--metrics-address"] == serving_flags()["--metrics-address"]
    model_copies = [c["args"][1] for c in instructions(runtime, "COPY")]
    assert flags["--model"] in model_copies, "the baked-in model is the one served"


def test_healthcheck_asks_the_grpc_health_service(runtime):
    command = healthcheck_command(runtime)
    assert command[0] == "/usr/local/bin/fpa-health-probe"
    flags = flag_values(command[1:])
    assert flags["--address"] == f"127.0.0.1:{grpc_port()}"
    assert flags["--service"] in HEALTH_SERVICES


def arg_defaults(facts):
    """ARG name -> default value, over all stages."""
    return dict(i["args"][0].split("=", 1) for s in facts["stages"]
                for i in instructions(s, "ARG") if "=" in i["args"][0])


def test_copy_sources_exist_in_the_build_context(facts):
    defaults = arg_defaults(facts)
    ignored = [line.strip() for line in (DEPLOY / "Dockerfile.dockerignore").read_text()
               .splitlines() if line.strip() and not line.startswith("#")]
    for s in facts["stages"]:
        for copy in instructions(s, "COPY"):
            if "--from=" in copy["text"]:
                continue  # from another stage, checked with the build stages
            for source in copy["args"][:-1]:
                path = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], source)
                assert not any(fnmatch.fnmatch(path, pattern) for pattern in ignored), path
                if path == defaults.get("MODEL_DIR") and not (REPO / path).exists():
                    pytest.skip(f"{path} (the shipped model) is not in the repository yet")
                assert (REPO / path).exists(), f"stage {s['name']}: COPY {source}: no {path}"


def build_runs(facts, name):
    return " ".join(" ".join(r["args"]) for r in instructions(stage(facts, name), "RUN"))


def test_build_stages_build_real_targets_to_real_paths(facts):
    serve, probe = binaries()
    targets = subprocess.run(["cmake", "--build", str(BUILD), "--target", "help"],
                             capture_output=True, text=True, timeout=120).stdout
    known = {line.split(":")[0] for line in targets.splitlines()}
    for name in ("build-cpu", "build-cuda"):
        run = build_runs(facts, name)
        wanted = re.search(r"--target ((?:[\w-]+ ?)+)", run).group(1).split()
        assert set(wanted) <= known, f"{name}: {set(wanted) - known} are no CMake targets"
        assert "-DFPA_NATIVE=OFF" in run, f"{name}: -march=native would tie the image to one CPU"
        # The stage copies fpa-serve from the path the build really puts it at.
        assert f"build/{serve.relative_to(BUILD)}" in run.split()
    assert probe.name == "fpa-health-probe"


def loaded_libraries(binary):
    """Paths of the shared libraries `binary` loads, as the loader finds them."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    assert "not found" not in out, out
    return re.findall(r"=> (/\S+)", out) + re.findall(r"^\s*(/\S+) \(", out, re.M)


def is_cuda_toolkit(path):
    return os.path.realpath(path).startswith("/usr/local/cuda")


def shared_library_packages(binaries):
    """Debian packages owning the shared libraries that the binaries load, less the CUDA
    toolkit's (a CUDA build's cudart and cuBLAS, which the cuda stage installs)."""
    libraries = {p for b in binaries for p in loaded_libraries(b) if not is_cuda_toolkit(p)}
    # Alternatives (libblas.so.3) belong to whoever provides the target; with merged /usr,
    # dpkg may know a library by its /lib path only. One dpkg call: each one reads every list.
    candidates = {lib: [lib, os.path.realpath(lib), os.path.realpath(lib).removeprefix("/usr")]
                  for lib in libraries}
    out = subprocess.run(["dpkg", "-S", *{c for cs in candidates.values() for c in cs}],
                         capture_output=True, text=True).stdout
    owners = {}
    for line in out.splitlines():
        packages, path = line.split(": ", 1)
        owners[path] = {p.split(":")[0] for p in packages.split(", ")}
    found = set()
    for lib, paths in candidates.items():
        owner = next((owners[p] for p in paths if p in owners), None)
        assert owner, f"no Debian package owns {lib}"
        found |= owner
    return found


def with_dependencies(packages):
    """packages and everything apt installs with them (Depends, Pre-Depends), as this
    machine's dpkg database records them."""
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Pre-Depends}, ${Depends}\n"],
                         capture_output=True, text=True, check=True).stdout
    depends = {}
    for line in out.splitlines():
        name, deps = line.split("\t")
        # "a (>= 1) | b": the first alternative that is installed here.
        depends[name] = [[alt.split()[0].split(":")[0] for alt in dep.split("|")]
                         for dep in deps.split(",") if dep.strip()]
    closure, todo = set(), list(packages)
    while todo:
        package = todo.pop()
        if package in closure:
            continue
        closure.add(package)
        for alternatives in depends.get(package, []):
            todo += [next((a for a in alternatives if a in depends), alternatives[0])]
    return closure


def is_cuda_build(binary):
    return any(is_cuda_toolkit(p) for p in loaded_libraries(binary))


def test_runtime_packages_are_what_the_binaries_load(facts, runtime):
    needed = shared_library_packages(binaries())
    listed = set(apt_packages(runtime))
    # A CUDA build loads a few more (Debian) libraries, which the cuda stage adds.
    cuda_build = is_cuda_build(binaries()[0])
    available = listed | (set(apt_packages(stage(facts, "cuda"))) if cuda_build else set())
    missing = needed - BASE_PACKAGES - with_dependencies(available)
    assert not missing, f"missing from the {'cuda' if cuda_build else 'runtime'} stage: {missing}"
    assert listed <= needed, f"installed but not loaded: {listed - needed}"


def test_cuda_stage_installs_the_cuda_libraries_a_cuda_build_loads(facts):
    cuda_libs = {os.path.basename(p).split(".so")[0]
                 for binary in binaries() for p in loaded_libraries(binary) if is_cuda_toolkit(p)}
    if not cuda_libs:
        pytest.skip("this build has no CUDA backend (FPA_HAVE_CUDA off)")
    # NVIDIA's package of each library the CUDA build loads.
    packages = {"libcudart": "cuda-cudart-", "libcublas": "libcublas-", "libcublasLt": "libcublas-"}
    assert cuda_libs <= set(packages), f"unexpected CUDA libraries: {cuda_libs - set(packages)}"
    installed = build_runs(facts, "cuda").split()
    for lib in cuda_libs:
        assert any(w.startswith(packages[lib]) for w in installed), f"cuda stage lacks {lib}"


def package_files(package):
    out = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True)
    skip = ("/usr/share/doc", "/usr/share/man", "/usr/share/lintian", "/usr/share/locale")
    return [p for p in out.stdout.splitlines()
            if p.startswith("/") and not p.startswith(skip)
            and (os.path.islink(p) or os.path.isfile(p))]


def place(src, rootfs, dest=None):
    """Puts src (a file, hard-linked or copied, or a symlink, as is) at rootfs + dest."""
    target = rootfs / (dest or src).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(target):
        return
    if os.path.islink(src):
        os.symlink(os.readlink(src), target)
        return
    try:
        os.link(src, target)  # cuBLAS alone is half a gigabyte
    except OSError:
        shutil.copy2(src, target)


def assemble_rootfs(rootfs, runtime, cuda, serve, probe, model):
    """The runtime stage as a directory: Debian 12's merged-/usr layout, the files of the
    packages it installs and of their dependencies (from the base's libc6 on), the
    alternatives links their maintainer scripts would make, for a CUDA build the cuda stage's
    packages and cudart and cuBLAS, the binaries, the model, and the image's user."""
    for top in ("bin", "sbin", "lib", "lib64"):
        (rootfs / "usr" / top).mkdir(parents=True, exist_ok=True)
        os.symlink(f"usr/{top}", rootfs / top)
    packages = BASE_PACKAGES | set(apt_packages(runtime))
    if is_cuda_build(serve):  # its Debian packages; NVIDIA's libraries are copied below
        packages |= {p for p in apt_packages(cuda) if "${CUDA_VERSION}" not in p}
    for package in sorted(with_dependencies(packages)):
        for path in package_files(package):
            place(path, rootfs)
    for binary in (serve, probe):
        place(str(binary), rootfs, f"/usr/local/bin/{binary.name}")
        for path in loaded_libraries(binary):
            real = os.path.realpath(path)
            if is_cuda_toolkit(path):
                place(real, rootfs)  # what the cuda stage's NVIDIA packages install
            link = rootfs / path.lstrip("/")
            if not os.path.lexists(link) and (rootfs / real.lstrip("/")).exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(real, link)
    (model_copy,) = [c for c in instructions(runtime, "COPY") if c["args"][0] == "${MODEL_DIR}"]
    shutil.copytree(model, rootfs / model_copy["args"][1].lstrip("/"))
    (user,) = instructions(runtime, "USER")
    uid, gid = user["args"][0].split(":")
    (rootfs / "etc").mkdir(exist_ok=True)
    (rootfs / "etc/passwd").write_text(
        f"root:x:0:0:root:/root:/bin/sh\nfpa:x:{uid}:{gid}::/nonexistent:/usr/sbin/nologin\n")
    (rootfs / "etc/group").write_text(f"root:x:0:\nfpa:x:{gid}:\n")
    os.chmod(rootfs, 0o755)


def in_rootfs(rootfs, userspec, argv):
    """argv run as userspec inside rootfs. chroot execs it, so the child's pid is the
    program's own and SIGTERM reaches it as `docker stop` would. No /proc, /sys, /dev or /tmp,
    and nothing writable by that user (as under the pods' readOnlyRootFilesystem): stricter
    than a container."""
    return ["chroot", f"--userspec={userspec}", str(rootfs), *argv]


def with_loopback_ports(args, grpc, metrics):
    """The image's arguments with its listen addresses moved to free loopback ports (the HTTP
    API's to any free one)."""
    out = []
    for arg in args:
        out.append(arg.replace(f"0.0.0.0:{grpc_port()}", f"127.0.0.1:{grpc}")
                   .replace(f"0.0.0.0:{metrics_port()}", f"127.0.0.1:{metrics}")
                   .replace(f"0.0.0.0:{http_port()}", "127.0.0.1:0")
                   .replace(f"127.0.0.1:{grpc_port()}", f"127.0.0.1:{grpc}"))
    return out


class Buildah:
    """buildah with its own storage in a test folder (vfs: no overlay mounts needed)."""

    def __init__(self, root):
        self.argv = [BUILDAH, "--root", str(root / "storage"), "--runroot", str(root / "run"),
                     "--storage-driver", "vfs"]

    def __call__(self, *args):
        result = subprocess.run([*self.argv, *map(str, args)], capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, f"buildah {args[0]}: {result.stderr}"
        return result.stdout.strip()


def containerfile(facts, variant):
    """FROM scratch, the assembled filesystem, then the image configuration of the runtime
    and variant stages (USER, ENTRYPOINT, CMD, HEALTHCHECK, ...) verbatim from the Dockerfile."""
    lines = ["FROM scratch", "COPY rootfs/ /"]
    for name in ("runtime", variant):
        lines += [i["text"] for i in stage(facts, name)["instructions"]
                  if i["keyword"] in IMAGE_CONFIG]
    return "\n".join(lines) + "\n"


def mounted(buildah, tag):
    """(the image's configuration as buildah recorded it, its filesystem mounted from buildah's
    store), then unmounted."""
    config = json.loads(buildah("inspect", "--type", "image", tag))["Docker"]["config"]
    container = buildah("from", tag)
    yield config, Path(buildah("mount", container))
    buildah("umount", container)
    buildah("rm", container)


@pytest.fixture(scope="module")
def image(facts, runtime, tmp_path_factory):
    """The runtime image: FPA_IMAGE from buildah's store FPA_IMAGE_STORE (built from this
    Dockerfile by tests/fresh), or else this build's variant assembled by buildah without a
    registry."""
    if os.geteuid() != 0:
        pytest.skip("chroot and buildah's storage need root")
    if BUILDAH is None:
        pytest.skip("buildah (Debian's) absent")
    if os.environ.get("FPA_IMAGE"):
        yield from mounted(Buildah(Path(os.environ["FPA_IMAGE_STORE"])), os.environ["FPA_IMAGE"])
        return
    serve, probe = binaries()
    model = model_for_tests()
    if model is None:
        pytest.skip("no model yet (models/fpa-v2 or tests/vectors/fpa_free)")
    work = tmp_path_factory.mktemp("image")
    variant = "cuda" if is_cuda_build(serve) else "cpu"
    assemble_rootfs(work / "context/rootfs", runtime, stage(facts, "cuda"), serve, probe, model)
    (work / "context/Containerfile").write_text(containerfile(facts, variant))
    buildah = Buildah(work)
    tag = f"localhost/fpa-serve:{variant}"
    # Docker format: OCI image configs have no HEALTHCHECK.
    buildah("build", "--isolation", "chroot", "--format", "docker", "--tag", tag,
            work / "context")
    yield from mounted(buildah, tag)
    shutil.rmtree(work)  # a CUDA build's image holds cuBLAS: gigabytes in vfs layers


def test_image_config_is_the_dockerfiles(image, runtime):
    config, _ = image
    entrypoint, cmd = entrypoint_and_cmd(runtime)
    (user,) = instructions(runtime, "USER")
    assert (config["Entrypoint"], config["Cmd"], config["User"]) == (entrypoint, cmd,
                                                                     user["args"][0])
    assert config["Healthcheck"]["Test"] == ["CMD", *healthcheck_command(runtime)]
    assert set(config["ExposedPorts"]) == {f"{p}/tcp" for p in (grpc_port(), metrics_port(),
                                                                 http_port())}
    assert config["StopSignal"] == "SIGTERM"


def test_image_serves_as_its_user_and_passes_its_healthcheck(image, tmp_path):
    config, rootfs = image
    grpc, metrics = free_port(), free_port()
    argv = with_loopback_ports(config["Entrypoint"] + config["Cmd"] + ["--threads", "1"],
                               grpc, metrics)
    kind, *healthcheck = config["Healthcheck"]["Test"]
    assert kind == "CMD"
    healthcheck = with_loopback_ports(healthcheck, grpc, metrics)
    user = config["User"]
    with Process(in_rootfs(rootfs, user, argv), tmp_path / "serve.log") as server:
        def healthy():
            check = subprocess.run(in_rootfs(rootfs, user, healthcheck),
                                   capture_output=True, text=True, timeout=30)
            return check.returncode == 0 and check.stdout.strip() == "SERVING"
        wait_until(healthy, "the image's HEALTHCHECK", server, timeout=120)
        assert "fpa_requests_running" in scrape(f"http://127.0.0.1:{metrics}/metrics")
        started = time.monotonic()
        assert server.terminate(timeout=15) == 0, server.log_text()
        assert time.monotonic() - started < 15
