#!/usr/bin/env bash
# Open MPI's mpirun starts a lazyfuse job: init() takes the ranks from OMPI_COMM_WORLD_RANK and
# OMPI_COMM_WORLD_SIZE, and the rendezvous from MASTER_PORT (a free one, so that parallel runs
# never collide). Usage: distributed_mpirun.sh NPROC PROGRAM ARGS...
set -euo pipefail
nproc=$1
shift
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
exec mpirun --allow-run-as-root --oversubscribe -n "$nproc" -x MASTER_PORT="$port" \
  -x OMP_NUM_THREADS=1 "$@"
