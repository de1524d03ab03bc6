#!/bin/sh
# Runs a command under a lease from the lock service (`leasehold serve`), in plain shell: curl, sed,
# no jq. The same contract as `leasehold run`, for machines without Node:
#
#   cron-wrapper.sh KEY COMMAND [ARGS...]
#
#   LEASEHOLD_SERVICE   the service (default http://127.0.0.1:7070)
#   LEASEHOLD_BEARER    a bearer token, when the service runs with --auth
#   TTL_MS              the lease's ttl (default 30000); renewed every ttl/3 while COMMAND runs
#   WAIT_MS             how long to wait for a busy key (default 0: skip, the cron case)
#
# COMMAND gets LEASEHOLD_KEY, LEASEHOLD_TOKEN and LEASEHOLD_SEQUENCER (pass the token or the
# sequencer to what it writes: the fence there refuses a holder whose lease ran out). Exits with
# COMMAND's code; 75 when the key stayed busy (one line on stderr); 69 when the service cannot be
# used; if a renewal finds the lease lost, COMMAND gets SIGTERM. The lease is released on exit.
set -u

service=${LEASEHOLD_SERVICE:-http://127.0.0.1:7070}
ttl_ms=${TTL_MS:-30000}
wait_ms=${WAIT_MS:-0}
if [ $# -lt 2 ]; then
  echo "usage: cron-wrapper.sh KEY COMMAND [ARGS...]" >&2
  exit 64
fi
key=$1
shift

# Every byte as %XX: a key is one path segment, whatever it holds ("/" included).
urlencode() { printf %s "$1" | od -An -tx1 -v | tr -d ' \n' | sed 's/\(..\)/%\1/g'; }
# One string field of a flat JSON answer (handles, tokens and sequencers hold no quotes or escapes).
field() { printf %s "$1" | sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p"; }

# call METHOD PATH [BODY [HEADER]]: prints the answer's body, then its status on a line of its own.
call() {
  _method=$1 _path=$2 _body=${3:-} _header=${4:-}
  set -- -sS -X "$_method" "$service$_path" -w '\n%{http_code}'
  [ -n "${LEASEHOLD_BEARER:-}" ] && set -- "$@" -H "authorization: Bearer $LEASEHOLD_BEARER"
  [ -n "$_header" ] && set -- "$@" -H "$_header"
  [ -n "$_body" ] && set -- "$@" -H 'content-type: application/json' -d "$_body"
  curl "$@"
}

# The same Idempotency-Key on every poll: a poll that ends busy keeps this waiter's place in the
# queue, and a retry after a lost answer gets the same grant back.
idem="cron-$(uname -n)-$$-$(date +%s)"
label="cron-wrapper@$(uname -n)"
path="/v1/locks/$(urlencode "$key")/acquire"
deadline=$(($(date +%s) + (wait_ms + 999) / 1000))
left=$wait_ms
while :; do
  poll=$left
  [ "$poll" -gt 60000 ] && poll=60000 # at most 60 s a request
  answer=$(call POST "$path" "{\"ttlMs\":$ttl_ms,\"waitMs\":$poll,\"label\":\"$label\"}" "idempotency-key: $idem") || { echo "cron-wrapper: cannot reach $service" >&2; exit 69; }
  status=$(printf %s "$answer" | tail -n 1)
  answer=$(printf %s "$answer" | sed '$d')
  [ "$status" = 200 ] && break
  if [ "$status" = 409 ]; then
    left=$(((deadline - $(date +%s)) * 1000))
    if [ "$left" -le 0 ]; then
      echo "cron-wrapper: $key is busy (held by $(field "$answer" holder)); skipped" >&2
      exit 75
    fi
    continue
  fi
  echo "cron-wrapper: acquire answered $status: $answer" >&2
  exit 69
done

lease=$(field "$answer" lease)
LEASEHOLD_KEY=$key
LEASEHOLD_TOKEN=$(field "$answer" token)
LEASEHOLD_SEQUENCER=$(field "$answer" sequencer)
export LEASEHOLD_KEY LEASEHOLD_TOKEN LEASEHOLD_SEQUENCER
echo "cron-wrapper: $key held under token $LEASEHOLD_TOKEN" >&2

child=''
renewer=''
release() {
  [ -n "$renewer" ] && kill -KILL "$renewer" 2>/dev/null # it may not have reset the traps it inherited yet
  call DELETE "/v1/leases/$lease" >/dev/null 2>&1
}
trap release EXIT
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null' INT TERM HUP

"$@" &
child=$!

# Renew every ttl/3 while the command runs; a lease found lost (410) stops the command.
interval=$(awk "BEGIN { print $ttl_ms / 3000 }")
(
  trap - EXIT INT TERM HUP # the wrapper's traps are not the renewer's
  while sleep "$interval" </dev/null >/dev/null 2>&1; do
    status=$(call POST "/v1/leases/$lease/renew" '{}' 2>/dev/null | tail -n 1)
    if [ "$status" = 410 ]; then
      echo "cron-wrapper: lease on $key lost; stopping the command" >&2
      kill -TERM "$child" 2>/dev/null
      exit 0
    fi
  done
) &
renewer=$!

# `wait` returns early when a trapped signal arrives: wait again until the command has ended.
while :; do
  wait "$child"
  code=$?
  kill -0 "$child" 2>/dev/null || break
done
exit "$code"
