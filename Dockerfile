# vLLM with the DeepSeek-V4 sparse-MLA fixes, built from a pinned lock entry.
#
#   docker build $(dsv4patch lock --build-args --pin 0.27.1) -t vllm-dsv4:0.27.1 .
#
# Stages:
#   patch    dsv4patch applies the pin's series to the pinned vLLM source
#            (/opt/vllm-src) and checks it against the lock.  CPU only; runs
#            offline when the build context has sdists/ (and wheels/ for
#            dsv4patch's deps).
#   kernels  nvcc + torch: `dsv4patch build` compiles only the CUDA units the
#            patches touch into a kernel wheel (/opt/kernels/*.whl).  With
#            KERNELS_STAGE=kernels-context the wheel comes from kernels/ in the
#            build context instead (made by `dsv4patch build` elsewhere).
#   wheel    `dsv4patch wheel`: the pin's stock vLLM wheel (lock sha256; from
#            vllm-wheels/ in the context or the package index) with the patched
#            files and the kernel library: vllm-<version>+dsv4.<hash>-*.whl.
#   final    the stock vLLM image of the same version with that wheel installed
#            (pip --no-deps), self-checked by `dsv4patch status --installed`.
# No `# syntax=` line and no heredocs: this file must build with the Dockerfile
# frontend built into the daemon (no frontend image pull, works offline).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu22.04
ARG VLLM_VERSION=0.27.1
ARG VLLM_IMAGE=vllm/vllm-openai:v${VLLM_VERSION}
# The stage the kernel wheel comes from: kernels (built here) or kernels-context.
ARG KERNELS_STAGE=kernels

# ----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS patch

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DSV4PATCH_CACHE=/var/cache/dsv4patch \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/dsv4patch-venv/bin:$PATH

# git is what dsv4patch drives; python:*-slim lacks it, a base image that has it
# (e.g. an offline test image) skips apt entirely.
# DL3008 (pin apt versions): git only applies patches; the result is pinned by the
# lock's patched_tree, which the stage checks, not by the git version.
# hadolint ignore=DL3008
RUN if ! command -v git >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends git ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && git --version

WORKDIR /src
# dsv4patch itself first (a wildcard may match nothing: LICENSE and wheels/ are optional), so
# that its install layer is reused when only locks/, patches/ or the pin's files change.
# wheels/ (optional): dsv4patch's dependencies and setuptools, for an offline build.
COPY pyproject.toml README.md LICENS[E] /src/
COPY dsv4patch/ /src/dsv4patch/
COPY wheel[s]/ /src/wheels/

