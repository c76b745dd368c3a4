#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, from Debian's packages, for the `slurm` tests.
#   scripts/slurm_local.sh         install (if missing), configure, start, wait until idle, check
#   scripts/slurm_local.sh stop    stop slurmd, slurmctld and munged
#   scripts/slurm_local.sh status  exit 0 when the cluster answers and its node is usable
# Run as root (CI runs it as root on a fresh machine). Re-running while it is up is a no-op
# apart from the checks. One node (this host) with nproc CPUs, one partition `debug`
# (default, oversubscribed, no time limit), no accounting (so no `sacct`).
set -euo pipefail

HOST=$(hostname)
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm
RUN=/run/slurm
WAIT_S=${SLURM_LOCAL_WAIT_S:-60}

log() { echo "slurm_local: $*" >&2; }

as_root() {
    if [[ $(id -u) -ne 0 ]]; then
        log "must run as root (it installs packages and starts daemons); try: sudo $0 $*"
        exit 1
    fi
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() {
    local file=$1 name=$2
    if pid_alive "$file"; then
        local pid
        pid=$(cat "$file")
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        log "stopped $name (pid $pid)"
    fi
    rm -f "$file"
}

node_state() { sinfo -h -n "$HOST" -o %t 2>/dev/null | head -n1; }

cluster_up() {
    scontrol ping 2>/dev/null | grep -q UP || return 1
    case $(node_state) in idle* | mix* | alloc*) return 0 ;; *) return 1 ;; esac
}

install_packages() {
    local missing=()
    for exe in munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client; do
        command -v "${exe%%:*}" >/dev/null 2>&1 || [[ -x /usr/sbin/${exe%%:*} ]] ||
            missing+=("${exe##*:}")
    done
    ((${#missing[@]})) || return 0
    log "installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

write_config() {
    local cpus mem_mb
    cpus=$(nproc)
    # a modest share of the memory: a node that reports less than RealMemory is drained
    mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
    mkdir -p "$CONF_DIR" "$STATE" "$SPOOL" "$LOGS" "$RUN"
    local new
    new=$(
        cat <<EOF
# written by kiln's scripts/slurm_local.sh: a single-node test cluster on $HOST
ClusterName=kiln-local
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits cred_expire seconds before it may start again (default 120)
AuthInfo=cred_expire=10
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# test all pending jobs every 2 s (default 60): a requeued job starts once it may
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
KillWait=30
Waittime=0
NodeName=$HOST CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
    )
    if [[ ! -f $CONF ]] || [[ $(cat "$CONF") != "$new" ]]; then
        printf '%s\n' "$new" >"$CONF"
        log "wrote $CONF (CPUs=$cpus RealMemory=${mem_mb}MB)"
        return 0
    fi
    return 1
}

start_munge() {
    if [[ ! -s /etc/munge/munge.key ]]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
        log "created /etc/munge/munge.key"
    fi
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 0700 /etc/munge
    chmod 0400 /etc/munge/munge.key
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    chmod 0755 /run/munge
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0
    fi
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    log "munged does not answer: see /var/log/munge/munged.log"
    exit 1
}

start() {
    as_root "$@"
    local t0=$SECONDS
    install_packages
    local changed=0
    write_config && changed=1
    start_munge
    if ((changed)); then  # a new config: restart whatever runs with the old one
        stop_pidfile "$RUN/slurmd.pid" slurmd
        stop_pidfile "$RUN/slurmctld.pid" slurmctld
    fi
    if ! pid_alive "$RUN/slurmctld.pid"; then
        /usr/sbin/slurmctld -i  # -i: ignore unreadable saved state (a previous machine's)
        log "started slurmctld"
    fi
    if ! pid_alive "$RUN/slurmd.pid"; then
        /usr/sbin/slurmd -N "$HOST"
        log "started slurmd"
    fi
    local deadline=$((SECONDS + WAIT_S))
    until cluster_up; do
        if ((SECONDS > deadline)); then
            log "node $HOST is not idle after ${WAIT_S}s (state: '$(node_state)')"
            sinfo -R >&2 || true
            tail -n 20 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" >&2 || true
            exit 1
        fi
        # a node left down or drained by an earlier run comes back
        case $(node_state) in down* | drain* | drng*)
            scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;;
        esac
        sleep 0.5
    done
    local hosts
    hosts=$(srun -n 2 hostname)
    if [[ $(grep -c . <<<"$hosts") -ne 2 ]]; then
        log "srun -n 2 hostname printed '$hosts', expected two lines"
        exit 1
    fi
    log "cluster up in $((SECONDS - t0))s: $(sinfo -h -o '%P %D nodes %c CPUs %t' | head -n1)"
}

stop() {
    as_root "$@"
    stop_pidfile "$RUN/slurmd.pid" slurmd
    stop_pidfile "$RUN/slurmctld.pid" slurmctld
    stop_pidfile /run/munge/munged.pid munged
}

case ${1:-start} in
    start) start "$@" ;;
    stop) stop "$@" ;;
    status) cluster_up ;;
    *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
