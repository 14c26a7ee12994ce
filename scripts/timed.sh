# Sourced by scripts/test and .ci/run: `timed NAME COMMAND...` runs COMMAND
# and then prints how long it took, so that every CI log says what each part
# costs (the budget is 60 minutes on this kind of machine).
timed() {
    local name=$1 started=$SECONDS
    shift
    "$@"
    echo "timed: $name: $((SECONDS - started)) s (total $SECONDS s)" >&2
}
