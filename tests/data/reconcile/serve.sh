#!/bin/sh
# An inference server: runs until stopped, and records the devices it was given.
mkdir -p "$TESSERA_CHECKPOINT_DIR"
echo "$CUDA_VISIBLE_DEVICES" > "$TESSERA_CHECKPOINT_DIR/devices-$TESSERA_REPLICA"
# Bounded, so that a test that fails never leaves it running for long.
i=0
while [ "$i" -lt 3000 ]; do i=$((i + 1)); sleep 0.1; done
