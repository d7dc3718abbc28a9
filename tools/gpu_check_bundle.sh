#!/usr/bin/env bash
# On the GPU machine, from .gpu/ (tools/pack_gpu.sh): the bundle example with every compiler on
# the machine made unavailable (ptxas, nvJitLink, nvrtc, the nvptx compiler library, PyTorch's
# and Triton's copies included), replaced by empty files in a private mount namespace.
set -u
cd "${1:-.gpu}"
export LD_LIBRARY_PATH=$PWD
mapfile -t compilers < <(find /usr /opt /root /home -xdev \( -name ptxas -o -name 'libnvJitLink.so*' -o -name 'libnvrtc*.so*' \
  -o -name 'libnvptxcompiler*' \) \( -type f -o -type l \) 2>/dev/null)
echo "== ${#compilers[@]} compiler files on this machine, e.g.: ${compilers[*]:0:3}"
if unshare -m --propagation private true 2>/dev/null; then
  unshare -m --propagation private bash -c '
    for f in "$@"; do [ -f "$f" ] && mount --bind /dev/null "$(readlink -f "$f")"; done
    echo "ptxas now: $(ptxas --version 2>&1 | head -1)"
    exec ./bundle_app ./bundle_app.tjb' bash "${compilers[@]}"
  echo "bundle_app exit status: $?"
else
  echo "(no mount namespaces here: hiding the compilers from PATH/CUDA_HOME only)"
  env PATH=/usr/bin:/bin CUDA_HOME=/nonexistent CUDA_PATH=/nonexistent TILEJIT_PTXAS=/nonexistent ./bundle_app ./bundle_app.tjb
  echo "bundle_app exit status: $?"
fi
