#!/bin/bash
# Run 2 behind results.md: build/ is the change (closes recorded without the device lock), base/
# main at ead088e (run 1's outcome: kFreesPerEvent 4, closes under the lock), alt/ the change with
# kFreesPerEvent 1 (run2-alt.patch). Run as `bash run2.sh OUT` beside run.sh.
TORCH_REPS=4 TORCH_CONFIGS="caching default vmm_barrier vmm_barrier_base vmm_barrier_alt" TAR_LOGS=1 \
  exec bash "$(dirname "$0")/run.sh" "$@"