# dsv4patch and its dependencies as wheels (built once), for this venv and the final stage's
# self-check.
RUN python3 -m venv /opt/dsv4patch-venv \
    && if ls wheels/*.whl >/dev/null 2>&1; then \
        pip wheel --no-index --find-links wheels --wheel-dir /opt/dsv4patch/wheels . ; \
    else \
        pip wheel --wheel-dir /opt/dsv4patch/wheels . ; \
    fi \
    && pip install --no-index --find-links /opt/dsv4patch/wheels /opt/dsv4patch/wheels/dsv4patch-*.whl \
    && dsv4patch --version

# The rest of the context, allow-listed by .dockerignore: locks/, patches/, plus the
# optional sdists/, vllm-wheels/ and kernels/.
COPY . /src/

ARG VLLM_PIN=0.27.1
# Label values: compute them with `dsv4patch lock --build-args`; this stage fails unless
# they equal what it derives from locks/vllm.toml.  Declared after the install steps, so
# that a build with other values (a new IMAGE_VERSION, a wrong arg) reuses their layers.
ARG VLLM_VERSION
ARG VLLM_COMMIT=
ARG PATCHED_TREE=
ARG PATCH_SET_SHA256=
ARG LOCK_SHA256=
ARG IMAGE_VERSION=

ENV VLLM_PIN=${VLLM_PIN} \
    VLLM_VERSION=${VLLM_VERSION} \
    VLLM_COMMIT=${VLLM_COMMIT} \
    PATCHED_TREE=${PATCHED_TREE} \
    PATCH_SET_SHA256=${PATCH_SET_SHA256} \
    LOCK_SHA256=${LOCK_SHA256} \
    IMAGE_VERSION=${IMAGE_VERSION}

# Build args vs lock (labels can never disagree with what is built), then seed the
# cache from sdists/ (offline builds: only files the lock pins are accepted).
RUN dsv4patch lock --lock locks/vllm.toml --check-build-args \
    && set -- \
    && for f in sdists/*; do if [ -f "$f" ]; then set -- "$@" --sdist "$f"; fi; done \
    && if [ "$#" -gt 0 ]; then dsv4patch fetch --lock locks/vllm.toml --pin "${VLLM_PIN}" "$@"; fi

# Fails the build (exit 1) unless every patch has the status the lock expects
# and the result is the lock's patched_tree; status cross-checks the tree.
RUN dsv4patch apply --lock locks/vllm.toml --pin "${VLLM_PIN}" --tree /opt/vllm-src \
        --no-build --format json > /opt/dsv4patch-apply.json \
    || { cat /opt/dsv4patch-apply.json >&2; exit 1; }
RUN dsv4patch status --tree /opt/vllm-src --lock locks/vllm.toml --pin "${VLLM_PIN}"

LABEL org.opencontainers.image.title="dsv4patch patched vLLM source" \
      org.opencontainers.image.version="${IMAGE_VERSION}" \
      dev.dsv4patch.pin="${VLLM_PIN}" \
      dev.dsv4patch.vllm.version="${VLLM_VERSION}" \
      dev.dsv4patch.vllm.commit="${VLLM_COMMIT}" \
      dev.dsv4patch.patch-set.sha256="${PATCH_SET_SHA256}" \
      dev.dsv4patch.patched-tree="${PATCHED_TREE}" \
      dev.dsv4patch.lock.sha256="${LOCK_SHA256}"

# ----------------------------------------------------------------------------
FROM ${CUDA_DEVEL_IMAGE} AS kernels

ARG VLLM_PIN=0.27.1
# vLLM's names: ';'- or space-separated arch list (empty = the lock's cuda_arch_list, else
# the arch list of vLLM's own release wheels, read from the tree: every GPU the stock wheel covers),
# parallel compile jobs and nvcc threads per job.
ARG torch_cuda_arch_list=""
ARG max_jobs=2
ARG nvcc_threads=1
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    DSV4PATCH_CACHE=/var/cache/dsv4patch \
    DSV4PATCH_TORCH_PYTHON=/opt/dsv4patch-venv/bin/python \
    MAX_JOBS=${max_jobs} \
    NVCC_THREADS=${nvcc_threads} \
    TORCH_CUDA_ARCH_LIST=${torch_cuda_arch_list} \
    PATH=/opt/dsv4patch-venv/bin:$PATH

# DL3008 (pin apt versions): versions differ per CUDA base image; the toolchain that
# matters (nvcc, torch) is pinned by CUDA_DEVEL_IMAGE and the vLLM tree.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

COPY --from=patch /src /src
COPY --from=patch /opt/vllm-src /opt/vllm-src
WORKDIR /src

# torch: the exact version the pinned vLLM requires (its requirements/cuda.txt),
# whose headers and libraries the kernels are compiled against.
RUN python3 -m venv /opt/dsv4patch-venv \
    && torch_version="$(sed -n 's/^torch==\([^ #]*\).*/\1/p' /opt/vllm-src/requirements/cuda.txt)" \
    && test -n "${torch_version}" \
    && pip install . \
    && pip install --extra-index-url "${TORCH_INDEX_URL}" "torch==${torch_version}"

