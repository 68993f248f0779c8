# Sourced by build-prometheus.sh and build-vpa.sh (after tests/go-env.sh): build Go programs
# into a cache directory once, each under a stamp, one build at a time (flock), with a row in
# build-times.tsv per build.
#
# The sourcing script sets `bin` (output dir), `key` (the stamp: a hash of its helper module,
# flags and Go version) and `version` (for messages), and defines:
#   up_to_date NAME   true when $bin/NAME is stamped with $key and is the expected version
#   build NAME        say what it builds, and compile it to "$bin/.NAME.tmp"
#   verify NAME       after the build: true when $bin/NAME is right, else say why on stderr
# Then `build_stamped NAME...` builds the names not up to date and sets `built` to their count.

build_stamped() {
  local name start secs
  exec 9>"$bin/.lock"
  flock 9
  built=0
  for name in "$@"; do
    if up_to_date "$name"; then
      echo "==> $name: up to date ($version)"
      continue
    fi
    start=$SECONDS
    build "$name"
    mv -f "$bin/.$name.tmp" "$bin/$name"
    verify "$name" || exit 1
    echo "$key" >"$bin/.stamp-$name"
    secs=$((SECONDS - start))
    printf '%s\t%s\t%ss\t%s\n' "$(date -u +%FT%TZ)" "$name" "$secs" \
      "$(go version | cut -d' ' -f3)" >>"$bin/build-times.tsv"
    echo "==> $name: built in ${secs}s ($version)"
    built=$((built + 1))
  done
}
