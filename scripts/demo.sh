#!/usr/bin/env bash
# The demo `make demo` runs (after `make setup build`): start a daemon on a
# temporary data directory, create a python sandbox, run code in it, move a
# file in and out, list its processes; then checkpoint it, crash it, recover
# it and show that a program's in-memory state came back; list its events,
# remove it, and stop the daemon this script started (by its PID). Nothing
# is left behind.
#
#   AMBER=bin/amber           the binary to run
#   AMBER_DEMO_DRIVER=gvisor  the sandbox driver (gvisor or criu)
#   AMBER_DEMO_TEMPLATE=python
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

AMBER=${AMBER:-bin/amber}
DRIVER=${AMBER_DEMO_DRIVER:-gvisor}
TEMPLATE=${AMBER_DEMO_TEMPLATE:-python}
[[ -x $AMBER ]] || { echo "demo: $AMBER not found; run \`make build\` first" >&2; exit 1; }

DATA=$(mktemp -d /tmp/amber-demo.XXXXXX)
chmod 711 "$DATA" # sandboxes' own users must be able to reach their state
UP_PID=""
SBX=""

cleanup() {
    local rc=$?
    set +e
    if [[ -n $SBX && -n $UP_PID ]]; then
        "$AMBER" sandbox rm "$SBX" >/dev/null 2>&1
    fi
    if [[ -n $UP_PID ]] && kill -0 "$UP_PID" 2>/dev/null; then
        kill -TERM "$UP_PID"
        for _ in $(seq 300); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$UP_PID" 2>/dev/null && kill -KILL "$UP_PID"
        wait "$UP_PID" 2>/dev/null
    fi
    if [[ $rc -ne 0 && -f $DATA/up.log ]]; then
        echo "--- last lines of the daemon's log ---" >&2
        tail -n 25 "$DATA/up.log" >&2
    fi
    # The gvisor driver keeps a network namespace mounted in its state.
    findmnt -rn -o TARGET | grep -F "$DATA/" | sort -r | xargs -r -n1 umount -l 2>/dev/null
    rm -rf "$DATA"
    exit $rc
}
trap cleanup EXIT

# A free loopback port, from 7777 up.
PORT=7777
while (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do PORT=$((PORT + 1)); done
export AMBER_ADDR=127.0.0.1:$PORT AMBER_DATA_DIR=$DATA
unset AMBER_TOKEN

B='' N=''
[[ -t 1 ]] && B=$'\033[1m' N=$'\033[0m'

# show CMD...: print a command as a user would type it.
show() {
    local out='$' a
    for a in "$@"; do
        if [[ $a =~ ^[A-Za-z0-9_./:=@%+-]+$ ]]; then out+=" $a"; else out+=" '${a//\'/\'\\\'\'}'"; fi
    done
    printf '\n%s%s%s\n' "$B" "$out" "$N"
}

# step ARGS...: show `amber ARGS...`, then run it.
step() {
    show amber "$@"
    "$AMBER" "$@"
}

echo "Starting the daemon: amber up --data-dir $DATA --addr $AMBER_ADDR --driver $DRIVER"
"$AMBER" up --data-dir "$DATA" --addr "$AMBER_ADDR" --driver "$DRIVER" --pool "$TEMPLATE=1" >"$DATA/up.log" 2>&1 &
UP_PID=$!
for i in $(seq 600); do
    if ! kill -0 "$UP_PID" 2>/dev/null; then
        UP_PID=""
        echo "demo: amber up exited:" >&2
        cat "$DATA/up.log" >&2
        exit 1
    fi
    [[ -s $DATA/admin.key ]] && "$AMBER" sandbox ls >/dev/null 2>&1 && break
    [[ $i -eq 600 ]] && { echo "demo: the daemon did not answer within 60 s" >&2; exit 1; }
    sleep 0.1
done
echo "Daemon is up (pid $UP_PID); its admin key is in $DATA/admin.key"

printf '\n%s$ SBX=$(amber sandbox create --template %s)%s\n' "$B" "$TEMPLATE" "$N"
SBX=$("$AMBER" sandbox create --template "$TEMPLATE")
echo "$SBX"

step exec "$SBX" -- python3 -c 'print(6*7)'

echo 'hello from the host' >"$DATA/hello.txt"
step files put "$SBX" "$DATA/hello.txt" /root/hello.txt
step exec "$SBX" -- sh -c 'cat /root/hello.txt | tr a-z A-Z > /root/shout.txt'
step files cat "$SBX" /root/shout.txt
step files ls "$SBX" /root
step exec -d "$SBX" -- python3 -c 'import time; time.sleep(600)'
step ps "$SBX"
step sandbox ls
step exec "$SBX" -- sh -c 'exit 3' || echo "(exit status $? — amber exec passes the command's status through)"

# The point of Amber: a crash loses nothing that was checkpointed. A
# program keeps a random value and a counter only in memory; after a
# checkpoint, a change, a crash (SIGKILL of everything) and a recover, it
# goes on from the checkpoint with the same value.
printf '
%s$ PID=$(amber exec -d %s -- python3 -c …a counter with a random value in memory…)%s\n' "$B" "$SBX" "$N"
PID=$("$AMBER" exec -d "$SBX" -- python3 -c '
import random, sys, time
r = random.getrandbits(32)
i = 0
while True:
    i += 1
    print(r, i, flush=True)
    time.sleep(0.1)
')
echo "$PID"
sleep 1
counter() { "$AMBER" exec "$SBX" -- sh -c "tail -n 2 /run/amber/proc/$PID.log | head -n 1"; }
show amber exec "$SBX" -- tail -n 1 "/run/amber/proc/$PID.log"
BEFORE=$(counter); echo "$BEFORE"
printf '
%s$ CKPT=$(amber checkpoint %s)%s\n' "$B" "$SBX" "$N"
CKPT=$("$AMBER" checkpoint "$SBX")
echo "$CKPT"
step exec "$SBX" -- sh -c 'echo written after the checkpoint > /root/after.txt'
step sandbox kill "$SBX"
step sandbox recover "$SBX"
sleep 0.5
show amber exec "$SBX" -- tail -n 1 "/run/amber/proc/$PID.log"
AFTER=$(counter); echo "$AFTER"
if [[ ${BEFORE%% *} != "${AFTER%% *}" ]]; then
    echo "demo: the counter's in-memory value changed (${BEFORE%% *} → ${AFTER%% *}): it was restarted, not restored" >&2
    exit 1
fi
echo "(the same random value ${AFTER%% *}: the process was restored from memory, not restarted)"
step exec "$SBX" -- sh -c 'ls /root; test ! -e /root/after.txt && echo "after.txt is gone: the sandbox is back at the cut"'
step checkpoint ls "$SBX"
step sandbox rm "$SBX"
step sandbox events "$SBX"
SBX=""
printf '\nStopping the daemon (pid %s)\n' "$UP_PID"
