#!/usr/bin/env bash
# A real SLURM cluster on localhost for the harness's tests and for trying the SLURM path on one machine.
#
#   scripts/slurm-local.sh up       install (apt) if needed, write configs, start every daemon, wait for idle nodes
#   scripts/slurm-local.sh down     stop everything this script started (by PID), jobs included
#   scripts/slurm-local.sh status   daemons and `sinfo`; exit 0 when the cluster is up, 3 when it is not
#
# Two compute nodes, node1 and node2 (2 task slots each, partition `debug`), one slurmctld, slurmdbd accounting
# on a private MariaDB, a private munged. Everything lives under $HARNESS_SLURM_DIR (default /tmp/harness-slurm):
# configs in etc/, pidfiles in run/, logs in log/, daemon state in spool/, the database in mysql/. The state is
# kept across down/up so job ids keep increasing (the accounting database remembers old ids); remove the folder
# after `down` for a clean slate. Outside that folder the script touches only: apt packages, a tagged line in
# /etc/hosts (node names -> 127.0.0.1) and a symlink /etc/slurm/slurm.conf when none exists (so plain `sinfo`
# and submitit find the cluster without SLURM_CONF); `down` removes both.
#
# Clusters with distinct state dirs and HARNESS_SLURM_PORT_BASEs run side by side: tests/slurm gives each test run
# its own (and its own HARNESS_SLURM_FIRST_JOB_ID, so job ids differ too), and `down` stops only the processes,
# /etc/hosts line and symlink of its own state dir.
#
# Exit codes: 0 ok; 1 a daemon did not come up (log tail printed); 2 usage; 3 prerequisites missing (not root,
# no apt-get, package install failed) -- tests skip on 3.
# Works without systemd or cgroups (proctrack/linuxproc, task/none). See docs/slurm.md.
set -euo pipefail

STATE=${HARNESS_SLURM_DIR:-/tmp/harness-slurm}
PORT_BASE=${HARNESS_SLURM_PORT_BASE:-16817}   # slurmctld; slurmdbd +1, node1 +2, node2 +3
FIRST_JOB_ID=${HARNESS_SLURM_FIRST_JOB_ID:-1}  # FirstJobId: a fresh state dir's first job id
CLUSTER_NAME=harness
PARTITION=debug
NODES=(node1 node2)
CPUS_PER_NODE=2
HOSTS_TAG="# harness-slurm ${STATE}"          # marks our /etc/hosts line
PROC_TAG="HARNESS_SLURM_DAEMON=${STATE}"      # in the environment of every daemon we start (and its children)
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server mariadb-client)
READY_TIMEOUT_S=${HARNESS_SLURM_READY_TIMEOUT_S:-60}

CTLD_PORT=$PORT_BASE
DBD_PORT=$((PORT_BASE + 1))
ETC=$STATE/etc RUN=$STATE/run LOG=$STATE/log SPOOL=$STATE/spool MUNGE_DIR=$STATE/munge MYSQL_DIR=$STATE/mysql
export SLURM_CONF=$ETC/slurm.conf
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
MYSQL_SOCKET=$MYSQL_DIR/mysqld.sock

say() { printf 'slurm-local: %s\n' "$*"; }
die() { local rc=$1; shift; printf 'slurm-local: error: %s\n' "$*" >&2; exit "$rc"; }

# --- processes -------------------------------------------------------------------------------------------------

pid_alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }
pid_from() { if [[ -s $1 ]]; then tr -dc 0-9 <"$1"; fi; }
running() { pid_alive "$(pid_from "$1")"; }

