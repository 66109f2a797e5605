# The CUDA build container of the kernel stage (builder/kernels/container.py builds it with
# docker-py; see README "Kernels"). It is the base image plus a venv with the builder;
# the container runs `python -m builder kernels --request ...`, the same code as host mode.
#
# BASE: NVIDIA's CUDA devel image of the target's lane by default, by the digest of its
# [[kernel_base]] in images/pins.toml (`python -m builder pin-images`) (toolkit from the base,
# nvcc at /usr/local/cuda), or any image with python3, its venv module and g++ (toolkit
# from PyPI: the build environment installs nvcc, CCCL, cuBLAS and cuRAND from NVIDIA's
# wheels, so no NVIDIA registry is needed). The build context holds the builder's source
# (builder/) and a wheelhouse of its requirements (wheelhouse/); the build needs no network.
# Few instructions on purpose: with the vfs storage driver every step copies the rootfs.
# No default: the builder always passes a base (by digest unless --base-image says else).
ARG BASE

FROM ${BASE} AS install
COPY . /tmp/context/
RUN python3 -m venv /opt/builder \
 && /opt/builder/bin/pip install --quiet --no-index --disable-pip-version-check \
      --find-links /tmp/context/wheelhouse /tmp/context/wheelhouse/*.whl \
 && cp -r /tmp/context/builder /opt/builder/builder-src \
 && echo /opt/builder/builder-src > "$(/opt/builder/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sglang_sm120_builder.pth"

# The final image: the base and the venv; the wheelhouse stays behind in the first stage.
FROM ${BASE}
COPY --from=install /opt/builder/ /opt/builder/
