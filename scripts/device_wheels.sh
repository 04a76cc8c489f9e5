#!/usr/bin/env bash
# Here (not on the device): download the peers' wheels for the device machine (x86-64, CPython 3.12, no internet
# there) into .whl/ (ignored by git), which the device scripts install from (scripts/device_env.sh). The versions are
# those of the recorded runs (README, data/README.md). FlashMLA needs only its wheel; FlashInfer also the
# dependencies its metadata names that the device image lacks (apache-tvm-ffi, nvidia-cudnn-frontend, cuda-tile,
# nccl4py; with them `flashinfer.mla` imports under CPython 3.12 and the image's other packages, checked on a CPU on
# 2026-12-07; its JIT build on the device is untried). About 47 MB of the 64 MiB a device call may carry;
# `PEERS=flashmla` fetches FlashMLA alone (10 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
pkgs=("sgl-flash-mla==1.0.0")
if [ "${PEERS:-flashmla,flashinfer}" != flashmla ]; then
  pkgs+=("flashinfer-python==0.6.18.post1" "apache-tvm-ffi==0.1.15.post2" "nvidia-cudnn-frontend==1.32.0"
         "cuda-tile==1.7.0" "nccl4py==0.6.0")
fi
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  plat+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d .whl "${pkgs[@]}"
ls -la .whl
