# Device call 1: keep the first half of the bundle (.gpu1/) in the machine's /tmp for the next call.
mkdir -p /tmp/gpustage && cp -r .gpu1/. /tmp/gpustage/ && ls /tmp/gpustage
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
