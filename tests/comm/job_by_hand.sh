#!/usr/bin/env bash
# Starts a job without MPI on this host, its processes started by hand as the seeds
# start them, on a free port; waits for every process and exits with the first nonzero
# status among them (0 when all succeed). Every process left when this script ends is
# killed.
#
#   job_by_hand.sh scheduler N STARTED [--last-worker VAR=VALUE]... PROGRAM [ARGS...]
#     Seed 001's dynamic networking: one scheduler (MS_ROLE=MS_SCHED) and STARTED
#     workers (MS_ROLE=MS_WORKER) of a job of N (MS_WORKER_NUM). STARTED < N tests a
#     worker that never arrives; --last-worker sets a variable for the last worker
#     started only (another TLS certificate: a worker the scheduler must refuse).
#   job_by_hand.sh nodes LAUNCHER N NODES PROGRAM [ARGS...]
#     tessera-run's multi-node form on one host: NODES launchers (LAUNCHER is the
#     tessera-run binary), each with --node-rank R and N / NODES local workers, node 0
#     serving the rendezvous on the master port.
#   job_by_hand.sh rank-table TABLE N PER_SERVER PROGRAM [ARGS...]
#     Seed 003's multi-process startup: N processes with RANK_TABLE_FILE, RANK_ID
#     (0..N-1) and DEVICE_ID (the place on its server, PER_SERVER devices per server);
#     rank 0 serves the rendezvous (TESSERA_MASTER_PORT).
set -u
mode=$1
shift
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
unset OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK PMI_SIZE TESSERA_COMM_BACKEND TESSERA_RANK MS_ROLE TESSERA_ROLE RANK_TABLE_FILE
pids=()
logs=$(mktemp -d)
trap 'kill -9 "${pids[@]}" 2>/dev/null; rm -rf "$logs"' EXIT
case $mode in
  scheduler)
    n=$1 started=$2
    shift 2
    last=()
    while [ "${1:-}" = --last-worker ]; do
      last+=("$2")
      shift 2
    done
    export MS_WORKER_NUM=$n MS_SCHED_HOST=127.0.0.1 MS_SCHED_PORT=$port
    MS_ROLE=MS_SCHED "$@" &
    pids+=($!)
    for ((i = 0; i < started; ++i)); do
      if ((i == started - 1)); then
        env "${last[@]}" MS_ROLE=MS_WORKER "$@" &
      else
        MS_ROLE=MS_WORKER "$@" &
      fi
      pids+=($!)
    done
    ;;
  nodes)
    launcher=$1 n=$2 nodes=$3
    shift 3
    for ((r = 0; r < nodes; ++r)); do
      "$launcher" --worker-num "$n" --local-worker-num $((n / nodes)) --node-rank "$r" \
        --master-addr 127.0.0.1 --master-port "$port" --log-dir "$logs/node$r" "$@" &
      pids+=($!)
    done
    ;;
  rank-table)
    table=$1 n=$2 per=$3
    shift 3
    export RANK_TABLE_FILE=$table TESSERA_MASTER_PORT=$port
    for ((i = 0; i < n; ++i)); do
      RANK_ID=$i DEVICE_ID=$((i % per)) "$@" &
      pids+=($!)
    done
    ;;
  *)
    echo "job_by_hand.sh: unknown mode \"$mode\" (scheduler, nodes or rank-table)" >&2
    exit 2
    ;;
esac
status=0
for pid in "${pids[@]}"; do
  wait "$pid"
  rc=$?
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
done
exit "$status"