RUN set -- \
    && for a in $(echo "${torch_cuda_arch_list}" | tr ';' ' '); do set -- "$@" --arch "$a"; done \
    && dsv4patch build --lock locks/vllm.toml --pin "${VLLM_PIN}" --tree /opt/vllm-src \
        "$@" --out /opt/kernels --format json > /opt/kernels-build.json \
    && ls /opt/kernels/*.whl

# ----------------------------------------------------------------------------
# The kernel wheel from the build context (kernels/*.whl, made by `dsv4patch build`
# for this pin elsewhere); used only with --build-arg KERNELS_STAGE=kernels-context.
FROM scratch AS kernels-context
COPY kernels/ /opt/kernels/

FROM ${KERNELS_STAGE} AS kernel-wheel

# ----------------------------------------------------------------------------
FROM patch AS wheel

ARG TARGETARCH

COPY --from=kernel-wheel /opt/kernels /opt/kernels

# The stock wheel: from vllm-wheels/ in the context (offline), else the package index
# (PIP_INDEX_URL etc., checked against the lock's sha256).
RUN set -- \
    && for f in vllm-wheels/*.whl; do if [ -f "$f" ]; then set -- "$@" --wheel "$f"; fi; done \
    && if [ "$#" -gt 0 ]; then dsv4patch fetch --lock locks/vllm.toml --pin "${VLLM_PIN}" "$@"; fi \
    && case "${TARGETARCH:-amd64}" in \
        amd64) platform=x86_64 ;; \
        arm64) platform=aarch64 ;; \
        *) echo "unsupported TARGETARCH ${TARGETARCH}" >&2; exit 1 ;; \
    esac \
    && if ! dsv4patch wheel --lock locks/vllm.toml --pin "${VLLM_PIN}" --platform "${platform}" \
            --kernels /opt/kernels/*.whl --out /opt/dist --format json > /opt/dsv4patch-wheel.json; then \
        cat /opt/dsv4patch-wheel.json >&2; exit 1; \
    fi

# ----------------------------------------------------------------------------
FROM ${VLLM_IMAGE} AS final

ARG VLLM_PIN=0.27.1
ARG VLLM_VERSION
ARG VLLM_COMMIT=
ARG PATCHED_TREE=
ARG PATCH_SET_SHA256=
ARG LOCK_SHA256=
ARG IMAGE_VERSION=
# 1: also check which kernels torch's dispatcher runs (`check --no-device` loads the
# CUDA image's forward-compatibility libcuda); 0 where the base has no CUDA libraries.
ARG KERNEL_DISPATCH_CHECK=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# `dsv4patch status --installed` in the image (health checks, `docker run`) checks the
# vLLM of the image's python3 and compares with this lock, offline (cache from `patch`).
ENV DSV4PATCH_CACHE=/var/cache/dsv4patch \
    DSV4PATCH_LOCK=/opt/dsv4patch/locks/vllm.toml \
    DSV4PATCH_VLLM_PYTHON=python3

COPY --from=wheel /opt/dist /opt/dsv4patch/dist
COPY --from=wheel /opt/dsv4patch-wheel.json /opt/dsv4patch/wheel.json
COPY --from=patch /opt/dsv4patch-apply.json /opt/dsv4patch/apply.json
COPY --from=patch /opt/dsv4patch/wheels /opt/dsv4patch/wheels
COPY --from=patch /src/locks /opt/dsv4patch/locks
COPY --from=patch /src/patches /opt/dsv4patch/patches
COPY --from=patch /var/cache/dsv4patch /var/cache/dsv4patch

# The patched vLLM wheel over the stock one (same version, dependencies already
# installed), dsv4patch in its own venv, then the self-check: every patch present
# in the installed vLLM and the kernel library of the patched tree installed.
RUN if python3 -m pip --version >/dev/null 2>&1; then \
        python3 -m pip install --no-cache-dir --no-deps --force-reinstall /opt/dsv4patch/dist/vllm-*.whl; \
    else \
        uv pip install --python "$(command -v python3)" --no-deps --reinstall /opt/dsv4patch/dist/vllm-*.whl; \
    fi \
    && python3 -m venv /opt/dsv4patch-venv \
    && /opt/dsv4patch-venv/bin/pip install --no-cache-dir --no-index \
        --find-links /opt/dsv4patch/wheels dsv4patch \
    && ln -s /opt/dsv4patch-venv/bin/dsv4patch /usr/local/bin/dsv4patch \
    && python3 -c 'import glob, zipfile; z = zipfile.ZipFile(glob.glob("/opt/dsv4patch/dist/vllm-*.whl")[0]); n = [m for m in z.namelist() if m.endswith(".dist-info/sboms/dsv4patch.cdx.json")]; open("/opt/dsv4patch/sbom.cdx.json", "wb").write(z.read(n[0]))' \
    && dsv4patch status --installed --python "$(command -v python3)" --pin "${VLLM_PIN}" \
    && if [ "${KERNEL_DISPATCH_CHECK}" = 1 ]; then \
        python3 -m "dsv4patch_kernels_$(echo "${VLLM_PIN}" | tr -cs 'A-Za-z0-9\n' '_')" check --no-device; \
    fi

LABEL org.opencontainers.image.title="vLLM ${VLLM_VERSION} with the DeepSeek-V4 sparse-MLA fixes" \
      org.opencontainers.image.version="${IMAGE_VERSION}" \
      dev.dsv4patch.pin="${VLLM_PIN}" \
      dev.dsv4patch.vllm.version="${VLLM_VERSION}" \
      dev.dsv4patch.vllm.commit="${VLLM_COMMIT}" \
      dev.dsv4patch.patch-set.sha256="${PATCH_SET_SHA256}" \
      dev.dsv4patch.patched-tree="${PATCHED_TREE}" \
      dev.dsv4patch.lock.sha256="${LOCK_SHA256}" \
      dev.dsv4patch.sbom="/opt/dsv4patch/sbom.cdx.json"
