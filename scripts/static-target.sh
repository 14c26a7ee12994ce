# shellcheck shell=bash
# Sourced by scripts/build and scripts/main-command-check: whether the
# command can be built static here, decided in one place. Sets `host` (the
# host's target), `musl` (its musl twin, empty if none) and `missing` (what
# the static build lacks here; empty when it can be made).
host=$(rustc -vV | sed -n 's/^host: //p')
missing=()
case "$host" in
    *-linux-gnu) musl=${host%-gnu}-musl ;;
    *) musl=; missing+=("the host, $host, is not a glibc Linux with a musl twin") ;;
esac
if [ -n "$musl" ]; then
    if ! ls "$(rustc --print target-libdir --target "$musl" 2>/dev/null)"/libstd-* >/dev/null 2>&1; then
        missing+=("the $musl target (\`rustup target add $musl\`)")
    fi
    # The compilers cc-rs would take for that target (for the bundled
    # SQLite), before musl-gcc.
    cc_variable=CC_${musl//-/_}
    named_cc=${!cc_variable:-}${TARGET_CC:-}$(printenv "CC_$musl" || true)
    if [ -z "$named_cc" ] && ! command -v musl-gcc >/dev/null; then
        missing+=("a C compiler for it (musl-gcc: \`apt-get install musl-tools\` on Debian)")
    fi
fi
