#!/usr/bin/env bash
# A SLURM test cluster on this machine, from Debian's packages, for the `slurm` tests.
#   scripts/slurm_local.sh [--nodes N]         install (if missing), configure, start, wait, check
#   scripts/slurm_local.sh stop                stop the daemons, remove the namespaces and links
#   scripts/slurm_local.sh [--nodes N] status  print each node's state; exit 0 when all are usable
#   scripts/slurm_local.sh on node1 CMD...     run CMD as on node1 (its namespace and hostname)
# Run as root (CI runs it as root on a fresh machine). Re-running while it is up is a no-op
# apart from the checks; with a changed slurm.conf and the same nodes it reconfigures the
# running daemons (jobs go on). Partitions over the same nodes, no time limit: `debug`
# (default, cores shared, never preempted), `low` (cores shared, preempted by `high` with
# PreemptMode=REQUEUE after a GraceTime), `lowcancel` (the same with PreemptMode=CANCEL) and
# `high`. No accounting (so no `sacct`).
#
# --nodes 2 (the default; SLURM_LOCAL_NODES): nodes node0..node<N-1>, each one slurmd
# (`slurmd -N node<i>`) in a network namespace kiln-node<i> of its own, with its own hostname
# (a UTS namespace) and address 10.77.0.1<i> on a private bridge kilnbr0 (10.77.0.1: slurmctld,
# in the root namespace). The namespaces have no route but that /24: all traffic stays between
# them, the bridge and the loopback. Each namespace's /etc/hosts (/etc/netns/kiln-node<i>/hosts)
# names every node, so a job's rendezvous address (the first node of SLURM_JOB_NODELIST) and
# gloo's own address (the hostname) resolve to bridge addresses. One munged (its socket on the
# shared filesystem) serves all; pid, log and spool files are per node (%n in slurm.conf).
# --nodes 1: the host itself is the only node (no namespaces).
set -euo pipefail

HOST=$(hostname)
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm
RUN=/run/slurm
WAIT_S=${SLURM_LOCAL_WAIT_S:-60}
NODES=${SLURM_LOCAL_NODES:-2}
NODES_GIVEN=${SLURM_LOCAL_NODES:+1}  # status checks the number only when one was asked for
BRIDGE=kilnbr0
NET=10.77.0  # a /24 of our own: .1 the controller (bridge), .10+i node i
NETNS_PREFIX=kiln-node
GRACE_S=60  # partition low's preemption grace time: SIGTERM, then SIGKILL this much later

log() { echo "slurm_local: $*" >&2; }

as_root() {
    if [[ $(id -u) -ne 0 ]]; then
        log "must run as root (it installs packages, starts daemons, makes namespaces); try: sudo $0"
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

# the node names of the cluster this script would start (multi: node0..), one a line
node_names() {
    if ((NODES == 1)); then
        echo "$HOST"
    else
        for ((i = 0; i < NODES; i++)); do echo "node$i"; done
    fi
}

# the node names of the cluster that is configured now (from slurm.conf), one a line
configured_nodes() {
    [[ -f $CONF ]] || return 0
    sed -n 's/^# kiln-node: //p' "$CONF"
}

node_state() { sinfo -h -n "$1" -o %t 2>/dev/null | head -n1; }

usable() { case $1 in idle* | mix* | alloc*) return 0 ;; *) return 1 ;; esac; }

cluster_up() {
    scontrol ping 2>/dev/null | grep -q UP || return 1
    local nodes node
    nodes=$(configured_nodes)
    [[ -n $nodes ]] || return 1
    for node in $nodes; do usable "$(node_state "$node")" || return 1; done
}

