# The CUDA build container of the kernel stage (builder/container.py builds it with
# docker-py; see README "Kernels"). It is the base image plus a venv with the builder;
# the container runs `python -m builder kernels --request ...`, the same code as host mode.
#
# BASE: NVIDIA's CUDA devel image of the target's lane by default (TOOLKIT=base, nvcc at
# /usr/local/cuda), or any image with python3 and its venv module (TOOLKIT=pypi: the
# build environment then installs nvcc, CCCL, cuBLAS and cuRAND from NVIDIA's PyPI wheels,
# so no NVIDIA registry is needed). The build context holds the builder's source and a
# wheelhouse of its requirements; the build needs no network.
ARG BASE=nvidia/cuda:12.9.1-devel-ubuntu24.04

FROM ${BASE} AS install
COPY wheelhouse/ /tmp/wheelhouse/
RUN python3 -m venv /opt/builder \
 && /opt/builder/bin/pip install --quiet --no-index --find-links /tmp/wheelhouse \
      --disable-pip-version-check $(ls /tmp/wheelhouse/*.whl)
COPY builder/ /opt/builder/src/builder/
# The builder runs from its source folder; a .pth file puts it on the venv's path.
RUN echo /opt/builder/src > "$(/opt/builder/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sglang_sm120_builder.pth"

# Final stage: the wheelhouse stays behind in the first one.
FROM ${BASE}
ARG TOOLKIT=base
LABEL org.opencontainers.image.title="sglang-sm120 kernel build container" \
      io.github.sglang-sm120.toolkit="${TOOLKIT}"
COPY --from=install /opt/builder/ /opt/builder/
# The kernel build never runs git; gitpython must not refuse to import without it.
ENV PYTHONDONTWRITEBYTECODE=1 GIT_PYTHON_REFRESH=quiet
WORKDIR /cache
