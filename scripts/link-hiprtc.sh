#!/usr/bin/env bash
# Make the plain names hip-python dlopens, libamdhip64.so and libhiprtc.so, resolve to ROCm
# 5.2.3's libamdhip64.so.5 from Debian bookworm (which carries hipRTC inside it).
#   as root:   bash scripts/link-hiprtc.sh       links beside libamdhip64.so.5 (a directory the loader
#                                                searches by file name; ldconfig's cache knows only sonames)
#   otherwise: bash scripts/link-hiprtc.sh DIR   links in DIR; then export LD_LIBRARY_PATH=DIR
set -euo pipefail
# awk reads to the end: one that exits at the first match leaves ldconfig writing to a closed pipe,
# and pipefail then ends the script with SIGPIPE's 141 (seen once in .ci/run).
lib=$(ldconfig -p | awk '/libamdhip64\.so\.5 / && !found {print $NF; found = 1}')
[ -n "$lib" ] || lib=/usr/lib/x86_64-linux-gnu/libamdhip64.so.5
[ -e "$lib" ] || { echo "libamdhip64.so.5 not found: apt-get install libamdhip64-5 libhiprtc-builtins5" >&2; exit 1; }
dir=${1:-$(dirname "$(readlink -f "$lib")")}
mkdir -p "$dir"
ln -sf "$lib" "$dir/libamdhip64.so"
ln -sf "$lib" "$dir/libhiprtc.so"
[ $# -eq 0 ] || echo "export LD_LIBRARY_PATH=$dir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