install_packages() {
    local missing=()
    for exe in munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client ip:iproute2 \
        unshare:util-linux; do
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
    mem_mb=$(awk -v n="$NODES" '/MemTotal/ {print int($2 / 1024 / 2 / n)}' /proc/meminfo)
    mkdir -p "$CONF_DIR" "$STATE" "$SPOOL" "$LOGS" "$RUN"
    local controller=$HOST nodes_lines="" names
    names=$(node_names | paste -sd, -)
    if ((NODES == 1)); then
        nodes_lines="NodeName=$HOST CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN"
    else
        controller="$HOST($NET.1)"
        local i
        for ((i = 0; i < NODES; i++)); do
            # every node claims all cores: the machine's cores are shared, not split
            nodes_lines+="NodeName=node$i NodeAddr=$NET.$((10 + i)) CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN"$'\n'
        done
        nodes_lines=${nodes_lines%$'\n'}
    fi
    local new
    new=$(
        cat <<EOF
# written by kiln's scripts/slurm_local.sh: a $NODES-node test cluster on $HOST
$(node_names | sed 's/^/# kiln-node: /')
ClusterName=kiln-local
SlurmctldHost=$controller
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits cred_expire seconds before it may start again (default 120)
AuthInfo=cred_expire=10
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE
# per node (%n: its name): several slurmd share this filesystem
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
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
# a node whose slurmd stopped answering is DOWN after 20 s (its job is requeued or ends)
SlurmdTimeout=20
InactiveLimit=0
MinJobAge=300
KillWait=30
Waittime=0
$nodes_lines
# preemption by partition: a job of high (tier 2) that needs the nodes preempts the jobs of
# low and lowcancel (tier 1): SIGTERM at once, then after GraceTime (SIGKILL) requeued (low) or
# cancelled (lowcancel). debug is never preempted.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE PriorityTier=1 PreemptMode=OFF
PartitionName=low Nodes=$names MaxTime=INFINITE State=UP OverSubscribe=FORCE PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE_S
PartitionName=lowcancel Nodes=$names MaxTime=INFINITE State=UP OverSubscribe=FORCE PriorityTier=1 PreemptMode=CANCEL GraceTime=$GRACE_S
PartitionName=high Nodes=$names MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
    )
    if [[ ! -f $CONF ]] || [[ $(cat "$CONF") != "$new" ]]; then
        printf '%s\n' "$new" >"$CONF"
        log "wrote $CONF ($NODES node(s): CPUs=$cpus RealMemory=${mem_mb}MB each)"
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

# the bridge (controller side) and one namespace per node, each with a veth on the bridge
make_network() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        log "made bridge $BRIDGE ($NET.1/24)"
    fi
    [[ $(ip addr show dev "$BRIDGE") == *"inet $NET.1/"* ]] || ip addr add "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local i ns addr hosts
    hosts="127.0.0.1 localhost"$'\n'"$NET.1 $HOST"
    for ((i = 0; i < NODES; i++)); do hosts+=$'\n'"$NET.$((10 + i)) node$i"; done
    for ((i = 0; i < NODES; i++)); do
        ns=$NETNS_PREFIX$i
        addr=$NET.$((10 + i))
        mkdir -p "/etc/netns/$ns"  # `ip netns exec` and on_node bind it over /etc/hosts
        printf '%s\n' "$hosts" >"/etc/netns/$ns/hosts"
        [[ -e /run/netns/$ns ]] || ip netns add "$ns"
        if ! ip link show "$ns" >/dev/null 2>&1; then
            ip link add "$ns" type veth peer name eth0 netns "$ns"
            log "made namespace $ns (node$i, $addr)"
        fi
        ip link set "$ns" master "$BRIDGE"
        ip link set "$ns" up
        ip netns exec "$ns" ip link set lo up
        [[ $(ip netns exec "$ns" ip addr show dev eth0) == *"inet $addr/"* ]] ||
            ip netns exec "$ns" ip addr add "$addr/24" dev eth0
        ip netns exec "$ns" ip link set eth0 up
    done
}

remove_network() {
    local ns
    for ns in $(ip netns list | awk '{print $1}' | grep "^$NETNS_PREFIX[0-9]*$" || true); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip link del "$ns" 2>/dev/null || true  # the veth pair (both ends)
        ip netns del "$ns"
        rm -rf "/etc/netns/$ns"
        log "removed namespace $ns"
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link del "$BRIDGE"
        log "removed bridge $BRIDGE"
    fi
    rmdir /etc/netns 2>/dev/null || true  # made for our hosts files; kept if anything else is in it
}

# run a command as if on node<i>: in its network namespace, with its hostname and /etc/hosts
# (nsenter, not `ip netns exec`, which mounts a fresh /sys without the cgroup mounts slurmd needs)
on_node() {
    local i=$1 ns=$NETNS_PREFIX$1
    shift
    nsenter --net="/run/netns/$ns" -- unshare --uts --mount --propagation slave sh -c \
        'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \
        sh "/etc/netns/$ns/hosts" "node$i" "$@"
}

start_slurmd() {
    local i=$1
    if ((NODES == 1)); then
        /usr/sbin/slurmd -N "$HOST"
        log "started slurmd"
        return
    fi
    mkdir -p "$SPOOL/node$i"
    on_node "$i" /usr/sbin/slurmd -N "node$i"
    log "started slurmd node$i in namespace $NETNS_PREFIX$i"
}

slurmd_pidfile() { echo "$RUN/slurmd-$1.pid"; }