# Processes we started that a pidfile does not name: slurmstepd (inherits slurmd's environment, so PROC_TAG)
# and job tasks (slurmstepd sets SLURM_CONF=$ETC/slurm.conf and SLURM_JOB_ID in their environment).
our_leftovers() {
  local f pid
  {
    grep -lzxF "$PROC_TAG" /proc/[0-9]*/environ 2>/dev/null || true
    for f in $(grep -lzxF "SLURM_CONF=$ETC/slurm.conf" /proc/[0-9]*/environ 2>/dev/null || true); do
      grep -qz '^SLURM_JOB_ID=' "$f" 2>/dev/null && echo "$f"
    done
  } | while read -r f; do
    pid=${f#/proc/}; pid=${pid%/environ}
    [[ $pid != "$$" && $pid != "$BASHPID" && $pid != "$PPID" ]] && echo "$pid"
  done | sort -un
}

stop_pids() {  # stop_pids NAME=PID...: TERM them all, wait up to 10 s, then KILL what is left
  local spec pid name i left
  for spec in "$@"; do if pid_alive "${spec##*=}"; then kill -TERM "${spec##*=}" 2>/dev/null || true; fi; done
  for i in $(seq 100); do
    left=0
    for spec in "$@"; do pid_alive "${spec##*=}" && left=1; done
    [[ $left == 0 ]] && break
    sleep 0.1
  done
  for spec in "$@"; do
    name=${spec%=*} pid=${spec##*=}
    if pid_alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; say "killed $name (pid $pid) after 10 s"
    else say "stopped $name (pid $pid)"; fi
  done
}

stop_pidfiles() {  # stop_pidfiles NAME=PIDFILE...: one group, stopped together
  local spec pid specs=()
  for spec in "$@"; do
    pid=$(pid_from "${spec##*=}")
    pid_alive "$pid" && specs+=("${spec%=*}=$pid")
    rm -f "${spec##*=}"
  done
  (( ${#specs[@]} )) && stop_pids "${specs[@]}"
  return 0
}

start_daemon() {  # start_daemon LOGFILE CMD...: a daemon that forks itself (SLURM's): its exit status is the start's
  local logfile=$1; shift
  # NOTE: stdio away from the caller: pytest waits on its pipes until every holder is gone
  env "$PROC_TAG" setsid "$@" </dev/null >>"$logfile" 2>&1
}

start_background() {  # start_background LOGFILE CMD...: a daemon that stays in the foreground (mariadbd)
  local logfile=$1; shift
  env "$PROC_TAG" setsid "$@" </dev/null >>"$logfile" 2>&1 &
}

wait_for() {  # wait_for SECONDS CMD...: retry CMD (each try cut at 5 s) until it succeeds or SECONDS pass
  # NOTE: CMD must be a program, not a shell function (timeout execs it)
  local deadline=$((SECONDS + $1)); shift
  while (( SECONDS < deadline )); do timeout 5 "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

fail_with_log() {
  local what=$1 logfile=$2
  printf 'slurm-local: error: %s\n' "$what" >&2
  [[ -f $logfile ]] && { printf -- '--- tail of %s\n' "$logfile" >&2; tail -n 25 "$logfile" >&2; }
  exit 1
}

# --- prerequisites ---------------------------------------------------------------------------------------------

require_root() {
  [[ $EUID -eq 0 ]] || die 3 "must run as root: it installs packages, edits /etc/hosts and runs the SLURM daemons"
}

missing_packages() {
  local p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

install_packages() {
  local missing; missing=$(missing_packages | tr '\n' ' '); missing=${missing% }
  [[ -z $missing ]] && return 0
  command -v apt-get >/dev/null || die 3 "packages missing ($missing) and apt-get is not available"
  say "installing $missing (apt)"
  # NOTE: a policy-rc.d that says no keeps the packages' init scripts from starting system-wide munge/mariadb/
  # slurm daemons that this script would not own; removed again right after.
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; own_policy=1; fi
  local rc=0
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >"$STATE/apt.log" 2>&1 \
    || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$STATE/apt.log" 2>&1 \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing \
              >>"$STATE/apt.log" 2>&1; } || rc=$?
  [[ $own_policy == 1 ]] && rm -f "$policy"
  if [[ $rc != 0 ]]; then
    tail -n 15 "$STATE/apt.log" >&2
    die 3 "apt-get install of $missing failed (rc $rc); full log: $STATE/apt.log"
  fi
}

# --- configuration ---------------------------------------------------------------------------------------------

write_if_changed() {  # write_if_changed PATH MODE < content
  local path=$1 mode=$2 tmp; tmp=$(mktemp "$path.XXXXXX")
  cat >"$tmp"
  if [[ -f $path ]] && cmp -s "$tmp" "$path"; then rm -f "$tmp"; else mv -f "$tmp" "$path"; fi
  chmod "$mode" "$path"
}

write_configs() {
  local host; host=$(hostname -s)
  local mem_mb; mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
  local auth="AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET"
  local node_lines="" i=0 n
  for n in "${NODES[@]}"; do
    # NOTE: both nodes are this host: same NodeHostname, distinct Port; RealMemory is the whole machine on each
    # (not consumable with CR_CPU, only checked against --mem)
    node_lines+="NodeName=$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT_BASE + 2 + i)) CPUs=$CPUS_PER_NODE RealMemory=$mem_mb State=UNKNOWN"$'\n'
    i=$((i + 1))
  done
  local node_csv; node_csv=$(IFS=,; echo "${NODES[*]}")
  write_if_changed "$ETC/slurm.conf" 644 <<EOF
# Written by scripts/slurm-local.sh -- edits are overwritten on the next \`up\`.
ClusterName=$CLUSTER_NAME
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
$auth
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
# no systemd/cgroups here
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# more task slots than cores: trust the node lines below, not the hardware
SlurmdParameters=config_overrides
# impossible requests fail at sbatch instead of pending forever
EnforcePartLimits=ALL
ReturnToService=2
SchedulerType=sched/backfill
# job ids (and so submitit's and the harness's rendezvous ports, derived from them) differ between side-by-side
# clusters given different first ids
FirstJobId=$FIRST_JOB_ID
# seconds between SIGTERM and SIGKILL on cancel/timeout (default 30); submitit ignores SIGTERM
KillWait=5
MailProg=/bin/true
# sacct (what submitit polls) needs accounting
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# NOTE: the slurmctld/sacct/sacctmgr -> slurmdbd connection authenticates with the munge socket named here,
# not AuthInfo's
AccountingStoragePass=$MUNGE_SOCKET
JobCompType=jobcomp/none
$node_lines
PartitionName=$PARTITION Nodes=$node_csv Default=YES MaxTime=INFINITE State=UP
EOF
  write_if_changed "$ETC/slurmdbd.conf" 600 <<EOF
# Written by scripts/slurm-local.sh -- edits are overwritten on the next \`up\`.
$auth
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
# root over MariaDB's unix socket (MYSQL_UNIX_PORT in slurmdbd's environment): no password
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
  write_if_changed "$ETC/cgroup.conf" 644 <<EOF
# Written by scripts/slurm-local.sh. Unused: proctrack/linuxproc and task/none load no cgroup plugin.
CgroupPlugin=autodetect
EOF
}

# --- /etc -------------------------------------------------------------------------------------------------------

hosts_lines() {  # hosts_lines ours|others: /etc/hosts lines that end in this state dir's tag, or the rest
  # NOTE: the tag ends the line: /tmp/hs-a's tag must not match /tmp/hs-ab's line
  TAG=$HOSTS_TAG WANT=$1 awk 'BEGIN { tag = ENVIRON["TAG"]; n = length(tag) }
    { mine = length($0) >= n && substr($0, length($0) - n + 1) == tag }
    (ENVIRON["WANT"] == "ours") == mine' /etc/hosts
}

add_hosts_line() {
  [[ -n $(hosts_lines ours) ]] && return 0
  local names="${NODES[*]}" host; host=$(hostname)
  # gloo resolves this machine's own hostname too; NOTE: also when only another cluster's line names it (that
  # line goes with that cluster's `down`)
  if ! getent hosts "$host" >/dev/null || [[ -n $(grep -F "# harness-slurm " /etc/hosts | grep -wF -- "$host") ]]; then
    names+=" $host"
  fi
  printf '127.0.0.1 %s %s\n' "$names" "$HOSTS_TAG" >>/etc/hosts
}

remove_hosts_line() {
  [[ -n $(hosts_lines ours) ]] || return 0
  local kept; kept=$(hosts_lines others)
  # NOTE: rewrite in place; /etc/hosts is often a bind mount that cannot be replaced by a rename
  printf '%s\n' "$kept" >/etc/hosts
}

link_default_conf() {
  mkdir -p /etc/slurm
  if [[ -L /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) == "$ETC/slurm.conf" ]]; then return 0; fi
  if [[ -e /etc/slurm/slurm.conf || -L /etc/slurm/slurm.conf ]]; then
    say "/etc/slurm/slurm.conf exists and is not ours: export SLURM_CONF=$ETC/slurm.conf to reach this cluster"
    return 0
  fi
  ln -s "$ETC/slurm.conf" /etc/slurm/slurm.conf
}

unlink_default_conf() {
  if [[ -L /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) == "$ETC/slurm.conf" ]]; then
    rm -f /etc/slurm/slurm.conf
  fi
}

# --- daemons ----------------------------------------------------------------------------------------------------

start_munge() {
  running "$MUNGE_DIR/munged.pid" && return 0
  # NOTE: munged refuses to run as root; run it as the munge user over a socket dir it owns
  install -d -o munge -g munge -m 0755 "$MUNGE_DIR"
  runuser -u munge -- env "$PROC_TAG" /usr/sbin/munged --socket="$MUNGE_SOCKET" \
    --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" \
    </dev/null >>"$LOG/munged.out" 2>&1 || fail_with_log "munged did not start" "$MUNGE_DIR/munged.log"
  wait_for 10 bash -c "munge -n -S '$MUNGE_SOCKET' | unmunge -S '$MUNGE_SOCKET'" \
    || fail_with_log "munge does not answer on $MUNGE_SOCKET" "$MUNGE_DIR/munged.log"
}

start_mariadb() {
  running "$MYSQL_DIR/mysqld.pid" && return 0
  # NOTE: the server's datadir, socket, pid and log must sit in a folder the mysql user owns
  install -d -o mysql -g mysql -m 0750 "$MYSQL_DIR"
  local opts=(--no-defaults --user=mysql --datadir="$MYSQL_DIR/data" --skip-networking --socket="$MYSQL_SOCKET"
              --pid-file="$MYSQL_DIR/mysqld.pid" --log-error="$MYSQL_DIR/mysqld.log"
              --innodb-buffer-pool-size=64M --innodb-log-file-size=64M --innodb-lock-wait-timeout=900)
  if [[ ! -d $MYSQL_DIR/data/mysql ]]; then
    mariadb-install-db "${opts[@]:0:3}" --auth-root-authentication-method=socket --skip-test-db \
      >"$LOG/mariadb-install-db.log" 2>&1 || fail_with_log "mariadb-install-db failed" "$LOG/mariadb-install-db.log"
  fi
  start_background "$LOG/mariadbd.out" /usr/sbin/mariadbd "${opts[@]}"
  wait_for 30 mariadb-admin --no-defaults --socket="$MYSQL_SOCKET" -u root ping || fail_with_log "MariaDB does not answer on $MYSQL_SOCKET" "$MYSQL_DIR/mysqld.log"
}

start_slurmdbd() {
  running "$RUN/slurmdbd.pid" && return 0
  # slurmdbd reads slurmdbd.conf from SLURM_CONF's folder; libmariadb takes the socket from MYSQL_UNIX_PORT
  MYSQL_UNIX_PORT=$MYSQL_SOCKET start_daemon "$LOG/slurmdbd.out" /usr/sbin/slurmdbd \
    || fail_with_log "slurmdbd did not start" "$LOG/slurmdbd.log"
  wait_for 30 sacctmgr -n list cluster || fail_with_log "slurmdbd does not answer" "$LOG/slurmdbd.log"
}

register_cluster() {
  if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER_NAME"; then
    sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null || die 1 "sacctmgr could not add cluster $CLUSTER_NAME"
  fi
}

start_slurmctld() {
  running "$RUN/slurmctld.pid" && return 0
  start_daemon "$LOG/slurmctld.out" /usr/sbin/slurmctld || fail_with_log "slurmctld did not start" "$LOG/slurmctld.log"
  wait_for 30 scontrol ping || fail_with_log "slurmctld does not answer" "$LOG/slurmctld.log"
}

start_slurmd() {
  local n=$1
  running "$RUN/slurmd-$n.pid" && return 0
  mkdir -p "$SPOOL/$n"
  start_daemon "$LOG/slurmd-$n.out" /usr/sbin/slurmd -N "$n" || fail_with_log "slurmd -N $n did not start" "$LOG/slurmd-$n.log"
  wait_for 15 test -s "$RUN/slurmd-$n.pid" || fail_with_log "slurmd -N $n did not start" "$LOG/slurmd-$n.log"
}

nodes_idle() {
  local states; states=$(sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null | sort -u)
  local n
  for n in "${NODES[@]}"; do grep -qE "^$n (idle|mix|alloc)$" <<<"$states" || return 1; done
}

resume_down_nodes() {  # a node left down/drained by an earlier run (e.g. "Not responding") comes back
  local n
  for n in "${NODES[@]}"; do
    if sinfo -h -N -n "$n" -o '%t' 2>/dev/null | grep -qE 'down|drain|fail'; then
      scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
    fi
  done
}

# --- commands ---------------------------------------------------------------------------------------------------

cmd_up() {
  local t0; t0=$(date +%s.%N)
  require_root
  mkdir -p "$STATE" "$ETC" "$RUN" "$LOG" "$SPOOL/ctld"
  install_packages
  local n; for n in "${NODES[@]}"; do mkdir -p "$SPOOL/$n"; done
  write_configs
  add_hosts_line
  link_default_conf
  start_munge
  start_mariadb
  start_slurmdbd
  register_cluster
  start_slurmctld
  for n in "${NODES[@]}"; do start_slurmd "$n"; done
  local i
  for i in $(seq $((READY_TIMEOUT_S * 5))); do
    nodes_idle && break
    (( i % 25 == 0 )) && resume_down_nodes
    sleep 0.2
  done
  if ! nodes_idle; then
    sinfo -N >&2 || true
    fail_with_log "nodes not idle after ${READY_TIMEOUT_S} s" "$LOG/slurmctld.log"
  fi
  sinfo
  say "up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s" \
      "(state $STATE; SLURM_CONF=$ETC/slurm.conf)"
}

cmd_down() {
  require_root
  local n
  if running "$RUN/slurmctld.pid"; then
    # jobs first, so no slurmstepd or task outlives its daemons
    local jobs; jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      # shellcheck disable=SC2016  # expanded by the inner bash
      wait_for 20 bash -c '[[ -z $(squeue -h -o %i) ]]' || say "jobs still listed after 20 s"
    fi
  fi
  # NOTE: order: slurmctld saves its state through slurmdbd; both need munge; slurmdbd needs MariaDB
  local group=(slurmctld="$RUN/slurmctld.pid")
  for n in "${NODES[@]}"; do group+=("slurmd $n=$RUN/slurmd-$n.pid"); done
  stop_pidfiles "${group[@]}"
  stop_pidfiles slurmdbd="$RUN/slurmdbd.pid"
  stop_pidfiles mariadbd="$MYSQL_DIR/mysqld.pid" munged="$MUNGE_DIR/munged.pid"
  local pid leftovers=()
  for pid in $(our_leftovers); do
    leftovers+=("$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-50 | tr '=' '_' || echo '?')=$pid")
  done
  (( ${#leftovers[@]} )) && stop_pids "${leftovers[@]}"
  remove_hosts_line
  unlink_default_conf
  say "down (state kept in $STATE)"
}

cmd_status() {
  local name file up=1
  for name in munged mariadbd slurmdbd slurmctld "${NODES[@]/#/slurmd-}"; do
    case $name in
      munged) file=$MUNGE_DIR/munged.pid ;;
      mariadbd) file=$MYSQL_DIR/mysqld.pid ;;
      *) file=$RUN/$name.pid ;;
    esac
    if running "$file"; then printf '%-14s running (pid %s)\n' "$name" "$(pid_from "$file")"
    else printf '%-14s stopped\n' "$name"; up=0; fi
  done
  if [[ $up == 1 ]]; then sinfo; sinfo -N -o '%N %P %c %t' ; return 0; fi
  return 3
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: $0 up|down|status   (state dir: \$HARNESS_SLURM_DIR, default /tmp/harness-slurm)" >&2; exit 2 ;;
esac
