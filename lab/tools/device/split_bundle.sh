#!/usr/bin/env bash
# Splits the CuTe-DSL bundle in .gpu/ (about 60 MiB) into .gpu1/ and .gpu2/ of about 30 MiB each, so
# that each travels beside the checkout (about 27 MiB) within one device call's 64 MiB:
#   call 1: carry [".gpu1"], run `bash lab/tools/device/stage.sh`
#   call 2 (at once, the machine is given back after about 30 s idle): carry [".gpu2"], start the
#   command with `source lab/tools/device/setup.sh;`; later calls on the warm machine source it too
#   and carry neither (FlashAttention-3's .fa3/ travels alone, in a later call).
set -euo pipefail
root="$(git rev-parse --show-toplevel)"
cd "$root"
[ -f .gpu/libs-cu13.tar.xz ] || { echo "split_bundle: no .gpu/libs-cu13.tar.xz here (build the bundle first)" >&2; exit 2; }
rm -rf .gpu1 .gpu2 && mkdir .gpu1 .gpu2
split -b 30M -d .gpu/libs-cu13.tar.xz .gpu1/libs-cu13.tar.xz.part_
mv .gpu1/libs-cu13.tar.xz.part_0[1-9] .gpu2/
cp .gpu/*.whl .gpu/setup-device.sh .gpu2/
for d in /.gpu1/ /.gpu2/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
du -sh .gpu1 .gpu2
