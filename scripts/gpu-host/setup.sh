# Source this on an offline GPU host from the project's root:   . .gpu/setup.sh
# (prepare.sh copies it into the git-ignored .gpu/ folder beside the wheels, from scripts/gpu-host/).
#
# It installs the wheels in .gpu/wheels (see wheels.sh) and the project itself into /tmp/site without touching the
# network, and puts them on PYTHONPATH. flashinfer JIT-compiles its kernels on first use (XQA ~10 s each, the SM90
# prefill kernels 80-130 s); kernels saved with save-kernels.sh and unpacked into .gpu/aot (prepare.sh --kernels DIR),
# or carried compressed as one file .gpu/kernels.tgz (`cat DIR/kernels.tgz.* > .gpu/kernels.tgz`, unpacked here when
# .gpu/aot is absent), are installed as flashinfer's prebuilt (AOT) kernels, so they load at once.
_gpu=${GPU_DIR:-.gpu}
mkdir -p /tmp/site "$_gpu/jit"
if [ -f "$_gpu/kernels.tgz" ] && [ ! -d "$_gpu/aot" ]; then
  tar xzf "$_gpu/kernels.tgz" -C "$_gpu" || { echo "gpu-host setup: unpacking $_gpu/kernels.tgz failed" >&2; return 1 2>/dev/null || exit 1; }
fi
if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$_gpu"/wheels/*.whl; then
  echo "gpu-host setup: installing the wheels in $_gpu/wheels failed" >&2; return 1 2>/dev/null || exit 1
fi
if [ -f pyproject.toml ]; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
    || { echo "gpu-host setup: installing the project failed" >&2; return 1 2>/dev/null || exit 1; }
fi
if [ -d "$_gpu/aot" ]; then
  mkdir -p /tmp/site/flashinfer/data/aot
  cp -r "$_gpu"/aot/. /tmp/site/flashinfer/data/aot/
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
export PYTHONUNBUFFERED=1
export FLASHINFER_WORKSPACE_BASE=$(cd "$_gpu/jit" && pwd)
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
# Compile only for the GPU that is here (e.g. 9.0a on Hopper, 10.0a on Blackwell).
_cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
[ -n "$_cc" ] && export FLASHINFER_CUDA_ARCH_LIST="${_cc}a"
python3 -c "import torch, flashinfer; print('gpu-host setup: torch', torch.__version__, '| flashinfer', flashinfer.__version__, '|', torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
unset _gpu _cc
