#!/usr/bin/env bash
# Install the carried SGLang 0.5.16 wheel set on the device.
# Usage (from the repo root, after every carry call did `cp -r .cache/dev516/cN /root/keep/`):
#   bash reports/2026-12-01-h200-serving/install.sh [KEEP_DIR=/root/keep] [TARGET=/tmp/site16]
# then run with PYTHONPATH=/tmp/site16 (ahead of the device's own packages).
# Reassembles split wheels (NAME.partNN), checks every sha256 against SHA256SUMS beside it (exit 1 on
# a mismatch or a missing required wheel; the wheels named in OPTIONAL beside it may be absent),
# and installs them all with pip --no-index --no-deps into TARGET.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KEEP="${1:-/root/keep}"
TARGET="${2:-/tmp/site16}"
WORK="$(mktemp -d /tmp/wheels16.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

shopt -s nullglob
# gather whole wheels and parts from every carried folder
for f in "$KEEP"/c*/*.whl; do cp -f "$f" "$WORK/"; done
declare -A PARTS=()
for p in "$KEEP"/c*/*.whl.part*; do
  b="$(basename "$p")"; PARTS["${b%.part*}"]=1
done
for w in "${!PARTS[@]}"; do
  mapfile -t plist < <(ls -1 "$KEEP"/c*/"$w".part* | awk -F/ '{print $NF"\t"$0}' | sort | cut -f2)
  for i in "${!plist[@]}"; do  # parts must be .part00 .. .partNN with none missing
    [[ "${plist[$i]}" == *".part$(printf %02d "$i")" ]] || { echo "MISSING PART: $w part $(printf %02d "$i") (carry every cN folder)" >&2; exit 1; }
  done
  cat "${plist[@]}" > "$WORK/$w"
  echo "reassembled $w from ${#plist[@]} parts"
done

# check sha256 of everything listed; optional wheels may be absent
bad=0; n=0
declare -A OPT=()
if [[ -f "$HERE/OPTIONAL" ]]; then while read -r o; do [[ -n "$o" ]] && OPT["$o"]=1; done < "$HERE/OPTIONAL"; fi
declare -a INSTALL=()
while read -r sum name; do
  [[ -z "${name:-}" ]] && continue
  if [[ ! -f "$WORK/$name" ]]; then
    if [[ -n "${OPT[$name]:-}" ]]; then echo "optional, not carried: $name"; continue; fi
    echo "MISSING: $name" >&2; bad=1; continue
  fi
  got="$(sha256sum "$WORK/$name" | cut -d' ' -f1)"
  if [[ "$got" != "$sum" ]]; then echo "SHA256 MISMATCH: $name ($got != $sum)" >&2; bad=1; continue; fi
  INSTALL+=("$WORK/$name"); n=$((n + 1))
done < "$HERE/SHA256SUMS"
for f in "$WORK"/*.whl; do
  grep -q "  $(basename "$f")\$" "$HERE/SHA256SUMS" || { echo "NOT IN SHA256SUMS: $(basename "$f")" >&2; bad=1; }
done
if [[ $bad -ne 0 ]]; then echo "install.sh: refusing to install (see above)" >&2; exit 1; fi
echo "sha256 ok for $n wheels; installing into $TARGET"

mkdir -p "$TARGET"
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$TARGET" "${INSTALL[@]}"
echo "installed $n wheels into $TARGET; run with: PYTHONPATH=$TARGET python3 -m sglang.launch_server ..."
