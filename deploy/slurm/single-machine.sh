#!/bin/bash
# Slurm on this one machine, to try deploy/slurm/unicron.sbatch (docs/multi-host.md, "Slurm on
# one machine"). Debian or Ubuntu, as root:
#
#   sudo apt-get install -y slurm-wlm munge
#   sudo deploy/slurm/single-machine.sh start     # writes the config, starts munged, slurmctld, slurmd
#   export SLURM_CONF=/var/tmp/unicron-slurm/slurm.conf   # (start prints it) then sbatch, squeue, ...
#   sudo deploy/slurm/single-machine.sh stop      # stops the three daemons it started
#
# Everything lives in one folder ($UNICRON_SLURM_DIR, default /var/tmp/unicron-slurm): slurm.conf,
# gres.conf, a munge key and socket of its own, state, spool and logs. Nothing of the machine's
# own Slurm or munge set-up (/etc/slurm, /etc/munge) is read or changed; the Slurm commands find
# this cluster through SLURM_CONF. One node, named after the machine (`hostname -s`), at
# 127.0.0.1, with the CPUs and memory `slurmd -C` finds and its GPUs as a `gpu` GRES
# (/dev/nvidia0, ...). $SLURM_GPUS sets how many, 0 for none; on a machine without GPUs, a number
# above 0 declares that many stand-ins (device files that are what /dev/null is), to try a job's
# GPU request: `sudo SLURM_GPUS=2 deploy/slurm/single-machine.sh start` (sudo passes only the
# variables named on its command line). The ports are $SLURMCTLD_PORT and $SLURMD_PORT (6817 and
# 6818, Slurm's own).
set -euo pipefail

DIR=${UNICRON_SLURM_DIR:-/var/tmp/unicron-slurm}
CTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
NODE=$(hostname -s)

say() { echo "single-machine.sh: $*"; }
die() { echo "single-machine.sh: $*" >&2; exit 1; }

gpu_count() {
    if [[ -n "${SLURM_GPUS:-}" ]]; then
        [[ "$SLURM_GPUS" =~ ^[0-9]+$ ]] || die "SLURM_GPUS=$SLURM_GPUS: give a number of GPUs (0: none)"
        echo "$SLURM_GPUS"
    else
        find /dev -maxdepth 1 -regex '/dev/nvidia[0-9]+' 2>/dev/null | wc -l
    fi
}

write_config() {
    local gpus=$1 node_line
    node_line=$(slurmd -C | head -1)  # NodeName=... CPUs=... RealMemory=...
    node_line=${node_line/NodeName=* CPUs=/NodeName=$NODE CPUs=}
    local gres=""
    if ((gpus > 0)); then
        gres="Gres=gpu:$gpus"
        local files=/dev/nvidia
        if [[ ! -e /dev/nvidia0 ]]; then  # stand-ins (Slurm keeps no GPU without a device file)
            files=$DIR/gpu
            for ((i = 0; i < gpus; i++)); do
                [[ -e $files$i ]] || mknod "$files$i" c 1 3  # what /dev/null is
            done
        fi
        echo "NodeName=$NODE Name=gpu File=$files[0-$((gpus - 1))]" >"$DIR/gres.conf"
    else
        : >"$DIR/gres.conf"
    fi
    cat >"$DIR/slurm.conf" <<EOF
# Written by deploy/slurm/single-machine.sh: Slurm on this one machine.
ClusterName=unicron
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
MailProg=/bin/true
KillWait=10
MinJobAge=600
$node_line NodeAddr=127.0.0.1 $gres State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

running() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    [[ $(id -u) == 0 ]] || die "run it as root (sudo): slurmd starts every job's processes as their user"
    local missing=()
    for cmd in slurmctld slurmd munged sinfo; do
        command -v "$cmd" >/dev/null || missing+=("$cmd")
    done
    ((${#missing[@]} == 0)) || die "${missing[*]} not installed: sudo apt-get install -y slurm-wlm munge"
    if running "$DIR/slurmctld.pid" || running "$DIR/slurmd.pid"; then
        die "already running from $DIR: stop it first ($0 stop)"
    fi
    local gpus
    gpus=$(gpu_count)
    mkdir -p "$DIR"/{state,spool,log}
    chmod 755 "$DIR"
    if [[ ! -f "$DIR/munge.key" ]]; then
        head -c 1024 /dev/urandom >"$DIR/munge.key"
        chmod 400 "$DIR/munge.key"
    fi
    write_config "$gpus"
    export SLURM_CONF=$DIR/slurm.conf
    munged --force --key-file="$DIR/munge.key" --socket="$DIR/munge.socket" \
        --pid-file="$DIR/munged.pid" --seed-file="$DIR/munged.seed" --log-file="$DIR/log/munged.log"
    slurmctld -i
    slurmd -N "$NODE"
    for _ in $(seq 60); do
        if [[ $(sinfo -h -N -o %t 2>/dev/null) == idle ]]; then
            say "Slurm is up: node $NODE ($(grep -o 'CPUs=[0-9]*' "$DIR/slurm.conf"), $gpus GPUs), partition debug; logs in $DIR/log"
            say "in every shell that uses it:  export SLURM_CONF=$DIR/slurm.conf"
            if ((gpus > 0)); then
                say "then:  sbatch --nodes=1 --gpus-per-node=$gpus deploy/slurm/unicron.sbatch examples/tinygpt/task.yaml"
            else
                say "then:  sbatch --nodes=1 --gpus-per-node=0 deploy/slurm/unicron.sbatch --slots 2 examples/tinygpt/task.yaml"
            fi
            return 0
        fi
        sleep 1
    done
    die "the node did not become idle in 60 s: see $DIR/log/slurmctld.log and $DIR/log/slurmd.log"
}

stop() {
    [[ $(id -u) == 0 ]] || die "run it as root (sudo)"
    for daemon in slurmd slurmctld munged; do
        if running "$DIR/$daemon.pid"; then
            kill "$(cat "$DIR/$daemon.pid")"
            for _ in $(seq 30); do running "$DIR/$daemon.pid" || break; sleep 0.5; done
            say "$daemon stopped"
        fi
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) die "usage: $0 start|stop (the folder: UNICRON_SLURM_DIR, default /var/tmp/unicron-slurm)" ;;
esac
