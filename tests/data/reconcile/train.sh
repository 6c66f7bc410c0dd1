#!/bin/sh
# A training job as the embedded runtime sees one: it works until the checkpoint signal, then
# saves its step into $TESSERA_CHECKPOINT_DIR and exits 0. Started again with
# $TESSERA_RESUME_FROM set, it records that it resumed.
mkdir -p "$TESSERA_CHECKPOINT_DIR"
if [ -n "$TESSERA_RESUME_FROM" ]; then
  echo "resumed from $(cat "$TESSERA_RESUME_FROM/step" 2>/dev/null)" >> "$TESSERA_CHECKPOINT_DIR/resumed"
fi
echo "$CUDA_VISIBLE_DEVICES" > "$TESSERA_CHECKPOINT_DIR/devices-$TESSERA_REPLICA"
step=0
trap 'echo "$step" > "$TESSERA_CHECKPOINT_DIR/step"; exit 0' USR1
# Bounded, so that a test that fails never leaves it running for long.
while [ "$step" -lt 3000 ]; do
  step=$((step + 1))
  sleep 0.1
done
