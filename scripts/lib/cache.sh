# Shared by the build scripts that cache what they build outside the repository (controlplane, helm, image).
# Source it after defining `cached` (status 0 when the cache is complete for these inputs) and setting
# PRODUCT (the path printed: bin dir, binary or image reference) and LOG_NAME; then:
#   cache_args HELP_LAST_LINE "$@"   --print / --help / bad arguments exit here; sets FORCE; exits with
#                                    PRODUCT printed when already cached (unless --force)
#   cache_lock DIR                   one build at a time per cache dir; re-checks the cache once it holds it

log() { printf '%s: %s\n' "$LOG_NAME" "$*" >&2; }
die() { printf '%s: error: %s\n' "$LOG_NAME" "$*" >&2; exit 1; }

cache_args() {
    local help_last="$1"
    shift
    FORCE=0
    case "${1:-}" in
        "") ;;
        --force) FORCE=1 ;;
        --print)
            if cached; then echo "$PRODUCT"; exit 0; fi
            log "not built yet: $PRODUCT"; exit 1 ;;
        -h|--help) sed -n "2,${help_last}p" "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
        *) die "unknown argument '$1' (expected --force, --print or nothing)" ;;
    esac
    # Fast path: nothing else runs when the cache is complete.
    if [[ $FORCE == 0 ]] && cached; then echo "$PRODUCT"; exit 0; fi
}

cache_lock() {
    command -v flock >/dev/null 2>&1 || die "'flock' (util-linux) is required"
    mkdir -p "$1" || die "cannot create cache dir $1"
    exec 9>"$1/.lock"
    if ! flock -n 9; then
        log "another build holds $1/.lock; waiting for it"
        flock 9
    fi
    if [[ $FORCE == 0 ]] && cached; then echo "$PRODUCT"; exit 0; fi
}
