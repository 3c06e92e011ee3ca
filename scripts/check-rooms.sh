#!/usr/bin/env bash
# The house's rules, checked on every `make`: the rooms and who may include
# whom are the ```rooms block of docs/ARCHITECTURE.md, and the code must
# agree with it.
#   1. every folder of library code is a room of the table (or inside one),
#      and every room of the table exists;
#   2. the table is ordered: a room may include only rooms listed above it
#      (so there is no cycle, and no lower room includes a higher one);
#   3. a file of room R includes only headers of R and of the rooms R
#      names; cli/, bench/, tests/ and fuzz/ may include any room's public
#      header;
#   4. an internal header (internal.h, *_internal.h, *.cuh) is included only
#      from its own room; tests/R/ may include R's (unit tests of internals),
#      fuzz/ any (a fuzz target drives a parser through its entry point);
#   5. a source file over 600 lines says at its top why it is one file
#      (a line with "One file" or "Why one file:" in its first 30 lines).
# Usage: scripts/check-rooms.sh [REPO]; prints each violation, exits 1 if any.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
doc=docs/ARCHITECTURE.md
[ -f "$doc" ] || { echo "check-rooms: $doc is missing"; exit 1; }

# room -> allowed rooms, in table order
declare -A allow=()
rooms=()
while IFS= read -r line; do
  line=${line%%#*}
  [[ $line =~ ^[[:space:]]*$ ]] && continue
  r=${line%%:*}
  r=${r//[[:space:]]/}
  deps=${line#*:}
  rooms+=("$r")
  allow[$r]=" $(echo $deps) "
done < <(awk '/^```rooms/{on=1; next} /^```/{on=0} on' "$doc")
[ ${#rooms[@]} -gt 0 ] || { echo "check-rooms: no \`\`\`rooms block in $doc"; exit 1; }

bad=0
fail() { echo "check-rooms: $*"; bad=1; }

# 2: order
declare -A seen=()
for r in "${rooms[@]}"; do
  for d in ${allow[$r]}; do
    [ -n "${seen[$d]:-}" ] || fail "$doc: room $r may include $d, which is not listed above it"
  done
  seen[$r]=1
  [ -d "$r" ] || fail "$doc: room $r does not exist"
done

mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null ||
  find . \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' \) | sed 's|^\./||')
existing=()
for f in "${files[@]}"; do [ -f "$f" ] && existing+=("$f"); done

# 5: long files
while read -r n f; do
  [ "$f" = total ] && continue
  [ "$n" -gt 600 ] || continue
  head -n 30 "$f" | grep -qi 'one file' || fail "$f: $n lines, and its first 30 lines do not say why it is one file ("One file: ...")"
done < <(wc -l "${existing[@]}")

# 1, 3, 4: one pass over every include line ("file:line:#include ...")
table=$(for r in "${rooms[@]}"; do echo "$r${allow[$r]}"; done)
out=$( { printf '%s\n' "$table"; echo '%%'; printf '%s\n' "${existing[@]}"; echo '%%';
         grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "${existing[@]}" || true; } |
  awk -v doc="$doc" '
    function room_of(p,   r, best) {
      best = ""
      for (r in allow) if (index(p, r "/") == 1 && length(r) > length(best)) best = r
      return best
    }
    function tool(p) { return p ~ /^(cli|bench|tests|fuzz)\// }
    function test_code(p) { return p ~ /^fuzz\// }
    function internal(p,   b) { b = p; sub(/.*\//, "", b); return b == "internal.h" || b ~ /_internal\.h$/ || b ~ /\.cuh$/ }
    BEGIN { part = 0 }
    /^%%$/ { part++; next }
    part == 0 { allow[$1] = " "; for (i = 2; i <= NF; i++) allow[$1] = allow[$1] $i " "; next }
    part == 1 { have[$0] = 1; if (!tool($0) && room_of($0) == "") print $0 ": its folder is no room of " doc; next }
    part == 2 {
      f = $0; sub(/:.*/, "", f)
      rest = substr($0, length(f) + 2); ln = rest; sub(/:.*/, "", ln)
      inc = rest; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
      if (!(inc in have)) next
      them = room_of(inc); if (them == "") next
      me = tool(f) ? "" : room_of(f)
      if (internal(inc) && them != me) {
        t = them; sub(/^[^\/]*\//, "", t)
        if (!test_code(f) && index(f, "tests/" them "/") != 1 && index(f, "tests/" t "/") != 1)
          print f ":" ln ": includes " inc ", an internal header of " them
        next
      }
      if (me == "" || them == me) next
      if (index(allow[me], " " them " ") == 0)
        print f ":" ln ": room " me " includes " inc " of room " them ", which " doc " does not let it"
    }')
if [ -n "$out" ]; then
  while IFS= read -r l; do fail "$l"; done <<<"$out"
fi
exit $bad
