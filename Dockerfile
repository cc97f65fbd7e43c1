# vLLM with the DeepSeek-V4 sparse-MLA fixes, built from a pinned lock entry.
#
#   docker build $(docker/build-args.sh --pin 0.27.1) -t vllm-dsv4:0.27.1 .
#
# Stages:
#   patch    dsv4patch applies the pin's series to the pinned vLLM source
#            (/opt/vllm-src), checks it against the lock and stages the changed
#            vllm/*.py files plus a hash manifest.  CPU only; runs offline when
#            the build context has sdists/ (and wheels/ for dsv4patch's deps).
#   kernels  nvcc + torch: `dsv4patch build` compiles only the CUDA units the
#            patches touch into a plugin wheel (/opt/kernels/*.whl).
#   final    the stock vLLM image of the same version, with the patched Python
#            files laid over the installed package and the kernel wheel installed,
#            self-checked against the manifest.
# No `# syntax=` line and no heredocs: this file must build with the Dockerfile
# frontend built into the daemon (no frontend image pull, works offline).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu22.04
ARG VLLM_VERSION=0.27.1
ARG VLLM_IMAGE=vllm/vllm-openai:v${VLLM_VERSION}

# ----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS patch

ARG VLLM_PIN=0.27.1
# Label values: compute them with docker/build-args.sh; this stage fails unless
# they equal what it derives from locks/vllm.toml.
ARG VLLM_VERSION
ARG VLLM_COMMIT=
ARG PATCHED_TREE=
ARG PATCH_SET_SHA256=
ARG LOCK_SHA256=
ARG IMAGE_VERSION=

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
# The context is allow-listed by .dockerignore: pyproject.toml, dsv4patch/,
# locks/, patches/, docker/, plus the optional sdists/ and wheels/.
COPY . /src/

# wheels/ (optional): dsv4patch's dependencies and setuptools, for an offline build.
RUN python3 -m venv /opt/dsv4patch-venv \
    && if ls wheels/*.whl >/dev/null 2>&1; then \
        pip install --no-index --find-links wheels . ; \
    else \
        pip install . ; \
    fi \
    && dsv4patch --version

ENV VLLM_PIN=${VLLM_PIN} \
    VLLM_VERSION=${VLLM_VERSION} \
    VLLM_COMMIT=${VLLM_COMMIT} \
    PATCHED_TREE=${PATCHED_TREE} \
    PATCH_SET_SHA256=${PATCH_SET_SHA256} \
    LOCK_SHA256=${LOCK_SHA256} \
    IMAGE_VERSION=${IMAGE_VERSION}

# Build args vs lock, then seed the cache from sdists/ (dsv4patch fetch --sdist).
RUN python3 docker/patch_stage.py preflight

# Fails the build (exit 1) unless every patch has the status the lock expects
# and the result is the lock's patched_tree.
RUN dsv4patch apply --lock locks/vllm.toml --pin "${VLLM_PIN}" --tree /opt/vllm-src \
        --no-build --format json > /opt/dsv4patch-apply.json \
    || { cat /opt/dsv4patch-apply.json >&2; exit 1; }

# Cross-check the result, stage the changed vllm/ files (git diff base..HEAD -- vllm/)
# into /opt/vllm-overlay with /opt/dsv4patch/manifest.json, write labels.env.
RUN python3 docker/patch_stage.py stage \
    && cp docker/install_overlay.py /opt/dsv4patch/ \
    && cat /opt/dsv4patch/labels.env

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
FROM ${VLLM_IMAGE} AS final

ARG VLLM_PIN=0.27.1
ARG VLLM_VERSION
ARG VLLM_COMMIT=
ARG PATCHED_TREE=
ARG PATCH_SET_SHA256=
ARG LOCK_SHA256=
ARG IMAGE_VERSION=

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

COPY --from=patch /opt/dsv4patch /opt/dsv4patch
COPY --from=patch /opt/vllm-overlay /opt/dsv4patch/overlay
COPY --from=patch /opt/dsv4patch-apply.json /opt/dsv4patch/apply.json
COPY --from=kernels /opt/kernels /opt/dsv4patch/kernels

# Patched Python files over the installed package (refused unless the installed
# files are this pin's unpatched ones), then the kernel plugin wheel, then the
# self-check: installed files hash as in the manifest, vllm.__version__ matches.
RUN python3 /opt/dsv4patch/install_overlay.py install /opt/dsv4patch/overlay /opt/dsv4patch/manifest.json \
    && if python3 -m pip --version >/dev/null 2>&1; then \
        python3 -m pip install --no-cache-dir --no-deps /opt/dsv4patch/kernels/*.whl; \
    else \
        uv pip install --python "$(command -v python3)" --no-deps /opt/dsv4patch/kernels/*.whl; \
    fi \
    && python3 /opt/dsv4patch/install_overlay.py check /opt/dsv4patch/manifest.json \
    && dist="$(basename /opt/dsv4patch/kernels/*.whl | cut -d- -f1)" \
    && python3 -m "${dist}" install-hook \
    && python3 -m "${dist}" check --no-device

LABEL org.opencontainers.image.title="vLLM ${VLLM_VERSION} with the DeepSeek-V4 sparse-MLA fixes" \
      org.opencontainers.image.version="${IMAGE_VERSION}" \
      dev.dsv4patch.pin="${VLLM_PIN}" \
      dev.dsv4patch.vllm.version="${VLLM_VERSION}" \
      dev.dsv4patch.vllm.commit="${VLLM_COMMIT}" \
      dev.dsv4patch.patch-set.sha256="${PATCH_SET_SHA256}" \
      dev.dsv4patch.patched-tree="${PATCHED_TREE}" \
      dev.dsv4patch.lock.sha256="${LOCK_SHA256}"
