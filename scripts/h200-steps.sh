# Sourced by the scripts/*-h200.sh runs on the GPU machine, after they set W (the run's
# folder under $OUT) and STEPS:
#   has STEP                 whether STEP is one of $STEPS
#   step NAME SECONDS CMD..  CMD under a timeout, its output in $STEP_LOGS/NAME.txt (default
#                            $W) and its last $STEP_TAIL lines (default 40) shown; the exit
#                            status and seconds appended to $W/summary.txt. The next step
#                            runs after a failure.
has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
step() {
    local name=$1 secs=$2 log
    shift 2
    log="${STEP_LOGS:-$W}/$name.txt"
    echo "== $name (timeout ${secs}s): $*"
    local t0=$SECONDS
    timeout "$secs" "$@" >"$log" 2>&1
    local rc=$?
    tail -n "${STEP_TAIL:-40}" "$log"
    echo "   $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$W/summary.txt"
}
