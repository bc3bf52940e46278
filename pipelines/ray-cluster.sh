#!/usr/bin/env bash
# lsr-index encode on a Ray cluster (docs/cluster.md): start a head and workers, submit an encode, build.
# Every node needs lsr-index with Ray (pip install -e '.[ray]' in a checkout) and the output directory on a file system
# shared by every node at the same path; only the encode step (the driver) reads the inputs. Ray 2.60 starts the head
# with token authentication: copy the head's ~/.ray/auth_token to the same place on every node (or point
# RAY_AUTH_TOKEN_PATH at it); the steps below run with RAY_AUTH_MODE=token.
#
#   pipelines/ray-cluster.sh head                         # on the head node: prints the address HEAD_IP:6379
#   pipelines/ray-cluster.sh worker HEAD_IP:6379          # on every other node (Ray finds its GPUs)
#   pipelines/ray-cluster.sh encode HEAD_IP:6379 /shared/lsr-out INPUT... [encode options]
#                                                         # on the head: → /shared/lsr-out/vectors (shards, manifest)
#   pipelines/ray-cluster.sh build /shared/lsr-out        # on one machine: → /shared/lsr-out/index
#   pipelines/ray-cluster.sh stop                         # on every node: stops Ray there
#   pipelines/ray-cluster.sh demo [WORKDIR]               # here: a local Ray on 127.0.0.1 encodes the sample
#                                                         # (→ WORKDIR/vectors, default lsr-out/ray-demo)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$([ -x .venv/bin/lsr-index ] && echo .venv/bin/ || true)
LSR=${LSR:-${BIN}lsr-index}
RAY=${RAY:-${BIN}ray}
PORT=${RAY_PORT:-6379}
export RAY_USAGE_STATS_ENABLED=${RAY_USAGE_STATS_ENABLED:-0}

case "${1:-}" in
  head)
    $RAY start --head --port "$PORT" --include-dashboard false
    echo "head address: $(hostname -I | awk '{print $1}'):$PORT" ;;
  worker)
    RAY_AUTH_MODE=token $RAY start --address "$2" ;;
  encode)
    address=$2 work=$3
    shift 3
    # the inputs first: a value right after --ray is its address
    RAY_AUTH_MODE=token $LSR --workdir "$work" encode "$@" --ray "$address"
    echo "vectors: $work/vectors (manifest.json lists the shards; build them with: $0 build $work)" ;;
  build)
    $LSR --workdir "$2" build
    echo "index: $2/index" ;;
  stop)
    $RAY stop ;;
  demo)
    # a one-node Ray that the driver starts and stops, on 127.0.0.1 (a `ray start` worker would bind this host's
    # outward address), with an encoder per core; tests/test_ray.py runs the multi-node case on one machine
    work=${2:-lsr-out/ray-demo}
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 $LSR --workdir "$work" encode data/sample/corpus.jsonl --preset splade-tiny \
      --shard-docs 50 --overwrite --ray local --ray-cpus 1
    echo "vectors: $work/vectors" ;;
  *)
    sed -n '2,16p' "$0" >&2
    exit 2 ;;
esac
