#!/bin/bash
# The guest's payload under tini: cgroup v2, swap, containerd, the kubelet, and a status file.
#
# The host talks to it only through the 9p share mounted at /share:
#   in:  kubelet.yaml, kubelet.kubeconfig, pki/ (ca.crt, kubelet.crt, kubelet.key), kubelet.flags,
#        gvisor/ (runsc and its containerd shim, optional: installed before containerd starts),
#        kubernetes-service ("SERVICE_IP PORT API_IP API_PORT"), images/*.tar (imported at boot),
#        kill-container (a request: "ID SIGNAL", signal that CRI container's task),
#        restart-kubelet (a request: restart the kubelet with the current kubelet.yaml),
#        swap-file (a request: "MIB": move swap to a new MIB swap file on the root disk, the
#        swap disk off; the kubelet sees the new capacity when it next starts),
#        swap-zram (a request: "MIB": move swap to a MIB zram device, the swap disk off),
#        swap-disk (a request: the swap disk back on, zram off),
#        poweroff (a request)
#   out: node.log (milestones), kubelet.log, containerd.log, status.json (every 2 s: meminfo,
#        vmstat, memory pressure (PSI), every container cgroup's memory and swap files),
#        psi.log (every 1 s, even when the node thrashes: "UPTIME SOME_AVG10 FULL_AVG10 ..."),
#        kubelet-generation
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
log() { echo "swapwise-node: $(cut -d' ' -f1 /proc/uptime)s $*" | tee -a /share/node.log >/dev/console; }

mount -t proc proc /proc
mount -t sysfs sys /sys
mkdir -p /dev/pts /dev/shm /share
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /share
log "userspace up (kernel $(uname -r))"

# cgroup v2 only (the kernel runs with cgroup_no_v1=all): the kubelet grants swap only there.
# memory_recursiveprot: system.slice's memory.min below covers everything under it.
mount -t cgroup2 -o memory_recursiveprot cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
modprobe overlay
echo "+cpu +cpuset +memory +pids +io" > /sys/fs/cgroup/cgroup.subtree_control
# The kubelet decides whether it can limit swap from ITS OWN cgroup's memory.swap.max, so it
# and containerd live in child cgroups, never the root.
mkdir -p /sys/fs/cgroup/system.slice
echo "+cpu +memory +pids +io" > /sys/fs/cgroup/system.slice/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/system.slice/containerd /sys/fs/cgroup/system.slice/kubelet \
  /sys/fs/cgroup/system.slice/node-init
# Keep the node's own agents (kubelet, containerd and its shims) out of reclaim: under memory
# pressure they must stay fast enough to evict pods and report, not thrash with them (what
# a protected system.slice does on a real node). The kubelet has a memory.min of its own
# inside the slice's: the slice's alone is shared out by usage, and containerd's page cache
# (hundreds of MiB of unpacked images) took most of it, so an overcommitted node's kubelet
# went unanswering for minutes. The slice's total stays 320M: protecting containerd's 288M
# too left the pods so little that the calm density run's start-up stalled (PSI 97 %).
# psi.log's last columns show what each uses.
echo 320M > /sys/fs/cgroup/system.slice/memory.min
echo 192M > /sys/fs/cgroup/system.slice/kubelet/memory.min
echo $$ > /sys/fs/cgroup/system.slice/node-init/cgroup.procs

# The memory PSI once a second, from shell builtins only: the status loop below scans every
# container cgroup, writes through 9p and forks a mv and a sleep, and slows down when the
# node thrashes, exactly when a reading matters. No fork here, a sleep on a FIFO nobody
# writes, and never OOM-killed.
# A line: uptime, the node's some and full avg10, then its agents: the kubelet's own memory
# some avg10, and memory.current of the kubelet, of containerd (with its shims) and of
# system.slice, and system.slice's memory.swap.current (bytes; -1: unreadable); then the
# guest's clock (epoch seconds, what the node agent's log lines are stamped with), the
# memory some total (microseconds stalled since boot) and the CPU some avg10 and total: the
# kernel's own figures that the node agent's marks are checked against. Last, where the CPU
# went (microseconds since boot): the pods (kubepods), the kubelet, containerd with its shims,
# this script (its status loop), then the whole guest busy and idle (/proc/stat, in ticks).
psi_log() {
  local up some full agent kubelet containerd slice swapped total cpu cpu_total _ lines
  local pods_us kubelet_us containerd_us init_us user nice system idle iowait irq softirq
  local cg=/sys/fs/cgroup/system.slice
  mkfifo /run/psi-tick && exec 3<> /run/psi-tick
  echo -1000 > "/proc/$BASHPID/oom_score_adj"
  : > /share/psi.log
  while :; do
    read -r up _ < /proc/uptime
    mapfile -t lines < /proc/pressure/memory  # two lines: read at once (see status)
    read -r _ some _ _ total <<< "${lines[0]}"; read -r _ full _ <<< "${lines[1]}"
    read -r _ cpu _ _ cpu_total < /proc/pressure/cpu
    read -r _ agent _ < "$cg/kubelet/memory.pressure" || agent=avg10=-1
    read -r kubelet < "$cg/kubelet/memory.current" || kubelet=-1
    read -r containerd < "$cg/containerd/memory.current" || containerd=-1
    read -r slice < "$cg/memory.current" || slice=-1
    read -r swapped < "$cg/memory.swap.current" || swapped=-1
    read -r _ pods_us < /sys/fs/cgroup/kubepods/cpu.stat || pods_us=-1
    read -r _ kubelet_us < "$cg/kubelet/cpu.stat" || kubelet_us=-1
    read -r _ containerd_us < "$cg/containerd/cpu.stat" || containerd_us=-1
    read -r _ init_us < "$cg/node-init/cpu.stat" || init_us=-1
    read -r _ user nice system idle iowait irq softirq _ < /proc/stat
    printf '%s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s\n' "$up" "${some#avg10=}" \
      "${full#avg10=}" "${agent#avg10=}" "$kubelet" "$containerd" "$slice" "$swapped" \
      "$EPOCHREALTIME" "${total#total=}" "${cpu#avg10=}" "${cpu_total#total=}" \
      "$pods_us" "$kubelet_us" "$containerd_us" "$init_us" \
      "$((user + nice + system + irq + softirq))" "$((idle + iowait))" >&4
    read -r -t 1 -u 3 _
  done 4>> /share/psi.log
}
[ -r /proc/pressure/memory ] && psi_log &

