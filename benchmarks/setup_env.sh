#!/usr/bin/env bash
# Creates benchmarks/.venv: the project itself (editable) plus the peers it is
# compared against. Peers live only here, never in the project's dependencies.
#
# Idempotent: a stamp file records what was installed; delete benchmarks/.venv
# (or the stamp) to start over. Set PYTHON to choose the interpreter.
#
# torch is pinned to the exact CPU build: any looser spec resolves to a CUDA
# build of several GB.
#
# The project goes in with its beam extra (benchmarks/convert.py). The peer there is
# array_record's own Beam pipeline, array_record.beam, which array-record itself
# ships; its module imports google.cloud.storage, hence that peer (and TensorFlow,
# for a demo generator only: convert.py stands a placeholder module in for it). The separate
# array-record-beam-sdk package is not installed: it pins array-record==0.5.0 (a
# downgrade of the reader the project uses) and pulls TensorFlow (~570 MB).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/.." && pwd)"
VENV="${HERE}/.venv"
PY="${VENV}/bin/python"
PYTHON="${PYTHON:-python3}"

PEERS=(
  "grain==0.2.18"
  "torch==2.13.0"
  "pillow"
  "psutil"
  "google-cloud-storage"
  "pandas"  # Ray Data (ray_executor.py's peer row) needs it; ray itself comes with the ray extra
  # resume_matrix.py's peers. torchvision (LitData needs it) is pinned to the release built
  # for torch 2.13: the newest pulls torch 2.14 and CUDA. mosaicml-streaming is not here:
  # every release requires numpy<2.2 and transformers<5; it gets an environment of its
  # own, benchmarks/.venv-mosaic (below).
  "torchdata==0.11.0"
  "datasets==5.2.0"
  "litdata==0.2.76"
  "torchvision==0.28.0"
)
# The project's extras the benchmarks need (tfrecord: streaming.py writes TFRecord files;
# beam: convert.py runs the Beam conversion; ray: ray_executor.py's RayExecutor and Ray Data rows).
EXTRAS="tfrecord,beam,tokenizers,ray"
STAMP="${VENV}/.bench-stamp"
# The stamp's content: change either list (or setup.cfg) and the install reruns.
WANT="$(printf '%s\n' "${PEERS[@]}" "${EXTRAS}"; cat "${ROOT}/setup.cfg" "${ROOT}/setup.py")"

# benchmarks/.venv-mosaic: MosaicML streaming for the resume matrix's mosaic-streaming
# column, whose child processes run there (they import numpy, torch and streaming, never
# granary or JAX). mosaicml-streaming 0.13.0 declares every cloud client (boto3, Google
# Cloud Storage, Azure, OCI, paramiko) and matplotlib as requirements; none is imported
# for shards on a local disk, so it goes in with --no-deps, beside the packages its
# modules import (their versions within its requirements): torch's CPU build,
# transformers<5 (StreamingDataLoader), the compressors (brotli, python-snappy, zstd),
# xxhash, catalogue, pillow, tqdm. torchvision is left out: only streaming.vision (image
# data sets) imports it, PyPI's wheel fails to load beside torch's CPU build, and the
# column stands placeholders in for the two names it imports (resume/mosaic_cols.py).
# `pip check` lists the clients and torchvision as missing; that is expected. A failed
# install leaves the matrix's column saying so in every cell; the rest of the
# benchmarks are unaffected.
MOSAIC_VENV="${HERE}/.venv-mosaic"
MOSAIC_PY="${MOSAIC_VENV}/bin/python"
MOSAIC_STAMP="${MOSAIC_VENV}/.bench-stamp"
TORCH_CPU="https://download.pytorch.org/whl/cpu"
MOSAIC_BASE=("torch==2.13.0+cpu" "numpy>=1.21.5,<2.2.0" "transformers>=4.21.3,<5"
             "xxhash>=3.0.0,<4" "python-snappy>=0.6.1,<1" "zstd>=1.5.2.5,<2" "Brotli>=1.0.9"
             "catalogue>=2,<3" "pillow" "tqdm>=4.64.0,<5")
MOSAIC="mosaicml-streaming==0.13.0"
MOSAIC_WANT="$(printf '%s\n' "${MOSAIC_BASE[@]}" "${MOSAIC}")"
if [[ ! -f "${MOSAIC_STAMP}" || "$(cat "${MOSAIC_STAMP}")" != "${MOSAIC_WANT}" ]]; then
  [[ -x "${MOSAIC_PY}" ]] || "${PYTHON}" -m venv "${MOSAIC_VENV}"
  MOSAIC_LOG="${MOSAIC_VENV}/install.log"
  echo "setting up ${MOSAIC_VENV} (log: ${MOSAIC_LOG}) ..."
  if { "${MOSAIC_PY}" -m pip install -q --upgrade pip &&
       "${MOSAIC_PY}" -m pip install -q --retries 1 --extra-index-url "${TORCH_CPU}" "${MOSAIC_BASE[@]}" &&
       "${MOSAIC_PY}" -m pip install -q --no-deps "${MOSAIC}" &&
       PYTHONPATH="${HERE}" "${MOSAIC_PY}" -c "from resume.mosaic_cols import streaming; streaming().MDSWriter"
     } >"${MOSAIC_LOG}" 2>&1; then
    printf '%s' "${MOSAIC_WANT}" > "${MOSAIC_STAMP}"
  else
    tail -n 20 "${MOSAIC_LOG}" >&2
    echo "warning: setup_env.sh could not make ${MOSAIC_VENV} (log: ${MOSAIC_LOG});" \
         "the resume matrix's mosaic-streaming column will say so" >&2
  fi
fi

if [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "${WANT}" ]]; then
  exit 0
fi

if [[ ! -x "${PY}" ]]; then
  "${PYTHON}" -m venv "${VENV}"
fi
# pip's chatter goes to a log, shown only if the install fails.
LOG="${VENV}/install.log"
echo "setting up ${VENV} (log: ${LOG}) ..."
if ! { "${PY}" -m pip install -q --upgrade pip &&
       "${PY}" -m pip install -q -e "${ROOT}[${EXTRAS}]" "${PEERS[@]}"; } >"${LOG}" 2>&1; then
  tail -n 40 "${LOG}" >&2
  echo "setup_env.sh: pip install failed; full log in ${LOG}" >&2
  exit 1
fi

# Peers must import next to the project's numpy and jax; fail loudly if not.
"${PY}" - <<'EOF'
import importlib.metadata as md

import grain.python  # noqa: F401
import numpy
import torch  # noqa: F401
import PIL  # noqa: F401
import psutil  # noqa: F401
import apache_beam  # noqa: F401
import array_record.beam.arrayrecordio  # noqa: F401
import google.cloud.storage  # noqa: F401
import ray.data  # noqa: F401
import torchdata.stateful_dataloader  # noqa: F401
import datasets  # noqa: F401
import litdata  # noqa: F401

for name in ("numpy", "jax", "array_record", "grain", "torch", "pillow", "psutil", "apache-beam", "ray", "pandas",
             "torchdata", "datasets", "litdata", "torchvision"):
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        version = "absent"
    print(f"  {name:13s} {version}")
EOF
"${PY}" -m pip check >/dev/null || {
  "${PY}" -m pip check >&2
  echo "warning: pip check reports version conflicts (above)" >&2
}

printf '%s' "${WANT}" > "${STAMP}"
