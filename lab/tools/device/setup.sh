# Device calls from the second on: `source lab/tools/device/setup.sh;` first. Joins the bundle's
# halves (the second from .gpu2/ where this call carries it), installs it once per machine
# (.gpu/setup-device.sh: the CuTe DSL, flash-attn-4, and FlashAttention-3 where .fa3/ arrived),
# and defines `left LIMIT` (seconds left of LIMIT since T0) for timeouts.
# The device's checkout is replaced at every call: write every result under $OUT (--out $OUT/...).
if [ -d .gpu2 ]; then mkdir -p /tmp/gpustage && cp -r .gpu2/. /tmp/gpustage/; fi
if ls /tmp/gpustage/libs-cu13.tar.xz.part_* >/dev/null 2>&1; then
  cat /tmp/gpustage/libs-cu13.tar.xz.part_* > /tmp/gpustage/libs-cu13.tar.xz && rm -f /tmp/gpustage/libs-cu13.tar.xz.part_*
fi
[ -e .gpu ] || ln -s /tmp/gpustage .gpu
source .gpu/setup-device.sh
T0=${T0:-$(date +%s)}
left() { echo $(( $1 - ($(date +%s) - T0) )); }