hostname "$(cat /share/hostname)"
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
# Pods (CNI bridge) reach the host side through here, and it reaches them.
sysctl -q -w net.ipv4.ip_forward=1
# No kube-proxy: the one rule it would write for what pods here dial, the `kubernetes`
# Service (in-cluster clients such as label-nodes), DNATed to the API server.
read -r svc_ip svc_port api_ip api_port < /share/kubernetes-service
for chain in PREROUTING OUTPUT; do
  iptables -t nat -A "$chain" -d "$svc_ip/32" -p tcp --dport "$svc_port" \
    -j DNAT --to-destination "$api_ip:$api_port"
done
log "kubernetes Service $svc_ip:$svc_port -> $api_ip:$api_port"

# Swap: a dedicated disk. Keep kswapd ahead of the kubelet's memory.available eviction
# threshold, so memory pressure is answered by swapping cold pages, not by evicting pods.
swapon /dev/vdb
sysctl -q -w vm.min_free_kbytes=65536
sysctl -q -w vm.watermark_scale_factor=200
log "swap on: $(tail -n +2 /proc/swaps | tr -s ' ' | tr '\n' ' ')"
log "meminfo: $(grep -E '^(MemTotal|SwapTotal):' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"

mkdir -p /var/lib/kubelet /etc/kubernetes/pki /var/log/pods
# gVisor, when the run brings it (build-gvisor.sh): containerd's runsc handler finds its shim
# on PATH and runsc where runsc.toml says.
if [ -x /share/gvisor/runsc ]; then
  install -m755 /share/gvisor/runsc /share/gvisor/containerd-shim-runsc-v1 /usr/local/bin/
  mkdir -p /share/gvisor/logs
  log "gVisor: $(/usr/local/bin/runsc --version | head -1)"
fi
( echo $BASHPID > /sys/fs/cgroup/system.slice/containerd/cgroup.procs
  exec containerd --config /swapwise/containerd.toml > /share/containerd.log 2>&1 ) &