start() {
    as_root
    local t0=$SECONDS
    install_packages
    local changed=0 node old
    old=$(configured_nodes)
    write_config && changed=1
    start_munge
    if ((changed)) && [[ $old == "$(node_names)" ]] && pid_alive "$RUN/slurmctld.pid" &&
        scontrol reconfigure 2>/dev/null; then
        changed=0  # the same nodes: the daemons re-read it, and running jobs go on
        log "reconfigured the running cluster"
    fi
    if ((changed)); then  # new nodes: restart whatever runs with the old config
        for node in $old; do stop_pidfile "$(slurmd_pidfile "$node")" "slurmd $node"; done
        stop_pidfile "$RUN/slurmd.pid" slurmd  # an older script's single-node pid file
        stop_pidfile "$RUN/slurmctld.pid" slurmctld
        ((NODES > 1)) || remove_network
    fi
    ((NODES == 1)) || make_network
    if ! pid_alive "$RUN/slurmctld.pid"; then
        /usr/sbin/slurmctld -i  # -i: ignore unreadable saved state (a previous machine's)
        log "started slurmctld"
    fi
    local i=0
    for node in $(node_names); do
        pid_alive "$(slurmd_pidfile "$node")" || start_slurmd "$i"
        i=$((i + 1))
    done
    local deadline=$((SECONDS + WAIT_S))
    until cluster_up; do
        if ((SECONDS > deadline)); then
            log "the nodes are not all idle after ${WAIT_S}s:"
            sinfo -N -h -o '%N %t' >&2 || true
            sinfo -R >&2 || true
            tail -n 20 "$LOGS"/slurm*.log >&2 || true
            exit 1
        fi
        # a node left down or drained by an earlier run comes back
        for node in $(node_names); do
            case $(node_state "$node") in down* | drain* | drng*)
                scontrol update NodeName="$node" State=RESUME 2>/dev/null || true ;;
            esac
        done
        sleep 0.5
    done
    local hosts expected=$NODES
    if ((NODES == 1)); then
        hosts=$(srun -n 2 hostname)
        expected=2
    else
        hosts=$(srun -N "$NODES" hostname | sort)
        if [[ $hosts != "$(node_names | sort)" ]]; then
            log "srun -N $NODES hostname printed '$hosts', expected $(node_names | paste -sd' ' -)"
            exit 1
        fi
    fi
    if [[ $(grep -c . <<<"$hosts") -ne $expected ]]; then
        log "srun printed '$hosts', expected $expected lines"
        exit 1
    fi
    log "cluster up in $((SECONDS - t0))s: $(sinfo -h -o '%P %D nodes (%N) %c CPUs %t' | head -n1)"
}

stop() {
    as_root
    local node
    for node in $(configured_nodes); do stop_pidfile "$(slurmd_pidfile "$node")" "slurmd $node"; done
    stop_pidfile "$RUN/slurmd.pid" slurmd
    stop_pidfile "$RUN/slurmctld.pid" slurmctld
    stop_pidfile /run/munge/munged.pid munged
    remove_network
}

status() {
    if ! scontrol ping 2>/dev/null | grep -q UP; then
        echo "slurmctld does not answer"
        return 1
    fi
    local node state ok=0 nodes
    nodes=$(configured_nodes)
    if [[ -n $NODES_GIVEN ]] && [[ $(grep -c . <<<"$nodes") -ne $NODES ]]; then
        echo "the cluster has $(grep -c . <<<"$nodes") node(s) ($(paste -sd' ' - <<<"$nodes")), not $NODES"
        ok=1
    fi
    for node in $nodes; do
        state=$(node_state "$node")
        echo "$node ${state:-unknown} $(scontrol show node "$node" 2>/dev/null | grep -o 'NodeAddr=[^ ]*')"
        usable "$state" || ok=1
    done
    return $ok
}

CMD=start
while (($#)); do
    case $1 in
        --nodes) NODES=${2:?--nodes needs a number}; NODES_GIVEN=1; shift 2 ;;
        --nodes=*) NODES=${1#--nodes=}; NODES_GIVEN=1; shift ;;
        start | stop | status) CMD=$1; shift ;;
        on)
            [[ ${2:-} =~ ^node[0-9]$ ]] && (($# > 2)) || {
                echo "usage: $0 on node<i> <command>...  (node0..node$((NODES - 1)))" >&2; exit 2; }
            i=${2#node}
            shift 2
            on_node "$i" "$@"
            exit ;;
        *) echo "usage: $0 [--nodes N] [start|stop|status]" >&2; exit 2 ;;
    esac
done
if ! [[ $NODES =~ ^[0-9]+$ ]] || ((NODES < 1 || NODES > 9)); then
    echo "slurm_local: --nodes $NODES is not valid: give a whole number from 1 to 9" >&2
    exit 2
fi
case $CMD in
    start) start ;;
    stop) stop ;;
    status) status ;;
esac