for _ in $(seq 1 600); do [ -S /run/containerd/containerd.sock ] && break; sleep 0.5; done
log "containerd up"
for image in /swapwise/images/*.tar /share/images/*.tar; do
  [ -f "$image" ] || continue
  ctr -n k8s.io images import "$image" >> /share/node.log 2>&1
done
log "images: $(ctr -n k8s.io images ls -q | tr '\n' ' ')"

kubelet_pid=""
generation=0
start_kubelet() {
  cp /share/kubelet.kubeconfig /etc/kubernetes/kubelet.kubeconfig
  cp /share/pki/* /etc/kubernetes/pki/
  cp /share/kubelet.yaml /etc/kubernetes/kubelet.yaml
  generation=$((generation + 1))
  # shellcheck disable=SC2046  # kubelet.flags is a word list on purpose
  ( echo $BASHPID > /sys/fs/cgroup/system.slice/kubelet/cgroup.procs
    exec /swapwise/kubelet --config=/etc/kubernetes/kubelet.yaml \
      --kubeconfig=/etc/kubernetes/kubelet.kubeconfig $(cat /share/kubelet.flags) \
      >> /share/kubelet.log 2>&1 ) &
  kubelet_pid=$!
  echo "$generation" > /share/kubelet-generation
  log "kubelet started (generation $generation, pid $kubelet_pid, $(grep -o '"swapBehavior": "[A-Za-z]*"' /etc/kubernetes/kubelet.yaml))"
}
start_kubelet

# What the tests read: the node's memory and every container cgroup's memory files, from
# shell builtins only. A pass used to fork a cat or an awk per file: some 300 processes every
# two seconds with 18 pods, which on the emulated CPU took a share of the node comparable to
# the pods' own. A cgroup can vanish mid-read (a container just stopped): it is left out.
# A file of several lines is read whole with mapfile, never line by line: `read` seeks back
# after each line, and /proc regenerates the file at every seek, so once a counter above grew
# a digit the next line started mid-word (a vmstat without oom_kill, a number for a key).
shopt -s globstar nullglob
status() {
  local sep="" f d up max swap_max cur swap_cur ooms key rest kv line
  local -a lines words
  read -r up _ < /proc/uptime
  printf '{"uptime_s": %s, "kubelet_generation": %s,\n "meminfo": {' "$up" "$generation"
  mapfile -t lines < /proc/meminfo
  for line in "${lines[@]}"; do  # "MemTotal:  2012108 kB" -> "MemTotal": 2012108
    words=($line)
    printf '%s"%s": %s' "$sep" "${words[0]%:}" "${words[1]}"; sep=", "
  done
  printf '},\n "vmstat": {'; sep=""
  mapfile -t lines < /proc/vmstat
  for line in "${lines[@]}"; do
    key=${line%% *}
    case $key in oom_kill|pswpin|pswpout) printf '%s"%s": %s' "$sep" "$key" "${line##* }"; sep=", " ;; esac
  done
  printf '},\n "memory_pressure": {'; sep=""
  mapfile -t lines < /proc/pressure/memory
  for line in "${lines[@]}"; do  # "some avg10=1.23 avg60=... total=N" -> "some": {"avg10": 1.23, ...}
    key=${line%% *} rest=${line#* }
    printf '%s"%s": {' "$sep" "$key"; sep=""
    for kv in $rest; do printf '%s"%s": %s' "$sep" "${kv%%=*}" "${kv#*=}"; sep=", "; done
    printf '}'; sep=", "
  done
  printf '},\n "cgroups": {'; sep=""
  for f in /sys/fs/cgroup/kubepods*/**/memory.swap.max; do
    d=${f%/memory.swap.max}
    { read -r max < "$d/memory.max" && read -r swap_max < "$f" && read -r cur < "$d/memory.current" &&
        read -r swap_cur < "$d/memory.swap.current" && mapfile -t lines < "$d/memory.events"
    } 2>/dev/null || continue
    ooms=0
    for line in "${lines[@]}"; do
      if [[ ${line%% *} == oom_kill ]]; then ooms=${line##* }; fi
    done
    printf '%s\n  "%s": {"memory.max": "%s", "memory.swap.max": "%s", "memory.current": "%s", "memory.swap.current": "%s", "oom_kill": %s}' \
      "$sep" "${d#/sys/fs/cgroup/}" "$max" "$swap_max" "$cur" "$swap_cur" "$ooms"
    sep=","
  done
  printf '}}\n'
}

while true; do
  status > /share/.status.json.tmp && mv /share/.status.json.tmp /share/status.json
  if [ -f /share/restart-kubelet ]; then
    rm -f /share/restart-kubelet
    kill "$kubelet_pid"
    wait "$kubelet_pid"
    start_kubelet
  fi
  if [ -f /share/swap-file ]; then
    read -r mib < /share/swap-file
    rm -f /share/swap-file
    # The new swap first, then the disk off: its pages move to RAM and the file.
    dd if=/dev/zero of=/swapfile bs=1M count="$mib" status=none && chmod 600 /swapfile &&
      mkswap -q /swapfile && swapon /swapfile && swapoff /dev/vdb
    log "swap moved to a ${mib} MiB file: $(tail -n +2 /proc/swaps | tr -s ' ' | tr '\n' ' ')"
  fi
  if [ -f /share/swap-zram ]; then
    read -r mib < /share/swap-zram
    rm -f /share/swap-zram
    modprobe zram num_devices=1 2>> /share/node.log
    echo "${mib}M" > /sys/block/zram0/disksize && mkswap -q /dev/zram0 &&
      swapon -p 10 /dev/zram0 && swapoff /dev/vdb
    log "swap moved to a ${mib} MiB zram device: $(tail -n +2 /proc/swaps | tr -s ' ' | tr '\n' ' ')"
  fi
  if [ -f /share/swap-disk ]; then
    rm -f /share/swap-disk
    swapon /dev/vdb && { ! grep -q zram0 /proc/swaps || swapoff /dev/zram0; } &&
      { [ ! -e /sys/block/zram0/reset ] || echo 1 > /sys/block/zram0/reset; }
    log "swap back on the disk: $(tail -n +2 /proc/swaps | tr -s ' ' | tr '\n' ' ')"
  fi
  if [ -f /share/kill-container ]; then
    read -r id signal < /share/kill-container
    rm -f /share/kill-container
    ctr -n k8s.io tasks kill --signal "$signal" "$id" >> /share/node.log 2>&1
    log "sent $signal to container $id"
  fi
  if [ -f /share/poweroff ]; then
    log "poweroff requested"
    kill "$kubelet_pid"
    sync
    echo o > /proc/sysrq-trigger
  fi
  sleep 2
done
